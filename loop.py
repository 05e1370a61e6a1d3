"""The closed RLAnything loop (paper §3, Algorithm 1): policy, reward model and environment
forged together, one iteration at a time.

    python loop.py --task livebench                      # the full method, CPU defaults
    python loop.py --task livebench --ablation grpo      # outcome-only GRPO (no R, λ = 0)
    python loop.py --task livebench --resume --name NAME # continue a killed run
    python loop.py --task livebench --eval-only --checkpoint runs/NAME
    python loop.py --task maze                           # the teaching setting: learns in minutes on a CPU

`train` is Algorithm 1; its body marks the 7 steps of one iteration (docs/METHOD.md, "One iteration").
What a Table 1 row switches on is a `config.Row` in `config.ABLATIONS`: R's verdicts, R's training, E, and the
outcome in P's reward (`stepwise`, the paper's claim 2, drops it), with the method rules that follow (GRPO's λ = 0).

Defaults: the released code's method with sizes for a 2-core CPU (a 135M model, fewer tasks,
smaller G and m, shorter generations). Every value is a flag, `--help` shows the released value
next to each that differs, and `--preset reference` applies them all; docs/METHOD.md lists every
deviation from the paper and the released code, with its reason.

Around the loop: plumbing/config.py (flags), plumbing/rundir.py (run folder, checkpoints, logs), plumbing/models.py and
plumbing/engines.py (loading and sampling), ppo.py (Eq. 5), tasks/ (the settings).
"""
from __future__ import annotations

import copy
import ctypes
import functools
import math
import os
import random
import resource
import signal
import sys
import time
from pathlib import Path
from typing import NamedTuple

from plumbing import dist
import environment as env
import policy
import reward_model
import tasks
from plumbing.config import ABLATIONS, Config, ConfigError, Row, describe, parse_args
from plumbing.engines import engine_tokens, make_engines, sync_seconds
from plumbing.models import ModelError, Trained, add_lora, dither_off_bf16, load, seed_everything
from plumbing.vision import freeze_tower
from plumbing.logprobs import LogProbs
from ppo import make_optimizer, ppo_update
from records import Sampling, stage
from plumbing.rundir import INTERRUPTED, Run, load_optimizer, on_sigint
from tasks import sandbox

__all__ = ["ABLATIONS", "Config", "ConfigError", "describe", "parse_args", "train", "main"]


# ───────────────────────────── the loop ─────────────────────────────

