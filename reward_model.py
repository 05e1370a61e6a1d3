"""R, the generative reward model, and its consistency feedback (Eq. 3).
Paper §3.2, "Reward model: consistency feedback", and §4.2 for the coding setting.

R is an LLM. In agent settings it reads one policy step and writes a short reasoning
ending in \\boxed{1} (good step) or \\boxed{-1} (bad step), m times per step. In the
coding setting it writes unit tests instead (one test per sample). Either way it is
trained with the same PPO loss as P (Eq. 5) on its whole output, with a reward that
measures how consistent each judgment is with the outcome and its siblings:

    >>> consistency_rewards(-0.5, [1, 0])     # docs/METHOD.md worked example, step B·1
    [1.0, -1.0]
    >>> test_writer_rewards([True, False], [[True, True], [False, True]])
    [1.0, -1.0]
"""
from __future__ import annotations

import re

from engines import boxed, prefilled, render_chat
from policy import zscore
from records import Group, Sample

RM_ACC_RANGE = (0.2, 0.8)  # only tasks with acc in this range feed reward-model training (Eq. 3)
UNPARSEABLE_REWARD = -2.0  # Eq. 3 reward of a judgment with no valid verdict

_TEST = re.compile(r"input[^\n\w]*\s*(?:```[^\n`]*\n(?P<fin>.*?)```|(?P<pin>.*?))\s*"
                   r"(?:\*\*|#+\s*)?(?:expected\s+)?output[^\n\w]*\s*(?:```[^\n`]*\n(?P<fout>.*?)```|(?P<pout>[^\n]*))",
                   re.DOTALL | re.IGNORECASE)

def parse_verdict(text: str) -> int:
    """+1 or −1 when the text holds exactly one \\boxed{} and it is 1, +1 or −1; else 0."""
    boxes = boxed(text)
    if len(boxes) != 1:
        return 0
    return {"1": 1, "+1": 1, "-1": -1}.get(boxes[0].strip(), 0)


def judge_steps(groups: list[Group], engine, cfg, prefix: str = "") -> None:
    """R judges every step of every rollout m times (agent settings), in one batched call: each step's
    `judge_prompt` is what R reads; `prefix` starts R's answer (the maze setting has R answer its
    verdict straight away). Fills step.judgments and step.verdicts."""
    steps = [st for g in groups for ro in g.rollouts for st in ro.steps]
    outs = prefilled(engine, [render_chat(engine.tokenizer, st.judge_prompt) for st in steps], prefix, n=cfg.m,
                     temperature=cfg.rm_temperature, top_p=cfg.rm_top_p, max_new_tokens=cfg.rm_max_new_tokens)
    for st, judgments in zip(steps, outs):
        st.judgments = judgments
        st.verdicts = [parse_verdict(c.text) for c in judgments]  # S_{τ_i,j} ∈ {+1, −1, 0}


def consistency_rewards(step_reward: float, verdicts: list[int]) -> list[float] | None:
    """Eq. 3 for one step: R_{S_j} = R_{τ_i} · S_j (−2 when S_j is unparseable), z-scored over the m
    judgments. None when all m raw rewards are equal (the step is skipped)."""
    raw = [step_reward * s if s != 0 else UNPARSEABLE_REWARD for s in verdicts]  # Eq. 3
    return zscore(raw)


def test_writer_rewards(gt_pass: list[bool], passes: list[list[bool]]) -> list[float] | None:
    """The coding reward of R's m generated tests (docs/METHOD.md, "coding R reward"), z-scored over the tests.

    gt_pass[i]: program i passes every ground-truth test (a "GT code").
    passes[i][k]: program i passes generated test k.
    Test k is correct iff every GT code passes it. Correct: +#(non-GT codes failing it);
    incorrect: −#(non-GT codes passing it); with no non-GT code: ±1.
    None when no program is a GT code, or when all rewards are equal.
    """
    gt = [i for i, ok in enumerate(gt_pass) if ok]
    if not gt:
        return None
    others = [i for i, ok in enumerate(gt_pass) if not ok]
    raw = []
    for k in range(len(passes[0]) if passes else 0):
        correct = all(passes[i][k] for i in gt)
        if not others:
            raw.append(1.0 if correct else -1.0)
        elif correct:
            raw.append(float(sum(not passes[i][k] for i in others)))
        else:
            raw.append(-float(sum(passes[i][k] for i in others)))
    return zscore(raw) if raw else None


def parse_test(text: str) -> tuple[str, str] | None:
    """R's generated test → (stdin, expected stdout), from the first "Input: … Output: …" pair, each
    part fenced or inline (a fenced output may span lines, an inline one is one line). None when malformed."""
    m = _TEST.search(text)
    if not m:
        return None
    stdin = (m["fin"] if m["fin"] is not None else m["pin"]).strip("\n` ")
    out = (m["fout"] if m["fout"] is not None else m["pout"]).strip("\n` ")
    if not stdin.strip() or not out.strip():
        return None
    return stdin + "\n", out + "\n"


