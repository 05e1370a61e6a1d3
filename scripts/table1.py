"""Paper Table 1 as a study: every ablation row × seeds, run one after another, then the table and
its figure from the runs' metrics.

    python scripts/table1.py --task maze --seeds 3                       # 5 rows × 3 seeds, then the tables and figures
    python scripts/table1.py --task livebench --seeds 3 --rows grpo,full --iterations 20   # loop flags pass through
    python scripts/table1.py --task maze --seeds 3 --report-only         # only the table and table1.png
    python scripts/table1.py --task maze --seeds 3 --first-seed 1         # seeds 1-2 here, seed 0 on another machine

Each cell is one `loop.py` run in its own process, in runs/<study>/<row>-s<seed>/. The study is
resumable: a finished run is skipped, a killed one is continued with --resume, so stopping and
starting the study again loses at most the iteration in flight. The table gives, per row, each
eval column after training as mean ± std over seeds with the per-seed values; "before" is the
iteration-0 eval (the initial model, the same for every row of a seed). R's columns are UT and
Detect in coding, Process / Outcome Acc in the agent settings (grpo has no R: "-"). A second table gives the
paper's comparisons (CONTRASTS), row against row, paired over the eval tasks within each seed; the last one
checks claim 4 at each seed's last eval (R's balanced Process Acc, `claim4`), and the report ends with the
machine and precision each seed ran on (`machines`).
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))   # run as a script from anywhere: the project's modules are one folder up

import loop  # noqa: E402
import tasks  # noqa: E402


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    p.add_argument("--task", default="maze", help="the setting (as loop.py --task)")
    p.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 per row")
    p.add_argument("--first-seed", type=int, default=0,
                   help="run seeds K..N-1 only, to split a study's seeds between machines (every row of a seed on one "
                        "machine); the report still reads every seed 0..N-1 that has metrics")
    p.add_argument("--rows", default=",".join(loop.ABLATIONS), help="comma-separated Table 1 rows")
    p.add_argument("--study", default="", help="study folder under --runs-dir (default: table1-<task>)")
    p.add_argument("--runs-dir", default="runs", help="where studies go")
    p.add_argument("--report-only", action="store_true", help="print the table and draw the figure; run nothing")
    args, loop_flags = p.parse_known_args(argv)
    rows = [r for r in args.rows.split(",") if r]
    bad = [r for r in rows if r not in loop.ABLATIONS]
    if bad or not rows:
        p.error(f"--rows: unknown {', '.join(bad) or '(none)'}; choose from {', '.join(loop.ABLATIONS)}")
    if "stepwise" in rows and "full" in rows and rows.index("stepwise") < rows.index("full"):
        p.error("--rows: put full before stepwise (the stepwise row's frozen R is the one its seed's full cell trained)")
    if args.seeds < 1:
        p.error("--seeds must be at least 1")
    if not 0 <= args.first_seed < args.seeds:
        p.error(f"--first-seed must be in 0..{args.seeds - 1} (--seeds {args.seeds})")
    for flag in ("--ablation", "--seed", "--name", "--runs-dir", "--resume", "--task"):
        if any(f == flag or f.startswith(flag + "=") for f in loop_flags):
            p.error(f"{flag} is set by table1.py itself")
    args.rows, args.loop_flags = rows, loop_flags
    args.dir = Path(args.runs_dir) / (args.study or f"table1-{args.task}")
    return args


def cell_args(args, row: str, seed: int) -> list[str]:
    """loop.py's flags for one cell. The stepwise row (claim 2) reads its frozen R from the same seed's full
    cell, the R that the full method trained, unless --rm-model is given (or --rm-oracle puts the labels in R's
    place)."""
    own_rm = any(f == "--rm-model" or f.startswith("--rm-model=") or f == "--rm-oracle" for f in args.loop_flags)
    rm = ["--rm-model", str(full_rm(args, seed))] if row == "stepwise" and not own_rm else []
    return ["--task", args.task, "--ablation", row, "--seed", str(seed), "--runs-dir", str(args.dir),
            "--name", f"{row}-s{seed}", *rm, *args.loop_flags]


def full_rm(args, seed: int) -> Path:
    """The reward model the full method trained in seed `seed`'s cell."""
    return args.dir / f"full-s{seed}" / "ckpt" / "reward_model"