def train(cfg: Config) -> Path:
    """Algorithm 1. A resumed run goes on after its last finished iteration (see rundir.Run)."""
    parts = ABLATIONS[cfg.ablation]   # which parts run: R's verdicts, R's training, E; the outcome in P's reward
    with Run(cfg) as run:
        adapter, slots, models, engines, start = setup(cfg, run, parts)
        for it in range(start + 1, cfg.iterations + 1):
            t_start, timings, synced, counted = time.perf_counter(), {}, sync_seconds(engines), engine_tokens(engines)
            seed_everything(iteration_seed(cfg, it) + dist.rank())  # a resumed run replays exactly

            # 1. pick the iteration's tasks: active versions + every pending rewrite
            picked = env.pick_tasks(slots, cfg.tasks_per_iter, random.Random(iteration_seed(cfg, it)))
            is_active = [t.id == slots[sid].active.id for sid, t in picked]
            # 2. P plays G rollouts per task (batched; under torchrun each rank plays its share of the tasks)
            with stage(timings, "rollout"):
                groups = adapter.rollout(dist.shard_tasks([t for _, t in picked]), cfg.group_size, engines["policy"],
                                         cfg)
            # 3. R judges every step m times (coding: writes m tests; every program runs on them)
            if parts.use_rm:
                with stage(timings, "judge"):
                    adapter.judge(groups, engines["reward_model"], cfg)
            groups = dist.unshard(groups)   # every rank's groups, in the order of `picked`
            # 4. E decides the pending rewrites (Eq. 4) and proposes new ones for slots outside [α_low, α_high]
            train_groups, env_stats = [g for g, a in zip(groups, is_active) if a], {}
            if parts.adapt_env:
                with stage(timings, "environment"):
                    if dist.rank() == 0:   # E decides once; every rank gets its decisions on the next line
                        decision = env.decide(slots, picked, groups, low=cfg.alpha_low, high=cfg.alpha_high)
                        train_groups, env_stats = decision.train, decision.stats | env.propose_rewrites(
                            decision.asking, adapter, cfg.env_mode, engines.get("environment"), env_sampling(cfg),
                            retries=cfg.env_retries, iteration=it)
                    slots, train_groups, env_stats = dist.broadcast((slots, train_groups, env_stats))
            # 5. Eq. 1-2 on every step, then P's samples and R's (Eq. 3), from this rank's share of the groups
            setting_stats = adapter.train_metrics(train_groups)   # every rank's groups (coding: R's funnel)
            train_groups = dist.shard_tasks(train_groups)
            policy.score_steps(train_groups, lam=parts.lam(cfg.lam), zero_single=cfg.zero_single,
                               reward=parts.reward(cfg.policy_reward))
            p_samples = policy.policy_samples(train_groups, acc_range=parts.acc_range(cfg.acc_lower, cfg.acc_upper),
                                              drop_zero=cfg.drop_zero_adv)
            r_samples = reward_model.rm_samples(train_groups, adapter.judge_kind, drop_zero=cfg.drop_zero_adv,
                                                balance=cfg.rm_balance, norm=cfg.rm_norm,
                                                wrong_cost=cfg.wrong_tests_cost) if parts.train_rm else []
            # 6. update P, then R (Eq. 5)
            with stage(timings, "train_policy"):
                stats = optimize(cfg, models["policy"], engines["policy"], p_samples, it, "policy")
            if parts.train_rm:
                with stage(timings, "train_rm"):
                    stats |= optimize(cfg, models["reward_model"], engines["reward_model"], r_samples, it, "rm")
            # 7. log, evaluate every --eval-every iterations, checkpoint
            row = iteration_row(groups, is_active, p_samples, r_samples, slots, env_stats, cfg.m, setting_stats) | stats
            run.samples(groups, it)
            if eval_due(cfg, it):
                with stage(timings, "eval"):
                    row |= evaluate(cfg, adapter, engines)
                row |= tasks.gains((run.metrics() or [{}])[0], row)   # paired over the eval tasks, against iteration 0
            timings |= adapter.pop_timings() | {"time/sync": sync_seconds(engines) - synced} | \
                {f"tokens/{name}_{kind}": n - counted[name][kind]   # processed this iteration (eval included)
                 for name, used in engine_tokens(engines).items() for kind, n in used.items()}
            timings |= sandbox_row()
            run.finish(it, row | timings | memory(), models, slots, t_start)
            if run.writer:
                print(summary(it, row | timings), flush=True)
            if INTERRUPTED.is_set():   # a Ctrl-C that a destructor swallowed (rundir.on_sigint)
                raise KeyboardInterrupt
    return run.dir


def env_sampling(cfg: Config) -> Sampling:
    """How E samples its summaries and rewrites (generate mode)."""
    return Sampling(cfg.env_temperature, cfg.env_top_p, cfg.env_max_new_tokens)


def eval_due(cfg: Config, it: int) -> bool:
    """Every --eval-every iterations and after the last (-1: never); under torchrun on every rank (eval_groups)."""
    return cfg.eval_every > 0 and it % cfg.eval_every == 0 or it == cfg.iterations and cfg.eval_every >= 0


def iteration_seed(cfg: Config, it: int) -> int:
    """The seed of iteration `it`: its sampling and its task draw depend on the run's seed and `it` only."""
    return cfg.seed * 100_003 + it


class Setup(NamedTuple):
    """What a run starts from (`setup`)."""
    adapter: tasks.Setting   # the setting
    slots: dict              # E's slots: each task's active version, pending rewrite and history (environment.Slot)
    models: dict             # "policy", "reward_model" → Trained
    engines: dict            # "policy", "reward_model" (and "environment" in generate mode) → the sampling engines
    start: int               # the last finished iteration (0 for a fresh run)


