"""The closed RLAnything loop (paper §3, Algorithm 1): policy, reward model and environment
forged together, one iteration at a time.

    python loop.py --task livebench                      # the full method, CPU defaults
    python loop.py --task livebench --ablation grpo      # outcome-only GRPO (no R, λ = 0)
    python loop.py --task livebench --resume --name NAME # continue a killed run
    python loop.py --task livebench --eval-only --checkpoint runs/NAME
    python loop.py --task alfworld                       # the LLM-agent setting, real ALFWorld engine

One iteration (docs/METHOD.md, "One iteration"):
  1. pick the iteration's tasks: active versions + every pending rewrite
  2. P plays G rollouts per task (batched)
  3. R judges every step m times (coding: writes m tests; all programs run on them)
  4. E decides pending rewrites (Eq. 4) and proposes new ones for slots outside [α_low, α_high]
  5. build policy samples (Eq. 1–2) and reward-model samples (Eq. 3)
  6. update P, then R (Eq. 5)
  7. log, evaluate every N iterations, checkpoint (atomically: a killed run resumes after
     its last finished iteration, nothing lost or repeated)

Defaults: the released code's method with sizes for a 2-core CPU (a 135M model, fewer tasks,
smaller G and m, shorter generations, LR 1e-5). Every value is a flag, `--help` shows the released
value next to each that differs, and `--preset reference` applies them all; docs/METHOD.md lists
every deviation from the paper and the released code, with its reason.
"""
from __future__ import annotations

import argparse
import ctypes
import dataclasses
import fcntl
import functools
import json
import math
import os
import random
import re
import resource
import shutil
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import environment as env
import llm
import policy
import reward_model
import tasks
from tasks import sandbox, stage

ABLATIONS = {  # paper Table 1 rows: (use R's verdicts, train R, adapt the environment)
    "grpo": (False, False, False),          # outcome-only GRPO: no R, λ = 0
    "policy": (True, False, False),         # integrated feedback, R frozen, environment fixed
    "policy_reward": (True, True, False),   # + R trained by consistency feedback
    "full": (True, True, True),             # + environment adaptation: the full method
}


def opt(default, help: str, **kw):
    return field(default=default, metadata={"help": help, **kw})


@dataclass
class Config:
    task: str = opt("livebench", "task setting", choices=sorted(tasks.REGISTRY))
    name: str = opt("", "run name (folder under --runs-dir); default <task>-<ablation>-s<seed>")
    runs_dir: str = opt("runs", "where run folders go")
    model: str = opt("smollm2", "policy init: smollm2 (embedded default), tiny (test model), a folder or a hub id")
    rm_model: str = opt("", "reward-model init; default: same as --model (separate weights)")
    env_model: str = opt("", "environment-model init (generate mode only); default: same as --model")
    engine: str = opt("auto", "sampling engine: auto (vLLM when installed, else transformers), hf, vllm",
                      choices=list(llm.ENGINES))
    vllm_gpu_memory: float = opt(0.3, "vLLM on GPU: share of GPU memory for its weights + KV cache (the trainer shares the GPU)")
    max_model_len: int = opt(4096, "vLLM: longest prompt + generation")
    seed: int = opt(0, "random seed")
    iterations: int = opt(15, "training iterations")
    ablation: str = opt("full", "paper Table 1 row", choices=list(ABLATIONS))
    tasks_per_iter: int = opt(4, "active tasks per iteration (pending rewrites come on top)")
    group_size: int = opt(8, "G: rollouts per task")
    m: int = opt(4, "R samples per step (coding: generated tests per task)")
    preset: str = opt("", "reference: the released code's configuration for this setting, method and scale "
                      "(see docs/METHOD.md); flags given on the command line still win", choices=["", "reference"])
    lam: float = opt(1.0, "λ of Eq. 1 (forced to 0 by --ablation grpo)")
    zero_single: bool = opt(False, "Eq. 2: zero a step index only one rollout reaches (default keeps its raw reward)")
    coding_reward: str = opt("integrated", "coding policy reward: integrated (Eq. 1: outcome + R's tests) or reference "
                             "(the released code: share of GT tests passed, z-scored)", choices=["integrated", "reference"])
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
    micro_batch: int = opt(4, "sequences per forward/backward (gradient accumulation)")
    max_train_samples: int = opt(0, "per model and iteration, train on at most this many samples, drawn at random (0: all)")
    gen_batch: int = opt(64, "sequences per generate call")
    amp: bool = opt(True, "bf16 autocast for sampling and training, fp32 master weights (only where bf16 is native)")
    lora_rank: int = opt(0, "LoRA rank for P and R via peft (0: full fine-tune); vLLM gets the merged weights")
    grad_checkpointing: bool = opt(True, "recompute decoder activations in backward (measured: 0.67x the peak memory for 1.16x the step time)")
    sandbox_timeout: float = opt(5.0, "seconds per program run")
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


