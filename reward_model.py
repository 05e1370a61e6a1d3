"""R, the generative reward model, and its consistency feedback (Eq. 3): paper §3.2, and §4.2 for coding.

R is an LLM. In agent settings it reads one policy step and writes a short reasoning ending in \\boxed{1} (good step)
or \\boxed{-1} (bad step), m times per step; in coding it writes unit tests (one test per sample). Either way it is
trained with P's PPO loss (Eq. 5) on its whole output, with a reward that measures how consistent each judgment
is with the outcome and its siblings:

    >>> consistency_rewards(-0.5, [1, 0])     # docs/METHOD.md worked example, step B·1
    [1.0, -1.0]
    >>> unit_test_rewards([True, False], [[True, True], [False, True]], wrong_cost=False)
    [1.0, -1.0]
"""
from __future__ import annotations

import math
import re
from collections import Counter

from plumbing.engines import boxed, prefilled, render_chat
from policy import zscore
from records import Group, Sample

RM_ACC_RANGE = (0.2, 0.8)  # only tasks with acc in this range feed reward-model training (Eq. 3)
UNPARSEABLE_REWARD = -2.0  # Eq. 3 reward of a judgment with no valid verdict

_TEST = re.compile(r"input[^\n\w]*\s*(?:```[^\n`]*\n(?P<fin>.*?)```|(?P<pin>.*?))\s*"
                   r"(?:\*\*|#+\s*)?(?:expected\s+)?output[^\n\w]*\s*(?:```[^\n`]*\n(?P<fout>.*?)```|(?P<pout>[^\n]*))",
                   re.DOTALL | re.IGNORECASE)


# ── R judges: verdicts on steps (agent settings), unit tests (coding) ──

def parse_verdict(text: str) -> int:
    """+1 or −1 when the text holds exactly one \\boxed{} and it is 1, +1 or −1; else 0."""
    boxes = boxed(text)
    if len(boxes) != 1:
        return 0
    return {"1": 1, "+1": 1, "-1": -1}.get(boxes[0].strip(), 0)


def judge_steps(groups: list[Group], engine, cfg, prefix: str) -> None:
    """R judges every step of every rollout m times (agent settings), in one batched call: each step's
    `judge_prompt` is what R reads; `prefix` starts R's answer (the maze setting has R answer its
    verdict straight away). A vision-language R also sees each step's `judge_images` (GUI: the screen before and
    after). Fills step.judgments and step.verdicts."""
    steps = [st for g in groups for ro in g.rollouts for st in ro.steps]
    prompts = [render_chat(engine.tokenizer, st.judge_prompt, images=len(st.judge_images)) for st in steps]
    outs = prefilled(engine, prompts, prefix, n=cfg.m, images=[st.judge_images for st in steps],
                     temperature=cfg.rm_temperature, top_p=cfg.rm_top_p, max_new_tokens=cfg.rm_max_new_tokens)
    for st, judgments in zip(steps, outs):
        st.judgments = judgments
        st.verdicts = [parse_verdict(c.text) for c in judgments]  # S_{τ_i,j} ∈ {+1, −1, 0}


def write_tests(groups: list[Group], prompts: list[str], engine, cfg, prefix: str) -> list[list[tuple[str, str] | None]]:
    """R in coding: m unit tests per task, one chat prompt per group (what R reads: the problem), in one
    batched call; `prefix` starts each test. Fills group.tests; returns each test parsed (`parse_test`,
    None when malformed). The verdicts S_j follow once every program has run on them (`verdicts_from_tests`)."""
    outs = prefilled(engine, prompts, prefix, n=cfg.m, temperature=cfg.rm_temperature, top_p=cfg.rm_top_p,
                     max_new_tokens=cfg.rm_max_new_tokens, desc="R writes tests")
    for g, tests in zip(groups, outs):
        g.tests = tests
    return [[parse_test(c.text) for c in tests] for tests in outs]


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


def verdicts_from_tests(parsed: list, passes: list[bool]) -> list[int]:
    """S_{τ,j} of one program in coding: +1 when it passes R's test j, −1 when it fails it, 0 when test j is
    malformed (Eq. 1 counts a 0 in m).

        >>> verdicts_from_tests([("1\\n", "2\\n"), None, ("2\\n", "3\\n")], [True, False, False])
        [1, 0, -1]
    """
    return [0 if t is None else (1 if ok else -1) for t, ok in zip(parsed, passes)]


# ── Eq. 3: R's consistency reward, and R's training samples ──

def consistency_raw(step_reward: float, verdicts: list[int]) -> list[float]:
    """Eq. 3's raw rewards of one step's m judgments: R_{S_j} = R_{τ_i} · S_j, −2 when S_j is unparseable."""
    return [step_reward * s if s != 0 else UNPARSEABLE_REWARD for s in verdicts]  # Eq. 3


