"""The task interface and a registry by name (paper §4: the three settings, plus the maze and the example).

A setting is a module under tasks/ with an `Adapter` class that fulfils `Setting` (below), over the records
of records.py, and optionally module-level DEFAULTS (its CPU defaults for loop.Config fields) and REFERENCE
(the released code's values for the setting, applied over RELEASED_TRAINER by --preset reference). `get` builds
it and checks at start-up that it has every method the run will call (`check`), so a missing one is a one-line
error, not a crash iterations in.
The multi-turn settings share their episode runner, evaluation and feedback: tasks/agent.py. A worked
example: tasks/guess.py, and docs/ADDING_A_SETTING.md.
"""
from __future__ import annotations

import importlib
import math
import random
import statistics
from typing import Protocol

from plumbing import dist
from records import Group, Task
from reward_model import majority


class Setting(Protocol):
    """What the loop calls on a setting's adapter. `judge_kind` is "steps" (R judges each step, Eq. 3) or
    "tests" (R writes unit tests, coding); `rewrite_prefix`, optional, prefills E's answer in generate mode."""

    judge_kind: str

    def train_tasks(self) -> list[Task]:
        """The slots' original tasks."""

    def eval_sets(self) -> dict[str, list[Task]]:
        """e.g. {"in_domain": ..., "ood": ...}; under --validation {"validation": ...} (`chosen_sets`)."""

    def rollout(self, tasks: list[Task], G: int, engine, cfg, temperature: float | None = None,
                max_turns: int | None = None) -> list[Group]:
        """P plays G rollouts of each task (batched); the keywords override cfg's (evaluation)."""

    def judge(self, groups: list[Group], engine, cfg) -> None:
        """R fills step.verdicts and step.judgments (or group.tests, coding)."""

    def evaluate(self, sets: dict[str, list[Task]], policy, rm, cfg) -> dict:
        """The paper's Table 1 columns for this setting, per eval set."""

    def pop_timings(self) -> dict:
        """The seconds (and counts) the setting's own machinery took since the last call."""

    # — E (Eq. 4): `variants` mode needs `variant`, `generate` mode `rewrite_prompt` and `parse_rewrite` —
    def variant(self, task: Task, direction: str) -> Task | None:
        """The next easier / harder variant of a task, or None at the end of its ladder."""

    def rewrite_prompt(self, root: Task, active: Task, direction: str, feedback: str, acc: float | None = None) -> str:
        """E's prompt for a rewrite (acc: the active version's accuracy, None before it has one) ..."""

    def parse_rewrite(self, root: Task, text: str) -> Task | None:
        """... and the validation of E's answer: the new task, or None."""

    def feedback(self, group: Group) -> str:
        """Critic feedback for E about one group (or, optional, `summary_prompt(group, r, risky)`: E's prompt
        to summarize failed rollout r given R's high-risk steps; environment.critic_feedback)."""


# the methods a run calls, by what it runs: always, and E's per --env-mode
ALWAYS = ("train_tasks", "eval_sets", "rollout", "judge", "evaluate", "pop_timings")
FOR_E = {"variants": ("variant",), "generate": ("rewrite_prompt", "parse_rewrite", "feedback")}


def check(adapter, env_mode: str | None = None) -> None:
    """A TaskError naming the first method the run needs that the adapter lacks: `ALWAYS`, and with E in
    env_mode its `FOR_E` ones. A method marked abstract (tasks.agent's `start`, `policy_prompt`, `act`) and
    not overridden counts as missing."""
    def has(name):
        fn = getattr(type(adapter), name, None)
        return callable(fn) and not getattr(fn, "__isabstractmethod__", False)

    wanted = [*ALWAYS, *getattr(adapter, "required", ()), *FOR_E.get(env_mode or "", ())]
    missing = [name for name in wanted if not has(name)]
    if missing or getattr(adapter, "judge_kind", None) not in ("steps", "tests"):
        what = f"method {missing[0]}()" if missing else "judge_kind ('steps' or 'tests')"
        need = f", which --env-mode {env_mode} needs" if missing and missing[0] in FOR_E.get(env_mode or "", ()) else ""
        raise TaskError(f"{type(adapter).__module__}.{type(adapter).__name__} has no {what}{need} "
                        "(the interface: tasks.Setting, docs/ADDING_A_SETTING.md)")


class TaskError(Exception):
    """Bad task name or data file; the message is one line for the user."""