class ConfigError(Exception):
    """A bad flag or flag combination; the message is one line for the user."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage dump
        raise ConfigError(message)


def _parser(defaults: dict | None) -> _Parser:
    """The CLI. `defaults`: the setting's values, shown by --help next to the released code's value where
    they differ; None: no defaults at all, to see which flags the command line gave."""
    parser = _Parser(description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                     add_help=defaults is not None)
    released = tasks.reference(defaults["task"]) if defaults else {}
    for f in dataclasses.fields(Config):
        flag = "--" + f.name.replace("_", "-")
        default = argparse.SUPPRESS if defaults is None else defaults[f.name]
        note = f" [released code: {released[f.name]}]" if f.name in released and released[f.name] != default else ""
        kw = {k: v for k, v in f.metadata.items() if k != "help"}
        if f.type == "bool":
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default,
                                help=f.metadata["help"] + note)
        else:
            parser.add_argument(flag, type={"int": int, "float": float}.get(f.type, str), default=default,
                                help=f.metadata["help"] + note, **kw)
    return parser


def setting_defaults(task: str, preset: str = "") -> dict:
    """Config defaults for a setting: the generic ones, the setting's CPU defaults, then the preset's."""
    base = {f.name: f.default for f in dataclasses.fields(Config)}
    return {**base, **tasks.defaults(task), **(tasks.reference(task) if preset == "reference" else {}),
            "task": task, "preset": preset}


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
    ("max_new_tokens", lambda v: v >= 1, "at least 1"),
    ("rm_max_new_tokens", lambda v: v >= 1, "at least 1"),
    ("env_max_new_tokens", lambda v: v >= 1, "at least 1"),
    ("env_retries", lambda v: v >= 1, "at least 1"),
    ("policy_steps", lambda v: v >= 1, "at least 1"),
    ("rm_steps", lambda v: v >= 1, "at least 1"),
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
    ]
    for bad, msg in combos:
        if bad:
            raise ConfigError(msg)


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
                cfg = Config(**{**json.loads(saved.read_text()), **given})
            except (json.JSONDecodeError, TypeError, UnicodeDecodeError) as e:
                raise ConfigError(f"{saved} is damaged ({type(e).__name__}); fix or remove it") from None
    validate(cfg)
    if cfg.ablation == "grpo":
        cfg.lam = 0.0
    if cfg.amp and not llm.bf16_fast():
        print("[loop] bf16 is not native on this machine: running fp32 (--no-amp)")
        cfg.amp = False
    cfg.name = _run_name(cfg)
    return cfg


# ───────────────────────────── run folder ─────────────────────────────

class Run:
    """runs/<name>/: config.json, metrics.jsonl, tb/, curve.png, samples/, and ckpt/ — the last finished
    iteration's P, R (HF format + optimizer), environment slots and state, swapped in atomically.

    The folder is locked (`.lock`, fcntl.flock) for the run's lifetime: a second launch on it stops
    with the holder's pid. A folder with no finished iteration (killed during the initial eval) is
    started again from scratch by --resume, with its saved config."""

    def __init__(self, cfg: Config):
        self.cfg, self.dir = cfg, Path(cfg.runs_dir) / cfg.name
        self.ckpt = self.dir / "ckpt"
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._lock = open(self.dir / ".lock", "a+")
        except OSError as e:
            raise ConfigError(f"cannot create the run folder {self.dir}: {e.strerror}") from None
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.seek(0)
            holder = self._lock.read().strip() or "?"
            self._lock.close()
            raise ConfigError(f"run folder {self.dir} is in use by another run (pid {holder})") from None
        self._lock.truncate(0)
        self._lock.write(str(os.getpid()))
        self._lock.flush()
        self._recover()
        self.fresh = not (self.ckpt / "state.json").exists()  # no finished iteration: start from scratch
        if not cfg.resume and any(p.name != ".lock" for p in self.dir.iterdir()):
            self.close()
            raise ConfigError(f"run folder {self.dir} exists: pass --resume to continue it "
                              + ("(it has no finished iteration: it restarts from scratch with its saved config)"
                                 if self.fresh else "") + ", or another --name")

    def close(self) -> None:
        """Release the lock; a folder that holds nothing else (a launch that failed early) is removed."""
        if self._lock.closed:
            return
        if [p.name for p in self.dir.iterdir()] == [".lock"]:
            shutil.rmtree(self.dir, ignore_errors=True)
        self._lock.close()

    def create(self) -> None:
        """Called once the task and the models loaded, so a bad flag leaves no folder behind."""
        (self.dir / "samples").mkdir(parents=True, exist_ok=True)
        (self.dir / "config.json").write_text(json.dumps(dataclasses.asdict(self.cfg), indent=2))

    def _recover(self):
        """A kill between the two renames of `commit` leaves ckpt.old (+ maybe a complete ckpt.tmp)."""
        tmp, old = self.dir / "ckpt.tmp", self.dir / "ckpt.old"
        if not self.ckpt.exists():
            if (tmp / "state.json").exists():
                os.replace(tmp, self.ckpt)
            elif old.exists():
                os.replace(old, self.ckpt)
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)

    def state(self) -> dict:
        return self.read_json("state.json")

    def read_json(self, name: str):
        """A file of the checkpoint; a damaged one is a one-line error, not a traceback."""
        try:
            return json.loads((self.ckpt / name).read_text())
        except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ConfigError(f"--resume: {self.ckpt / name} is damaged ({type(e).__name__}); "
                              f"the checkpoint cannot be resumed") from None

    def restart(self) -> None:
        """--resume of a folder with no finished iteration: drop what the killed attempt wrote."""
        for name in ("metrics.jsonl", "curve.png"):
            (self.dir / name).unlink(missing_ok=True)
        for name in ("tb", "samples", "ckpt.tmp"):
            shutil.rmtree(self.dir / name, ignore_errors=True)

    def prepare(self, models: dict, slots) -> None:
        """Write the iteration's checkpoint to ckpt.tmp (the slow part); `commit` makes it current."""
        tmp = self.dir / "ckpt.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        for name, (model, tok, optimizer) in models.items():
            llm.save(model, tok, tmp / name, optimizer)
        (tmp / "env_state.json").write_text(json.dumps(env.slots_to_json(slots), indent=1))

    def commit(self, iteration: int) -> None:
        """Called after the iteration's metrics line is written."""
        tmp, old = self.dir / "ckpt.tmp", self.dir / "ckpt.old"
        (tmp / "state.json").write_text(json.dumps({"iteration": iteration}))  # written last: marks tmp complete
        if self.ckpt.exists():
            os.replace(self.ckpt, old)
        os.replace(tmp, self.ckpt)
        shutil.rmtree(old, ignore_errors=True)

    def metrics(self) -> list[dict]:
        path = self.dir / "metrics.jsonl"
        return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []

    def truncate_metrics(self, last: int) -> None:
        """On resume: drop lines of an iteration that never finished (it will be redone)."""
        kept = [r for r in self.metrics() if r["iteration"] <= last]
        (self.dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))

    def log(self, row: dict) -> None:
        with open(self.dir / "metrics.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")


