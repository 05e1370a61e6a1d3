"""Every formula pinned to hand-worked values (docs/METHOD.md's worked example included)."""
import math

import pytest

import environment as env
import policy
import reward_model as rm
from plumbing.config import ConfigError, parse_args
from records import Completion
from records import Group, Rollout, Step, Task
from tasks.livebench import coding_metrics


# ── Eq. 1 ──
def test_integrated_reward_hand_values():
    assert policy.integrated_reward(1, [1, 1], lam=1.0) == 2.0
    assert policy.integrated_reward(1, [1, -1], lam=1.0) == 1.0
    assert policy.integrated_reward(-1, [-1, -1], lam=1.0) == -2.0
    assert policy.integrated_reward(-1, [1, 0], lam=1.0) == -0.5          # a 0 still counts in m
    assert policy.integrated_reward(-1, [1, 1, 0], lam=0.5) == pytest.approx(-1 + 0.5 * 2 / 3)
    assert policy.integrated_reward(1, [-1, -1, -1], lam=0.0) == 1.0
    assert policy.integrated_reward(-1, [], lam=1.0) == -1.0             # no R: the outcome alone


# ── Eq. 2: docs/METHOD.md worked example, G = 2, m = 2 ──
WORKED_R = [[2.0, 1.0], [-2.0, -0.5, -2.0]]


def test_worked_example_rewards():
    a = [policy.integrated_reward(1, v, lam=1.0) for v in ([1, 1], [1, -1])]
    b = [policy.integrated_reward(-1, v, lam=1.0) for v in ([-1, -1], [1, 0], [-1, -1])]
    assert [a, b] == WORKED_R


def test_worked_example_advantages_single_keeps_its_reward():
    assert policy.step_advantages(WORKED_R, zero_single=False) == [[1.0, 1.0], [-1.0, -1.0, -2.0]]


def test_worked_example_advantages_zero_single():
    assert policy.step_advantages(WORKED_R, zero_single=True) == [[1.0, 1.0], [-1.0, -1.0, 0.0]]


def test_step_advantages_equal_rewards_and_three_rollouts():
    assert policy.step_advantages([[1.0], [1.0], [1.0]], zero_single=False) == [[0.0], [0.0], [0.0]]
    # values 1, 2, 3: mean 2, population std sqrt(2/3)
    s = math.sqrt(2 / 3)
    adv = policy.step_advantages([[1.0], [2.0], [3.0]], zero_single=False)
    assert [x[0] for x in adv] == pytest.approx([-1 / s, 0.0, 1 / s])


# ── Eq. 3: docs/METHOD.md worked example ──
def test_consistency_rewards_worked_example():
    assert rm.consistency_rewards(-0.5, [1, 0]) == [1.0, -1.0]   # raw [−0.5, −2]
    assert rm.consistency_rewards(2.0, [1, 1]) is None           # raw [2, 2]: skipped


def test_consistency_rewards_hand_values():
    # R = 1, verdicts [+1, −1, +1]: raw [1, −1, 1], mean 1/3, std sqrt(8/9)
    z = rm.consistency_rewards(1.0, [1, -1, 1])
    s = math.sqrt(8 / 9)
    assert z == pytest.approx([(2 / 3) / s, (-4 / 3) / s, (2 / 3) / s])


@pytest.mark.parametrize("text,verdict", [
    (r"The step opens the fridge. \boxed{1}", 1),
    (r"\boxed{+1}", 1),
    (r"bad move \boxed{-1}", -1),
    (r"\boxed{ -1 }", -1),
    (r"\boxed{1} no wait \boxed{-1}", 0),       # two verdicts: ambiguous
    (r"\boxed{1} \boxed{1}", 0),                # two boxes, even if equal
    (r"\boxed{0}", 0),
    (r"\boxed{yes}", 0),
    ("the answer is 1", 0),
    ("", 0),
])
def test_parse_verdict(text, verdict):
    assert rm.parse_verdict(text) == verdict


