"""E, the environment model: task slots that get harder or easier from critic feedback (Eq. 4).
Paper §3.3, "Environment: adaptation from critic feedback".

Every original task is a *slot*: its original, its active version, the history of
accepted rewrites and at most one pending rewrite. After the rollouts of an
iteration, a slot whose active accuracy is ≥ α_high asks E for a harder version, one
with accuracy ≤ α_low for an easier one. A valid proposal is rolled out in the next
iteration and accepted only if its accuracy a′ moved the right way (Eq. 4):

    >>> band = dict(low=0.2, high=0.8)                      # α_low, α_high (--alpha-low, --alpha-high)
    >>> direction(1.0, **band), direction(0.5, **band), direction(0.0, **band)
    ('harder', None, 'easier')
    >>> accept("harder", 1.0, 0.5, **band), accept("harder", 1.0, 0.0, **band), accept("easier", 0.0, 0.25, **band)
    (True, False, True)

Two ways to make a rewrite, one interface (`propose`):
  variants  the adapter's next easier/harder variant of the slot's ladder, all
            pre-verified. No LLM call: the step along the ladder is fixed, so critic
            feedback is not used. This project's stand-in for small models, not a
            mechanism of the paper or the released code.
  generate  E (a frozen LLM) writes a new task from the slot's root, its active
            version, its accuracy and the critic feedback; the adapter validates it
            (well-formed, solvable) and E retries up to `retries` times. The paper's
            and the released code's mechanism in all three settings.

Critic feedback (`critic_feedback`): what the policy's failed rollouts show, and R's
high-risk steps, the steps of failed rollouts that all m judgments called bad.
"""
from __future__ import annotations

import random
import re
from dataclasses import asdict, dataclass, field, replace
from typing import NamedTuple

from plumbing.engines import ANSWER_PREFIX, last_boxed, prefilled, render_chat
from records import Group, Sampling, Task

SUMMARY_MAX_NEW_TOKENS = 96  # E's failure summaries (CPU scale; the released E writes up to 8192 tokens, reasoning included)


def direction(acc: float, low: float, high: float) -> str | None:
    """Eq. 4 trigger: "harder" when acc ≥ high, "easier" when acc ≤ low, else None."""
    if acc >= high:
        return "harder"
    if acc <= low:
        return "easier"
    return None


def accept(direction: str, acc_prev: float, acc_new: float, low: float, high: float) -> bool:
    """Eq. 4 acceptance of a rewrite with accuracy acc_new, proposed when the active version had acc_prev.
    harder: 0 < a′ < a and a′ ≥ α_low.  easier: 0 < a′, a′ > a and a′ ≤ α_high."""
    if direction == "harder":
        return 0 < acc_new < acc_prev and acc_new >= low   # Eq. 4, harder
    if direction == "easier":
        return 0 < acc_new and acc_new > acc_prev and acc_new <= high  # Eq. 4, easier
    raise ValueError(f"direction must be 'harder' or 'easier', not {direction!r}")


@dataclass
class Slot:
    root: Task
    active: Task
    history: list[str] = field(default_factory=list)  # ids of accepted rewrites, oldest first
    pending: Task | None = None
    pending_direction: str | None = None
    pending_from_acc: float | None = None               # a: the active accuracy when it was proposed
    acc: float | None = None                            # the active version's accuracy at its last rollout


def make_slots(tasks: list[Task]) -> dict[str, Slot]:
    return {t.id: Slot(root=t, active=t) for t in tasks}


def pick_tasks(slots: dict[str, Slot], n: int, rng: random.Random) -> list[tuple[str, Task]]:
    """The iteration's tasks (docs/METHOD.md, step 1): n active versions drawn from the slots with no pending
    rewrite, plus every pending rewrite. A slot is never rolled out as both in one iteration (released
    code: `candidate_slots` excludes `pend_slots`)."""
    free = sorted(sid for sid, slot in slots.items() if slot.pending is None)
    chosen = rng.sample(free, min(n, len(free)))
    return [(s, slots[s].active) for s in chosen] + [(s, slots[s].pending) for s in sorted(slots) if slots[s].pending]