def setup(cfg: Config, run: Run, parts: Row) -> Setup:
    """The adapter, E's slots and the models (R's if the row uses R, E's if it adapts E in generate mode), fresh or
    from the checkpoint; the initial eval (iteration 0) of a fresh run."""
    removed = sandbox.cleanup_stale()
    if removed:
        print(f"[loop] removed {removed} leftover sandbox folder(s) of killed runs")
    adapter = tasks.get(cfg.task, cfg, env_mode=cfg.env_mode if parts.adapt_env else None)
    if cfg.resume and run.fresh:
        print(f"[loop] {run.dir} has no finished iteration: starting it again from scratch", flush=True)
        run.restart()
        cfg.resume = False
    start, policy_init, rm_init = 0, cfg.model, cfg.rm_model or cfg.model
    if cfg.resume:
        start, slots = run.state()["iteration"], run.slots()
        run.truncate_metrics(start)
        policy_init, rm_init = str(run.ckpt / "policy"), str(run.ckpt / "reward_model")
        print(f"[loop] resuming {run.dir} after iteration {start}", flush=True)
    else:
        slots = env.make_slots(adapter.train_tasks())
    env_init = cfg.env_model or cfg.model if parts.adapt_env and cfg.env_mode == "generate" else ""
    models, engines = build_models(cfg, parts.use_rm, policy_init, rm_init, env_init)
    if cfg.resume:
        for name, m in models.items():
            if m.optimizer is not None and not load_optimizer(m.optimizer, run.ckpt / name, m.module):
                print(f"[loop] warning: {run.ckpt / name / 'optimizer.pt'} is missing: "
                      f"{name} goes on with a fresh AdamW state", flush=True)
    run.create(start)
    if not cfg.resume:   # "before": evaluate the initial models (unless --eval-every -1), commit iteration 0
        results = {}
        if cfg.eval_every >= 0:
            seed_everything(cfg.seed + dist.rank())
            t0 = time.perf_counter()
            results = evaluate(cfg, adapter, engines)
            if run.writer:
                print(f"[loop] iteration 0 (before training) eval in {time.perf_counter() - t0:.0f}s")
                print_table({k.removeprefix("eval/"): v for k, v in results.items()})
            adapter.pop_timings()
            results |= sandbox_row()
        run.finish(0, results, models, slots)
    return Setup(adapter, slots, models, engines, start)


def sandbox_row() -> dict:
    """sandbox/*: the programs run since the last call and their timeouts (`sandbox.pop_stats`; coding only)."""
    ran = sandbox.pop_stats()
    return {f"sandbox/{k}": v for k, v in ran.items()} if ran["runs"] else {}


def optimize(cfg: Config, trained: Trained, engine, samples, it: int, name: str) -> dict:
    """Eq. 5 on one model (ppo.ppo_update), then sync its engine. With --fresh-optimizer (the released
    code) every iteration starts from a new AdamW; otherwise the run's optimizer carries its moments over."""
    optimizer = trained.optimizer or make_optimizer(trained.module, cfg.lr if name == "policy" else cfg.rm_lr)
    if 0 < cfg.max_train_samples < len(samples):  # a compute budget per iteration, not in the paper
        samples = random.Random(iteration_seed(cfg, it)).sample(samples, cfg.max_train_samples)
    stats = ppo_update(trained.module, optimizer, samples, trained.tokenizer.pad_token_id, clip_eps=cfg.clip_eps,
                       steps=cfg.policy_steps if name == "policy" else cfg.rm_steps, target_kl=cfg.target_kl_of(name),
                       kl_beta=cfg.kl_beta, micro_batch=cfg.micro_batch, amp=cfg.amp and cfg.train_amp, seed=it,
                       log_ratio_clamp=cfg.log_ratio_clamp, warmup_steps=cfg.warmup_steps,
                       sampler_old_kl=cfg.sampler_old_kl)
    trained.saved = trained.saved and not stats   # no samples, no step: the checkpoint still holds this model
    engine.sync()
    release_memory()
    return {f"losses/{name}_{k}": v for k, v in stats.items()}


