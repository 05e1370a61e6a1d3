"""Eq. 4 in motion: slots, pending rewrites decided by their fresh accuracy, state round trip."""
import json
import random

import environment as env
from tasks import Group, Rollout, Step, Task


def task(level):
    return Task(f"lad-{level}", f"problem {level}", {"tests": []}, ladder="lad", level=level, origin="original")


class LadderAdapter:
    """A plain-data adapter double: a 4-level ladder, no LLM, no sandbox."""

    def variant(self, t, direction):
        level = t.level + (1 if direction == "harder" else -1)
        return task(level) if 0 <= level <= 3 else None

    def feedback(self, group):
        return f"acc {group.acc}"


def group(t, wins, G=4):
    return Group(t, [Rollout(t.id, [Step("p", [1], "r", [2], verdicts=[-1, -1])], 1 if i < wins else -1)
                     for i in range(G)])


def test_harder_rewrite_proposed_then_accepted():
    slots = env.make_slots([task(1)])
    picked = env.pick_tasks(slots, 8, random.Random(0))
    assert [t.id for _, t in picked] == ["lad-1"]
    train, stats = env.update(slots, picked, [group(task(1), 4)], LadderAdapter(), "variants")
    assert len(train) == 1 and stats["proposed"] == 1
    slot = slots["lad-1"]
    assert slot.pending.id == "lad-2" and slot.pending_direction == "harder" and slot.pending_from_acc == 1.0
    picked = env.pick_tasks(slots, 8, random.Random(0))
    assert [t.id for _, t in picked] == ["lad-1", "lad-2"]          # active + the pending rewrite
    train, stats = env.update(slots, picked, [group(task(1), 4), group(task(2), 2)], LadderAdapter(), "variants")
    assert stats["accepted"] == 1 and len(train) == 2                # accepted: its rollouts join training
    assert slot.active.id == "lad-2" and slot.history == ["lad-2"] and slot.pending is None
    assert slot.acc == 0.5                                           # balanced now: nothing new proposed
    assert stats["proposed"] == 0


def test_rejected_rewrite_is_discarded_and_not_trained_on():
    slots = env.make_slots([task(1)])
    env.update(slots, [("lad-1", task(1))], [group(task(1), 0)], LadderAdapter(), "variants")
    assert slots["lad-1"].pending.id == "lad-0"
    picked = [("lad-1", task(1)), ("lad-1", task(0))]
    train, stats = env.update(slots, picked, [group(task(1), 0), group(task(0), 0)], LadderAdapter(), "variants")
    assert stats["rejected"] == 1 and [g.task.id for g in train] == ["lad-1"]
    assert slots["lad-1"].active.id == "lad-1"
    assert slots["lad-1"].pending.id == "lad-0"    # still at acc 0: proposed again


def test_top_of_ladder_has_no_proposal():
    slots = env.make_slots([task(3)])
    _, stats = env.update(slots, [("lad-3", task(3))], [group(task(3), 4)], LadderAdapter(), "variants")
    assert stats["proposed"] == 0 and stats["failed"] == 1 and slots["lad-3"].pending is None


def test_critic_feedback_has_high_risk_steps():
    text = env.critic_feedback(group(task(1), 1), LadderAdapter())
    assert text.startswith("acc 0.25") and "judged bad in every sample" in text


def test_slots_json_round_trip():
    slots = env.make_slots([task(1), Task("x", "p", {"a": 1})])
    env.update(slots, [("lad-1", task(1))], [group(task(1), 4)], LadderAdapter(), "variants")
    again = env.slots_from_json(json.loads(json.dumps(env.slots_to_json(slots))))
    assert again == slots
