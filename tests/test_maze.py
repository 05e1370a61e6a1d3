"""The teaching setting (grid mazes): a scripted optimal policy wins at every level, exact step labels
agree with the solver, bad answers cost a step, E's rewrites are solver-checked, the ladder moves,
and 2 loop iterations per ablation on the tiny model."""
import re
from math import isnan
from types import SimpleNamespace

import pytest

from plumbing import models
import loop
from plumbing.models import bf16_fast
import tasks
from loop_cli import two_iterations
from records import Completion
from tasks import maze as mz

CFG = SimpleNamespace(max_turns=20, max_new_tokens=4, top_p=1.0, temperature=1.0, m=2, rm_temperature=1.0,
                      rm_top_p=1.0, rm_oracle=False, rm_max_new_tokens=4)


class ScriptedEngine:
    """A test double for an engine: `answer(prompt)` gives the text after the prefilled "\\boxed{"."""

    def __init__(self, answer):
        self.answer, self.tokenizer = answer, models.load("tiny")[1]

    def generate(self, prompts, n=1, **kw):
        return [[Completion(self.answer(p), [1], [2], "stop") for _ in range(n)] for p in prompts]


def optimal(prompt: str) -> str:
    """Reads the map and the numbered moves from P's prompt and answers a move on a shortest path."""
    grid = prompt.split("'G' goal):\n")[1].split("\nThe goal is at")[0].splitlines()
    dist = mz.distances(grid)
    moves = re.findall(r"(\d+)\. \w+ → row (\d+), column (\d+)", prompt)
    best = min(moves, key=lambda m: dist.get((int(m[1]), int(m[2])), 10**9))
    return f"{best[0]}}}"


@pytest.fixture(scope="module")
def adapter():
    return mz.Adapter(loop.parse_args(["--task", "maze"]))


def test_splits_and_ladder_shapes(adapter):
    sets = adapter.sets
    assert len(sets["train"]) == len(mz.LEVELS) * len(mz.TRAIN_SEEDS)
    assert {t.level for t in sets["in_domain"]} == set(range(len(mz.LEVELS)))
    assert not {tuple(t.data["grid"]) for t in sets["train"]} & {tuple(t.data["grid"]) for t in sets["in_domain"]}
    for t in sets["train"]:
        lo, hi = mz.LEVELS[t.level][3]
        assert lo <= t.data["dist"] <= hi
    assert all(t.level is None and t.data["grid"][1].count(".") >= 2 for t in sets["ood"])
    grids = {name: {tuple(t.data["grid"]) for t in ts} for name, ts in sets.items()}
    assert len(grids["validation"]) == len(sets["validation"]) == len(mz.VALIDATION_LEVELS) * len(mz.VALIDATION_SEEDS)
    assert not grids["validation"] & (grids["train"] | grids["in_domain"] | grids["ood"])
    for t in sets["validation"]:
        lo, hi = mz.VALIDATION_LEVELS[t.level][3]
        assert lo <= t.data["dist"] <= hi


def test_validation_flag_swaps_the_eval_sets_for_the_validation_split():
    plain = mz.Adapter(loop.parse_args(["--task", "maze"])).eval_sets()
    chosen = mz.Adapter(loop.parse_args(["--task", "maze", "--validation"])).eval_sets()
    assert set(plain) == {"in_domain", "ood"} and set(chosen) == {"validation"}
    assert all(t.data["split"] == "validation" for t in chosen["validation"])
    no_split = SimpleNamespace(validation=True, eval_tasks=0, seed=0, task="alfworld")
    with pytest.raises(tasks.TaskError, match="no validation split"):   # a one-line error, not an empty eval
        tasks.chosen_sets({"train": chosen["validation"], "in_domain": chosen["validation"]}, no_split)


def test_an_unparseable_answer_counts_as_one():
    """One rollout per answer: "1}" is a valid move, "up}" and "9}" are not (no such number); each step is
    one answer, so 2 of the 3 steps are unparseable: the logged share is 2/3."""
    adapter = mz.Adapter(loop.parse_args(["--task", "maze"]))
    task = next(t for t in adapter.sets["train"] if t.level == 3)
    answers = iter(["1}", "up}", "9}"])
    cfg = SimpleNamespace(**{**vars(CFG), "max_turns": 1})
    groups = adapter.rollout([task], 3, ScriptedEngine(lambda p: next(answers)), cfg)
    assert [st.parsed for ro in groups[0].rollouts for st in ro.steps] == [True, False, False]
    row = loop.iteration_row(groups, [True], [], [], {}, {}, m=3, setting_metrics={})
    assert row["train/policy_unparseable"] == pytest.approx(2 / 3)
    assert row["train/policy_response_len"] == 1          # the test double's one response token
    steps = [st for ro in groups[0].rollouts for st in ro.steps]
    for st, verdicts in zip(steps, ([1, 0], [0, 0], [-1, 1])):   # R's judgments: 0 is no verdict
        st.verdicts = verdicts
    assert loop.iteration_row(groups, [True], [], [], {}, {}, m=3, setting_metrics={})["train/rm_unparseable"] == pytest.approx(3 / 6)


