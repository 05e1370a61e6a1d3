"""Plumbing, skip on a first read: the run's configuration. Every flag of loop.py with its generic
default, each setting's own defaults (tasks/<task>.py DEFAULTS) and the released code's (--preset
reference), validation with one-line errors, and --resume's saved config. The method's values are
documented in docs/METHOD.md.

`python loop.py --task X --help` lists the flags with setting X's defaults; the flags only some
settings read are grouped under those settings' names.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import tasks
from plumbing.engines import CPU_KV_BLOCK, ENGINES
from plumbing.models import bf16_fast
from plumbing.vision import names_vlm

@dataclass(frozen=True)
class Row:
    """A row of the paper's Table 1: which parts of Algorithm 1 run, and the method rules that follow from them."""
    use_rm: bool            # R judges P's steps, and its verdicts S enter P's reward (Eq. 1)
    train_rm: bool          # R is trained by consistency feedback (Eq. 3)
    adapt_env: bool         # E rewrites tasks harder or easier (Eq. 4)
    outcome: bool = True    # the outcome O enters P's reward (Eq. 1); without it P learns from R's verdicts alone

    def lam(self, lam: float) -> float:
        """Eq. 1's λ: the run's, or 0 when no R judges (outcome-only GRPO)."""
        return lam if self.use_rm else 0.0

    def acc_range(self, low: float, high: float) -> tuple[float, float]:
        """P's accuracy filter, on the outcomes: the run's range, or off when P's reward holds no outcome (its
        training data then carries no outcome label at all)."""
        return (low, high) if self.outcome else (0.0, 1.0)

    def reward(self, setting_reward: str) -> str:
        """policy.score_steps' reward: the setting's (coding: integrated or the released reference), or Eq. 1
        without O ("stepwise")."""
        return setting_reward if self.outcome else "stepwise"


ABLATIONS = {   # the paper's Table 1 rows, and claim 2's
    "grpo": Row(use_rm=False, train_rm=False, adapt_env=False),          # outcome-only GRPO: no R, λ = 0
    "policy": Row(use_rm=True, train_rm=False, adapt_env=False),         # integrated feedback, R frozen, E fixed
    "policy_reward": Row(use_rm=True, train_rm=True, adapt_env=False),   # + R trained by consistency feedback
    "full": Row(use_rm=True, train_rm=True, adapt_env=True),             # + E adapting the tasks: the full method
    # claim 2: P on R's step-wise verdicts alone, R frozen (give it a trained one: --rm-model)
    "stepwise": Row(use_rm=True, train_rm=False, adapt_env=False, outcome=False),
}


def opt(default, help: str, **kw):
    return field(default=default, metadata={"help": help, **kw})