def iteration_row(groups, is_active, p_samples, r_samples, slots, env_stats, m: int, setting_metrics: dict) -> dict:
    """What one iteration logs about its rollouts, samples and slots (metrics.jsonl, TensorBoard), with
    the signs of a collapse over every rollout played: the share of P's answers that are no valid action
    or program, of R's judgments with no verdict (coding: malformed tests), and their mean lengths in tokens;
    and R's Theorem 1 quantities over the played steps (`reward_model.theorem1_metrics`: against the
    outcomes, and against the step labels where the setting has them); and the setting's own
    (`train_metrics`: in coding, where R's training signal is lost)."""
    rollouts = [ro for g in groups for ro in g.rollouts]
    steps = [st for ro in rollouts for st in ro.steps]
    thm1 = reward_model.theorem1_metrics(rollouts, m, labels=any(st.label is not None for st in steps)) \
        if any(st.verdicts for st in steps) else {}
    judgments = [c for g in groups for c in g.tests] + [c for st in steps for c in st.judgments]
    return {"train/acc": _mean(g.acc for g, a in zip(groups, is_active) if a),
            "train/policy_unparseable": _mean(not st.parsed for st in steps),
            "train/policy_response_len": _mean(len(st.response_ids) for st in steps),
            "train/rm_unparseable": _mean(v == 0 for st in steps for v in st.verdicts),
            "train/rm_response_len": _mean(len(c.ids) for c in judgments),
            "train/rewrite_acc": _mean(g.acc for g, a in zip(groups, is_active) if not a), "train/tasks": len(groups),
            "train/policy_samples": int(dist.all_sum(len(p_samples))),   # every rank's
            "train/rm_samples": int(dist.all_sum(len(r_samples))),
            "train/verdict_mean": _mean([v for g in groups for ro in g.rollouts for st in ro.steps
                                         for v in st.verdicts]),
            "env/mean_level": _mean([s.active.level for s in slots.values() if s.active.level is not None]),
            **{f"train/{k}": v for k, v in (thm1 | setting_metrics).items()},
            **{f"env/{k}": v for k, v in env_stats.items()}}


def memory() -> dict:
    return {"sys/peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
            "sys/rss_gib": release_memory()}


def evaluate(cfg, adapter, engines) -> dict:
    return {f"eval/{k}": v for k, v in
            adapter.evaluate(adapter.eval_sets(), engines["policy"], engines.get("reward_model"), cfg).items()}


# ───────────────────────────── models ─────────────────────────────

def build_models(cfg: Config, use_rm: bool, policy_init: str, rm_init: str, env_init: str = ""):
    """(name → Trained) for the trained P and R, plus the engines of P, R and the frozen E (only when
    `env_init` is given: E writes tasks in generate mode)."""
    models, dithered = {}, {}
    for name, init, lr, wanted in (("policy", policy_init, cfg.lr, True), ("reward_model", rm_init, cfg.rm_lr, use_rm)):
        if wanted:
            model, tok = load(init, cfg.seed)
            if cfg.amp and cfg.dither and not (cfg.resume or cfg.eval_only):   # a fresh run with a bf16 sampler
                if init in dithered:   # the same weights and seed dither the same: copy them (seconds on CPU)
                    model.load_state_dict(dithered[init])
                else:
                    dither_off_bf16(model, cfg.seed)
                    dithered[init] = model.state_dict()
            if cfg.lora_rank and not hasattr(model, "peft_config"):  # a resumed LoRA checkpoint has them already
                model = add_lora(model, cfg.lora_rank)
            freeze_tower(model, train=cfg.train_vision)   # a vision-language model's vision tower; else nothing
            if cfg.grad_checkpointing:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            module = model
            if dist.active() and not cfg.eval_only:   # train a sharded copy; the engine samples `model`, whole
                module = dist.shard(LogProbs(copy.deepcopy(model)), bf16=cfg.amp and cfg.train_amp)
            models[name] = Trained(model, tok, None if cfg.fresh_optimizer else make_optimizer(module, lr), module)
    to_serve = {k: (m.model, m.tokenizer) for k, m in models.items()}
    if env_init:
        to_serve["environment"] = load(env_init, cfg.seed)
    t0 = time.perf_counter()
    engines = make_engines(cfg.engine, to_serve, batch_size=cfg.gen_batch, amp=cfg.amp, seed=cfg.seed,
                           max_model_len=cfg.max_model_len, gpu_memory_utilization=cfg.vllm_gpu_memory,
                           kv_block=cfg.kv_block)
    print(f"[loop] engine {cfg.engine}: {type(engines['policy']).__name__} for {', '.join(engines)} "
          f"(ready in {time.perf_counter() - t0:.0f}s)", flush=True)
    if dist.active() and not cfg.eval_only:   # each rank samples from a full copy, refreshed after each update
        engines |= {k: dist.Synced(engines[k], m.module) for k, m in models.items()}
    return models, engines