def test_scripted_optimal_policy_wins_at_every_level_in_the_fewest_steps(adapter):
    tasks = [next(t for t in adapter.sets["train"] if t.level == k) for k in range(len(mz.LEVELS))]
    tasks += adapter.sets["ood"][:2]
    groups = adapter.rollout(tasks, 2, ScriptedEngine(optimal), CFG)
    for g in groups:
        for ro in g.rollouts:
            assert ro.outcome == 1 and len(ro.steps) == g.task.data["dist"], g.task.id
            assert [st.label for st in ro.steps] == [1] * len(ro.steps)     # every step on a shortest path


def test_labels_agree_with_the_solver_hand_worked():
    grid = ["S.#", "..#", "#.G"]                 # BFS distances: S(0,0)=4, (0,1)=3, (1,0)=3, (1,1)=2, (2,1)=1
    dist = mz.distances(grid)
    assert dist[(0, 0)] == 4 and dist[(1, 1)] == 2 and (0, 2) not in dist
    assert mz.step_label(dist, (0, 0), (0, 1)) == 1 and mz.step_label(dist, (0, 1), (0, 0)) == -1
    assert mz.step_label(dist, (1, 1), (1, 0)) == -1 and mz.step_label(dist, (2, 1), (2, 2)) == 1
    assert mz.step_label(dist, (0, 0), None) == -1                          # a wasted step
    assert [name for name, _ in mz.moves_from(grid, (0, 1))] == ["down", "left"]   # walls and edges not offered


def test_bad_answers_cost_a_step_and_the_episode_goes_on(adapter):
    task = next(t for t in adapter.sets["train"] if t.level == 2)
    cfg = SimpleNamespace(**{**vars(CFG), "max_turns": 3})
    [g] = adapter.rollout([task], 2, ScriptedEngine(lambda p: "nine}"), cfg)
    for ro in g.rollouts:
        assert ro.outcome == -1 and len(ro.steps) == 3 and ro.invalid == 3
        assert all(st.label == -1 for st in ro.steps)
    assert "Move taken: none (no valid move number)" in g.rollouts[0].steps[0].judge_prompt
    [g] = adapter.rollout([task], 1, ScriptedEngine(lambda p: "7}"), cfg)   # a number with no such move
    assert g.rollouts[0].invalid == 3


def test_no_slack_ends_at_the_first_step_off_a_shortest_path():
    strict = mz.Adapter(loop.parse_args(["--task", "maze", "--maze-no-slack"]))
    task = next(t for t in strict.sets["train"] if t.level == 2)
    cfg = SimpleNamespace(**{**vars(CFG), "max_turns": 6})

    def worst_after_one(prompt):   # a shortest-path move first, then the move that leads farthest from the goal
        if "Your last moves" not in prompt:
            return optimal(prompt)
        grid = prompt.split("'G' goal):\n")[1].split("\nThe goal is at")[0].splitlines()
        moves = re.findall(r"(\d+)\. \w+ → row (\d+), column (\d+)", prompt)
        return f"{max(moves, key=lambda m: mz.distances(grid).get((int(m[1]), int(m[2])), -1))[0]}}}"

    runs = {name: strict.rollout([task], 1, ScriptedEngine(answer), cfg)[0].rollouts[0]
            for name, answer in (("optimal", optimal), ("invalid", lambda p: "nine}"), ("slip", worst_after_one))}
    assert [st.label for st in runs["optimal"].steps] == [1] * task.data["dist"] and runs["optimal"].outcome == 1
    assert [st.label for st in runs["invalid"].steps] == [-1] and runs["invalid"].outcome == -1
    assert [st.label for st in runs["slip"].steps] == [1, -1] and runs["slip"].outcome == -1
    for ro in runs.values():   # the outcome is the AND of the step labels
        assert ro.outcome == (1 if all(st.label == 1 for st in ro.steps) else -1)