def high_risk_steps(group: Group) -> list[tuple[int, list[int]]]:
    """R's side of the critic feedback: for each FAILED rollout of the group, the indices of the steps
    where all m judgments were −1. [(rollout index, [step indices])], failed rollouts only."""
    return [(r, [k for k, st in enumerate(ro.steps) if st.verdicts and all(v == -1 for v in st.verdicts)])
            for r, ro in enumerate(group.rollouts) if ro.outcome < 0]


def _risky_text(group: Group, limit: int = 3) -> str:
    lines = [f"rollout {r} step {k}: {group.rollouts[r].steps[k].response.strip()[:160]!r} → "
             f"{group.rollouts[r].steps[k].observation.strip()[:160]!r}"
             for r, ks in high_risk_steps(group) for k in ks][:limit]
    return "Steps of failed rollouts the reward model judged bad in every sample:\n" + "\n".join(lines) if lines else ""


def critic_feedback(groups: list[Group], adapter, engine=None, sampling: Sampling | None = None) -> list[str]:
    """What E is told about each group's task (Eq. 4's critic feedback), one text per group.

    Adapters with `summary_prompt` (ALFWorld): E first summarizes each failed rollout in at most two
    sentences (E's `sampling`, at most SUMMARY_MAX_NEW_TOKENS), from its trajectory and R's high-risk
    step indices, all in ONE generate call; the
    feedback is those summaries. Otherwise: the adapter's `feedback(group)` (coding: GT and generated
    tests with their pass rates) plus R's high-risk steps of failed rollouts.
    """
    if engine is None or not hasattr(adapter, "summary_prompt"):
        return ["\n".join(p for p in (adapter.feedback(g), _risky_text(g)) if p) for g in groups]
    jobs = [(i, r, adapter.summary_prompt(g, r, steps)) for i, g in enumerate(groups) for r, steps in high_risk_steps(g)]
    summary = replace(sampling, max_new_tokens=SUMMARY_MAX_NEW_TOKENS)
    outs = prefilled(engine, [render_chat(engine.tokenizer, p) for _, _, p in jobs], ANSWER_PREFIX, n=1,
                     **asdict(summary), desc="E summarizes")
    lines = [[] for _ in groups]
    for (i, r, _), (c,) in zip(jobs, outs):
        lines[i].append(f"- Rollout {r}: {boxed_text(c.text) or '(no summary)'}")
    return ["\n".join(ls) or f"all {len(g.rollouts)} rollouts succeeded" for g, ls in zip(groups, lines)]


def boxed_text(text: str, limit: int = 400) -> str:
    """The content of the last \\boxed{...} (an unclosed last box runs to the end), at most two sentences."""
    body = last_boxed(text, closed=False) or ""
    sentences = re.split(r"(?<=[.!?])\s+", " ".join(body.split()))
    return " ".join(sentences[:2])[:limit]


def propose(requests: list[tuple[Slot, str, str]], adapter, mode: str, engine=None, sampling: Sampling | None = None,
            *, retries: int) -> list[tuple[Task | None, int]]:
    """One proposal per (slot, direction, feedback): (task or None, tries used).

    generate mode: E's N = `retries` tries for every request are sampled in ONE generate call
    (n = N per prompt), then checked in order; the first valid one is the proposal and the tries
    used are its position. Same result as N sequential rounds, in one decode pass.
    """
    if mode == "variants":
        return [(adapter.variant(slot.active, d), 0) for slot, d, _ in requests]
    if mode != "generate":
        raise ValueError(f"unknown environment mode {mode!r}")
    prompts = [render_chat(engine.tokenizer, adapter.rewrite_prompt(slot.root, slot.active, d, feedback, slot.acc))
               for slot, d, feedback in requests]
    outs = prefilled(engine, prompts, getattr(adapter, "rewrite_prefix", ""), n=retries, **asdict(sampling),
                     desc="E proposes")
    result = []
    for (slot, _, _), tries in zip(requests, outs):
        for attempt, out in enumerate(tries, start=1):
            task = adapter.parse_rewrite(slot.root, out.text)
            if task is not None:
                break
        result.append((task, attempt))
    return result


