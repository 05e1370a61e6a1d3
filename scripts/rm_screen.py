"""R alone: a screen of R's training levers on the validation split, P frozen (paper §3.2, Eq. 3; Theorem 1).
Issue 25's question: can consistency feedback teach this R to judge steps at all? Any setting with exact step
labels on its validation split (the maze, the default; osworld's labelled MiniWoB pages).

    python scripts/rm_screen.py                                  # every configuration below, seed 0, then the table
    python scripts/rm_screen.py --configs paper,batch --seeds 2
    python scripts/rm_screen.py --report-only                    # the table from what has run
    python scripts/rm_screen.py --task osworld --configs paper --seeds 2 --iterations 8 --eval-every 4 \
        --eval-samples 2 --eval-temperature 1                    # loop flags follow; the maze's defaults are these

One configuration runs the loop's steps that touch R, with everything else held still:
  1-2. P (the initial model, never updated) plays G rollouts on the iteration's training tasks (the loop's draw);
  3.   R judges every step m times;
  5.   Eq. 1 on every step (R_τ = O_τ + λ·mean S), R's Eq. 3 samples;
  6.   R's Eq. 5 update (the loop's `optimize`, with the run's flags).
E is off and P does not learn, so the rollouts R learns from keep one distribution. At iteration 0 and every
--eval-every iterations, R judges one fixed set of P's rollouts on the labelled VALIDATION tasks (played once,
by the frozen P; disjoint from the training and eval tasks), and the row records R's balanced Process Acc against the
exact step labels (`tasks.agent_metrics`), Theorem 1's μ against the labels and against the outcomes,
its mean verdict and its share of unparseable verdicts. The eval sets are never played.

What it can and cannot show: a lever that does not teach R here, where its data holds still, is unlikely to
teach it in the loop; one that does is a candidate for the full loop's validation runs (scripts/sweep.py),
because in the loop P's rollouts move as P learns. A configuration "collapses" when R's verdicts at an eval
are 90 % or more one verdict (|mean verdict| ≥ 0.8) or more than 20 % unparseable.

Each configuration × seed writes <out>/<config>-s<seed>/metrics.jsonl (and machine.jsonl); a finished one is
skipped, an unfinished one starts again. Compare configurations only on one machine.
"""
from __future__ import annotations

import argparse
import copy
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))   # run as a script from anywhere: the project's modules are one folder up

import environment as env  # noqa: E402
import loop  # noqa: E402
import policy  # noqa: E402
import reward_model  # noqa: E402
import tasks  # noqa: E402
from plumbing.config import parse_args  # noqa: E402
from plumbing.models import machine, seed_everything  # noqa: E402
from scripts.premise import fixed_judges, judged, labelled_validation  # noqa: E402

# name → the loop flags that make the configuration (on top of the setting's defaults; R's levers of issue 25)
CONFIGS = {
    "paper": [],                                   # Eq. 3 per step at the maze's defaults (R's LR 3e-6, m = 3, T 1)
    "balance": ["--rm-balance"],                   # Theorem 2: both signs of R_τ carry equal weight
    "batch": ["--rm-norm", "batch"],               # Eq. 3 z-scored over the iteration: unanimous steps train R
    "balance-batch": ["--rm-balance", "--rm-norm", "batch"],
    "lr1e-5": ["--rm-lr", "1e-5"],                 # R's step size (the trust region, KL 0.01, still bounds it)
    "m6": ["--m", "6"],                            # more judgments per step: fewer unanimous (skipped) steps
    "steps4": ["--rm-steps", "4"],                 # more optimizer steps per iteration
    "t0.7": ["--rm-temperature", "0.7"],           # fewer unparseable verdicts, more unanimous steps
    "lr1e-5-balance-batch": ["--rm-lr", "1e-5", "--rm-balance", "--rm-norm", "batch"],
    # every R update above hits the 0.01 trust region (α ≤ 0.5): R's own, wider, with a step that fills it
    "kl0.05-lr1e-5-balance": ["--rm-target-kl", "0.05", "--rm-lr", "1e-5", "--rm-balance"],
    # the GUI runs R with no trust region (the released code's); its paper cell took updates of KL 0.2-0.3
    "kl0.05": ["--rm-target-kl", "0.05"],
    "kl0.05-balance": ["--rm-target-kl", "0.05", "--rm-balance"],
    # R trains on every sample of its iteration, as the released code does (the GUI's CPU default keeps 32 of ~120)
    "all-kl0.05-balance": ["--max-train-samples", "0", "--rm-target-kl", "0.05", "--rm-balance"],
}
# λ is hardly a lever of per-step Eq. 3: z-scoring R_τ·S_j over a step's m judgments keeps only the sign of R_τ
# (unless a verdict is unparseable: its fixed −2 does not scale), and R_τ = O_τ + λ·mean S has the sign of O_τ for
# λ ≤ 1 (|mean S| ≤ 1). Per step, Eq. 3 teaches R to predict the rollout's outcome from each of its steps;
# Theorem 2's bias follows when most rollouts fail.
BOUND_VERDICT, BOUND_UNPARSEABLE = 0.8, 0.2   # a collapse: |mean verdict| ≥ 0.8, or > 20 % unparseable


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    p.add_argument("--task", default="maze", help="a setting with step labels on its validation split")
    p.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated names of CONFIGS")
    p.add_argument("--seeds", type=int, default=1, help="seeds 0..N-1 per configuration")
    p.add_argument("--out", default="runs/rm-screen", help="where the cells go")
    p.add_argument("--val-tasks", type=int, default=24, help="labelled validation tasks R is measured on (spread "
                                                             "over the split)")
    p.add_argument("--report-only", action="store_true")
    p.add_argument("--cell", default="", help=argparse.SUPPRESS)   # CONFIG:SEED, one cell in this process
    args, loop_flags = p.parse_known_args(argv)
    if args.task not in tasks.REGISTRY:
        p.error(f"--task: unknown {args.task!r}; choose from {', '.join(tasks.REGISTRY)}")
    args.configs = [c for c in args.configs.split(",") if c]
    bad = [c for c in args.configs if c not in CONFIGS]
    if bad:
        p.error(f"--configs: unknown {', '.join(bad)}; choose from {', '.join(CONFIGS)}")
    for flag in ("--seed", "--ablation", "--validation"):
        if any(f == flag or f.startswith(flag + "=") for f in loop_flags):
            p.error(f"{flag} is set by rm_screen.py itself")
    args.loop_flags = loop_flags
    return args