def test_generated_rewrites_are_solver_checked(adapter):
    root = adapter.sets["train"][0]
    new = adapter.parse_rewrite(root, "Here: \\boxed{#####/#S..#/###G#}")
    assert new.data["grid"] == ["#####", "#S..#", "###G#"] and new.data["dist"] == 3 and new.origin == "generated"
    for bad in ("\\boxed{#####/#S#G#/#####}",      # no path
                "\\boxed{S..G/S...}",               # two starts, no G on a line, ragged
                "\\boxed{S.x/..G}",                 # unknown character
                "\\boxed{" + "/".join(["S" + "." * 9] + ["." * 10] * 8 + ["." * 9 + "G"]) + "}",  # 10 × 10
                "no box"):
        assert adapter.parse_rewrite(root, bad) is None
    for held_out in ("in_domain", "validation"):   # never train on an eval or a validation maze
        grid = adapter.sets[held_out][0].data["grid"]
        assert adapter.parse_rewrite(root, "\\boxed{" + "/".join(grid) + "}") is None
    prompt = adapter.rewrite_prompt(root, root, "harder", "rollout 0: not at the goal", 0.875)
    assert "/".join(root.data["grid"]) in prompt and "success rate on it: 0.88" in prompt


def test_variants_move_along_the_ladder(adapter):
    t = next(t for t in adapter.sets["train"] if t.level == 2)
    harder, easier = adapter.variant(t, "harder"), adapter.variant(t, "easier")
    assert (harder.level, easier.level) == (3, 1) and harder.data["dist"] > t.data["dist"] > easier.data["dist"]
    assert adapter.variant(easier, "easier").level == 0
    top = next(t for t in adapter.sets["train"] if t.level == len(mz.LEVELS) - 1)
    assert adapter.variant(top, "harder") is None and adapter.variant(adapter.sets["train"][0], "easier") is None
    assert adapter.variant(adapter.sets["ood"][0], "easier") is None


@pytest.mark.slow
@pytest.mark.parametrize("ablation", list(loop.ABLATIONS))
def test_cli_two_iterations_each_ablation(tmp_path, ablation):
    rows = two_iterations("maze", ablation, tmp_path, "--max-turns", "3", "--eval-tasks", "3", "--eval-samples", "2",
                          "--eval-every", "0")
    assert "eval/ood/success" in rows[0] and "eval/in_domain/success_se" in rows[-1]
    assert ("eval/in_domain/process_acc" in rows[-1]) == (ablation != "grpo")
    if ablation != "grpo":   # per task, R's labelled steps and hits, paired against iteration 0
        counts = rows[-1]["eval/in_domain/process_counts_tasks"]
        assert len(counts) == 3 and all(len(c) == 4 and c[1] <= c[0] and c[3] <= c[2] for c in counts)
        assert "eval/in_domain/process_bacc_gain_se" in rows[-1] and "eval/in_domain/process_bacc_se" in rows[-1]


@pytest.mark.slow
def test_rm_oracle_puts_the_exact_labels_in_rs_place(tmp_path):
    """--rm-oracle (a control): every verdict is the step's label, so against the labels the judge is perfect,
    in training (Theorem 1's μ = p₊ + p₋ = 2 against the labels, where both kinds of step were played) and at the
    eval (Process Acc 100 %)."""
    rows = two_iterations("maze", "stepwise", tmp_path, "--rm-oracle", "--max-turns", "3", "--eval-tasks", "3",
                          "--eval-samples", "2", "--eval-every", "0")
    for r in rows[1:]:
        mu = r["train/thm1_label_mu"]
        assert mu == 2.0 or isnan(mu)   # NaN: the iteration's rollouts held steps of one label only
    assert rows[0]["eval/in_domain/process_acc"] == rows[-1]["eval/in_domain/process_acc"] == 1.0


def test_rm_oracle_is_refused_where_steps_have_no_labels_or_r_trains():
    for argv in (["--task", "alfworld", "--ablation", "stepwise", "--rm-oracle"], ["--task", "maze", "--rm-oracle"]):
        with pytest.raises(loop.ConfigError, match="--rm-oracle"):
            loop.parse_args(argv)


def test_the_maze_samples_in_fp32_like_its_updates():
    """The maze's P and R update in fp32 with tiny steps; a bf16 sampler would act on those steps amplified
    (scripts/sampler_check.py), so its defaults sample in fp32 too, and --amp still asks for bf16."""
    cfg = loop.parse_args(["--task", "maze"])
    assert not cfg.amp and not cfg.train_amp
    assert loop.parse_args(["--task", "maze", "--amp"]).amp == bf16_fast()   # bf16 only where it is native
