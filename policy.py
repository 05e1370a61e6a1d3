"""P, the policy: integrated feedback (Eq. 1) and step-index advantages (Eq. 2).
Paper §3.1, "Policy: integrated feedback".

The policy is rewarded per step by the outcome plus the reward model's step-wise
verdicts; advantages are z-scored per step index across the task's group, and each
step becomes a training sample of its own (a constant advantage over its tokens). R's verdicts
S_{τ_i,j} are written by reward_model.py: `judge_steps` in the agent settings (R reads the step),
`verdicts_from_tests` in coding (the program runs on R's m tests).

    >>> integrated_reward(+1, [1, -1, 1], lam=1.0)      # 1 + (1/3)·1
    1.3333333333333333
    >>> step_advantages([[2.0, 1.0], [-2.0, -0.5, -2.0]], zero_single=False)
    [[1.0, 1.0], [-1.0, -1.0, -2.0]]
"""
from __future__ import annotations

import statistics

from records import Group, Sample


def integrated_reward(outcome: int, verdicts: list[int], lam: float) -> float:
    """Eq. 1: R_{τ_i} = O_τ + (λ/m) Σ_j S_{τ_i,j}. An unparseable verdict is 0 and still counts in m."""
    if not verdicts:
        return float(outcome)
    return outcome + lam * sum(verdicts) / len(verdicts)  # Eq. 1


def zscore(values: list[float]) -> list[float] | None:
    """(v − mean) / std with the population std; None when the values are all equal (std ≈ 0)."""
    std = statistics.pstdev(values)
    if std < 1e-8:
        return None
    mean = statistics.fmean(values)
    return [(v - mean) / std for v in values]


def step_advantages(rewards: list[list[float]], zero_single: bool) -> list[list[float]]:
    """Eq. 2: for each step index k, z-score R_{τ_k} over the rollouts of the group that reach step k.

    rewards[r][k] is rollout r's reward at step k. std ≈ 0 gives 0. A step index only one
    rollout reaches keeps its raw reward (reference code; the paper is silent), or 0
    with zero_single=True.
    """
    adv = [[0.0] * len(r) for r in rewards]
    for k in range(max(map(len, rewards), default=0)):
        rows = [r for r in range(len(rewards)) if len(rewards[r]) > k]
        if len(rows) == 1:
            adv[rows[0]][k] = 0.0 if zero_single else rewards[rows[0]][k]
            continue
        z = zscore([rewards[r][k] for r in rows])  # Eq. 2
        for r, value in zip(rows, z or [0.0] * len(rows)):
            adv[r][k] = value
    return adv


def score_steps(groups: list[Group], *, lam: float, zero_single: bool, reward: str) -> None:
    """Eq. 1 → Eq. 2 on every step of every group: step.reward is R_{τ_i}, which R's consistency reward
    (Eq. 3) reads too, and step.advantage its z-score over the group (Eq. 2).

    reward="integrated": Eq. 1, R_{τ_i} = O_τ + (λ/m) Σ_j S_{τ_i,j}.
    reward="reference": the rollout's graded score (coding: the share of GT tests passed, as the released
    code does) instead of Eq. 1; z-scored over the group like any single-step reward.
    reward="stepwise" (the paper's claim 2, Figure 1): Eq. 1 without the outcome, R_{τ_i} = (λ/m) Σ_j S_{τ_i,j}.
    """
    for g in groups:
        rewards = [[ro.score if reward == "reference" else                                                   # Eq. 1
                    integrated_reward(0 if reward == "stepwise" else ro.outcome, st.verdicts, lam)
                    for st in ro.steps] for ro in g.rollouts]
        adv = step_advantages(rewards, zero_single)                                                         # Eq. 2
        for ro, r_row, a_row in zip(g.rollouts, rewards, adv):
            for st, r, a in zip(ro.steps, r_row, a_row):
                st.reward, st.advantage = r, a


def policy_samples(groups: list[Group], *, acc_range: tuple[float, float], drop_zero: bool) -> list[Sample]:
    """P's training samples: one per step, with the step's advantage (set by `score_steps`).
    Tasks whose acc lies outside acc_range are left out. Steps with advantage 0 are dropped when
    drop_zero (the released code drops them in ALFWorld and OSWorld and keeps them in coding, where
    they still count in the loss's batch mean and its KL term)."""
    return [Sample(st.prompt_ids, st.response_ids, st.advantage, st.vision, st.logprobs)
            for g in groups if acc_range[0] <= g.acc <= acc_range[1]
            for ro in g.rollouts for st in ro.steps if st.response_ids and not (drop_zero and st.advantage == 0)]