def finished(run: Path, iterations: int) -> bool:
    """The run logged its last iteration (a study kept as metrics only, without checkpoints, counts too)."""
    try:
        rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
        return bool(rows) and rows[-1]["iteration"] >= iterations
    except (OSError, json.JSONDecodeError, KeyError, TypeError):
        return False


def run_study(args) -> None:
    """Every (row, seed) cell in turn: skipped when finished, resumed when started, else started."""
    for seed in range(args.first_seed, args.seeds):
        for row in args.rows:
            cfg = loop.parse_args(cell_args(args, row, seed))      # validates the flags before anything runs
            run = args.dir / cfg.name
            if finished(run, cfg.iterations):
                print(f"[table1] {cfg.name}: finished, skipped", flush=True)
                continue
            if row == "stepwise" and cfg.rm_model == str(full_rm(args, seed)) and not full_rm(args, seed).exists():
                raise SystemExit(f"[table1] {cfg.name} reads its frozen R from {full_rm(args, seed)}, which does not "
                                 f"exist: run the full row of seed {seed} first (--rows full,stepwise)")
            resume = (run / "config.json").exists()
            cmd = [sys.executable, str(ROOT / "loop.py"), *cell_args(args, row, seed),
                   *(["--resume"] if resume else [])]
            print(f"[table1] {cfg.name}: {'resuming' if resume else 'starting'}", flush=True)
            t0 = time.perf_counter()
            code = subprocess.call(cmd, cwd=ROOT)
            if code != 0:
                raise SystemExit(f"[table1] {cfg.name} exited with {code}; run the study again to resume it")
            print(f"[table1] {cfg.name}: done in {(time.perf_counter() - t0) / 60:.1f} min", flush=True)


def load(args) -> dict:
    """(row, seed) → metrics rows, for the study's cells that have metrics."""
    return load_cells(args.dir, args.rows, args.seeds)


def load_cells(folder: Path, rows, seeds: int) -> dict:
    """(row, seed) → metrics rows of the cells <row>-s<seed> under `folder` that have metrics."""
    return {(row, seed): read_metrics(folder / f"{row}-s{seed}") for row in rows for seed in range(seeds)
            if (folder / f"{row}-s{seed}" / "metrics.jsonl").exists()}


def read_metrics(run: Path) -> list[dict]:
    """A run folder's metrics.jsonl, one dict per logged iteration."""
    return read_jsonl(run / "metrics.jsonl")


def read_jsonl(path: Path) -> list[dict]:
    """One dict per non-empty line of a JSON-lines file; [] when the file is missing."""
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def machines(args, runs: dict) -> str:
    """Markdown: per seed, the machines its cells ran on (each launch's line in machine.jsonl) and the precision they
    trained in (config.json's `amp`: bf16 autocast, else fp32). Every row of a seed should share one machine and
    precision, since vLLM samples differently on each CPU; a seed whose cells differ is flagged."""
    def precision(run: Path) -> str:
        amp = json.loads((run / "config.json").read_text()).get("amp") if (run / "config.json").exists() else None
        return {True: "bf16 autocast", False: "fp32"}.get(amp, "not recorded")

    lines = ["| seed | cells | machine | precision | one machine |", "|---|---|---|---|---|"]
    for seed in range(args.seeds):
        cells = [args.dir / f"{row}-s{seed}" for row in args.rows if (row, seed) in runs]
        if not cells:
            continue
        seen = {f"{m.get('cpu', '?')}, {m.get('cpu_isa', '?')}, {m.get('cpus', '?')} cores"
                + (f", {m['gpu']}" if m.get("gpu") else "")
                for run in cells for m in read_jsonl(run / "machine.jsonl") or [{"cpu": "not recorded"}]}
        kinds = {precision(run) for run in cells}
        lines.append(f"| {seed} | {len(cells)} | {'; '.join(sorted(seen))} | {', '.join(sorted(kinds))} | "
                     + ("yes" if len(seen) == 1 and len(kinds) == 1 else "**no**") + " |")
    return "\n".join(lines)


def eval_columns(runs: dict) -> list[str]:
    """The eval/* keys the runs report, in the adapter's order, each accuracy followed by its paired gain
    over iteration 0 (standard errors are shown next to their value, not as columns)."""
    by_set: dict[str, dict] = {}
    keys = {k for rows in runs.values() for r in rows for k in r}
    for rows in runs.values():
        for r in rows:
            for k in r:
                if k.startswith("eval/") and tasks.headline(k):
                    by_set.setdefault(k.split("/")[1], {})[k] = None
    return [c for cols in by_set.values() for k in cols for c in (k, k + "_gain") if c in keys]


