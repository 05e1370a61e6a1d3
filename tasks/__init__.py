"""The task interface and a registry by name (paper §4: the three settings, plus the maze).

An adapter (one per setting, over the records of records.py) provides:

    train_tasks() -> list[Task]                     the slots' original tasks
    eval_sets() -> dict[str, list[Task]]            e.g. {"in_domain": ..., "ood": ...}; under --validation
                                                    {"validation": ...} (`chosen_sets`)
    rollout(tasks, G, engine, cfg, temperature=None, max_turns=None) -> list[Group]
                                                    P plays G rollouts of each task (batched); the
                                                    keywords override cfg's (evaluation)
    judge(groups, engine, cfg) -> None              R fills step.verdicts / step.judgments / group.tests
    evaluate(sets, policy, rm, cfg) -> dict         the paper's Table 1 columns for this setting
    variant(task, direction) -> Task | None         `variants` mode of E: the next easier/harder variant
    rewrite_prompt(root, active, direction, feedback, acc) -> str
                                                    `generate` mode of E: E's prompt (acc: the active
                                                    version's accuracy, None before it has one) ...
    parse_rewrite(root, text) -> Task | None        ... and the validation of E's answer
    feedback(group) -> str                          critic feedback for E (Eq. 4), or instead
    summary_prompt(group, r, risky) -> str          (optional) E's prompt to summarize failed rollout r
                                                    given R's high-risk steps; the summaries are then
                                                    the feedback (environment.critic_feedback)
    pop_timings() -> dict                           the seconds (and counts) the setting's own machinery
                                                    took since the last call: sandbox, engine, browser
    judge_kind: "steps" (R judges each step, Eq. 3) or "tests" (R writes unit tests, coding)
    rewrite_prefix: str (optional)                  the prefilled opening of E's answer in generate mode
    DEFAULTS (module level, optional): the setting's CPU defaults for loop.Config fields
    REFERENCE (module level, optional): the released code's values, for --preset reference

The multi-turn settings share their episode runner, evaluation and feedback: tasks/agent.py.
"""
from __future__ import annotations

import importlib
import math
import random
import statistics

from records import Group, Task


class TaskError(Exception):
    """Bad task name or data file; the message is one line for the user."""


REGISTRY = {"livebench": "tasks.livebench", "alfworld": "tasks.alfworld", "osworld": "tasks.osworld",
            "maze": "tasks.maze"}


class AdapterBase:
    """What every adapter shares: the config, its task sets (`self.sets`, "train" plus the eval sets)
    and the timings of its own machinery, which the loop collects with `pop_timings`."""

    sets: dict[str, list[Task]]

    def __init__(self, cfg):
        self.cfg, self.timings = cfg, {}

    def train_tasks(self) -> list[Task]:
        return self.sets["train"]

    def eval_sets(self) -> dict[str, list[Task]]:
        """The eval sets: every non-empty set but "train" and "validation" (`chosen_sets`)."""
        return chosen_sets(self.sets, self.cfg)

    def pop_timings(self) -> dict:
        timings, self.timings = self.timings, {}
        return timings


def chosen_sets(sets: dict[str, list[Task]], cfg) -> dict[str, list[Task]]:
    """What an eval plays: the eval sets (every non-empty set but "train" and "validation"), or under
    --validation the validation split alone, which is for choosing hyperparameters and is disjoint from
    the training tasks and every eval set. Each is cut to a fixed random subset of --eval-tasks tasks (0: all)."""
    if cfg.validation and not sets.get("validation"):
        raise TaskError(f"--validation: the {cfg.task} setting has no validation split")
    n = cfg.eval_tasks
    return {name: (random.Random(cfg.seed).sample(ts, n) if 0 < n < len(ts) else ts) for name, ts in sets.items()
            if ts and name != "train" and (name == "validation") == bool(cfg.validation)}


def eval_groups(adapter, sets: dict[str, list[Task]], policy, rm, cfg) -> dict[str, list[Group]]:
    """Every eval set played in ONE rollout call (and judged in one call when R is given), then split
    back by set: bigger batches are faster. eval set name → its groups."""
    names = [name for name, ts in sets.items() for _ in ts]
    groups = adapter.rollout([t for ts in sets.values() for t in ts], cfg.eval_samples, policy, cfg,
                             temperature=cfg.eval_temperature, max_turns=cfg.eval_max_turns or cfg.max_turns)
    if rm is not None:
        adapter.judge(groups, rm, cfg)
    return {name: [g for g, n in zip(groups, names) if n == name] for name in sets}


def accuracy(key: str, groups: list[Group]) -> dict:
    """An eval set's accuracy, as metrics named after `key`: the mean over tasks of each task's accuracy
    (over its --eval-samples episodes); `key`_se, std/√n over tasks (the task is the unit that was
    sampled; nan for a single task); `key`_tasks, each task's accuracy in the set's fixed order, so that
    two iterations can be compared task by task (paired_gain)."""
    accs = [g.acc for g in groups]
    se = statistics.stdev(accs) / math.sqrt(len(accs)) if len(accs) > 1 else float("nan")
    return {key: sum(accs) / len(accs), key + "_se": se, key + "_tasks": accs}


def paired_gain(before: list[float], after: list[float]) -> tuple[float, float]:
    """An eval's gain between two iterations on the same tasks: the mean of the per-task differences
    d_i = after_i - before_i and its standard error std(d)/√n. Pairing removes the spread between easy
    and hard tasks, which dominates the unpaired SE √(se_before² + se_after²) when few tasks are
    evaluated and the successes sit in a few of them."""
    if len(before) != len(after):
        raise ValueError(f"paired_gain: {len(before)} tasks before, {len(after)} after")
    d = [a - b for b, a in zip(before, after)]
    return statistics.fmean(d), statistics.stdev(d) / math.sqrt(len(d)) if len(d) > 1 else float("nan")


def gains(before: dict, row: dict) -> dict:
    """Every eval accuracy of `row` that `before` (the iteration-0 row) measured on the same tasks:
    `key`_gain and `key`_gain_se, its paired gain over iteration 0."""
    out = {}
    for k, after in row.items():
        if k.endswith("_tasks") and len(before.get(k, ())) == len(after):
            base = k.removesuffix("_tasks")
            out[base + "_gain"], out[base + "_gain_se"] = paired_gain(before[k], after)
    return out


def headline(key: str) -> bool:
    """An eval metric shown as a column: not a standard error, a per-task list or a gain."""
    return not key.endswith(("_se", "_tasks", "_gain"))


def defaults(name: str) -> dict:
    """A setting's own CPU defaults (its module's DEFAULTS): flags given on the command line win."""
    return getattr(importlib.import_module(REGISTRY[name]), "DEFAULTS", {}) if name in REGISTRY else {}


def reference(name: str) -> dict:
    """The released code's configuration of a setting (its module's REFERENCE), for --preset reference."""
    return getattr(importlib.import_module(REGISTRY[name]), "REFERENCE", {}) if name in REGISTRY else {}


def get(name: str, cfg):
    """The adapter for a task name."""
    if name not in REGISTRY:
        raise TaskError(f"unknown task {name!r}; choose from: {', '.join(sorted(REGISTRY))}")
    return importlib.import_module(REGISTRY[name]).Adapter(cfg)
