"""Step-size sweep on the validation split (paper §3.4, Eq. 5's optimizer): which learning rate, optimizer
life and warm-up keep P's and R's PPO updates inside their trust region without stalling learning.

    python scripts/sweep.py --task maze                       # every configuration below, seed 0, then the table
    python scripts/sweep.py --task maze --configs lr3e-6-warm6 --seeds 2
    python scripts/sweep.py --task maze --report-only         # the table from what has run
    python scripts/sweep.py --task livebench --configs coding-kl0,coding-kl0.05,coding-kl0.2   # coding's trust region
    python scripts/sweep.py --task livebench --configs coding-kl0.05,coding-stop   # answers end with the code block

Every cell is a `scripts/table1.py` cell (one `loop.py` run, resumable) with `--validation`: it is evaluated on
the setting's validation split only, never on the eval sets, so the choice made from this table leaves
the eval sets untouched. Each configuration names all its optimizer flags, so a change of defaults does
not change what a configuration means. The table gives, per configuration, P's validation accuracy at the last
eval (maze: success, coding: Code; mean over seeds, per-seed values in brackets) and its paired gain over
iteration 0, R's (maze: balanced Process Acc, coding: Detect), the medians and maxima of the update's KL and the
medians of its clip fraction for P and R (ppo.ppo_update's update_*), R's mean verdict in the last third,
and whether a seed collapsed: more than 20 % of P's or R's answers unparseable in the last third, and at
least 10 points more than in the first third (the untrained maze policy's own share is about 65 %). A run
of 3 iterations or fewer (stopped early) is not judged.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scripts import table1  # noqa: E402

# name → the loop flags of one configuration (P's and R's optimizer alike unless named)
CONFIGS = {
    "lr3e-5-fresh": ["--lr", "3e-5", "--rm-lr", "3e-5", "--fresh-optimizer", "--warmup-steps", "0", "--target-kl", "0"],
    "lr3e-6-warm6": ["--lr", "3e-6", "--rm-lr", "3e-6", "--no-fresh-optimizer", "--warmup-steps", "6", "--target-kl", "0"],
    "lr3e-5-kl0.01": ["--lr", "3e-5", "--rm-lr", "3e-5", "--fresh-optimizer", "--warmup-steps", "0", "--target-kl", "0.01"],
    "fp32-lr3e-6-kl0.01": ["--lr", "3e-6", "--rm-lr", "3e-6", "--fresh-optimizer", "--warmup-steps", "0", "--target-kl",
                           "0.01", "--no-train-amp"],
    "fp32-lr1e-6": ["--lr", "1e-6", "--rm-lr", "1e-6", "--fresh-optimizer", "--warmup-steps", "0", "--target-kl", "0",
                    "--no-train-amp"],
    # coding (livebench): its optimizer, with and without a trust region for P and R
    **{f"coding-kl{kl}": ["--lr", "1e-5", "--rm-lr", "1e-5", "--fresh-optimizer", "--warmup-steps", "0", "--target-kl",
                          kl, "--rm-target-kl", "-1", "--no-stop-after-code"] for kl in ("0", "0.05", "0.2")},
    "coding-stop": ["--lr", "1e-5", "--rm-lr", "1e-5", "--fresh-optimizer", "--warmup-steps", "0", "--target-kl", "0.05",
                    "--rm-target-kl", "-1", "--stop-after-code"],   # coding-kl0.05, P's answers end with their code block
}
# setting → its two headline eval metrics on the validation split: P's, then R's
HEADLINE = {"maze": ("success", "process_bacc"), "livebench": ("code", "detect")}
# A collapse: the share of unparseable answers in the last third above COLLAPSE and RISE above the first third's.
# The rise matters: the untrained maze policy already answers 65 % of its steps with no valid move number.
COLLAPSE, RISE = 0.2, 0.1


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    p.add_argument("--task", default="maze")
    p.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated names of CONFIGS")
    p.add_argument("--row", default="full", help="the Table 1 row every cell runs")
    p.add_argument("--seeds", type=int, default=1, help="seeds 0..N-1 per configuration")
    p.add_argument("--runs-dir", default="runs")
    p.add_argument("--report-only", action="store_true")
    args, loop_flags = p.parse_known_args(argv)
    args.configs = [c for c in args.configs.split(",") if c]
    bad = [c for c in args.configs if c not in CONFIGS]
    if bad:
        p.error(f"--configs: unknown {', '.join(bad)}; choose from {', '.join(CONFIGS)}")
    args.loop_flags = loop_flags
    return args


def study(args, name: str):
    """The scripts/table1.py study of one configuration."""
    return table1.parse(["--task", args.task, "--seeds", str(args.seeds), "--rows", args.row, "--runs-dir",
                         args.runs_dir, "--study", f"sweep-{args.task}/{name}", "--validation", *CONFIGS[name],
                         *args.loop_flags])


def row(name: str, cells: list[list[dict]], task: str) -> str:
    """One configuration's line of the sweep table, from its cells' metrics rows."""
    def over_seeds(fn, spec=".3g"):
        vals = [fn(rows) for rows in cells]
        vals = [v for v in vals if v == v]
        if not vals:
            return "-"
        return f"{statistics.fmean(vals):{spec}} [" + ", ".join(f"{v:{spec}}" for v in vals) + "]"

    def last(key):
        return lambda rows: 100 * table1.last_eval(rows).get(key, float("nan"))

    def trained(fn):
        return lambda rows: fn([r for r in rows if r["iteration"] > 0])

    def collapsed_in(rows, key):
        rows = [r for r in rows if r["iteration"] > 0]
        first, last = table1.third(rows, key, False), table1.third(rows, key, True)
        return last > COLLAPSE and last > first + RISE

    collapsed = [rows for rows in cells if rows[-1]["iteration"] > 3 and any(collapsed_in(rows, k) for k in
                                                                 ("train/policy_unparseable", "train/rm_unparseable"))]
    p_key, r_key = HEADLINE[task]
    cols = [over_seeds(lambda rows: float(rows[-1]["iteration"]), ".0f"), over_seeds(last(f"eval/validation/{p_key}"), ".1f"),
            over_seeds(last(f"eval/validation/{p_key}_gain"), "+.1f"), over_seeds(last(f"eval/validation/{p_key}_gain_se"), ".1f"),
            over_seeds(last(f"eval/validation/{r_key}"), ".1f")]
    for who in ("policy", "rm"):
        cols += [over_seeds(trained(table1.median(f"losses/{who}_update_clipfrac"))),
                 over_seeds(trained(table1.median(f"losses/{who}_update_kl"))),
                 over_seeds(trained(lambda rows, k=f"losses/{who}_update_kl": max((r[k] for r in rows if k in r),
                                                                                   default=float("nan"))))]
    for who in ("policy", "rm"):   # the unparseable share, first third → last third
        key = f"train/{who}_unparseable"
        cols.append(over_seeds(trained(lambda rows, k=key: table1.third(rows, k, False)), ".2f") + " → "
                    + over_seeds(trained(lambda rows, k=key: table1.third(rows, k, True)), ".2f"))
    cols += [over_seeds(trained(lambda rows: table1.third(rows, "train/verdict_mean", True)), ".2f"),
             f"{len(collapsed)} of {judged}" if (judged := sum(rows[-1]["iteration"] > 3 for rows in cells)) else "not judged"]
    return f"| {name} | `{' '.join(CONFIGS[name])}` | " + " | ".join(cols) + " |"


def main(argv=None) -> int:
    args = parse(argv)
    if args.task not in HEADLINE:
        sys.exit(f"error: --task {args.task}: the sweep knows {', '.join(HEADLINE)}")
    p_key, r_key = HEADLINE[args.task]
    head = ["configuration", "flags", "iterations run", f"validation {p_key} % (last eval)", "gain", "gain SE", f"R {r_key} %",
            "P clip", "P KL", "P KL max", "R clip", "R KL", "R KL max", "P unparseable, first → last third",
            "R unparseable, first → last third",
            "R verdict mean, last third", "seeds collapsed"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in args.configs:
        s = study(args, name)
        if not args.report_only:
            table1.run_study(s)
        runs = table1.load(s)
        if runs:
            lines.append(row(name, [runs[k] for k in sorted(runs)], args.task))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