# ── coding RM reward ──
def test_unit_test_rewards_hand_example():
    # programs 0,1 are GT codes; 2,3 are not. Tests:
    #  t0: correct, fails both non-GT → +2   t1: correct, fails one → +1
    #  t2: incorrect (GT 1 fails), passes 1 non-GT → −1   t3: correct, fails none → 0
    gt_pass = [True, True, False, False]
    passes = [[True, True, True, True],
              [True, True, False, True],
              [False, True, True, True],
              [False, False, False, True]]
    raw = [2.0, 1.0, -1.0, 0.0]
    mean, std = 0.5, math.sqrt(sum((r - 0.5) ** 2 for r in raw) / 4)
    assert rm.unit_test_rewards(gt_pass, passes, wrong_cost=False) == pytest.approx([(r - mean) / std for r in raw])


def test_unit_test_rewards_no_nongt_and_none_cases():
    assert rm.unit_test_rewards([True, True], [[True, False], [True, True]], wrong_cost=False) == [1.0, -1.0]
    assert rm.unit_test_rewards([False, False], [[True], [False]], wrong_cost=False) is None   # no GT code: skipped
    assert rm.unit_test_rewards([True, False], [[True, True], [True, True]], wrong_cost=False) is None  # all equal


def test_wrong_tests_cost_hand_worked():
    """--wrong-tests-cost: gt_pass [T, F, F]; test 0 correct, catching 1 wrong program (+1); test 1 wrong (the GT
    code fails it) and passed by no other program: 0 in the paper, −1 here; test 2 wrong and passed by both: −2.
    Raw [1, −1, −2]: mean −2/3, population std √(42/27) = 1.2472 → z [1.3363, −0.2673, −1.0690]."""
    passes = [[True, False, False], [False, False, True], [True, False, True]]
    assert rm.unit_test_rewards([True, False, False], passes, wrong_cost=True) == pytest.approx(
        [1.3363, -0.2673, -1.0690], abs=1e-4)
    paper = rm.unit_test_rewards([True, False, False], passes, wrong_cost=False)   # raw [1, 0, −2]
    assert paper == pytest.approx([1.0690, 0.2673, -1.3363], abs=1e-4)
    with pytest.raises(ConfigError, match="coding setting only"):
        parse_args(["--task", "maze", "--wrong-tests-cost"])


@pytest.mark.parametrize("text,test", [
    ("Input:\n```\n3 4\n```\nOutput:\n```\n7\n```", ("3 4\n", "7\n")),
    ("**Input:**\n```\n2\n1 2\n```\n**Output:**\n```\n3\n```\nThe sum is 3.", ("2\n1 2\n", "3\n")),
    ("### Input\n```text\n1\n```\n### Expected output\n```\n2\n```", ("1\n", "2\n")),
    ("Input: 1234\nOutput: 10\nbecause 1+2+3+4", ("1234\n", "10\n")),
    ("Sample input:\n5\n3 1 4\nExpected output: 1 3 4", ("5\n3 1 4\n", "1 3 4\n")),
    ("Input:\n```\n\n```\nOutput:\n```\n7\n```", None),    # empty input
    ("Input: 5\n", None),                                   # no output
    ("def f(n): return n", None),
])
def test_parse_test(text, test):
    assert rm.parse_test(text) == test


# ── Eq. 4 ──
@pytest.mark.parametrize("acc,expected", [(1.0, "harder"), (0.8, "harder"), (0.79, None), (0.5, None),
                                          (0.21, None), (0.2, "easier"), (0.0, "easier")])
def test_direction(acc, expected):
    assert env.direction(acc, low=0.2, high=0.8) == expected   # the paper's α_low, α_high


@pytest.mark.parametrize("d,a,a2,ok", [
    ("harder", 1.0, 0.5, True), ("harder", 1.0, 0.2, True), ("harder", 1.0, 0.125, False),  # a′ ≥ α_low
    ("harder", 1.0, 0.0, False), ("harder", 0.8, 0.8, False), ("harder", 0.8, 0.9, False),
    ("easier", 0.0, 0.25, True), ("easier", 0.0, 0.8, True), ("easier", 0.0, 0.875, False),  # a′ ≤ α_high
    ("easier", 0.0, 0.0, False), ("easier", 0.2, 0.2, False), ("easier", 0.2, 0.1, False),
])
def test_accept(d, a, a2, ok):
    assert env.accept(d, a, a2, low=0.2, high=0.8) is ok