def plot_curve(rows: list[dict], path: Path) -> None:
    """Learning curve: training accuracy and the paper's Table 1 metrics per iteration."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = ["train/acc"] + sorted({k for r in rows for k in r if k.startswith("eval/") and not k.endswith("_se")})
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, group in zip(axes, (keys[:1], keys[1:])):
        for k in group:
            pts = [(r["iteration"], r[k]) for r in rows if k in r and not math.isnan(r[k])]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=k)
        ax.set_xlabel("iteration")
        if ax.lines:
            ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    axes[0].set_title("training accuracy (active tasks)")
    axes[1].set_title("eval: the paper's Table 1 columns")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_samples(groups, path: Path, limit: int = 4) -> None:
    """Readable rollouts: the prompt, each response with its outcome, verdicts, reward and advantage."""
    lines = []
    for g in groups[:limit]:
        lines += ["=" * 100, f"TASK {g.task.id} (acc {g.acc:.2f})", g.task.prompt.strip(), ""]
        for r, ro in enumerate(g.rollouts):
            for k, st in enumerate(ro.steps):
                lines += [f"--- rollout {r} step {k} | outcome {ro.outcome:+d} | verdicts {st.verdicts} | "
                          f"R {st.reward:+.3f} | A {st.advantage:+.3f} | {st.observation}", st.response.strip()]
        for k, t in enumerate(g.tests):
            lines += [f"--- R's test {k}", t.text.strip()]
    path.write_text("\n".join(lines) + "\n")


# ───────────────────────────── models ─────────────────────────────

def build_models(cfg: Config, use_rm: bool, policy_init: str, rm_init: str, env_init: str = ""):
    """(name → (model, tokenizer, optimizer)) for the trained P and R, plus the engines of P, R and the
    frozen E (only when `env_init` is given: E writes tasks in generate mode)."""
    models = {}
    for name, init, lr, wanted in (("policy", policy_init, cfg.lr, True), ("reward_model", rm_init, cfg.rm_lr, use_rm)):
        if wanted:
            model, tok = llm.load(init, cfg.seed)
            if cfg.lora_rank and not hasattr(model, "peft_config"):  # a resumed LoRA checkpoint has them already
                model = llm.add_lora(model, cfg.lora_rank)
            if cfg.grad_checkpointing:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            models[name] = (model, tok, None if cfg.fresh_optimizer else llm.make_optimizer(model, lr))
    to_serve = {k: (m, t) for k, (m, t, _) in models.items()}
    if env_init:
        to_serve["environment"] = llm.load(env_init, cfg.seed)
    t0 = time.perf_counter()
    engines = llm.make_engines(cfg.engine, to_serve, batch_size=cfg.gen_batch, amp=cfg.amp, seed=cfg.seed,
                               max_model_len=cfg.max_model_len, gpu_memory_utilization=cfg.vllm_gpu_memory)
    print(f"[loop] engine {cfg.engine}: {type(engines['policy']).__name__} for {', '.join(engines)} "
          f"(ready in {time.perf_counter() - t0:.0f}s)", flush=True)
    return models, engines


def print_table(results: dict) -> None:
    """The paper's Table 1 columns for this setting (coding: Code / UT / Detect; agents: success,
    Process Acc, Outcome Acc), one row per eval set, in %, accuracies with their standard error."""
    sets = sorted({k.split("/")[0] for k in results})
    cols = list(dict.fromkeys(k.split("/", 1)[1] for k in results if not k.endswith("_se")))
    print(f"{'eval set':<12}" + "".join(f"{c.upper():>16}" for c in cols))
    for s in sets:
        print(f"{s:<12}" + "".join(f"{_pct(results, f'{s}/{c}'):>16}" for c in cols))


def _pct(results: dict, key: str) -> str:
    """A metric in %, with ± its standard error when the adapter reports one."""
    if key not in results:
        return "-"
    se = results.get(key + "_se", float("nan"))
    return f"{100 * results[key]:.1f}" + ("" if math.isnan(se) else f" ± {100 * se:.1f}")


def evaluate(cfg, adapter, engines) -> dict:
    return {f"eval/{k}": v for k, v in
            adapter.evaluate(adapter.eval_sets(), engines["policy"], engines.get("reward_model"), cfg).items()}


def eval_only(cfg: Config) -> None:
    path = Path(cfg.checkpoint)
    if (path / "ckpt" / "policy").exists():
        policy_init, rm_init = str(path / "ckpt" / "policy"), str(path / "ckpt" / "reward_model")
        if not Path(rm_init).exists():
            rm_init = cfg.rm_model or cfg.model
    elif (path / "config.json").exists():
        policy_init, rm_init = str(path), cfg.rm_model or cfg.model
    else:
        raise ConfigError(f"--checkpoint {cfg.checkpoint}: neither a run folder nor a model folder")
    adapter = tasks.get(cfg.task, cfg)
    _, engines = build_models(cfg, True, policy_init, rm_init)
    llm.seed_everything(cfg.seed)
    results = evaluate(cfg, adapter, engines)
    print_table({k.removeprefix("eval/"): v for k, v in results.items()})


# ───────────────────────────── the loop ─────────────────────────────

def train(cfg: Config) -> Path:
    run = Run(cfg)
    try:
        return _train(cfg, run)
    finally:
        run.close()


def _train(cfg: Config, run: Run) -> Path:
    use_rm, train_rm, adapt_env = ABLATIONS[cfg.ablation]
    removed = sandbox.cleanup_stale()
    if removed:
        print(f"[loop] removed {removed} leftover sandbox folder(s) of killed runs")
    adapter = tasks.get(cfg.task, cfg)
    start = 0
    if cfg.resume and run.fresh:
        print(f"[loop] {run.dir} has no finished iteration: starting it again from scratch", flush=True)
        run.restart()
        cfg.resume = False
    if cfg.resume:
        start = run.state()["iteration"]
        run.truncate_metrics(start)
        policy_init, rm_init = str(run.ckpt / "policy"), str(run.ckpt / "reward_model")
        try:
            slots = env.slots_from_json(run.read_json("env_state.json"))
        except (TypeError, KeyError, AttributeError) as e:
            raise ConfigError(f"--resume: {run.ckpt / 'env_state.json'} is damaged ({type(e).__name__})") from None
        print(f"[loop] resuming {run.dir} after iteration {start}", flush=True)
    else:
        policy_init, rm_init = cfg.model, cfg.rm_model or cfg.model
        slots = env.make_slots(adapter.train_tasks())
    env_init = cfg.env_model or cfg.model if adapt_env and cfg.env_mode == "generate" else ""
    models, engines = build_models(cfg, use_rm, policy_init, rm_init, env_init)
    if cfg.resume:
        for name, (_, _, optimizer) in models.items():
            if optimizer is not None and not llm.load_optimizer(optimizer, run.ckpt / name):
                print(f"[loop] warning: {run.ckpt / name / 'optimizer.pt'} is missing: "
                      f"{name} goes on with a fresh AdamW state", flush=True)
    run.create()

    from torch.utils.tensorboard import SummaryWriter
    tb = SummaryWriter(run.dir / "tb", purge_step=start + 1 if cfg.resume else None)

    def finish(iteration: int, row: dict, t_start: float | None = None) -> None:
        with stage(row, "checkpoint"):
            run.prepare(models, slots)
        if t_start is not None:
            row["time/iteration"] = time.perf_counter() - t_start
        row = {"iteration": iteration, **row}
        for k, v in row.items():
            if isinstance(v, (int, float)) and k != "iteration" and not math.isnan(v):
                tb.add_scalar(k if "/" in k else f"charts/{k}", v, iteration)
        tb.flush()
        run.log(row)
        plot_curve(run.metrics(), run.dir / "curve.png")
        run.commit(iteration)

    if not cfg.resume and cfg.eval_every < 0:   # (a resumed run has iteration 0 committed already)
        finish(0, {})
    elif not cfg.resume:  # "before": evaluate the initial models, commit iteration 0
        llm.seed_everything(cfg.seed)
        t0 = time.perf_counter()
        results = evaluate(cfg, adapter, engines)
        print(f"[loop] iteration 0 (before training) eval in {time.perf_counter() - t0:.0f}s")
        print_table({k.removeprefix("eval/"): v for k, v in results.items()})
        finish(0, results)

    for it in range(start + 1, cfg.iterations + 1):
        llm.seed_everything(cfg.seed * 100_003 + it)  # per-iteration seed: a resumed run replays exactly
        t_iter, timings, synced = time.perf_counter(), {}, llm.sync_seconds(engines)
        adapter.timings = timings  # the adapter adds time/sandbox (its share of rollout, judge and eval)
        picked = env.pick_tasks(slots, cfg.tasks_per_iter, random.Random(cfg.seed * 100_003 + it))
        is_active = [t.id == slots[sid].active.id for sid, t in picked]  # the rest are pending rewrites
        with stage(timings, "rollout"):                                     # 2. P plays
            groups = adapter.rollout([t for _, t in picked], cfg.group_size, engines["policy"], cfg)
        if use_rm:
            with stage(timings, "judge"):                                   # 3. R judges
                adapter.judge(groups, engines["reward_model"], cfg)
        env_stats = {}
        if adapt_env:
            with stage(timings, "environment"):                             # 4. E adapts
                train_groups, env_stats = env.update(
                    slots, picked, groups, adapter, cfg.env_mode, engines.get("environment"), low=cfg.alpha_low,
                    high=cfg.alpha_high, retries=cfg.env_retries, temperature=cfg.env_temperature,
                    top_p=cfg.env_top_p, max_new_tokens=cfg.env_max_new_tokens, iteration=it)
        else:
            train_groups = [g for g, a in zip(groups, is_active) if a]
        p_samples = policy.policy_samples(train_groups, cfg.lam, not cfg.zero_single, cfg.coding_reward,  # 5.
                                          (cfg.acc_lower, cfg.acc_upper), cfg.drop_zero_adv)
        r_samples = reward_model.rm_samples(train_groups, adapter.judge_kind,
                                            drop_zero=cfg.drop_zero_adv) if train_rm else []
        stats = {}
        with stage(timings, "train_policy"):                                # 6. update P, then R
            stats |= update(cfg, models["policy"], engines["policy"], p_samples, cfg.policy_steps, it, "policy")
        if train_rm:
            with stage(timings, "train_rm"):
                stats |= update(cfg, models["reward_model"], engines["reward_model"], r_samples, cfg.rm_steps, it, "rm")
        row = {"train/acc": _mean(g.acc for g, a in zip(groups, is_active) if a),
               "train/rewrite_acc": _mean(g.acc for g, a in zip(groups, is_active) if not a), "train/tasks": len(groups),
               "train/policy_samples": len(p_samples), "train/rm_samples": len(r_samples),
               "train/verdict_mean": _mean([v for g in groups for ro in g.rollouts for st in ro.steps
                                            for v in st.verdicts]),
               "env/mean_level": _mean([s.active.level for s in slots.values() if s.active.level is not None]),
               **{f"env/{k}": v for k, v in env_stats.items()}, **stats}
        write_samples(groups, run.dir / "samples" / f"iter_{it:04d}.txt")
        if cfg.eval_every > 0 and it % cfg.eval_every == 0 or it == cfg.iterations and cfg.eval_every >= 0:
            with stage(timings, "eval"):                                    # 7. evaluate
                row |= evaluate(cfg, adapter, engines)
        timings["time/sync"] = llm.sync_seconds(engines) - synced  # weight copies into vLLM (within the stages)
        row |= timings | {"sys/peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
                          "sys/rss_gib": release_memory()}
        finish(it, row, t_iter)  # adds time/checkpoint and time/iteration
        print(_summary(it, row), flush=True)
    tb.close()
    return run.dir


@functools.cache
def _libc():
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc (macOS, musl): the allocator is left as it is
        return None


def release_memory() -> float:
    """Give freed heap pages back to the system (glibc malloc_trim), after each model update and each
    iteration; returns the current RSS in GiB. Without it the process grew about 1 GiB per osworld
    iteration (11.2 → 14.8 GiB in 3 iterations, then the OOM killer, next to 32 browsers).
    A fixed 1 MiB mmap threshold (mallopt) was tried instead and dropped: with it, training spent a
    third of its CPU time in the kernel (page faults on every large tensor) and an iteration took
    over twice as long."""
    if (libc := _libc()) is not None:
        libc.malloc_trim(0)
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30
    except OSError:
        return float("nan")


def update(cfg: Config, model_tok_opt, engine, samples, steps: int, it: int, name: str) -> dict:
    """Eq. 5 on one model, then sync its engine. With --fresh-optimizer (the released code) every
    iteration starts from a new AdamW; otherwise the run's optimizer carries its moments over."""
    model, tok, optimizer = model_tok_opt
    optimizer = optimizer or llm.make_optimizer(model, cfg.lr if name == "policy" else cfg.rm_lr)
    if 0 < cfg.max_train_samples < len(samples):  # a compute budget per iteration, not in the paper
        samples = random.Random(cfg.seed * 100_003 + it).sample(samples, cfg.max_train_samples)
    stats = llm.ppo_update(model, optimizer, samples, tok.pad_token_id, steps=steps, clip_eps=cfg.clip_eps,
                           kl_beta=cfg.kl_beta, micro_batch=cfg.micro_batch, amp=cfg.amp, seed=it,
                           log_ratio_clamp=cfg.log_ratio_clamp)
    engine.sync()
    release_memory()
    return {f"losses/{name}_{k}": v for k, v in stats.items()}