REGISTRY = {"livebench": "tasks.livebench", "alfworld": "tasks.alfworld", "osworld": "tasks.osworld",
            "maze": "tasks.maze", "guess": "tasks.guess"}


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

    def train_metrics(self, groups: list[Group]) -> dict:
        """A setting's own diagnostics of the groups P and R train on this iteration (after E's decisions),
        logged as train/<key> (coding: where R's signal goes); none by default."""
        return {}


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
    back by set: bigger batches are faster. Under torchrun each rank plays and judges its share of the
    tasks, and every rank gets every group back. eval set name → its groups."""
    names = [name for name, ts in sets.items() for _ in ts]
    mine = dist.shard_tasks([t for ts in sets.values() for t in ts])
    groups = adapter.rollout(mine, cfg.eval_samples, policy, cfg, temperature=cfg.eval_temperature,
                             max_turns=cfg.eval_max_turns or cfg.max_turns) if mine else []
    if rm is not None and groups:
        adapter.judge(groups, rm, cfg)
    groups = dist.unshard(groups)
    return {name: [g for g, n in zip(groups, names) if n == name] for name in sets}


def accuracy(key: str, groups: list[Group]) -> dict:
    """An eval set's accuracy, as metrics named after `key`: the mean over tasks of each task's accuracy
    (over its --eval-samples episodes), with `mean_se`'s standard error and per-task list."""
    return mean_se(key, [g.acc for g in groups])


def mean_se(key: str, per_task: list[float]) -> dict:
    """A per-task eval metric over a set: `key`, the mean over the tasks where it is defined (NaN marks one
    where it is not); `key`_se, std/√n over those tasks (the task is the unit that was sampled; NaN for fewer
    than two); `key`_tasks, every task's value in the set's fixed order, so that two iterations can be
    compared task by task (paired_gain).

        >>> mean_se("ut", [0.5, float("nan"), 1.0, 0.0])    # std of (0.5, 1, 0) = 0.5, over √3
        {'ut': 0.5, 'ut_se': 0.2886751345948129, 'ut_tasks': [0.5, nan, 1.0, 0.0]}
    """
    vals = [v for v in per_task if not math.isnan(v)]
    nan = float("nan")
    return {key: statistics.fmean(vals) if vals else nan,
            key + "_se": statistics.stdev(vals) / math.sqrt(len(vals)) if len(vals) > 1 else nan,
            key + "_tasks": list(per_task)}


def paired_gain(before: list[float], after: list[float]) -> tuple[float, float]:
    """An eval's gain between two iterations on the same tasks: the mean of the per-task differences
    d_i = after_i - before_i and its standard error std(d)/√n, over the tasks where the metric is defined
    at both (not NaN). Pairing removes the spread between easy and hard tasks, which dominates the unpaired
    SE √(se_before² + se_after²) when few tasks are evaluated and the successes sit in a few of them."""
    if len(before) != len(after):
        raise ValueError(f"paired_gain: {len(before)} tasks before, {len(after)} after")
    d = [a - b for b, a in zip(before, after) if not (math.isnan(a) or math.isnan(b))]
    nan = float("nan")
    return statistics.fmean(d) if d else nan, statistics.stdev(d) / math.sqrt(len(d)) if len(d) > 1 else nan


def process_counts(rollouts) -> list[int]:
    """[n₊, hits₊, n₋, hits₋]: R's judged steps per label and how many its majority verdict gets right (a tie
    misses), over judged rollouts: `agent_metrics` reads R's accuracies from them, and an eval keeps them per task
    for the standard errors below."""
    steps = [st for ro in rollouts for st in ro.steps if st.label is not None and st.verdicts]
    by_label = [[majority(st.verdicts) == st.label for st in steps if st.label == y] for y in (1, -1)]
    return [len(by_label[0]), sum(by_label[0]), len(by_label[1]), sum(by_label[1])]


def balanced(counts) -> float:
    """Balanced accuracy from `process_counts`: the mean hit rate of the labels present (NaN for none).

        >>> balanced([3, 1, 1, 1]), balanced([0, 0, 4, 2])   # (1/3 + 1) / 2; one label only: its hit rate
        (0.6666666666666666, 0.5)
    """
    rates = [hit / n for n, hit in (counts[:2], counts[2:]) if n]
    return sum(rates) / len(rates) if rates else float("nan")


def agent_metrics(rollouts) -> dict:
    """R's accuracies in agent settings (paper Table 1), over judged rollouts.

    Process Acc: share of labelled steps (±1) whose majority verdict equals the label; a tie counts as a miss.
    Outcome Acc: share of rollouts where the sign of the mean step score (the mean over steps of the mean verdict)
    equals the outcome; 0 counts as a miss. Not in the paper, to read Process Acc against: process_majority, the
    share of the more common label (what an R that always gives that verdict scores), and process_bacc, the mean
    of the per-label hit rates (`balanced`: 0.5 for such an R, whatever the label mix).
    """
    n_pos, hit_pos, n_neg, hit_neg = counts = process_counts(rollouts)
    scored = [ro for ro in rollouts if ro.steps and all(st.verdicts for st in ro.steps)]
    outcome_hits = 0
    for ro in scored:
        score = sum(sum(st.verdicts) / len(st.verdicts) for st in ro.steps) / len(ro.steps)
        outcome_hits += (score > 0) - (score < 0) == ro.outcome
    n, nan = n_pos + n_neg, float("nan")
    return {"process_acc": (hit_pos + hit_neg) / n if n else nan,
            "process_majority": max(n_pos, n_neg) / n if n else nan,
            "process_bacc": balanced(counts),
            "outcome_acc": outcome_hits / len(scored) if scored else nan}