def test_accept_custom_thresholds():
    assert env.accept("harder", 1.0, 0.3, low=0.4, high=0.9) is False
    assert env.direction(0.85, low=0.1, high=0.9) is None


# ── sample builders ──
def _step(verdicts, judgments=()):
    return Step("p", [1, 2], "r", [3, 4], verdicts=list(verdicts), judgments=list(judgments))


def _c(i):
    return Completion(f"j{i}", [9], [10 + i], "stop")


def p_samples(groups, *, lam=1.0, zero_single=False, reward="integrated", acc_range=(1 / 8, 7 / 8), drop_zero=True):
    """Eq. 1-2 onto the steps, then P's samples, as loop.train calls them (defaults: ALFWorld's filter)."""
    policy.score_steps(groups, lam=lam, zero_single=zero_single, reward=reward)
    return policy.policy_samples(groups, acc_range=acc_range, drop_zero=drop_zero)


def r_samples(groups, *, kind="steps", balance=False, norm="step"):
    """R's samples (Eq. 3 on step.reward), as loop.train calls them."""
    return rm.rm_samples(groups, kind, drop_zero=True, balance=balance, norm=norm, wrong_cost=False)


def test_policy_and_rm_samples_on_worked_example():
    task = Task("t", "p", {})
    a = Rollout("t", [_step([1, 1], [_c(0), _c(1)]), _step([1, -1], [_c(2), _c(3)])], 1)
    b = Rollout("t", [_step([-1, -1], [_c(4), _c(5)]), _step([1, 0], [_c(6), _c(7)]),
                      _step([-1, -1], [_c(8), _c(9)])], -1)
    g = Group(task, [a, b])
    samples = p_samples([g])
    assert [st.reward for st in a.steps + b.steps] == [2.0, 1.0, -2.0, -0.5, -2.0]   # R_τ on the records
    assert [s.advantage for s in samples] == [1.0, 1.0, -1.0, -1.0, -2.0]
    rs = r_samples([g])
    # Eq. 3 on every step: A·0 raw [2,2] skip; A·1 raw [1,−1] → [1,−1]; B·0 raw [2,2] skip;
    # B·1 raw [−0.5,−2] → [1,−1]; B·2 raw [2,2] skip
    assert [(s.response_ids[0], s.advantage) for s in rs] == [(12, 1.0), (13, -1.0), (16, 1.0), (17, -1.0)]


def test_policy_samples_acc_filter_and_reference_reward():
    task = Task("t", "p", {})
    solved = Group(task, [Rollout("t", [_step([1])], 1), Rollout("t", [_step([-1])], 1)])
    assert p_samples([solved]) == []          # acc 1 > 7/8: left out
    mixed = Group(task, [Rollout("t", [_step([])], 1, score=1.0), Rollout("t", [_step([])], -1, score=0.5),
                         Rollout("t", [_step([])], -1, score=0.0)])
    s = p_samples([mixed], reward="reference")
    sd = math.sqrt(((1 - 0.5) ** 2 + 0 + 0.5 ** 2) / 3)
    assert [x.advantage for x in s] == pytest.approx([0.5 / sd, -0.5 / sd])  # the 0 advantage is dropped
    assert r_samples([solved]) == []   # acc outside [0.2, 0.8]


