"""E, the environment model: task slots that get harder or easier from critic feedback (Eq. 4).
Paper §3.3, "Environment: adaptation from critic feedback".

Every original task is a *slot*: its original, its active version, the history of
accepted rewrites and at most one pending rewrite. After the rollouts of an
iteration, a slot whose active accuracy is ≥ α_high asks E for a harder version, one
with accuracy ≤ α_low for an easier one. A valid proposal is rolled out in the next
iteration and accepted only if its accuracy a′ moved the right way (Eq. 4):

    >>> direction(1.0), direction(0.5), direction(0.0)
    ('harder', None, 'easier')
    >>> accept("harder", 1.0, 0.5), accept("harder", 1.0, 0.0), accept("easier", 0.0, 0.25)
    (True, False, True)

Two ways to make a rewrite, one interface (`propose`):
  variants  the adapter's next easier/harder variant of the slot's ladder, all
            pre-verified. No LLM call: the step along the ladder is fixed, so critic
            feedback is not used. This is the reference code's OSWorld mechanism and
            suits small models.
  generate  E (a frozen LLM) writes a new task from the slot's root, its active
            version and the critic feedback; the adapter validates it (well-formed,
            solvable) and E retries up to `retries` times. The paper's mechanism.
"""
from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field

from llm import prefilled, render_chat
from tasks import Group, Task

ALPHA_LOW, ALPHA_HIGH = 0.2, 0.8


def direction(acc: float, low: float = ALPHA_LOW, high: float = ALPHA_HIGH) -> str | None:
    """Eq. 4 trigger: "harder" when acc ≥ high, "easier" when acc ≤ low, else None."""
    if acc >= high:
        return "harder"
    if acc <= low:
        return "easier"
    return None


def accept(direction: str, acc_prev: float, acc_new: float, low: float = ALPHA_LOW, high: float = ALPHA_HIGH) -> bool:
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
    """The iteration's tasks: n active versions, plus every pending rewrite (METHOD.md step 1)."""
    ids = sorted(slots)
    chosen = rng.sample(ids, min(n, len(ids)))
    return [(s, slots[s].active) for s in chosen] + [(s, slots[s].pending) for s in ids if slots[s].pending]


def high_risk_steps(group: Group, limit: int = 3) -> list[str]:
    """R's side of the critic feedback: steps where all m judgments were −1."""
    out = []
    for ro in group.rollouts:
        for k, st in enumerate(ro.steps):
            if st.verdicts and all(v == -1 for v in st.verdicts):
                out.append(f"step {k}: {st.response.strip()[:160]!r} → {st.observation.strip()[:160]!r}")
    return out[:limit]


def critic_feedback(group: Group, adapter) -> str:
    """What E is told about a slot: the adapter's failure summaries (and coding test pass rates) + R's high-risk steps."""
    parts = [adapter.feedback(group)]
    risky = high_risk_steps(group)
    if risky:
        parts.append("Steps the reward model judged bad in every sample:\n" + "\n".join(risky))
    return "\n".join(p for p in parts if p)


def propose(requests: list[tuple[Slot, str, str]], adapter, mode: str, engine=None, *, retries: int = 4,
            temperature: float = 1.0, max_new_tokens: int = 768) -> list[tuple[Task | None, int]]:
    """One proposal per (slot, direction, feedback): (task or None, tries used).

    generate mode: E's N = `retries` tries for every request are sampled in ONE generate call
    (n = N per prompt), then checked in order; the first valid one is the proposal and the tries
    used are its position. Same result as N sequential rounds, but one decode pass: at the small
    batches E works at, a decode step costs about the same for 4 rows as for 16.
    """
    if mode == "variants":
        return [(adapter.variant(slot.active, d), 0) for slot, d, _ in requests]
    if mode != "generate":
        raise ValueError(f"unknown environment mode {mode!r}")
    prompts = [render_chat(engine.tokenizer, adapter.rewrite_prompt(slot.root, slot.active, d, feedback))
               for slot, d, feedback in requests]
    outs = prefilled(engine, prompts, getattr(adapter, "rewrite_prefix", ""), n=retries, temperature=temperature,
                     top_p=0.95, max_new_tokens=max_new_tokens, desc="E proposes")
    result = []
    for (slot, _, _), tries in zip(requests, outs):
        for attempt, out in enumerate(tries, start=1):
            task = adapter.parse_rewrite(slot.root, out.text)
            if task is not None:
                break
        result.append((task, attempt))
    return result


def update(slots: dict[str, Slot], picked: list[tuple[str, Task]], groups: list[Group], adapter, mode: str,
           engine=None, *, low: float = ALPHA_LOW, high: float = ALPHA_HIGH, retries: int = 4,
           max_new_tokens: int = 768, iteration: int = 0) -> tuple[list[Group], dict]:
    """METHOD.md step 4: decide the pending rewrites from their fresh accuracy, then propose new
    rewrites for slots outside [low, high]. Returns the groups that join this iteration's
    training data (active versions + accepted rewrites) and counts for the log."""
    stats = {"accepted": 0, "rejected": 0, "proposed": 0, "failed": 0, "e_tries": 0}
    train, latest = [], {}
    for (sid, task), g in zip(picked, groups):
        slot = slots[sid]
        if slot.pending is not None and task.id == slot.pending.id:
            if accept(slot.pending_direction, slot.pending_from_acc, g.acc, low, high):
                slot.active, slot.acc = task, g.acc
                slot.history.append(task.id)
                train.append(g)
                latest[sid] = g
                stats["accepted"] += 1
            else:
                stats["rejected"] += 1
            slot.pending = slot.pending_direction = slot.pending_from_acc = None
        else:
            slot.acc = g.acc
            train.append(g)
            latest.setdefault(sid, g)
    requests = []
    for sid, g in latest.items():
        d = direction(slots[sid].acc, low, high)
        if d and slots[sid].pending is None:
            requests.append((slots[sid], d, critic_feedback(g, adapter)))
    for (slot, d, _), (task, tries) in zip(requests, propose(requests, adapter, mode, engine, retries=retries,
                                                                      max_new_tokens=max_new_tokens)):
        stats["e_tries"] += tries
        if task is None:
            stats["failed"] += 1
            continue
        if mode == "generate":
            task.id = f"{slot.root.id}~gen{iteration}"
        slot.pending, slot.pending_direction, slot.pending_from_acc = task, d, slot.acc
        stats["proposed"] += 1
    return train, stats


def slots_to_json(slots: dict[str, Slot]) -> dict:
    return {sid: asdict(s) for sid, s in slots.items()}


def slots_from_json(data: dict) -> dict[str, Slot]:
    def task(d):
        return Task(**d) if d else None
    return {sid: Slot(**{**s, "root": task(s["root"]), "active": task(s["active"]), "pending": task(s["pending"])})
            for sid, s in data.items()}
