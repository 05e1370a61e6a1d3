"""Eq. 4 in motion: slots, pending rewrites decided by their fresh accuracy, state round trip."""
import json
import random

import environment as env
from records import Group, Rollout, Sampling, Step, Task


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


def update(slots, picked, groups):
    """One iteration of E in variants mode, as loop.train runs it: decide, then propose."""
    train, asking, stats = env.decide(slots, picked, groups, low=0.2, high=0.8)
    return train, stats | env.propose_rewrites(asking, LadderAdapter(), "variants", retries=4, iteration=1)


def test_harder_rewrite_proposed_then_accepted():
    slots = env.make_slots([task(1)])
    picked = env.pick_tasks(slots, 8, random.Random(0))
    assert [t.id for _, t in picked] == ["lad-1"]
    train, stats = update(slots, picked, [group(task(1), 4)])
    assert len(train) == 1 and stats["proposed"] == 1
    slot = slots["lad-1"]
    assert slot.pending.id == "lad-2" and slot.pending_direction == "harder" and slot.pending_from_acc == 1.0
    picked = env.pick_tasks(slots, 8, random.Random(0))
    assert [t.id for _, t in picked] == ["lad-2"]                   # the pending rewrite only, not also the active
    train, stats = update(slots, picked, [group(task(2), 2)])
    assert stats["accepted"] == 1 and len(train) == 1                # accepted: its rollouts join training
    assert slot.active.id == "lad-2" and slot.history == ["lad-2"] and slot.pending is None
    assert slot.acc == 0.5 and stats["proposed"] == 0


def test_pending_slot_is_not_also_active_and_gets_no_proposal_when_decided():
    """Released code (sample/alfworld_rl_rollout.py, candidate_slots / pend_slots): a slot with a pending
    rewrite is not sampled as an active task, and the iteration that decides it proposes nothing new
    for it, even when the decided version sits outside [α_low, α_high]."""
    slots = env.make_slots([task(1), Task("other", "p", {}, origin="original")])
    update(slots, [("lad-1", task(1))], [group(task(1), 4)])
    for seed in range(20):                                           # any draw: lad-1 only as its pending rewrite
        picked = env.pick_tasks(slots, 2, random.Random(seed))
        assert [(sid, t.id) for sid, t in picked if sid == "lad-1"] == [("lad-1", "lad-2")]
    # the harder rewrite is solved every time (a′ = 1 is not < a = 1): rejected, and no new proposal now
    train, stats = update(slots, [("lad-1", task(2))], [group(task(2), 4)])
    assert (stats["rejected"], stats["proposed"], train) == (1, 0, [])
    assert slots["lad-1"].pending is None and slots["lad-1"].active.id == "lad-1"
    # the next iteration rolls out the active version again, and proposes from it
    _, stats = update(slots, [("lad-1", task(1))], [group(task(1), 4)])
    assert stats["proposed"] == 1 and slots["lad-1"].pending.id == "lad-2"


def test_rejected_rewrite_is_discarded_and_not_trained_on():
    slots = env.make_slots([task(1)])
    update(slots, [("lad-1", task(1))], [group(task(1), 0)])
    assert slots["lad-1"].pending.id == "lad-0"
    train, stats = update(slots, [("lad-1", task(0))], [group(task(0), 0)])
    assert stats["rejected"] == 1 and train == []
    assert slots["lad-1"].active.id == "lad-1" and slots["lad-1"].pending is None


def test_top_of_ladder_has_no_proposal():
    slots = env.make_slots([task(3)])
    _, stats = update(slots, [("lad-3", task(3))], [group(task(3), 4)])
    assert stats["proposed"] == 0 and stats["failed"] == 1 and slots["lad-3"].pending is None


def test_high_risk_steps_come_from_failed_rollouts_only():
    g = group(task(1), 1)                                            # rollout 0 won, 1-3 failed; all steps −1, −1
    assert env.high_risk_steps(g) == [(1, [0]), (2, [0]), (3, [0])]
    [text] = env.critic_feedback([g], LadderAdapter())
    assert text.startswith("acc 0.25") and "judged bad in every sample" in text and "rollout 0" not in text
    assert env.high_risk_steps(group(task(1), 4)) == []              # no failed rollout: no high-risk step


class SummaryAdapter(LadderAdapter):
    """An adapter whose E summarizes failed rollouts first (as ALFWorld's does)."""

    def summary_prompt(self, g, r, risky):
        return f"summarize rollout {r}, risky {risky}"


def test_e_summarizes_each_failed_rollout_with_its_high_risk_steps():
    from tests.test_livebench import ScriptedEngine
    e = ScriptedEngine(["It looped. It never opened the fridge. Third sentence.}", "}", "Wrong room"])  # after "\\boxed{"
    g = group(task(1), 1)
    [text] = env.critic_feedback([g], SummaryAdapter(), e, Sampling(0.8, 0.95, 64))
    assert e.calls == 1                                              # one batched call for all summaries
    assert text.splitlines() == ["- Rollout 1: It looped. It never opened the fridge.",
                                 "- Rollout 2: (no summary)", "- Rollout 3: Wrong room"]
    assert e.prompts == [f"summarize rollout {r}, risky [0]\\boxed{{" for r in (1, 2, 3)]


def test_slots_json_round_trip():
    slots = env.make_slots([task(1), Task("x", "p", {"a": 1})])
    update(slots, [("lad-1", task(1))], [group(task(1), 4)])
    again = env.slots_from_json(json.loads(json.dumps(env.slots_to_json(slots))))
    assert again == slots
