"""Where the learning signal is: the initial policy's success rate at the training temperature,
with G rollouts per task, per ladder level (coding, maze), page (osworld) or task type (alfworld).

Eq. 2 gives no advantage to a group that is all right or all wrong, so the column that matters is
"mixed": the share of tasks whose G rollouts hold both a success and a failure.

    python scripts/base_rates.py --task maze
    python scripts/base_rates.py --task livebench --per-key 12
    python scripts/base_rates.py --task alfworld --per-key 4        # any loop flag passes through

It samples only the training split and the variants reachable from it (never an eval set) and
prints a Markdown table.
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from plumbing import models  # noqa: E402
import loop  # noqa: E402
import tasks  # noqa: E402


def key_of(task) -> str:
    """The row a task belongs to: its ladder level, page or task type."""
    if "task_type" in task.data:
        return task.data["task_type"]
    if "page" in task.data:
        return task.data["page"] + (" + hint" if task.data.get("hint") else "")
    return f"level {task.level}" if task.level is not None else "-"


def ladder_pool(adapter) -> list:
    """The training tasks and every variant E's `variants` mode can reach from them (so each ladder
    level is measured, not only the level the slots start at)."""
    pool, todo = {}, list(adapter.train_tasks())
    while todo:
        t = todo.pop()
        if t.id in pool:
            continue
        pool[t.id] = t
        if t.ladder is not None:       # ALFWorld's tasks have no ladder (its variants are planned on demand)
            todo += [v for d in ("harder", "easier") if (v := adapter.variant(t, d)) is not None]
    return list(pool.values())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--per-key", type=int, default=0, help="at most this many training tasks per row (0: all)")
    args, rest = p.parse_known_args(argv)
    cfg = loop.parse_args(rest)
    adapter = tasks.get(cfg.task, cfg)
    rng = random.Random(cfg.seed)
    by_key = {}
    for t in ladder_pool(adapter):
        by_key.setdefault(key_of(t), []).append(t)
    chosen = [t for ts in by_key.values() for t in (rng.sample(ts, args.per_key) if 0 < args.per_key < len(ts) else ts)]
    _, engines = loop.build_models(cfg, False, cfg.model, cfg.model)
    models.seed_everything(cfg.seed)
    t0 = time.perf_counter()
    groups = adapter.rollout(chosen, cfg.group_size, engines["policy"], cfg)
    seconds = time.perf_counter() - t0
    rows = {}
    for g in groups:
        rows.setdefault(key_of(g.task), []).append(g.acc)
    print(f"{cfg.task}: {cfg.model}, T {cfg.temperature}, top-p {cfg.top_p}, G {cfg.group_size}, "
          f"{len(groups)} training tasks, {seconds:.0f} s\n")
    print("| row | tasks | success % | tasks with any success | mixed (0 < acc < 1) |")
    print("|---|---|---|---|---|")
    for key in sorted(rows, key=lambda k: (len(k), k)):
        accs = rows[key]
        print(f"| {key} | {len(accs)} | {100 * statistics.fmean(accs):.1f} | {sum(a > 0 for a in accs)} | "
              f"{sum(0 < a < 1 for a in accs)} |")
    accs = [a for v in rows.values() for a in v]
    print(f"| all | {len(accs)} | {100 * statistics.fmean(accs):.1f} | {sum(a > 0 for a in accs)} | "
          f"{sum(0 < a < 1 for a in accs)} |")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (loop.ConfigError, models.ModelError, tasks.TaskError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