def test_rm_balance_on_worked_example():
    """--rm-balance, by hand: one step with R_τ = 1 and two with R_τ < 0, verdicts [1, −1] each.
    Eq. 3 raw: [1, −1], [−0.5, 0.5], [−1, 1] → z-scored [1, −1], [−1, 1], [−1, 1]. Weights: the positive
    class holds 1 of 3 steps → 3 / 2 = 1.5; the other holds 2 → 3 / 4 = 0.75. Each class then sums to
    |1.5| · 2 = |0.75| · 4 = 3."""
    task = Task("t", "p", {})
    win = Rollout("t", [_step([1, -1], [_c(0), _c(1)])], 1)
    loss = Rollout("t", [_step([1, -1], [_c(2), _c(3)]), _step([1, -1], [_c(4), _c(5)])], -1)
    g = Group(task, [win, loss])
    win.steps[0].reward, loss.steps[0].reward, loss.steps[1].reward = 1.0, -0.5, -1.0
    plain = r_samples([g])
    assert [s.advantage for s in plain] == [1.0, -1.0, -1.0, 1.0, -1.0, 1.0]
    balanced = r_samples([g], balance=True)
    assert [s.advantage for s in balanced] == [1.5, -1.5, -0.75, 0.75, -0.75, 0.75]
    assert rm.balance_weights([False, False]) == [1.0, 1.0]   # one class only: nothing to balance
    from plumbing.config import ConfigError, parse_args
    with pytest.raises(ConfigError, match="--rm-balance"):   # coding's R writes tests: refused, never ignored
        parse_args(["--task", "livebench", "--model", "tiny", "--rm-balance"])


def test_rm_norm_batch_trains_unanimous_steps_by_hand():
    """--rm-norm batch, by hand: R said −1 twice on a won rollout's step (R_τ = 1) and on a failed one's
    (R_τ = −1). Per step (Eq. 3) both steps are unanimous: no sample. Over the batch the raw rewards
    [−1, −1, 1, 1] have mean 0 and std 1: the won step's −1 verdicts get −1, the failed step's get +1."""
    task = Task("t", "p", {})
    g = Group(task, [Rollout("t", [_step([-1, -1], [_c(0), _c(1)])], 1),
                     Rollout("t", [_step([-1, -1], [_c(2), _c(3)])], -1)])
    g.rollouts[0].steps[0].reward, g.rollouts[1].steps[0].reward = 1.0, -1.0
    assert r_samples([g]) == []
    batch = r_samples([g], norm="batch")
    assert [(s.response_ids[0], s.advantage) for s in batch] == [(10, -1.0), (11, -1.0), (12, 1.0), (13, 1.0)]
    # an unparseable verdict keeps Eq. 3's −2: raw [1, −2] and [−1, 1]; mean −0.25, deviations [1.25, −1.75,
    # −0.75, 1.25], variance 6.75 / 4 = 1.6875, std 1.2990
    z = rm.batch_consistency_rewards([(1.0, [1, 0]), (-1.0, [1, -1])])
    assert z == [pytest.approx([0.9623, -1.3472], abs=1e-4), pytest.approx([-0.5774, 0.9623], abs=1e-4)]
    assert rm.batch_consistency_rewards([(1.0, [1, 1])]) is None   # every raw reward equal
    assert rm.batch_consistency_rewards([]) is None and r_samples([], norm="batch") == []
    from plumbing.config import ConfigError, parse_args
    with pytest.raises(ConfigError, match="--rm-norm"):
        parse_args(["--task", "livebench", "--model", "tiny", "--rm-norm", "batch"])


def test_rm_samples_tests_kind():
    task = Task("t", "p", {})
    g = Group(task, [Rollout("t", [_step([])], 1), Rollout("t", [_step([])], -1)],
              tests=[_c(0), _c(1)], test_passes=[[True, True], [False, True]])
    assert [(s.response_ids[0], s.advantage) for s in r_samples([g], kind="tests")] == [(10, 1.0), (11, -1.0)]


# ── Table 1 coding metrics ──
def test_coding_metrics_hand_example():
    # task A: programs [GT, non-GT], tests: t0 passes GT fails non-GT (detects), t1 passes both, t2 malformed
    # task B: no GT code → ignored by both
    # task C: only GT codes: t0 correct, t1 not → counts for UT only
    m = coding_metrics(
        gt_pass=[[True, False], [False], [True]],
        passes=[[[True, True, False], [False, True, False]], [[True]], [[True, False]]],
        tests_ok=[[True, True, False], [True], [True, True]])
    assert m["ut_tasks"][0] == pytest.approx(2 / 3) and math.isnan(m["ut_tasks"][1]) and m["ut_tasks"][2] == 0.5
    assert m["ut"] == pytest.approx(7 / 12)     # A: t0, t1 correct of 3; C: 1 of 2; B has no GT code
    assert m["ut_se"] == pytest.approx(1 / 12)  # std(2/3, 1/2) = (1/6)/√2, over √2
    assert m["detect"] == pytest.approx(1 / 3)  # A only: t0
    assert math.isnan(m["detect_se"]) and math.isnan(m["detect_tasks"][2])   # one task: no SE; C has no non-GT code


