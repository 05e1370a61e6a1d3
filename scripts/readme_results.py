"""The README's results table, read off the committed studies in docs/studies/ (tests/test_layout.py checks that
the README shows exactly this table).

    python scripts/readme_results.py          # prints the Markdown table

Each measured cell comes from a study's metrics.jsonl: the default coding run's paired gains (`loop.py` logs
eval/<set>/code_gain and _gain_se), the Table 1 studies' full − GRPO differences, paired over the eval tasks within
each seed and averaged over seeds (scripts/table1.py's `paired_contrast`), R's balanced Process Acc at the
full row's last eval, and the GUI claims study's cells as they land. The paper's numbers (Table 1, 7B models) are written here, beside ours.
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scripts.table1 import last_eval, load_cells, over_seeds, paired_contrast, read_metrics  # noqa: E402

STUDIES = ROOT / "docs" / "studies"
# the default coding run at today's defaults (`make run`), on each machine kind it ran on: vLLM samples differently
DEFAULT_RUNS = {"an AMD EPYC with bf16": "speed-42/new-d9828ee", "an AVX2-only EPYC (fp32)": "speed-42/new-7c57034-avx2"}
SEEDS = 3


def pct(x: float) -> str:
    return f"{100 * x:.1f}"


def signed(x: float) -> str:
    """+1.2 / −1.2, with the minus sign the docs use."""
    return f"{x:+.1f}".replace("-", "−")


def gain(row: dict, key: str) -> str:
    return f"{signed(100 * row[key + '_gain'])} ± {100 * row[key + '_gain_se']:.1f}"


def default_run(run: list[dict]) -> str:
    """In-domain Code before → after with its paired gain, and the OOD gain, of one default run."""
    before, after = run[0], last_eval(run)
    return (f"in-domain Code {pct(before['eval/in_domain/code'])} → {pct(after['eval/in_domain/code'])} % "
            f"({gain(after, 'eval/in_domain/code')}), OOD {gain(after, 'eval/ood/code')}")


def full_minus_grpo(runs: dict, col: str) -> tuple[float, float]:
    """(mean over seeds, SE between seeds) of full − grpo at the last eval, in %."""
    mean, between, _ = over_seeds(paired_contrast(runs, "full", "grpo", col, SEEDS))
    return mean, between


def table() -> str:
    livebench = load_cells(STUDIES / "table1-livebench-final", ("full", "grpo"), SEEDS)
    maze = load_cells(STUDIES / "table1-maze-final", ("full", "grpo"), SEEDS)
    code = "; ".join(default_run(read_metrics(STUDIES / folder)) + f" on {machine}"
                     for machine, folder in DEFAULT_RUNS.items())
    lb, lb_se = full_minus_grpo(livebench, "eval/in_domain/code")
    lb_ood, _ = full_minus_grpo(livebench, "eval/ood/code")
    mz, mz_se = full_minus_grpo(maze, "eval/in_domain/success")
    gui = read_metrics(STUDIES / "table1-osworld" / "full-s0")
    gui_end = last_eval(gui)
    bacc = ", ".join(pct(last_eval(maze["full", s])["eval/in_domain/process_bacc"]) for s in range(SEEDS))
    rows = [
        ("default coding run, today's defaults (one seed per machine)", code, "—",
         "[speed-42](docs/studies/speed-42/README.md)"),
        ("coding, full − GRPO (earlier defaults, 3 seeds)",
         f"in-domain {signed(lb)} (SE {lb_se:.1f} between seeds), OOD {signed(lb_ood)}",
         "LiveBench 43.2 vs 38.8 (full vs Policy)",
         "[STUDIES.md](docs/STUDIES.md#summary-coding-livebench-columns-at-the-final-defaults)"),
        ("maze, full − GRPO (today's maze defaults, 3 seeds)",
         f"in-domain {signed(mz)} (SE {mz_se:.1f}): no row beyond noise",
         "ALFWorld 60.2 vs 51.1 (full vs Policy)",
         "[STUDIES.md](docs/STUDIES.md#summary-the-maze-at-the-final-defaults-5-rows--3-seeds)"),
        ("R's balanced Process Acc after training (maze, full row)", f"{bacc} % on seeds 0–2 (below chance)",
         "ALFWorld 47.0 → 56.4", "[STUDIES.md](docs/STUDIES.md#summary-the-four-claims)"),
        ("GUI (MiniWoB++), full row, seed 0 (the claims study's first cell)",
         f"P's in-domain success {pct(gui[0]['eval/in_domain/success'])} → {pct(gui_end['eval/in_domain/success'])} % "
         f"({gain(gui_end, 'eval/in_domain/success')}); R's balanced Process Acc on labelled pages "
         f"{pct(gui[0]['eval/process/process_bacc'])} → {pct(gui_end['eval/process/process_bacc'])} %: \"bad\" to every step",
         "OSWorld 40.4 → 52.1; Process Acc 86.0 → 91.3",
         "[STUDIES.md](docs/STUDIES.md#the-gui-claims-study-issue-43-from-2026-12-06)"),
    ]
    lines = ["| what | measured (135M model, 2-core CPU) | paper (7B) | where |", "|---|---|---|---|"]
    return "\n".join(lines + [f"| {' | '.join(r)} |" for r in rows])


if __name__ == "__main__":
    print(table())