def _bootstrap(n: int, draws: int, seed: int) -> list[list[int]]:
    """`draws` resamples, with replacement, of n task indices (a fixed seed: the same SE on every call)."""
    rng = random.Random(seed)
    return [[rng.randrange(n) for _ in range(n)] for _ in range(draws)]


def _pooled(counts) -> list[int]:
    return [sum(c[k] for c in counts) for k in range(4)]


def bacc_se(counts: list[list[int]], draws: int = 2000, seed: int = 0) -> float:
    """The standard error of an eval set's balanced Process Acc (`balanced` over the tasks' pooled
    `process_counts`), from a bootstrap over its tasks with labelled steps: a task's steps share its episodes, so
    the task is the unit that was sampled, as in `mean_se`. NaN for fewer than two such tasks."""
    have = [c for c in counts if c[0] + c[2]]
    if len(have) < 2:
        return float("nan")
    return statistics.stdev(balanced(_pooled([have[i] for i in pick])) for pick in _bootstrap(len(have), draws, seed))


def paired_bacc_gain(before: list[list[int]], after: list[list[int]], draws: int = 2000,
                     seed: int = 0) -> tuple[float, float]:
    """Balanced Process Acc's gain between two evals of the same tasks (per-task `process_counts`) and its
    standard error, from a paired bootstrap: each resample draws tasks and keeps both evals' counts of a task
    together, so the spread between easy and hard tasks cancels, as in `paired_gain`. Over the tasks with
    labelled steps at both evals; NaN SE for fewer than two."""
    if len(before) != len(after):
        raise ValueError(f"paired_bacc_gain: {len(before)} tasks before, {len(after)} after")
    both = [(b, a) for b, a in zip(before, after) if b[0] + b[2] and a[0] + a[2]]
    gain = balanced(_pooled([a for _, a in both])) - balanced(_pooled([b for b, _ in both]))
    if len(both) < 2:
        return gain, float("nan")
    return gain, statistics.stdev(balanced(_pooled([both[i][1] for i in pick])) -
                                  balanced(_pooled([both[i][0] for i in pick]))
                                  for pick in _bootstrap(len(both), draws, seed))


def gains(before: dict, row: dict) -> dict:
    """Every eval accuracy of `row` that `before` (the iteration-0 row) measured on the same tasks:
    `key`_gain and `key`_gain_se, its paired gain over iteration 0 (balanced Process Acc's from the per-task
    counts)."""
    out = {}
    for k, after in row.items():
        if k.endswith("/process_counts_tasks") and len(before.get(k, ())) == len(after):
            base = k.removesuffix("_counts_tasks") + "_bacc"
            out[base + "_gain"], out[base + "_gain_se"] = paired_bacc_gain(before[k], after)
        elif k.endswith("_tasks") and len(before.get(k, ())) == len(after):
            base = k.removesuffix("_tasks")
            out[base + "_gain"], out[base + "_gain_se"] = paired_gain(before[k], after)
    return out


def headline(key: str) -> bool:
    """An eval metric shown as a column: not a standard error, a per-task list, a gain or Theorem 1's
    quantities (reward_model.theorem1: a table of their own)."""
    return not key.endswith(("_se", "_tasks", "_gain")) and "thm1_" not in key


def defaults(name: str) -> dict:
    """A setting's own CPU defaults (its module's DEFAULTS): flags given on the command line win."""
    return getattr(importlib.import_module(REGISTRY[name]), "DEFAULTS", {}) if name in REGISTRY else {}


# The released code's trainer, the same in each of its settings: a new AdamW every iteration at a constant LR of
# 1e-6, no KL early stop, bf16 autocast, log-ratios clamped at ±10, and π_old always recomputed by the trainer.
RELEASED_TRAINER = {"lr": 1e-6, "rm_lr": 1e-6, "fresh_optimizer": True, "warmup_steps": 0, "target_kl": 0.0,
                    "train_amp": True, "log_ratio_clamp": 10.0, "sampler_old_kl": 0.0}


def reference(name: str) -> dict:
    """The released code's configuration of a setting, for --preset reference: its trainer (RELEASED_TRAINER),
    then the setting's own values (its module's REFERENCE)."""
    if name not in REGISTRY:
        return {}
    return {**RELEASED_TRAINER, **getattr(importlib.import_module(REGISTRY[name]), "REFERENCE", {})}


def get(name: str, cfg, env_mode: str | None = None) -> Setting:
    """The adapter for a task name, checked for every method the run needs (`check`; env_mode: E's mode
    when the run adapts the environment)."""
    if name not in REGISTRY:
        raise TaskError(f"unknown task {name!r}; choose from: {', '.join(sorted(REGISTRY))}")
    adapter = importlib.import_module(REGISTRY[name]).Adapter(cfg)
    check(adapter, env_mode)
    return adapter