# ── Theorem 1's quantities (reward_model.theorem1) ──
def test_theorem1_hand_example():
    # good steps' verdicts [+1 +1], [+1 −1]: p₊ = 3/4; bad steps' [−1 −1], [+1 0]: p₋ = 2/4 (0 is unparseable)
    # S⁺ ∈ {1, 0}, S⁻ ∈ {−1, 0.5}: S⁺ > S⁻ in 3 of the 4 pairs; bound 1 − exp(−2 · 0.25² / 4)
    q = rm.theorem1([[1, 1], [1, -1]], [[-1, -1], [1, 0]], m=2)
    assert (q["p_plus"], q["p_minus"], q["mu"], q["precision"]) == (0.75, 0.5, 1.25, 0.75)
    assert q["bound"] == pytest.approx(1 - math.exp(-2 * 0.25 ** 2 / 4)) == pytest.approx(0.030767, abs=1e-6)


def test_theorem1_constant_and_perfect_judges():
    constant = rm.theorem1([[-1, -1, -1]] * 4, [[-1, -1, -1]] * 6, m=3)   # a constant −1: μ = 0 + 1
    assert (constant["mu"], constant["precision"], constant["bound"]) == (1.0, 0.0, 0.0)
    perfect = rm.theorem1([[1, 1, 1]] * 2, [[-1, -1, -1]] * 3, m=3)
    assert (perfect["mu"], perfect["precision"]) == (2.0, 1.0)
    assert perfect["bound"] == pytest.approx(1 - math.exp(-3 / 4))        # μ − 1 = 1
    wrong = rm.theorem1([[-1, -1]], [[1, 1]], m=2)                          # points the wrong way: μ = 0
    assert (wrong["mu"], wrong["precision"], wrong["bound"]) == (0.0, 0.0, 0.0)
    assert all(v != v for v in rm.theorem1([], [[1]], m=1).values())        # an empty class: NaN


def test_theorem1_metrics_by_outcome_and_by_label():
    # a won rollout whose steps are labelled +1, −1 and a failed one with a −1 step; R says +1 on every step
    won = Rollout("t", [Step("p", [], "r", [], verdicts=[1, 1], label=1), Step("p", [], "r", [], verdicts=[1, 1], label=-1)], 1)
    lost = Rollout("t", [Step("p", [], "r", [], verdicts=[1, -1], label=-1)], -1)
    q = rm.theorem1_metrics([won, lost], m=2, labels=True)
    assert (q["thm1_p_plus"], q["thm1_p_minus"], q["thm1_precision"]) == (1.0, 0.5, 1.0)   # by outcome
    assert (q["thm1_label_p_plus"], q["thm1_label_p_minus"]) == (1.0, 0.25)                # by label
    assert q["thm1_label_precision"] == 0.5     # S = 1 on the good step against S = 1 and 0 on the bad ones
    assert "thm1_label_mu" not in rm.theorem1_metrics([won, lost], m=2, labels=False)


# ── the released code's coding path (reward/llm_rl_reward.py), worked by hand ──
def test_rm_test_writer_trains_only_on_balanced_tasks():
    """R's coding samples come only from tasks with acc in [0.2, 0.8], as for step judges."""
    task = Task("t", "p", {})
    all_pass = Group(task, [Rollout("t", [_step([])], 1), Rollout("t", [_step([])], 1)],
                     tests=[_c(0), _c(1)], test_passes=[[True, False], [True, False]])
    assert r_samples([all_pass], kind="tests") == []          # acc 1.0: left out (raw rewards would be [1, −1])