class Decision(NamedTuple):
    """What E decided this iteration (`decide`)."""
    train: list[Group]                     # the groups that train: active versions + accepted rewrites
    asking: list[tuple[Slot, str, Group]]  # the slots that ask E for a rewrite: (slot, "harder" | "easier", group)
    stats: dict   # counts, and claim 3's accepted_acc (mean a′ accepted now), rewritten_acc (of earlier rewrites)


def decide(slots: dict[str, Slot], picked: list[tuple[str, Task]], groups: list[Group], *, low: float,
           high: float) -> Decision:
    """docs/METHOD.md, step 4a: Eq. 4 for the pending rewrites rolled out this iteration, from their fresh
    accuracy, and Eq. 4's trigger for the active versions. A slot whose pending rewrite is decided now asks
    for nothing until the next iteration (released code)."""
    stats = {"accepted": 0, "rejected": 0}
    train, asking, accepted_accs, rewritten_accs = [], [], [], []
    for (sid, task), g in zip(picked, groups):
        slot = slots[sid]
        if slot.pending is not None and task.id == slot.pending.id:
            if accept(slot.pending_direction, slot.pending_from_acc, g.acc, low, high):
                slot.active, slot.acc = task, g.acc
                slot.history.append(task.id)
                train.append(g)
                stats["accepted"] += 1
                accepted_accs.append(g.acc)
            else:
                stats["rejected"] += 1
            slot.pending = slot.pending_direction = slot.pending_from_acc = None
        else:
            slot.acc = g.acc
            train.append(g)
            if slot.history:
                rewritten_accs.append(g.acc)
            if d := direction(g.acc, low, high):
                asking.append((slot, d, g))
    stats["accepted_acc"], stats["rewritten_acc"] = _mean(accepted_accs), _mean(rewritten_accs)
    return Decision(train, asking, stats)


def propose_rewrites(asking: list[tuple[Slot, str, Group]], adapter, mode: str, engine=None,
                     sampling: Sampling | None = None, *, retries: int, iteration: int) -> dict:
    """docs/METHOD.md, step 4b: for each slot that asks (`decide`), E's rewrite from the critic feedback
    on its group; a valid one becomes the slot's pending rewrite, rolled out in the next iteration.
    engine and sampling: E's, in generate mode. Returns counts for the log: proposed, failed (no valid
    rewrite in `retries` tries) and e_tries (the tries used)."""
    stats = {"proposed": 0, "failed": 0, "e_tries": 0}
    feedback = (critic_feedback([g for _, _, g in asking], adapter, engine, sampling)
                if mode == "generate" else [""] * len(asking))  # variants mode reads no feedback
    requests = [(slot, d, fb) for (slot, d, _), fb in zip(asking, feedback)]
    for (slot, d, _), (task, tries) in zip(requests, propose(requests, adapter, mode, engine, sampling, retries=retries)):
        stats["e_tries"] += tries
        if task is None:
            stats["failed"] += 1
            continue
        if mode == "generate":
            task.id = f"{slot.root.id}~gen{iteration}"
        slot.pending, slot.pending_direction, slot.pending_from_acc = task, d, slot.acc
        stats["proposed"] += 1
    return stats


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def slots_to_json(slots: dict[str, Slot]) -> dict:
    return {sid: asdict(s) for sid, s in slots.items()}


def slots_from_json(data: dict) -> dict[str, Slot]:
    def task(d):
        return Task(**d) if d else None
    return {sid: Slot(**{**s, "root": task(s["root"]), "active": task(s["active"]), "pending": task(s["pending"])})
            for sid, s in data.items()}