@dataclass
class Config:
    task: str = opt("livebench", "task setting", choices=sorted(tasks.REGISTRY))
    name: str = opt("", "run name (folder under --runs-dir); default <task>-<ablation>-s<seed>")
    runs_dir: str = opt("runs", "where run folders go")
    model: str = opt("smollm2", "policy init: smollm2 (embedded default), tiny (test model), tiny-vlm (its "
                     "vision-language sibling), a folder or a hub id (a Qwen-VL one reads screenshots: osworld)")
    rm_model: str = opt("", "reward-model init; default: same as --model (separate weights)")
    env_model: str = opt("", "environment-model init (generate mode only); default: same as --model")
    engine: str = opt("auto", "sampling engine: auto (vLLM when installed, else transformers), hf, vllm",
                      choices=list(ENGINES))
    vllm_gpu_memory: float = opt(0.3, "vLLM on GPU: share of GPU memory for its weights + KV cache (the trainer shares the GPU)")
    max_model_len: int = opt(4096, "vLLM: longest prompt + generation")
    kv_block: int = opt(0, f"vLLM: tokens per KV-cache block, the grain of its prefix cache (0: {CPU_KV_BLOCK} on CPU, "
                        "where vLLM's own 128 caches none of the map a maze's prompts share; vLLM's own on GPU)")
    seed: int = opt(0, "random seed")
    iterations: int = opt(15, "training iterations")
    ablation: str = opt("full", "paper Table 1 row", choices=list(ABLATIONS))
    tasks_per_iter: int = opt(4, "active tasks per iteration (pending rewrites come on top)")
    group_size: int = opt(8, "G: rollouts per task")
    m: int = opt(4, "R samples per step (coding: generated tests per task); under torchrun write --judgments "
                 "(torchrun reads --m as an abbreviation of its own flags)", aliases=["--judgments"])
    preset: str = opt("", "reference: the released code's configuration for this setting, method and scale "
                      "(see docs/METHOD.md); flags given on the command line still win", choices=["", "reference"])
    lam: float = opt(1.0, "λ of Eq. 1 (0 under --ablation grpo: config.Row.lam)")
    zero_single: bool = opt(False, "Eq. 2: zero a step index only one rollout reaches (default keeps its raw reward)")
    policy_reward: str = opt("integrated", "P's reward: integrated (Eq. 1: the outcome + λ·R's verdicts; coding: R's "
                             "tests) or reference (the released coding code: the share of GT tests passed, z-scored)",
                             choices=["integrated", "reference"], aliases=["--coding-reward"])
    coding_task: str = opt("completion", "coding: completion (P completes the first lines of a reference solution: "
                           "LiveBench's code-completion task) or generation (P writes the whole program)",
                           choices=["generation", "completion"])
    stop_after_code: bool = opt(True, "coding: P's answer ends with the token that closes its code block (what it "
                                "writes after the block earns no reward); --no-stop-after-code: on to eos, as released")
    acc_lower: float = opt(1 / 8, "policy training keeps tasks with acc in [--acc-lower, --acc-upper]")
    acc_upper: float = opt(7 / 8, "upper end of the policy's accuracy filter")
    drop_zero_adv: bool = opt(True, "drop samples whose advantage is exactly 0 (P and R); else they stay in the "
                              "loss's mean and KL term")
    temperature: float = opt(1.0, "policy sampling temperature")
    top_p: float = opt(0.95, "policy nucleus sampling")
    max_new_tokens: int = opt(192, "policy tokens per step")
    max_turns: int = opt(40, "agent tasks: step limit of an episode (paper, ALFWorld: 40)")
    rm_temperature: float = opt(0.8, "R sampling temperature")
    rm_top_p: float = opt(0.95, "R nucleus sampling")
    rm_max_new_tokens: int = opt(96, "R tokens per judgment / test")
    rm_balance: bool = opt(False, "agent settings, not in the paper: steps with a positive and a non-positive "
                           "reward carry equal weight in R's Eq. 3 samples (reward_model.balance_weights)")
    wrong_tests_cost: bool = opt(False, "coding, not in the paper: a test R writes that a GT code fails earns at most "
                                 "−1 (the paper's reward gives 0 to a wrong test that every program fails, as to a "
                                 "correct test that catches nothing, so the two tie)")
    rm_oracle: bool = opt(False, "maze, a control, not the method: R's m verdicts on a step are its exact label "
                          "(tasks.agent.label_verdicts), so --ablation stepwise / policy show what a perfect judge's "
                          "step signal gives P")
    maze_no_slack: bool = opt(False, "maze, not in the paper: an episode ends at its first step off a shortest path "
                              "(an invalid answer included), so its outcome is the AND of its step labels: the "
                              "setting where per-step Eq. 3's outcome signal is a step signal (docs/PREMISE.md)")
    rm_norm: str = opt("step", "agent settings: Eq. 3's z-score over each step's m judgments (step: the paper; a step "
                       "whose m judgments agree is skipped) or over every judgment of the iteration (batch, not in "
                       "the paper: unanimous steps train R too; reward_model.batch_consistency_rewards)",
                       choices=["step", "batch"])
    env_mode: str = opt("variants", "E's rewrites: variants (move along the ladder) or generate (E writes a task)",
                        choices=["variants", "generate"])
    env_retries: int = opt(4, "N: E's tries per proposal in generate mode")
    env_temperature: float = opt(0.8, "E sampling temperature (generate mode)")
    env_top_p: float = opt(0.95, "E nucleus sampling (generate mode)")
    env_max_new_tokens: int = opt(768, "E's tokens per try in generate mode")
    alpha_low: float = opt(0.2, "α_low of Eq. 4")
    alpha_high: float = opt(0.8, "α_high of Eq. 4")
    lr: float = opt(1e-5, "policy learning rate (AdamW, constant)")
    rm_lr: float = opt(1e-5, "reward-model learning rate")
    policy_steps: int = opt(2, "policy optimizer steps per iteration")
    rm_steps: int = opt(2, "reward-model optimizer steps per iteration")
    clip_eps: float = opt(0.2, "PPO clip ε (Eq. 5)")
    kl_beta: float = opt(0.01, "KL β to the pre-update policy, k3 estimator (Eq. 5)")
    log_ratio_clamp: float = opt(10.0, "clamp log(π_θ/π_old) to ±this before exp in the loss (Eq. 5; 0: off)")
    fresh_optimizer: bool = opt(True, "a new AdamW every iteration (released code); --no-fresh-optimizer keeps its "
                                "state across iterations and checkpoints it")
    target_kl: float = opt(0.0, "trust region, not in the released code: scale each update back until its KL to "
                           "the sampling policy (token mean, k3) is at most this (ppo.line_search; 0: off)")
    rm_target_kl: float = opt(-1.0, "R's trust region, as --target-kl for R alone (not in the paper; -1: the same "
                              "as --target-kl)")
    sampler_old_kl: float = opt(1e-6, "take π_old of the mini-batches after the first from the sampler's log-probs "
                                "when the first one's sampler KL (k3, token mean) is at most this, saving a forward "
                                "pass (ppo.ppo_update; 0: always recompute, the released code)")
    warmup_steps: int = opt(0, "linear LR warm-up over each AdamW's first N optimizer steps: with a fresh optimizer "
                            "every iteration's, else the run's first N (0: constant LR, the released code)")
    micro_batch: int = opt(4, "sequences per forward/backward (gradient accumulation)")
    max_train_samples: int = opt(0, "per model and iteration, train on at most this many samples, drawn at random (0: all)")
    gen_batch: int = opt(64, "sequences per generate call")
    amp: bool = opt(True, "bf16 autocast for sampling and training, fp32 master weights (only where bf16 is native)")
    train_amp: bool = opt(True, "with --amp, bf16 autocast in P's and R's updates too; --no-train-amp computes their "
                          "log-probs and updates in fp32 (sampling stays bf16): a bf16 forward of slightly changed "
                          "weights moves log-probs by ~0.1, which PPO's ratio and clip read as a step (docs/NOTES.md)")
    dither: bool = opt(True, "with --amp (a bf16 sampler): move P's and R's fp32 master weights to random points of "
                       "their bf16 rounding cells once, at the start of a run, so that an update reaches the bf16 sampler "
                       "as the trainer made it; without it a weight on a bf16 tie flips a whole bf16 step under any "
                       "update (docs/NOTES.md)")
    lora_rank: int = opt(0, "LoRA rank for P and R via peft (0: full fine-tune); vLLM gets the merged weights")
    train_vision: bool = opt(False, "a vision-language P or R (osworld task): train its vision tower too (default: "
                             "frozen, only the language model trains)")
    grad_checkpointing: bool = opt(True, "recompute decoder activations in backward: less memory, slower steps (docs/NOTES.md)")
    sandbox_timeout: float = opt(5.0, "seconds per program run")
    validation: bool = opt(False, "evaluate on the setting's validation split instead of its eval sets: for "
                           "choosing hyperparameters (maze, livebench; the eval sets are not played)")
    eval_every: int = opt(5, "evaluate every N iterations (0: only before and after; -1: never, e.g. for benchmarks)")
    eval_samples: int = opt(1, "policy samples per eval task")
    eval_tasks: int = opt(0, "tasks per eval set, a fixed random subset (0: all)")
    eval_temperature: float = opt(0.0, "policy temperature at eval (0: greedy)")
    eval_max_turns: int = opt(0, "agent tasks: step limit of an eval episode (0: --max-turns)")
    humaneval_limit: int = opt(10, "HumanEval problems in the OOD eval (0: none, -1: all 164)")
    data: str = opt("", "LiveBench coding questions as an extra eval set: a jsonl in LiveBench's format, or 'hub'")
    backend: str = opt("miniwob", "osworld task: miniwob (MiniWoB++ in headless Chromium, offline) or osworld "
                       "(real OSWorld VMs through the desktop-env bridge)", choices=["miniwob", "osworld"])
    screenshots: bool = opt(False, "osworld task: record screenshots with each observation (for a vision-language policy)")
    browsers: int = opt(16, "osworld task: most browsers (or OSWorld VMs) at once; more episodes play in waves")
    browser_timeout: float = opt(30.0, "osworld task: seconds a browser / bridge call may take before it is restarted")
    osworld_tasks: str = opt("", "--backend osworld: OSWorld's evaluation_examples folder (test_all.json + examples/)")
    osworld_python: str = opt("", "--backend osworld: the python of the venv holding desktop-env (runs the bridge)")
    osworld_provider: str = opt("docker", "--backend osworld: desktop-env's VM provider (docker, vmware, virtualbox, aws, ...)")
    osworld_vm: str = opt("", "--backend osworld: desktop-env's path_to_vm (empty: the provider's default)")
    resume: bool = opt(False, "continue the run --name after its last finished iteration")
    eval_only: bool = opt(False, "evaluate --checkpoint and print the paper's Table 1 columns")
    checkpoint: str = opt("", "for --eval-only: a run folder, or a model folder (then R = --rm-model)")

    def target_kl_of(self, name: str) -> float:
        """The trust region of the update of `name` ("policy" or "rm"): R's own when --rm-target-kl is set."""
        return self.rm_target_kl if name == "rm" and self.rm_target_kl >= 0 else self.target_kl


