"""The task interface and a registry by name (paper §4: the three settings).

The records below are plain data; the loop owns them and the modules are
functions over them. An adapter (one per setting) provides:

    train_tasks() -> list[Task]                     the slots' original tasks
    eval_sets() -> dict[str, list[Task]]            e.g. {"in_domain": ..., "ood": ...}
    rollout(tasks, G, engine, cfg, temperature=None, max_turns=None) -> list[Group]
                                                    P plays G rollouts of each task (batched); the
                                                    keywords override cfg's (evaluation)
    judge(groups, engine, cfg) -> None              R fills step.verdicts / step.judgments / group.tests
    evaluate(sets, policy, rm, cfg) -> dict         the paper's Table 1 columns for this setting
    variant(task, direction) -> Task | None         `variants` mode of E: the next easier/harder variant
    rewrite_prompt(root, active, direction, feedback, acc) -> str, parse_rewrite(root, text) -> Task | None
                                                    `generate` mode of E: E's prompt, and validation
    feedback(group) -> str                          critic feedback for E (Eq. 4), or instead
    summary_prompt(group, r, risky) -> str          (optional) E's prompt to summarize failed rollout r
                                                    given R's high-risk steps; the summaries are then
                                                    the feedback (environment.critic_feedback)
    judge_kind: "steps" (R judges each step, Eq. 3) or "tests" (R writes unit tests, coding)
    DEFAULTS (module level, optional): the setting's CPU defaults for loop.Config fields
    REFERENCE (module level, optional): the released code's values, for --preset reference
    timings: dict                                   the loop's per-iteration timings; the adapter adds
                                                    its environment's share (sandbox, engine, browser)
"""
from __future__ import annotations

import importlib
import math
import random
import re
import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

from llm import Completion, prefilled


@dataclass
class Task:
    id: str
    prompt: str                    # what the policy is asked (problem statement, goal, ...)
    data: dict                     # what the checker needs (tests, reference solution, scene, ...)
    ladder: str | None = None      # variants of one task, easy → hard (E's `variants` mode)
    level: int | None = None
    origin: str | None = None      # how it came to be: "original", "variant", "generated"


@dataclass
class Step:
    """One policy step; also one training sample of its own."""
    prompt: str
    prompt_ids: list[int]
    response: str
    response_ids: list[int]
    observation: str = ""                                     # what the environment answered
    verdicts: list[int] = field(default_factory=list)         # S_{τ_i,j} ∈ {+1, −1, 0}, j = 1..m
    judgments: list[Completion] = field(default_factory=list)  # R's m outputs for this step (agent tasks)
    reward: float = 0.0                                       # R_{τ_i}, Eq. 1
    advantage: float = 0.0                                    # Eq. 2
    label: int | None = None                                  # ground-truth step quality, where known


@dataclass
class Rollout:
    task_id: str
    steps: list[Step]
    outcome: int          # O_τ ∈ {+1, −1}
    score: float = 0.0    # a graded outcome where the setting has one (coding: share of GT tests passed)
    info: dict = field(default_factory=dict)


@dataclass
class Group:
    """The G rollouts of one task in one iteration, plus R's task-level outputs (coding: tests)."""
    task: Task
    rollouts: list[Rollout]
    tests: list[Completion] = field(default_factory=list)       # coding: R's m generated tests
    test_passes: list[list[bool]] = field(default_factory=list)  # coding: [program i][test k]

    @property
    def acc(self) -> float:
        return sum(r.outcome > 0 for r in self.rollouts) / max(len(self.rollouts), 1)


@contextmanager
def stage(timings: dict, name: str):
    """Adds the seconds spent inside the block to timings["time/<name>"]."""
    t0 = time.perf_counter()
    yield
    timings[f"time/{name}"] = timings.get(f"time/{name}", 0.0) + time.perf_counter() - t0


class TaskError(Exception):
    """Bad task name or data file; the message is one line for the user."""


REGISTRY = {"livebench": "tasks.livebench", "alfworld": "tasks.alfworld", "osworld": "tasks.osworld",
            "maze": "tasks.maze"}


def eval_groups(adapter, sets: dict[str, list[Task]], policy, rm, cfg) -> dict[str, list[Group]]:
    """Every eval set played in ONE rollout call (and judged in one call when R is given), then split
    back by set: bigger batches are faster. eval set name → its groups."""
    names = [name for name, ts in sets.items() for _ in ts]
    groups = adapter.rollout([t for ts in sets.values() for t in ts], cfg.eval_samples, policy, cfg,
                             temperature=cfg.eval_temperature, max_turns=cfg.eval_max_turns or cfg.max_turns)
    if rm is not None:
        adapter.judge(groups, rm, cfg)
    return {name: [g for g, n in zip(groups, names) if n == name] for name in sets}