def consistency_rewards(step_reward: float, verdicts: list[int]) -> list[float] | None:
    """Eq. 3 for one step: the raw rewards (`consistency_raw`) z-scored over the m judgments. None when all
    m raw rewards are equal (the step is skipped: an R whose m judgments agree gets no gradient from it)."""
    return zscore(consistency_raw(step_reward, verdicts))


def batch_consistency_rewards(steps: list[tuple[float, list[int]]]) -> list[list[float]] | None:
    """Eq. 3 with one z-score over every judgment of the given (R_τ, verdicts) steps instead of one per step
    (--rm-norm batch, not in the paper): a step whose m judgments agree still gets its raw rewards' sign
    against the batch, so an R that has drifted to one verdict is pushed back on the steps where that verdict
    is inconsistent with R_τ. None when there is no step or every raw reward is equal.

        >>> batch_consistency_rewards([(1.0, [-1, -1]), (-1.0, [-1, -1])])   # raw [−1, −1] and [1, 1]
        [[-1.0, -1.0], [1.0, 1.0]]
    """
    raw = [consistency_raw(r, verdicts) for r, verdicts in steps]
    flat = [x for row in raw for x in row]
    z = zscore(flat) if flat else None   # no step in R's accuracy band: nothing to normalize
    if z is None:
        return None
    rows = iter(z)
    return [[next(rows) for _ in row] for row in raw]


def unit_test_rewards(gt_pass: list[bool], passes: list[list[bool]], *, wrong_cost: bool) -> list[float] | None:
    """The coding reward of R's m generated tests (docs/METHOD.md, "coding R reward"), z-scored over the tests.

    gt_pass[i]: program i passes every ground-truth test (a "GT code"). passes[i][k]: program i passes test k.
    Test k is correct iff every GT code passes it. Correct: +#(non-GT codes failing it); incorrect: −#(non-GT
    codes passing it), at most −1 with wrong_cost (--wrong-tests-cost, not in the paper); no non-GT code: ±1.
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
            raw.append(-float(max(wrong_cost, sum(passes[i][k] for i in others))))
    return zscore(raw) if raw else None


def rm_samples(groups: list[Group], kind: str, *, acc_range: tuple[float, float] = RM_ACC_RANGE,
               drop_zero: bool, balance: bool, norm: str, wrong_cost: bool) -> list[Sample]:
    """Training samples for R from one iteration. Eq. 3 reads each step's reward R_{τ_i}, step.reward (set by
    policy.score_steps). Only tasks with acc in acc_range feed R, in every setting (released code: [0.2, 0.8]):
    a task with no success or no failure gives R nothing to be consistent with.
    kind="steps": Eq. 3 per step.  kind="tests": the coding test-writer reward per task (`unit_test_rewards`).
    Samples with advantage 0 are dropped when drop_zero, as for the policy. Not in the paper, kind "steps" only:
    balance (--rm-balance), steps with R_τ > 0 and the others carry equal total weight (`balance_weights`);
    norm (--rm-norm), "step" z-scores each step's m rewards (Eq. 3), "batch" all at once (`batch_consistency_rewards`).
    """
    pairs, steps = [], []   # (R's m outputs for one step or task, their rewards, the step's R_τ); (step, R_τ)
    for g in groups:
        if not acc_range[0] <= g.acc <= acc_range[1]:
            continue
        if kind == "tests":
            gt_pass = [ro.outcome > 0 for ro in g.rollouts]
            pairs.append((g.tests, unit_test_rewards(gt_pass, g.test_passes, wrong_cost=wrong_cost), 0.0))
        else:
            steps += [(st, st.reward) for ro in g.rollouts for st in ro.steps]
    if norm == "batch":
        advs = batch_consistency_rewards([(r, st.verdicts) for st, r in steps]) or [None] * len(steps)
    else:
        advs = [consistency_rewards(r, st.verdicts) for st, r in steps]                       # Eq. 3
    pairs += [(st.judgments, adv, r) for (st, r), adv in zip(steps, advs)]
    pairs = [(outs, adv, r) for outs, adv, r in pairs if adv]
    weights = balance_weights([r > 0 for _, _, r in pairs]) if balance and kind == "steps" else [1.0] * len(pairs)
    return [Sample(c.prompt_ids, c.ids, w * a, c.vision, c.logprobs) for (outs, adv, _), w in zip(pairs, weights)
            for c, a in zip(outs, adv) if not (drop_zero and a == 0)]


def balance_weights(positive: list[bool]) -> list[float]:
    """Per step, n / (2·n_c) for its class c (R_τ > 0 or not) among the n steps that train R, so each
    class carries half the weight (1 for every step while a class is empty). When most rollouts fail,
    most steps have R_τ < 0 and a plain Eq. 3 pays "−1" on most of them: R can learn the constant
    verdict −1 (docs/STUDIES.md, the maze study).

    >>> balance_weights([True, False, False])
    [1.5, 0.75, 0.75]
    """
    n, n_pos = len(positive), sum(positive)
    if n_pos in (0, n):
        return [1.0] * n
    return [n / (2 * n_pos) if p else n / (2 * (n - n_pos)) for p in positive]


# ── R's majority verdict (Table 1's Process Acc reads it: tasks.agent_metrics) ──

def majority(verdicts: list[int]) -> int:
    """R's majority verdict over its m judgments of a step: the sign of their sum (0 on a tie)."""
    total = sum(verdicts)
    return (total > 0) - (total < 0)