def test_reference_coding_reward_worked_example():
    """GT pass fractions [1, .5, 0, 0]: pass@all acc 1/4 ∈ [0.2, 0.8], z-scored with the population std:
    mean .375, std √.171875 = .41458 → [1.5076, .3015, −.9045, −.9045]. Fractions [1, .5, 0]: acc 1/3,
    advantages [1.2247, 0, −1.2247], and the 0 is KEPT (coding keeps zero advantages)."""
    import loop
    cfg = loop.parse_args(["--task", "livebench", "--preset", "reference"])   # the released reward and filter
    kw = dict(reward=cfg.policy_reward, acc_range=(cfg.acc_lower, cfg.acc_upper), drop_zero=cfg.drop_zero_adv)
    assert kw == dict(reward="reference", acc_range=(0.2, 0.8), drop_zero=False)
    task = Task("t", "p", {})

    def grp(scores):
        return Group(task, [Rollout("t", [_step([1, -1])], 1 if s == 1 else -1, score=s) for s in scores])

    adv = [s.advantage for s in p_samples([grp([1.0, 0.5, 0.0, 0.0])], **kw)]
    assert adv == pytest.approx([1.5076, 0.3015, -0.9045, -0.9045], abs=1e-4)
    adv = [s.advantage for s in p_samples([grp([1.0, 0.5, 0.0])], **kw)]
    assert adv == pytest.approx([1.2247, 0.0, -1.2247], abs=1e-4)   # three samples: the zero stays
    assert p_samples([grp([0.5, 0.0, 0.0])], **kw) == []          # acc 0: left out, though std > 0
    assert p_samples([grp([1.0, 1.0, 1.0, 1.0, 1.0])], **kw) == []  # acc 1: left out
    assert len(p_samples([grp([1.0, 1.0, 1.0, 1.0, 0.5])], **kw)) == 5  # acc 0.8: kept (inclusive)


def test_reference_test_writer_reward_worked_example():
    """Programs c0 (GT code), c1-c3; tests t0 (passes c0 only) → +3, t1 (c0, c1) → +2, t2 (c1 only, wrong)
    → −1, t3 (malformed: passes nobody) → −0. z over the 4 tests: [1.2649, .6325, −1.2649, −.6325]."""
    passes = [[True, True, False, False], [False, True, True, False], [False] * 4, [False] * 4]
    assert rm.unit_test_rewards([True, False, False, False], passes, wrong_cost=False) == pytest.approx(
        [1.2649, 0.6325, -1.2649, -0.6325], abs=1e-4)


# ── Eq. 5, per token ──
def test_token_loss_hand_values_and_log_ratio_clamp():
    import torch
    from ppo import token_loss
    logp, old, adv = torch.tensor([[0.0, -1.0, -1.5]]), torch.tensor([[-1.0, -1.0, -1.0]]), torch.tensor([2.0])
    pg, kl, r = token_loss(logp, old, adv, clip_eps=0.2, log_ratio_clamp=10.0)
    # r = e, 1, e^−.5: A > 0 so min(r·A, clip(r)·A) = [1.2·2, 1·2, e^−.5·2]
    assert pg[0].tolist() == pytest.approx([-2.4, -2.0, -2 * math.exp(-0.5)])
    # k3: π_old/π_θ − log(π_old/π_θ) − 1 = e^−d + d − 1 with d = log r
    assert kl[0].tolist() == pytest.approx([math.exp(-1) + 1 - 1, 0.0, math.exp(0.5) - 0.5 - 1])
    # log r = 30 is clamped to 10 (released code) before exp; with the clamp off it is not
    pg, kl, r = token_loss(torch.tensor([[30.0]]), torch.tensor([[0.0]]), torch.tensor([-1.0]), clip_eps=0.2,
                           log_ratio_clamp=10.0)
    assert r.item() == pytest.approx(math.exp(10)) and kl.item() == pytest.approx(math.exp(-10) + 9)
    assert pg.item() == pytest.approx(math.exp(10))              # A < 0: −min(r·A, 1.2·A) = r
    _, kl, r = token_loss(torch.tensor([[30.0]]), torch.tensor([[0.0]]), torch.tensor([-1.0]), clip_eps=0.2,
                          log_ratio_clamp=0)
    assert r.item() == pytest.approx(math.exp(30), rel=1e-4) and kl.item() == pytest.approx(29.0)