def accuracy(groups: list[Group]) -> tuple[float, float]:
    """An eval set's accuracy and its standard error: the mean over tasks of each task's accuracy
    (over its --eval-samples episodes), and std/√n over tasks (the task is the unit that was sampled;
    nan for a single task)."""
    accs = [g.acc for g in groups]
    se = statistics.stdev(accs) / math.sqrt(len(accs)) if len(accs) > 1 else float("nan")
    return sum(accs) / len(accs), se


def eval_subsets(splits: dict[str, list[Task]], n: int, seed: int) -> dict[str, list[Task]]:
    """Every non-empty split but "train" as an eval set, cut to a fixed random subset of n tasks (0: all)."""
    return {name: (random.Random(seed).sample(ts, n) if 0 < n < len(ts) else ts)
            for name, ts in splits.items() if name != "train" and ts}


ANSWER_PREFIX = "\\boxed{"   # the agent settings prefill P's answer with it: a 135M model otherwise rarely boxes one
_BOXED_INT = re.compile(r"\\boxed\{\s*(\d+)\s*\}")


def parse_choice(text: str, n: int) -> int | None:
    """The 1-based index in the last \\boxed{k} of an answer, if 1 <= k <= n (a numbered-menu action)."""
    found = _BOXED_INT.findall(text)
    return int(found[-1]) if found and 1 <= int(found[-1]) <= n else None


def play_turns(episodes: list, over, prompt_of, act_all, engine, cfg, temperature: float | None,
               max_turns: int) -> None:
    """Batched multi-turn play (agent settings): at every turn ONE generate call serves every live
    episode (those not `over` and under max_turns steps), its answer prefilled with ANSWER_PREFIX;
    then `act_all([(episode, prompt + prefix, completion)])` applies the answers."""
    for _ in range(max_turns):
        live = [ep for ep in episodes if not over(ep) and len(ep.steps) < max_turns]
        if not live:
            return
        prompts = [prompt_of(ep, engine.tokenizer) for ep in live]
        outs = prefilled(engine, prompts, ANSWER_PREFIX, n=1, max_new_tokens=cfg.max_new_tokens, top_p=cfg.top_p,
                         temperature=cfg.temperature if temperature is None else temperature)
        act_all([(ep, p + ANSWER_PREFIX, c) for ep, p, (c,) in zip(live, prompts, outs)])


def agent_results(played: dict[str, list[Group]], rm, process: bool = True) -> dict:
    """The Table 1 columns of an agent setting, per eval set: success (± its standard error), and with
    R its Outcome Acc, and its Process Acc where steps carry ground-truth labels (with the two
    references of reward_model.agent_metrics: the majority label's share and the balanced accuracy)."""
    from reward_model import agent_metrics
    out = {}
    for name, mine in played.items():
        out[f"{name}/success"], out[f"{name}/success_se"] = accuracy(mine)
        if rm is not None:
            m = agent_metrics([ro for g in mine for ro in g.rollouts])
            if process:
                out |= {f"{name}/{k}": m[k] for k in ("process_acc", "process_majority", "process_bacc")}
            out[f"{name}/outcome_acc"] = m["outcome_acc"]
    return out


def judge_steps(groups: list[Group], engine, cfg, prefix: str = "") -> None:
    """R judges every step of every rollout m times (agent settings), in one batched call: each step's
    judge prompt is in rollout.info["judge_prompts"]; `prefix` starts R's answer (the maze setting has
    R answer its verdict straight away). Fills step.judgments and step.verdicts."""
    from llm import render_chat
    from reward_model import parse_verdict

    steps = [(st, p) for g in groups for ro in g.rollouts for st, p in zip(ro.steps, ro.info["judge_prompts"])]
    outs = prefilled(engine, [render_chat(engine.tokenizer, p) for _, p in steps], prefix, n=cfg.m,
                     temperature=cfg.rm_temperature, top_p=cfg.rm_top_p, max_new_tokens=cfg.rm_max_new_tokens)
    for (st, _), judgments in zip(steps, outs):
        st.judgments = judgments
        st.verdicts = [parse_verdict(c.text) for c in judgments]  # S_{τ_i,j} ∈ {+1, −1, 0}


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