def majority(verdicts: list[int]) -> int:
    """R's majority verdict over its m judgments of a step: the sign of their sum (0 on a tie)."""
    total = sum(verdicts)
    return (total > 0) - (total < 0)


def agent_metrics(rollouts) -> dict:
    """R's accuracies in agent settings (paper Table 1), over judged rollouts.

    Process Acc: share of labelled steps whose majority verdict equals the ground-truth label (±1);
    a tie counts as a miss. Outcome Acc: share of rollouts where the sign of the mean step score
    (the mean over steps of the mean verdict) equals the outcome; 0 counts as a miss.
    Not in the paper, to read Process Acc against: process_majority, the share of the more common
    label (what an R that always gives that verdict scores), and process_bacc, the mean of the
    per-label hit rates (0.5 for such an R, whatever the label mix).
    """
    steps = [st for ro in rollouts for st in ro.steps if st.label is not None and st.verdicts]
    scored = [ro for ro in rollouts if ro.steps and all(st.verdicts for st in ro.steps)]
    hits = sum(majority(st.verdicts) == st.label for st in steps)
    outcome_hits = 0
    for ro in scored:
        score = sum(sum(st.verdicts) / len(st.verdicts) for st in ro.steps) / len(ro.steps)
        outcome_hits += (score > 0) - (score < 0) == ro.outcome
    by_label = [[majority(st.verdicts) == st.label for st in steps if st.label == y] for y in (1, -1)]
    recalls = [sum(h) / len(h) for h in by_label if h]
    nan = float("nan")
    return {"process_acc": hits / len(steps) if steps else nan,
            "process_majority": max(map(len, by_label)) / len(steps) if steps else nan,
            "process_bacc": sum(recalls) / len(recalls) if recalls else nan,
            "outcome_acc": outcome_hits / len(scored) if scored else nan}


def rm_samples(groups: list[Group], step_rewards: list[list[list[float]]], kind: str,
               acc_range: tuple[float, float] = RM_ACC_RANGE, drop_zero: bool = True,
               balance: bool = False) -> list[Sample]:
    """Training samples for R from one iteration. step_rewards[g][r][k] is step k's reward R_{τ_i} in
    rollout r of group g (what policy.policy_samples returns).

    Only tasks with acc in acc_range feed R, in every setting (released code: [0.2, 0.8]): a task with
    no success or no failure gives R nothing to be consistent with.
    kind="steps": Eq. 3 per step.  kind="tests": the coding test-writer reward per task.
    Samples with advantage 0 are dropped when drop_zero, as for the policy.
    balance (kind "steps"; not in the paper, --rm-balance): steps whose reward R_τ is positive and
    steps whose reward is not carry equal total weight, see `balance_weights`.
    """
    pairs = []   # (R's m outputs for one step or task, their rewards, the step's R_τ)
    for g, rewards in zip(groups, step_rewards):
        if not acc_range[0] <= g.acc <= acc_range[1]:
            continue
        if kind == "tests":
            pairs.append((g.tests, test_writer_rewards([ro.outcome > 0 for ro in g.rollouts], g.test_passes), 0.0))
        else:
            pairs += [(st.judgments, consistency_rewards(r, st.verdicts), r)                  # Eq. 3
                      for ro, r_row in zip(g.rollouts, rewards) for st, r in zip(ro.steps, r_row)]
    pairs = [(outs, adv, r) for outs, adv, r in pairs if adv]
    weights = balance_weights([r > 0 for _, _, r in pairs]) if balance and kind == "steps" else [1.0] * len(pairs)
    return [Sample(c.prompt_ids, c.ids, w * a) for (outs, adv, _), w in zip(pairs, weights)
            for c, a in zip(outs, adv) if not (drop_zero and a == 0)]


def balance_weights(positive: list[bool]) -> list[float]:
    """Per step, n / (2·n_c) for its class c (R_τ > 0 or not) among the n steps that train R, so each
    class carries half the weight (1 for every step while a class is empty). When most rollouts fail,
    most steps have R_τ < 0 and a plain Eq. 3 pays "−1" on most of them: R can learn the constant
    verdict −1 (README, the maze study).

    >>> balance_weights([True, False, False])
    [1.5, 0.75, 0.75]
    """
    n, n_pos = len(positive), sum(positive)
    if n_pos in (0, n):
        return [1.0] * n
    return [n / (2 * n_pos) if p else n / (2 * (n - n_pos)) for p in positive]