def _mean(xs) -> float:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else float("nan")


def _summary(it: int, row: dict) -> str:
    parts = [f"it {it:3d}", f"acc {row['train/acc']:.2f}", f"P samples {row['train/policy_samples']}",
             f"R samples {row['train/rm_samples']}"]
    if "env/proposed" in row:
        parts.append(f"env +{row['env/accepted']}/-{row['env/rejected']} new {row['env/proposed']}")
    parts += [f"{k.removeprefix('eval/')} {_pct(row, k)}" for k, v in row.items()
              if k.startswith("eval/") and not k.endswith("_se") and not math.isnan(v)]
    parts.append(" ".join(f"{k.removeprefix('time/')} {v:.0f}s" for k, v in row.items() if k.startswith("time/")))
    return " | ".join(parts)


def main(argv=None) -> int:
    cfg = None
    try:
        cfg = parse_args(argv)
        if cfg.eval_only:
            eval_only(cfg)
        else:
            print(f"[loop] run folder: {train(cfg)}")
    except (ConfigError, llm.ModelError, tasks.TaskError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if cfg is not None and not cfg.eval_only:
            print(f"\ninterrupted: the last finished iteration is kept; continue with "
                  f"python loop.py --name {cfg.name} --runs-dir {cfg.runs_dir} --resume", file=sys.stderr)
        else:
            print("\ninterrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    # SIGTERM (kill, a scheduler) exits like Ctrl-C does, so exit handlers run: the osworld task's
    # browsers are killed with the run. The checkpoint is atomic either way.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.exit(main())