def last_eval(rows: list[dict]) -> dict:
    evaluated = [r for r in rows if any(k.startswith("eval/") for k in r)]
    return evaluated[-1] if evaluated else {}


def fmt(rows: list[dict], col: str) -> str:
    """One column over seeds, in %: mean ± std over seeds, then each seed's value (± its eval's standard
    error, when the adapter reports one)."""
    pairs = [(r[col], r.get(col + "_se", float("nan"))) for r in rows if col in r and not math.isnan(r[col])]
    if not pairs:
        return "-"
    vals = [100 * v for v, _ in pairs]
    spread = f" ± {statistics.stdev(vals):.1f}" if len(vals) > 1 else ""
    seeds = ", ".join(f"{100 * v:.1f}" + ("" if math.isnan(se) else f"±{100 * se:.1f}") for v, se in pairs)
    return f"{statistics.fmean(vals):.1f}{spread} ({seeds})"


def table(args, runs: dict) -> str:
    """Markdown: a "before" line (each seed's iteration-0 eval), then one line per row (its last eval),
    mean ± std over seeds with the per-seed values in %, and the mean minutes per run (the sum of its
    iterations' time: vLLM's start and the iteration-0 eval are not in it)."""
    cols = eval_columns(runs)
    head = ["row", "iteration", *[c.removeprefix("eval/") for c in cols], "min/run"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    before = {}
    for (row, seed), rows in runs.items():   # per seed, the iteration-0 eval that has the most columns (with R)
        if rows and len(rows[0]) > len(before.get(seed, {})):
            before[seed] = rows[0]
    lines.append("| before | 0 | " + " | ".join(fmt(list(before.values()), c) for c in cols) + " | |")
    for row in args.rows:
        cells = [runs[row, s] for s in range(args.seeds) if (row, s) in runs]
        after = [last_eval(rows) for rows in cells]
        its = ",".join(str(i) for i in sorted({a["iteration"] for a in after if a})) or "-"
        minutes = statistics.fmean(sum(r.get("time/iteration", 0) for r in rows) / 60 for rows in cells) if cells else 0
        lines.append(f"| {row} | {its} | " + " | ".join(fmt(after, c) for c in cols)
                     + f" | {minutes:.0f} |")
    return "\n".join(lines)


def dynamics(args, runs: dict) -> str:
    """Markdown: what each row did while training, mean over seeds (per-seed values in brackets):
    training accuracy over the first and the last third of the iterations, P's and R's training
    samples per iteration, R's mean verdict, and E's rewrites (accepted / decided) summed over the run."""
    def total(key):
        return lambda rows: float(sum(r.get(key, 0) for r in rows)) if any(key in r for r in rows) else float("nan")

    def mean(key):
        return lambda rows: statistics.fmean(r[key] for r in rows) if rows else float("nan")

    return per_row_table(args, runs, {
        "train acc, first third": lambda rows: third(rows, "train/acc", False),
        "train acc, last third": lambda rows: third(rows, "train/acc", True),
        "P samples/it": mean("train/policy_samples"), "R samples/it": mean("train/rm_samples"),
        "R mean verdict, last third": lambda rows: third(rows, "train/verdict_mean", True),
        "E accepted": total("env/accepted"), "E rejected": total("env/rejected")})


def trust_region(args, runs: dict) -> str:
    """Markdown: the size of P's and R's updates and the signs of a collapse, mean over seeds (per-seed values
    in brackets). Clip fraction and KL are medians over a run's updates, measured after each update against
    the policy that sampled its data (ppo.ppo_update's update_*); "in-update" is the clip fraction averaged
    over the update's mini-batches, the first of them on-policy (CleanRL's convention, and the only one the
    studies before the update_* metrics logged). Unparseable: the share of answers with no valid action or
    program (P) or no verdict (R), over the last third of the iterations; entropy: π_old's mean token entropy
    on the trained responses, nats."""
    cols = {"P clip, in-update": median("losses/policy_clipfrac")}
    for who, name in (("P", "policy"), ("R", "rm")):
        cols |= {f"{who} clip": median(f"losses/{name}_update_clipfrac"), f"{who} KL": median(f"losses/{name}_update_kl"),
                 f"{who} entropy": median(f"losses/{name}_entropy"),
                 f"{who} unparseable, last third": lambda rows, k=f"train/{name}_unparseable": third(rows, k, True)}
    return per_row_table(args, runs, cols, spec=".3g")


def theorem1(args, runs: dict) -> str:
    """Markdown: R's Theorem 1 quantities (reward_model.theorem1) per row, mean over seeds (per-seed values in
    brackets): on the training steps, medians over the run's iterations, against the outcomes (μ, 𝒜 and its
    bound at the run's m) and, where steps carry labels, against the labels (μ_label); at the last eval, μ and 𝒜
    on each eval set. μ > 1 is the theorem's condition for 𝒜 → 1; a constant R has μ = 1, 𝒜 = 0."""
    sets = sorted({k.split("/")[1] for rows in runs.values() for r in rows for k in r
                   if k.startswith("eval/") and k.endswith("/thm1_mu")})
    cols = {"train μ": median("train/thm1_mu"), "train 𝒜": median("train/thm1_precision"),
            "train bound": median("train/thm1_bound"), "train μ_label": median("train/thm1_label_mu")}
    for s in sets:
        for name, key in (("μ", "thm1_mu"), ("𝒜", "thm1_precision"), ("μ_label", "thm1_label_mu")):
            cols[f"{s} {name}, last eval"] = lambda rows, k=f"eval/{s}/{key}": last_eval(rows).get(k, float("nan"))
    return per_row_table(args, runs, cols, spec=".3g")


def r_grows(after: dict, s: str) -> bool:
    """Claim 4 on eval set `s` at one seed's last eval (`after`), as issue 43 fixes it: R's balanced Process Acc has
    risen above its own iteration-0 value by more than twice the paired SE (tasks.paired_bacc_gain), ends above
    50 % by more than twice its SE (tasks.bacc_se), and R's verdicts carry signal about the labels (μ_label > 1)."""
    get = lambda key: after.get(f"eval/{s}/{key}", float("nan"))  # noqa: E731
    return (get("process_bacc_gain") > 2 * get("process_bacc_gain_se")
            and get("process_bacc") - 0.5 > 2 * get("process_bacc_se") and get("thm1_label_mu") > 1)


def claim4(args, runs: dict) -> str:
    """Markdown: R's balanced Process Acc per row with an R and per eval set with labelled steps, per seed: iteration
    0 → the last eval (the paired gain ± SE, over the tasks with labelled steps at both), the last eval's SE,
    μ_label, and whether claim 4 holds there (`r_grows`); the last column says whether it holds at every seed. In %."""
    sets = sorted({k.split("/")[1] for rows in runs.values() for r in rows for k in r
                   if k.startswith("eval/") and k.endswith("/process_bacc_gain")})
    head = ["row", "set", *[f"seed {s}" for s in range(args.seeds)], "holds at every seed"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in args.rows:
        for s in sets:
            cells, holds = [], []
            for seed in range(args.seeds):
                rows = runs.get((row, seed), [])
                after = last_eval(rows)
                if f"eval/{s}/process_bacc_gain" not in after:
                    cells.append("-")
                    continue
                holds.append(r_grows(after, s))
                get = lambda key: 100 * after[f"eval/{s}/{key}"]  # noqa: E731
                cells.append(f"{100 * rows[0][f'eval/{s}/process_bacc']:.1f} → {get('process_bacc'):.1f} "
                             f"({get('process_bacc_gain'):+.1f} ± {get('process_bacc_gain_se'):.1f}), SE "
                             f"{get('process_bacc_se'):.1f}, μ_label {after[f'eval/{s}/thm1_label_mu']:.2f}"
                             + (" ✓" if holds[-1] else " ✗"))
            if holds:
                every = "yes" if all(holds) and len(holds) == args.seeds else "no"
                lines.append(f"| {row} | {s} | " + " | ".join(cells) + f" | {every} |")
    return "\n".join(lines)


# The paper's comparisons, as (A, B) for A − B: claim 1's ladder (Policy < + Reward < + Env), each against
# outcome-only GRPO, and claim 2's step-wise row against GRPO and against integrated feedback with an untrained R.
CONTRASTS = [("policy_reward", "policy"), ("full", "policy_reward"), ("full", "policy"), ("full", "grpo"),
             ("policy", "grpo"), ("stepwise", "grpo"), ("stepwise", "policy")]


def contrasts(args, runs: dict) -> str:
    """Markdown: each of the paper's comparisons A − B at the last eval, paired over the eval tasks within a seed
    (tasks.paired_gain: the same tasks, the same iteration-0 model), for every per-task eval accuracy. Per seed
    d ± its SE over tasks; over seeds the mean of the d's with two SEs: between seeds, std(d)/√k, which sees the
    seed-to-seed spread, and within, √Σse²/k, which sees only the task sampling. In %."""
    cols = [c for c in eval_columns(runs) if not c.endswith("_gain")]
    head = ["A − B", "metric", *[f"seed {s}" for s in range(args.seeds)], "mean", "SE between seeds", "SE within"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for a, b in CONTRASTS:
        if a not in args.rows or b not in args.rows:
            continue
        for col in cols:
            per_seed = paired_contrast(runs, a, b, col, args.seeds)
            if not per_seed:
                continue
            mean, between, within = over_seeds(per_seed)
            seeds = [f"{per_seed[s][0]:+.1f} ± {per_seed[s][1]:.1f}" if s in per_seed else "-" for s in range(args.seeds)]
            lines.append(f"| {a} − {b} | {col.removeprefix('eval/')} | " + " | ".join(seeds) + f" | {mean:+.1f} | "
                         + ("-" if math.isnan(between) else f"{between:.1f}") + f" | {within:.1f} |")
    return "\n".join(lines)


def paired_contrast(runs: dict, a: str, b: str, col: str, seeds: int) -> dict:
    """seed → (A − B, its SE) in %, row A against row B on eval column `col` at their last eval, paired over the
    eval tasks (tasks.paired_gain); seeds where either row is missing or they stopped at different iterations are
    left out."""
    per_seed = {}
    for s in range(seeds):
        ea, eb = last_eval(runs.get((a, s), [])), last_eval(runs.get((b, s), []))
        ta, tb = ea.get(col + "_tasks"), eb.get(col + "_tasks")
        if ta is not None and tb is not None and len(ta) == len(tb) and ea["iteration"] == eb["iteration"]:
            d, se = tasks.paired_gain(tb, ta)          # (before, after) = (B, A): the mean of A_i − B_i
            if not math.isnan(d):
                per_seed[s] = (100 * d, 100 * se)
    return per_seed


def over_seeds(per_seed: dict) -> tuple[float, float, float]:
    """(mean, SE between seeds, SE within) of `paired_contrast`'s per-seed differences: std(d)/√k (NaN for one
    seed) and √Σse²/k."""
    ds = [d for d, _ in per_seed.values()]
    between = statistics.stdev(ds) / math.sqrt(len(ds)) if len(ds) > 1 else float("nan")
    return statistics.fmean(ds), between, math.sqrt(sum(se ** 2 for _, se in per_seed.values())) / len(ds)


def third(rows: list[dict], key: str, last: bool) -> float:
    """The mean of `key` over the first or the last third of a run's iterations."""
    k = max(1, len(rows) // 3)
    xs = [r[key] for r in (rows[-k:] if last else rows[:k]) if key in r and not math.isnan(r[key])]
    return statistics.fmean(xs) if xs else float("nan")


def median(key: str):
    """The median of `key` over the iterations that logged it (the updates that ran), NaNs left out."""
    return lambda rows: statistics.median(xs) if (xs := [r[key] for r in rows if key in r and r[key] == r[key]]) \
        else float("nan")


def per_row_table(args, runs: dict, cols: dict, spec: str = ".2f") -> str:
    """Markdown: one line per row, each column a function of a run's training rows (iteration > 0),
    shown as the mean over seeds with the per-seed values in brackets (format `spec`)."""
    def per_seed(row, fn):
        vals = [fn([r for r in runs[row, s] if r["iteration"] > 0]) for s in range(args.seeds) if (row, s) in runs]
        vals = [v for v in vals if not math.isnan(v)]
        return f"{statistics.fmean(vals):{spec}} [" + ", ".join(f"{v:{spec}}" for v in vals) + "]" if vals else "-"

    lines = ["| row | " + " | ".join(cols) + " |", "|" + "---|" * (len(cols) + 1)]
    for row in args.rows:
        lines.append(f"| {row} | " + " | ".join(per_seed(row, fn) for fn in cols.values()) + " |")
    return "\n".join(lines)


def figure(args, runs: dict, path: Path) -> None:
    """Eval accuracy per iteration (one panel per eval set's first column), each row's mean over
    seeds as a line and its min–max over seeds as a band."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    firsts = {}
    for c in eval_columns(runs):
        firsts.setdefault(c.split("/")[1], c)
    panels = list(firsts.values())
    if not panels:
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.8), squeeze=False)
    for ax, col in zip(axes[0], panels):
        for row in args.rows:
            series = [{r["iteration"]: r[col] for r in runs[row, s] if col in r}
                      for s in range(args.seeds) if (row, s) in runs]
            its = sorted(set().union(*series)) if series else []
            pts = [(i, [100 * s[i] for s in series if i in s]) for i in its]
            if not pts:
                continue
            xs = [i for i, _ in pts]
            ax.plot(xs, [statistics.fmean(v) for _, v in pts], marker="o", label=row)
            ax.fill_between(xs, [min(v) for _, v in pts], [max(v) for _, v in pts], alpha=0.2)
        ax.set_title(col.removeprefix("eval/"))
        ax.set_xlabel("iteration")
        ax.set_ylabel("%")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{args.task}: Table 1 rows, mean over seeds (band: min–max)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def claims(args, runs: dict, path: Path) -> None:
    """The paper's Figure 1 views, from the runs' training rows (each row's mean over seeds as a line, min–max
    over seeds as a band): training accuracy per iteration for every row (claim 2 compares stepwise, policy and
    grpo), the cumulative count of E's accepted rewrites (claim 3: it grows with training), and the accepted
    rewrites' accuracy a′ when accepted, against Eq. 4's band [α_low, α_high] (claim 3: it stays in the band).
    The E panels show the rows with E."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def cumulative(key):
        return lambda rows: dict(zip((r["iteration"] for r in rows), itertools.accumulate(r.get(key, 0) for r in rows)))

    def per_iteration(key):
        return lambda rows: {r["iteration"]: r[key] for r in rows if key in r and r[key] == r[key]}

    with_e = [row for row in args.rows if any("env/accepted" in r for (rw, _), rows in runs.items() if rw == row
                                              for r in rows)]
    panels = [("training accuracy (claim 2)", per_iteration("train/acc"), args.rows, False),   # (..., Eq. 4's band)
              ("E: accepted rewrites, cumulative (claim 3)", cumulative("env/accepted"), with_e, False),
              ("E: accuracy a′ of the rewrites accepted (claim 3)", per_iteration("env/accepted_acc"), with_e, True)]
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.8), squeeze=False)
    for ax, (title, series_of, rows, band) in zip(axes[0], panels):
        for row in rows:
            series = [series_of([r for r in runs[row, s] if r["iteration"] > 0])
                      for s in range(args.seeds) if (row, s) in runs]
            its = sorted(set().union(*series)) if series else []
            pts = [(i, [x[i] for x in series if i in x]) for i in its]
            if not pts:
                continue
            xs = [i for i, _ in pts]
            ax.plot(xs, [statistics.fmean(v) for _, v in pts], marker="o", label=row)
            ax.fill_between(xs, [min(v) for _, v in pts], [max(v) for _, v in pts], alpha=0.2)
        if not ax.lines:   # studies run before the key was logged
            ax.text(0.5, 0.5, "not logged by these runs", ha="center", va="center", transform=ax.transAxes)
        if band:
            for y in (loop.Config.alpha_low, loop.Config.alpha_high):
                ax.axhline(y, color="grey", linestyle="--", linewidth=1)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle(f"{args.task}: the paper's claims 2 and 3, mean over seeds (band: min–max)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> int:
    args = parse(argv)
    try:
        if not args.report_only:
            run_study(args)
    except loop.ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    runs = load(args)
    if not runs:
        print(f"error: no runs under {args.dir}", file=sys.stderr)
        return 2
    print(table(args, runs))
    print()
    print(contrasts(args, runs))
    print()
    print(dynamics(args, runs))
    print()
    print(trust_region(args, runs))
    print()
    print(theorem1(args, runs))
    print()
    print(claim4(args, runs))
    print()
    print(machines(args, runs))
    figure(args, runs, args.dir / "table1.png")
    claims(args, runs, args.dir / "claims.png")
    print(f"[table1] figures: {args.dir / 'table1.png'}, {args.dir / 'claims.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
