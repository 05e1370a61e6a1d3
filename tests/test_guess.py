"""The example setting (tasks/guess.py, docs/ADDING_A_SETTING.md): its rules by hand, its splits, the start-up
check of the setting interface, and 2 loop iterations of every ablation on the tiny model."""
import pytest

import loop
import tasks
from loop_cli import SETTING_ROWS, two_iterations
from records import Completion
from tasks import guess


@pytest.fixture(scope="module")
def adapter():
    return tasks.get("guess", loop.parse_args(["--task", "guess", "--model", "tiny"]), env_mode="variants")


def test_a_game_by_hand(adapter):
    """Hidden 3 in 1..8: 5 (open 1..8: good, "lower"), no number (bad, a wasted step), 6 (open 1..4: bad),
    2 (good, "higher"), 3 (good, "correct": won)."""
    ep = adapter.start(next(t for t in adapter.sets["train"] if t.data == {"n": 8, "secret": 3}), 0)
    for text in ["\\boxed{5}", "\\boxed{x}", "\\boxed{6}", "\\boxed{2}", "\\boxed{3}"]:
        adapter.act(ep, "p", Completion(text, [1], [2], "stop"))
    assert [(st.label, st.observation, st.parsed) for st in ep.steps] == [
        (1, "lower", True), (-1, "no valid guess", False), (-1, "lower", True), (1, "higher", True), (1, "correct", True)]
    assert (ep.won, ep.done, ep.invalid, ep.low, ep.high) == (True, True, 1, 3, 4)
    assert "Guesses so far: 5: lower; no valid guess; 6: lower; 2: higher." in ep.steps[-1].judge_prompt


def test_splits_are_disjoint_and_variants_climb_the_ladder(adapter):
    content = {name: {(t.data["n"], t.data["secret"]) for t in ts} for name, ts in adapter.sets.items()}
    assert not content["train"] & content["in_domain"] and not content["train"] & content["ood"]
    first = adapter.sets["train"][0]
    harder = adapter.variant(first, "harder")
    assert (first.level, harder.level) == (0, 1) and adapter.variant(harder, "easier").level == 0
    assert adapter.variant(first, "easier") is None and adapter.variant(adapter.sets["ood"][0], "harder") is None


def test_a_setting_missing_a_method_fails_at_start_up_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.delattr(guess.Adapter, "variant")
    args = ["--task", "guess", "--model", "tiny", "--engine", "hf", "--runs-dir", str(tmp_path)]
    assert loop.main(args) == 2                                   # E's variants mode needs it: refused at once
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "variant()" in err and "--env-mode variants" in err
    assert not (tmp_path / "guess-full-s0").exists()                 # the failed launch leaves no folder
    assert loop.main([*args, "--ablation", "grpo", "--iterations", "0", "--eval-every", "-1"]) == 0   # no E: fine


@pytest.mark.slow
@pytest.mark.parametrize("ablation", SETTING_ROWS)
def test_cli_two_iterations_each_ablation(tmp_path, ablation):
    rows = two_iterations("guess", ablation, tmp_path, "--max-turns", "3", "--eval-tasks", "3", "--eval-every", "0")
    assert "eval/ood/success" in rows[0] and "eval/in_domain/success_se" in rows[-1]
    assert ("eval/in_domain/process_acc" in rows[-1]) == (ablation != "grpo")
    assert ("train/thm1_label_mu" in rows[1]) == (ablation != "grpo")      # R judged steps with exact labels


class Answers:
    """A test double for an engine (the tiny model's tokenizer): P's sample j answers "4" when j is even, "9" when
    odd; R's judgment j of a step says 1, -1, then nothing valid."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def generate(self, prompts, n=1, **kw):
        texts = ["1}", "-1}", "x}"] if "Is the answer right?" in prompts[0] else ["4}", "9}"]
        return [[Completion(texts[j % len(texts)], [1], [2, 3], "stop") for j in range(n)] for _ in prompts]


@pytest.mark.parametrize("engine", ["tiny", "scripted"])
def test_the_single_turn_skeleton_in_the_docs_plays_judges_and_feeds_eq_1_to_3(engine):
    """docs/ADDING_A_SETTING.md's single-turn skeleton, run as written, on the tiny model and on scripted answers
    (the tiny model's are noise): P answers each task G times (one step per rollout, its outcome from the boxed
    answer), R judges each answer m times, and Eq. 1-3 turn them into P's and R's samples."""
    from pathlib import Path

    import policy
    import reward_model
    from plumbing.engines import ANSWER_PREFIX, boxed, make_engines, prefilled, render_chat
    from plumbing.models import load
    from records import Group, Rollout, Step, Task

    doc = (Path(__file__).parent.parent / "docs" / "ADDING_A_SETTING.md").read_text()
    code = doc.split("## A single-turn setting", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    space = {"AdapterBase": tasks.AdapterBase, "render_chat": render_chat, "prefilled": prefilled, "boxed": boxed,
             "ANSWER_PREFIX": ANSWER_PREFIX, "Group": Group, "Rollout": Rollout, "Step": Step,
             "reward_model": reward_model, "PROMPT": "What is {q}? Answer in \\boxed{{}}.",
             "JUDGE_PROMPT": "Question: what is {q}?\nAnswer: {a}\nIs the answer right? Reply \\boxed{{1}} or \\boxed{{-1}}."}
    exec(code, space)
    cfg = loop.parse_args(["--task", "guess", "--model", "tiny", "--group-size", "4", "--m", "3"])
    model, tok = load("tiny", 0)
    engine = make_engines("hf", {"p": (model, tok)}, amp=False, seed=0)["p"] if engine == "tiny" else Answers(tok)
    adapter = space["Adapter"](cfg)
    groups = adapter.rollout([Task("q0", "2 + 2", {"answer": "4"}), Task("q1", "3 + 4", {"answer": "7"})],
                             cfg.group_size, engine, cfg)
    adapter.judge(groups, engine, cfg)
    assert [len(g.rollouts) for g in groups] == [4, 4]
    for g in groups:
        for ro in g.rollouts:
            (st,) = ro.steps
            assert ro.outcome == (1 if boxed(st.response)[-1:] == [g.task.data["answer"]] else -1)
            assert st.response.startswith(ANSWER_PREFIX) and st.response_ids and g.task.prompt in st.judge_prompt
            assert len(st.verdicts) == 3 and set(st.verdicts) <= {-1, 0, 1} and len(st.judgments) == 3
    policy.score_steps(groups, lam=1.0, zero_single=False, reward="integrated")
    for g in groups:   # Eq. 1 with λ = 1: O + the mean verdict, one step per rollout
        assert [ro.steps[0].reward for ro in g.rollouts] == \
               pytest.approx([ro.outcome + sum(ro.steps[0].verdicts) / 3 for ro in g.rollouts])
    samples = reward_model.rm_samples(groups, adapter.judge_kind, acc_range=(0.0, 1.0), drop_zero=False,
                                      balance=False, norm="step", wrong_cost=False)
    varied = [st for g in groups for ro in g.rollouts for st in ro.steps if len(set(st.verdicts)) > 1]
    assert len(samples) == 3 * len(varied)   # Eq. 3: a step whose m verdicts agree is skipped
    if engine == "scripted":   # "4" is right for 2 + 2 only; R's [1, -1, 0] train R on every step
        assert [g.acc for g in groups] == [0.5, 0.0] and len(samples) == 3 * 8