def test_paired_gain_by_hand():
    """Four eval tasks before and after: d = (0.25, 0, 0, 0.5), mean 0.1875; the deviations from it are
    (0.0625, -0.1875, -0.1875, 0.3125), squares summing to 0.171875, so std = √(0.171875 / 3) = 0.23936
    and SE = 0.23936 / √4 = 0.11968."""
    from tasks import paired_gain
    gain, se = paired_gain([0.0, 0.5, 1.0, 0.25], [0.25, 0.5, 1.0, 0.75])
    assert gain == pytest.approx(0.1875) and se == pytest.approx(0.119678, abs=1e-6)
    # a task where the metric is undefined at either iteration (NaN) is left out: d = (0.5, −0.5), std √0.5, SE 0.5
    assert paired_gain([0.0, math.nan, 1.0, 0.0], [0.5, 1.0, 0.5, math.nan]) == pytest.approx((0.0, 0.5))
    with pytest.raises(ValueError):
        paired_gain([0.0, 1.0], [1.0])


def test_balanced_process_acc_standard_errors_by_hand():
    """Per-task [n₊, hits₊, n₋, hits₋]. Two tasks, (1, 1, 0, 0) and (0, 0, 1, 0): pooled bAcc (1 + 0) / 2 = 0.5. A
    bootstrap draw of 2 tasks is {1, 1} (p 1/4: bAcc 1), {2, 2} (p 1/4: 0) or one of each (p 1/2: 0.5), so the
    bootstrap SE is √(¼·0.25 + ¼·0.25) = √0.125 = 0.354. Paired: (1, 0, 0, 0), (0, 0, 1, 0) → (1, 1, 0, 0),
    (0, 0, 1, 1) moves every draw from 0 to 1, a gain of 1 with SE 0."""
    from tasks import bacc_se, gains, paired_bacc_gain
    assert bacc_se([[1, 1, 0, 0], [0, 0, 1, 0]], draws=20000) == pytest.approx(math.sqrt(0.125), abs=0.005)
    assert bacc_se([[2, 1, 2, 1], [0, 0, 0, 0], [2, 1, 2, 1]]) == 0.0   # unlabelled tasks left out; no spread
    assert math.isnan(bacc_se([[2, 1, 2, 1], [0, 0, 0, 0]]))            # one labelled task: no SE
    before, after = [[1, 0, 0, 0], [0, 0, 1, 0]], [[1, 1, 0, 0], [0, 0, 1, 1]]
    assert paired_bacc_gain(before, after) == (1.0, 0.0)
    assert gains({"in_domain/process_counts_tasks": before}, {"in_domain/process_counts_tasks": after}) == \
        {"in_domain/process_bacc_gain": 1.0, "in_domain/process_bacc_gain_se": 0.0}
    with pytest.raises(ValueError):
        paired_bacc_gain(before, after[:1])


def test_eval_accuracy_keeps_each_task_and_gains_pair_them():
    from tasks import accuracy, gains, headline
    task = Task("t", "p", {})
    groups = [Group(task, [Rollout("t", [], o) for o in outs]) for outs in ([1, -1], [-1, -1], [1, 1])]
    m = accuracy("in_domain/code", groups)
    assert m["in_domain/code_tasks"] == [0.5, 0.0, 1.0] and m["in_domain/code"] == pytest.approx(0.5)
    assert m["in_domain/code_se"] == pytest.approx(0.5 / math.sqrt(3))
    later = {"in_domain/code_tasks": [1.0, 0.5, 1.0], "ood/code_tasks": [0.0]}
    g = gains(m, later)   # ood was not measured before: no gain for it
    assert g == {"in_domain/code_gain": pytest.approx(1 / 3), "in_domain/code_gain_se": pytest.approx(math.sqrt(1 / 12) / math.sqrt(3))}
    assert [k for k in [*m, *g] if headline(k)] == ["in_domain/code"]