def print_table(results: dict) -> None:
    """The paper's Table 1 columns for this setting (coding: Code / UT / Detect; agents: success,
    Process Acc, Outcome Acc), one row per eval set, in %, accuracies with their standard error."""
    sets = sorted({k.split("/")[0] for k in results})
    cols = list(dict.fromkeys(k.split("/", 1)[1] for k in results if tasks.headline(k)))
    widths = [max(16, len(c) + 2) for c in cols]
    print(f"{'eval set':<12}" + "".join(f"{c.upper():>{w}}" for c, w in zip(cols, widths)))
    for s in sets:
        print(f"{s:<12}" + "".join(f"{_pct(results, f'{s}/{c}'):>{w}}" for c, w in zip(cols, widths)))


def _pct(results: dict, key: str, sign: bool = False) -> str:
    """A metric in %, with ± its standard error when the adapter reports one."""
    if key not in results:
        return "-"
    se = results.get(key + "_se", float("nan"))
    return f"{100 * results[key]:{'+' if sign else ''}.1f}" + ("" if math.isnan(se) else f" ± {100 * se:.1f}")


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
    _, engines = build_models(cfg, True, policy_init, rm_init)   # under torchrun, a full copy on each rank
    seed_everything(cfg.seed + dist.rank())
    t0 = time.perf_counter()
    results = evaluate(cfg, adapter, engines)   # each rank plays its share of the tasks
    if dist.rank() == 0:
        print(f"[loop] eval in {time.perf_counter() - t0:.0f}s", flush=True)
        print_table({k.removeprefix("eval/"): v for k, v in results.items()})


# ───────────────────────────── helpers ─────────────────────────────

@functools.cache
def _libc():
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc (macOS, musl): the allocator is left as it is
        return None


def release_memory() -> float:
    """Give freed heap pages back to the system (glibc malloc_trim), after each model update and each
    iteration; returns the current RSS in GiB. Without it the process grows by the freed pages of
    every update (docs/NOTES.md has the measurement)."""
    if (libc := _libc()) is not None:
        libc.malloc_trim(0)
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30
    except OSError:
        return float("nan")


def _mean(xs) -> float:
    return sum(xs) / len(xs) if (xs := list(xs)) else float("nan")   # the condition runs first


def summary(it: int, row: dict) -> str:
    parts = [f"it {it:3d}", f"acc {row['train/acc']:.2f}", f"P samples {row['train/policy_samples']}",
             f"R samples {row['train/rm_samples']}"]
    if "env/proposed" in row:
        parts.append(f"env +{row['env/accepted']}/-{row['env/rejected']} new {row['env/proposed']}")
    parts += [f"{k.removeprefix('eval/')} {_pct(row, k)}" + (f" (gain {_pct(row, k + '_gain', sign=True)})"
                                                             if k + "_gain" in row else "")
              for k, v in row.items() if k.startswith("eval/") and tasks.headline(k) and not math.isnan(v)]
    parts.append(" ".join(f"{k.removeprefix('time/')} {v:.0f}s" for k, v in row.items() if k.startswith("time/")))
    return " | ".join(parts)


def main(argv=None) -> int:
    cfg = None
    try:
        cfg = parse_args(argv)
        dist.init()
        if dist.rank() == 0:
            print(f"[loop] {describe(cfg)}", flush=True)
        if cfg.eval_only:
            eval_only(cfg)
        else:
            folder = train(cfg)
            if dist.rank() == 0:
                print(f"[loop] run folder: {folder}")
    except (ConfigError, ModelError, tasks.TaskError) as e:
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
    signal.signal(signal.SIGINT, on_sigint)
    dist.exit_process(main())