class ConfigError(Exception):
    """A bad flag or flag combination; the message is one line for the user."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage dump
        raise ConfigError(message)


# Flags that only some settings read, grouped under those settings' names in --help.
SETTING_FLAGS = {
    "livebench (coding)": ["coding_task", "stop_after_code", "wrong_tests_cost", "sandbox_timeout", "humaneval_limit", "data"],
    "alfworld, osworld, maze (multi-turn agents)": ["max_turns", "eval_max_turns", "rm_oracle", "maze_no_slack"],
    "osworld": ["backend", "screenshots", "browsers", "browser_timeout", "osworld_tasks", "osworld_python",
                "osworld_provider", "osworld_vm"],
}


def _parser(defaults: dict | None) -> _Parser:
    """The CLI. `defaults`: the setting's values, shown by --help next to the released code's value where
    they differ; None: no defaults at all, to see which flags the command line gave."""
    parser = _Parser(description="RLAnything's closed loop (paper Algorithm 1): policy, reward model and "
                     "environment trained together.", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                     add_help=defaults is not None)
    groups = {}
    for title, names in SETTING_FLAGS.items():
        group = parser.add_argument_group(f"only for {title}")
        groups |= dict.fromkeys(names, group)
    released = tasks.reference(defaults["task"]) if defaults else {}
    for f in dataclasses.fields(Config):
        flags = ["--" + f.name.replace("_", "-"), *f.metadata.get("aliases", [])]
        default = argparse.SUPPRESS if defaults is None else defaults[f.name]
        note = f" [released code: {released[f.name]}]" if f.name in released and released[f.name] != default else ""
        kw = {k: v for k, v in f.metadata.items() if k not in ("help", "aliases")}
        where = groups.get(f.name, parser)
        if f.type == "bool":
            where.add_argument(*flags, action=argparse.BooleanOptionalAction, default=default,
                               help=f.metadata["help"] + note)
        else:
            where.add_argument(*flags, type={"int": int, "float": float}.get(f.type, str), default=default,
                               help=f.metadata["help"] + note, **kw)
    return parser


def setting_defaults(task: str, preset: str = "") -> dict:
    """Config defaults for a setting: the generic ones, the setting's CPU defaults, then the preset's."""
    base = {f.name: f.default for f in dataclasses.fields(Config)}
    return {**base, **tasks.defaults(task), **(tasks.reference(task) if preset == "reference" else {}),
            "task": task, "preset": preset}


def describe(cfg: Config) -> str:
    """One line for the start of a run: the setting, then every value that is not Config's generic default
    (the setting's own defaults, --preset's and the flags given), so that a run says what it runs.

        >>> describe(Config(task="maze", lr=3e-6, group_size=8))
        'maze: lr=3e-06'
    """
    generic = {f.name: f.default for f in dataclasses.fields(Config)}
    changed = [f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in dataclasses.asdict(cfg).items()
               if k not in ("task", "name") and v != generic[k]]
    return f"{cfg.task}: " + (", ".join(changed) or "Config's generic defaults")


NAME_OK = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}")


def _run_name(cfg: Config) -> str:
    return cfg.name or f"{cfg.task}-{cfg.ablation}-s{cfg.seed}"


# Every numeric flag's valid range, in one place: (flag, test, what it must be).
RANGES = [
    ("group_size", lambda v: v >= 2, "at least 2 (advantages are z-scored over the group)"),
    ("m", lambda v: v >= 1, "at least 1"),
    ("seed", lambda v: v >= 0, ">= 0"),
    ("iterations", lambda v: v >= 0, ">= 0"),
    ("tasks_per_iter", lambda v: v >= 1, "at least 1"),
    ("max_turns", lambda v: v >= 1, "at least 1"),
    ("browsers", lambda v: v >= 1, "at least 1"),
    ("max_train_samples", lambda v: v >= 0, ">= 0 (0: all)"),
    ("eval_tasks", lambda v: v >= 0, ">= 0 (0: all)"),
    ("eval_samples", lambda v: v >= 1, "at least 1"),
    ("eval_every", lambda v: v >= -1, ">= -1"),
    ("humaneval_limit", lambda v: v >= -1, ">= -1 (-1: all, 0: none)"),
    ("lora_rank", lambda v: v >= 0, ">= 0 (0: full fine-tune)"),
    ("gen_batch", lambda v: v >= 1, "at least 1"),
    ("micro_batch", lambda v: v >= 1, "at least 1"),
    ("max_model_len", lambda v: v >= 64, "at least 64"),
    ("kv_block", lambda v: v >= 0 and v % 32 == 0, "0 (the engine's choice) or a multiple of 32 (vLLM's CPU attention "
                                                   "takes no other)"),
    ("max_new_tokens", lambda v: v >= 1, "at least 1"),
    ("rm_max_new_tokens", lambda v: v >= 1, "at least 1"),
    ("env_max_new_tokens", lambda v: v >= 1, "at least 1"),
    ("env_retries", lambda v: v >= 1, "at least 1"),
    ("policy_steps", lambda v: v >= 1, "at least 1"),
    ("rm_steps", lambda v: v >= 1, "at least 1"),
    ("warmup_steps", lambda v: v >= 0, ">= 0 (0: no warm-up)"),
    ("target_kl", lambda v: v >= 0, ">= 0 (0: off)"),
    ("sampler_old_kl", lambda v: v >= 0, ">= 0 (0: always recompute)"),
    ("rm_target_kl", lambda v: v >= 0 or v == -1, ">= 0 (0: off), or -1 (the same as --target-kl)"),
    ("lr", lambda v: 0 < v < 1, "in (0, 1)"),
    ("rm_lr", lambda v: 0 < v < 1, "in (0, 1)"),
    ("lam", lambda v: v >= 0, ">= 0"),
    ("temperature", lambda v: 0 < v <= 10, "in (0, 10] (training samples at T > 0)"),
    ("rm_temperature", lambda v: 0 <= v <= 10, "in [0, 10] (0: greedy)"),
    ("rm_top_p", lambda v: 0 < v <= 1, "in (0, 1]"),
    ("env_temperature", lambda v: 0 <= v <= 10, "in [0, 10] (0: greedy)"),
    ("env_top_p", lambda v: 0 < v <= 1, "in (0, 1]"),
    ("acc_lower", lambda v: 0 <= v <= 1, "in [0, 1]"),
    ("acc_upper", lambda v: 0 <= v <= 1, "in [0, 1]"),
    ("log_ratio_clamp", lambda v: v >= 0, ">= 0 (0: off)"),
    ("eval_max_turns", lambda v: v >= 0, ">= 0 (0: --max-turns)"),
    ("eval_temperature", lambda v: 0 <= v <= 10, "in [0, 10] (0: greedy)"),
    ("top_p", lambda v: 0 < v <= 1, "in (0, 1]"),
    ("alpha_low", lambda v: 0 <= v < 1, "in [0, 1)"),
    ("alpha_high", lambda v: 0 < v <= 1, "in (0, 1]"),
    ("clip_eps", lambda v: 0 < v < 1, "in (0, 1)"),
    ("kl_beta", lambda v: v >= 0, ">= 0"),
    ("sandbox_timeout", lambda v: 0.5 <= v <= 600, "in [0.5, 600] seconds (a Python program needs ~0.1 s to start)"),
    ("browser_timeout", lambda v: v >= 1, "at least 1 second"),
    ("vllm_gpu_memory", lambda v: 0 < v <= 1, "in (0, 1]"),
]


def validate(cfg: "Config") -> None:
    """Flag ranges and combinations; raises ConfigError with one line naming the flag."""
    for name, ok, must in RANGES:
        value = getattr(cfg, name)
        if isinstance(value, float) and not math.isfinite(value) or not ok(value):
            raise ConfigError(f"--{name.replace('_', '-')} must be {must}, not {value}")
    combos = [
        (cfg.alpha_low >= cfg.alpha_high, "need --alpha-low < --alpha-high"),
        (cfg.acc_lower > cfg.acc_upper, "need --acc-lower <= --acc-upper"),
        (cfg.resume and cfg.eval_only, "--resume and --eval-only don't go together"),
        (cfg.eval_only and not cfg.checkpoint, "--eval-only needs --checkpoint (a run folder or a model folder)"),
        (cfg.ablation == "grpo" and cfg.lam not in (0.0, 1.0), "--ablation grpo has no reward model: --lam must stay unset"),
        (cfg.ablation == "stepwise" and cfg.lam == 0, "--ablation stepwise rewards P with λ·(R's mean verdict) alone: "
                                                      "--lam must be > 0"),
        (cfg.rm_balance and cfg.task == "livebench", "--rm-balance weighs R's step verdicts; the coding setting's R "
                                                     "writes tests (agent settings only)"),
        (cfg.wrong_tests_cost and cfg.task != "livebench", "--wrong-tests-cost changes the reward of R's unit tests "
                                                           "(the coding setting only)"),
        (cfg.rm_oracle and cfg.task != "maze", "--rm-oracle reads exact step labels on training steps: the maze "
                                               "only (ALFWorld computes its planner labels in evaluation only)"),
        (cfg.rm_oracle and cfg.ablation not in ("policy", "stepwise"), "--rm-oracle replaces R's verdicts with the "
                                                                         "labels: use it with --ablation policy or "
                                                                         "stepwise (R is not trained)"),
        (cfg.rm_norm != "step" and cfg.task == "livebench", "--rm-norm normalizes R's step verdicts; the coding "
                                                            "setting's R writes tests (agent settings only)"),
    ]
    for bad, msg in combos:
        if bad:
            raise ConfigError(msg)


RENAMED = {"coding_reward": "policy_reward"}   # a run folder's saved config may use a field's earlier name


def parse_args(argv=None) -> Config:
    """Flags → Config: the generic defaults, then the setting's (tasks/<task>.py DEFAULTS), then
    --preset's, then the flags given. With --resume, the run's saved config is the base and only
    the flags given on this command line change it (e.g. a larger --iterations to extend a run)."""
    given = vars(_parser(None).parse_known_args(argv)[0])
    task = given.get("task", Config.task)
    cfg = Config(**vars(_parser(setting_defaults(task, given.get("preset", ""))).parse_args(argv)))
    if not NAME_OK.fullmatch(cfg.name or "x"):
        raise ConfigError(f"--name {cfg.name!r}: use letters, digits, '.', '_' and '-' only "
                          "(a folder name under --runs-dir, not a path)")
    if cfg.resume:
        saved = Path(cfg.runs_dir) / _run_name(cfg) / "config.json"
        if saved.exists():
            try:
                cfg = Config(**{RENAMED.get(k, k): v for k, v in json.loads(saved.read_text()).items()} | given)
            except (json.JSONDecodeError, TypeError, UnicodeDecodeError) as e:
                raise ConfigError(f"{saved} is damaged ({type(e).__name__}); fix or remove it") from None
    validate(cfg)
    if cfg.task == "osworld" and not cfg.screenshots and any(map(names_vlm, (cfg.model, cfg.rm_model or cfg.model))):
        print("[loop] a vision-language model reads the screen: recording screenshots (--screenshots)")
        cfg.screenshots = True
    if cfg.amp and not bf16_fast():
        print("[loop] bf16 is not native on this machine: running fp32 (--no-amp)")
        cfg.amp = False
    cfg.name = _run_name(cfg)
    return cfg