def judge_metrics(adapter, groups, engine, cfg) -> dict:
    """R judges a copy of `groups` (its verdicts replace any earlier ones); R's accuracy, Theorem 1 and drift."""
    groups = copy.deepcopy(groups)
    adapter.judge(groups, engine, cfg)
    return judged([ro for g in groups for ro in g.rollouts], cfg.m)


def run_cell(args, name: str, seed: int) -> None:
    """One configuration × seed: the loop's R steps for --iterations, R measured on the validation rollouts."""
    folder = Path(args.out) / f"{name}-s{seed}"
    folder.mkdir(parents=True, exist_ok=True)
    cfg = parse_args(["--task", args.task, "--seed", str(seed), *args.loop_flags, *CONFIGS[name]])
    adapter = tasks.get(args.task, cfg, env_mode=None)
    models, engines = loop.build_models(cfg, True, cfg.model, cfg.rm_model or cfg.model)
    (folder / "config.json").write_text(json.dumps({"config": name, "flags": CONFIGS[name], **vars(cfg)}, indent=1))
    (folder / "machine.jsonl").write_text(json.dumps(machine()) + "\n")
    val = labelled_validation(adapter)
    if not val:
        sys.exit(f"error: --task {args.task} has no labelled validation tasks to measure R on")
    val = [val[k] for k in range(0, len(val), max(1, len(val) // args.val_tasks))][:args.val_tasks]
    seed_everything(cfg.seed)
    val_groups = adapter.rollout(val, cfg.eval_samples, engines["policy"], cfg, temperature=cfg.eval_temperature)
    slots = env.make_slots(adapter.train_tasks())
    with open(folder / "metrics.jsonl", "w") as log:
        for it in range(cfg.iterations + 1):
            t0, row = time.perf_counter(), {"iteration": it}
            if it > 0:
                seed_everything(loop.iteration_seed(cfg, it))
                picked = env.pick_tasks(slots, cfg.tasks_per_iter, random.Random(loop.iteration_seed(cfg, it)))
                groups = adapter.rollout([t for _, t in picked], cfg.group_size, engines["policy"], cfg)
                adapter.judge(groups, engines["reward_model"], cfg)
                policy.score_steps(groups, lam=cfg.lam, zero_single=cfg.zero_single, reward=cfg.policy_reward)
                samples = reward_model.rm_samples(groups, adapter.judge_kind, drop_zero=cfg.drop_zero_adv,
                                                  balance=cfg.rm_balance, norm=cfg.rm_norm, wrong_cost=cfg.wrong_tests_cost)
                rollouts = [ro for g in groups for ro in g.rollouts]
                row |= {"train/rm_samples": len(samples), "train/acc": statistics.fmean(g.acc for g in groups),
                        "train/verdict_mean": statistics.fmean(v for ro in rollouts for st in ro.steps
                                                               for v in st.verdicts),
                        **{f"train/{k}": v for k, v in
                           (reward_model.theorem1_metrics(rollouts, cfg.m, labels=True) | fixed_judges(rollouts)).items()}}
                row |= loop.optimize(cfg, models["reward_model"], engines["reward_model"], samples, it, "rm")
            if it % cfg.eval_every == 0 or it == cfg.iterations:
                seed_everything(cfg.seed)   # every eval of every configuration judges with the same sampling seed
                row |= {f"val/{k}": v for k, v in judge_metrics(adapter, val_groups, engines["reward_model"],
                                                                 cfg).items()}
            row["time/iteration"] = time.perf_counter() - t0
            log.write(json.dumps(row) + "\n")
            log.flush()
            print(f"[rm_screen] {name}-s{seed} " + " ".join(f"{k} {v:.3g}" for k, v in row.items()
                                                           if k.startswith("val/process_bacc") or k in (
                                                               "val/thm1_label_mu", "val/verdict_mean",
                                                               "train/rm_samples", "losses/rm_update_kl")),
                  flush=True)
    (folder / "done").touch()


def cell_rows(folder: Path) -> list[dict]:
    path = folder / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def collapsed(row: dict) -> bool:
    return abs(row["val/verdict_mean"]) >= BOUND_VERDICT or row["val/unparseable"] > BOUND_UNPARSEABLE


def report(args) -> str:
    """Markdown: per configuration (seeds pooled as per-seed values), R on the validation rollouts before and after."""
    lines = ["| configuration | flags | balanced Process Acc, it 0 → last | μ (labels), it 0 → last | "
             "μ (outcomes), last | mean verdict, last | R samples / it | median R KL | collapsed |",
             "|---|---|---|---|---|---|---|---|---|"]
    oracle = {}   # seed → its first row with the fixed judges' numbers
    for name in args.configs:
        by_seed = {s: rows for s in range(args.seeds) if (rows := cell_rows(Path(args.out) / f"{name}-s{s}"))
                   and (Path(args.out) / f"{name}-s{s}" / "done").exists()}
        for s, rows in by_seed.items():   # the validation rollouts are the same in every configuration
            oracle[s] = oracle.get(s) or next((r for r in rows if "val/oracle_label_mu" in r), None)
        cells = list(by_seed.values())
        if not cells:
            continue
        evals = [[r for r in rows if "val/process_bacc" in r] for rows in cells]

        def seeds(key, at, scale=1.0, fmt=".1f"):
            return ", ".join(f"{scale * e[at][key]:{fmt}}" for e in evals)
        train = [r for rows in cells for r in rows if "train/rm_samples" in r]
        kls = [r["losses/rm_update_kl"] for r in train if "losses/rm_update_kl" in r]
        lines.append(f"| {name} | `{' '.join(CONFIGS[name]) or '(defaults)'}` | {seeds('val/process_bacc', 0, 100)} → "
                     f"{seeds('val/process_bacc', -1, 100)} | {seeds('val/thm1_label_mu', 0, fmt='.2f')} → "
                     f"{seeds('val/thm1_label_mu', -1, fmt='.2f')} | {seeds('val/thm1_mu', -1, fmt='.2f')} | "
                     f"{seeds('val/verdict_mean', -1, fmt='+.2f')} | "
                     f"{statistics.fmean(r['train/rm_samples'] for r in train):.0f} | "
                     f"{statistics.median(kls) if kls else float('nan'):.4f} | "
                     f"{'yes' if any(collapsed(e[-1]) for e in evals) else 'no'} |")
    for s, row in sorted((s, r) for s, r in oracle.items() if r):
        lines.append(f"\nFixed judges on seed {s}'s validation rollouts (balanced Process Acc; μ against the outcomes): "
                     + "; ".join(f"{j} {100 * row[f'val/oracle_{j}_bacc']:.1f} %, μ {row[f'val/oracle_{j}_mu']:.2f}"
                                 for j in ("label", "outcome", "valid")) + ".")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse(argv)
    if args.cell:
        name, seed = args.cell.rsplit(":", 1)
        run_cell(args, name, int(seed))
        return 0
    for name in args.configs if not args.report_only else []:
        for seed in range(args.seeds):
            if not (Path(args.out) / f"{name}-s{seed}" / "done").exists():   # each cell in its own process
                cmd = [sys.executable, __file__, "--cell", f"{name}:{seed}", "--task", args.task, "--configs", name,
                       "--out", args.out,
                       "--val-tasks", str(args.val_tasks), *args.loop_flags]
                if subprocess.run(cmd).returncode:
                    print(f"[rm_screen] {name}-s{seed} failed; the table shows what finished", file=sys.stderr)
    print(report(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