# ── Theorem 1 ──

def theorem1(good: list[list[int]], bad: list[list[int]], m: int) -> dict:
    """Theorem 1's quantities for R, from its m verdicts on steps of two classes: `good` (steps of successful
    rollouts, or steps labelled +1) and `bad` (steps of failed rollouts, or labelled −1).

        p₊ = P(S = +1 | good step)    p₋ = P(S = −1 | bad step)    μ = p₊ + p₋
        𝒜 = P(S_τ⁺ > S_τ⁻), S_τ the mean of a step's m verdicts, over every (good, bad) pair of steps
        bound = 1 − exp(−m(μ − 1)²/4) when μ > 1 (Theorem 1: 𝒜 → 1 as m → ∞ iff μ > 1), else 0
    An unparseable verdict (0) is neither +1 nor −1 and counts 0 in S_τ. A constant R has μ = 1 and 𝒜 = 0
    (ties are not "greater"). μ/2 is R's balanced accuracy per single judgment. NaN where a class is empty.

        >>> q = theorem1(good=[[1, 1], [1, -1]], bad=[[-1, -1], [1, 0]], m=2)   # p₊ = 3/4, p₋ = 2/4
        >>> q["p_plus"], q["p_minus"], q["mu"], q["precision"]    # S⁺ ∈ {1, 0}, S⁻ ∈ {−1, 0.5}: 3 of 4 pairs
        (0.75, 0.5, 1.25, 0.75)
        >>> round(q["bound"], 4)                                  # 1 − exp(−2 · 0.25² / 4)
        0.0308
    """
    nan = float("nan")
    if not good or not bad:
        return {"p_plus": nan, "p_minus": nan, "mu": nan, "precision": nan, "bound": nan}
    p_plus = sum(v == 1 for vs in good for v in vs) / max(sum(map(len, good)), 1)
    p_minus = sum(v == -1 for vs in bad for v in vs) / max(sum(map(len, bad)), 1)
    mu = p_plus + p_minus
    s_good = Counter(sum(vs) / len(vs) if vs else 0.0 for vs in good)   # S_τ value → steps with it
    s_bad = Counter(sum(vs) / len(vs) if vs else 0.0 for vs in bad)
    wins = sum(n * k for s, n in s_good.items() for t, k in s_bad.items() if s > t)
    return {"p_plus": p_plus, "p_minus": p_minus, "mu": mu, "precision": wins / (len(good) * len(bad)),
            "bound": theorem1_bound(mu, m)}


def theorem1_bound(mu: float, m: int) -> float:
    """Theorem 1's lower bound on 𝒜 for a judge of summed class accuracy μ with m judgments per step:
    1 − exp(−m(μ − 1)²/4) when μ > 1, else 0.

        >>> round(theorem1_bound(1.5, 3), 4), theorem1_bound(0.9, 3)    # 1 − exp(−3 · 0.25 / 4)
        (0.171, 0.0)
    """
    return 1 - math.exp(-m * (mu - 1) ** 2 / 4) if mu > 1 else 0.0


def theorem1_metrics(rollouts, m: int, labels: bool) -> dict:
    """`theorem1` over judged rollouts, keyed thm1_*: the classes are the rollouts' outcomes (what R is trained
    to be consistent with) and, with `labels` (exact step labels: maze, ALFWorld's planner, MiniWoB's labelled
    pages), thm1_label_* the steps' ground-truth labels."""
    steps = [(st, ro.outcome) for ro in rollouts for st in ro.steps if st.verdicts]
    out = {f"thm1_{k}": v for k, v in theorem1([st.verdicts for st, o in steps if o > 0],
                                               [st.verdicts for st, o in steps if o < 0], m).items()}
    if labels:
        out |= {f"thm1_label_{k}": v for k, v in theorem1([st.verdicts for st, _ in steps if st.label == 1],
                                                          [st.verdicts for st, _ in steps if st.label == -1], m).items()}
    return out
