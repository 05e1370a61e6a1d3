"""The example setting (tasks/guess.py, docs/ADDING_A_SETTING.md): its rules by hand, its splits, the start-up
check of the setting interface, and 2 loop iterations of every ablation on the tiny model."""
import pytest

import loop
import tasks
from loop_cli import two_iterations
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
@pytest.mark.parametrize("ablation", list(loop.ABLATIONS))
def test_cli_two_iterations_each_ablation(tmp_path, ablation):
    rows = two_iterations("guess", ablation, tmp_path, "--max-turns", "3", "--eval-tasks", "3", "--eval-every", "0")
    assert "eval/ood/success" in rows[0] and "eval/in_domain/success_se" in rows[-1]
    assert ("eval/in_domain/process_acc" in rows[-1]) == (ablation != "grpo")
    assert ("train/thm1_label_mu" in rows[1]) == (ablation != "grpo")      # R judged steps with exact labels
