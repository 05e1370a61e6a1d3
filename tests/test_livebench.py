"""The coding adapter: built-in data, LiveBench's question format, HumanEval, the scorer, E's rewrites."""
import base64
import json
import os
import pickle
import re
import warnings
import zlib
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest

import environment as env
from records import Completion, Group, Rollout, Sampling, Step, Task
from tasks import TaskError
from tasks.livebench import (Adapter, compiles, extract_code, given_lines, load_builtin, load_humaneval, load_livebench,
                             rm_funnel, run_gt, run_tests)

FIXTURES = Path(__file__).parent / "fixtures"


def cfg(**kw):
    base = dict(data="", humaneval_limit=0, seed=0, sandbox_timeout=5.0, m=2, rm_temperature=0.8, rm_top_p=1.0,
                rm_max_new_tokens=16, temperature=1.0, top_p=1.0, max_new_tokens=16, coding_task="generation",
                policy_reward="integrated", env_mode="variants", validation=False, eval_tasks=0, task="livebench",
                stop_after_code=True)
    return SimpleNamespace(**{**base, **kw})


def test_builtin_set_shape():
    rows = load_builtin()
    assert len(rows) >= 60 and len({r["id"] for r in rows}) == len(rows)
    ladders = Counter(r["ladder"] for r in rows)
    assert len(ladders) >= 15 and all(3 <= n <= 5 for n in ladders.values())
    for name in ladders:
        levels = sorted(r["level"] for r in rows if r["ladder"] == name)
        assert levels == list(range(len(levels)))
        assert sum(r["root"] for r in rows if r["ladder"] == name) == 1
        assert len({r["split"] for r in rows if r["ladder"] == name}) == 1
    assert all(len(r["tests"]) >= 5 and r["solution"] for r in rows)
    assert {r["split"] for r in rows} == {"train", "eval_id", "eval_ood", "validation"}
    validation = [r for r in rows if r["split"] == "validation"]
    assert len({r["ladder"] for r in validation}) >= 4
    others = {r["prompt"] for r in rows if r["split"] != "validation"}
    assert not any(r["prompt"] in others for r in validation)


@pytest.mark.slow
def test_every_reference_solution_passes_every_gt_test():
    a = Adapter(cfg())
    results = run_gt([(t, t.data["solution"]) for t in a.tasks], timeout=10.0)
    failed = [(t.id, r) for t, r in zip(a.tasks, results) if not all(r)]
    assert failed == []


def test_validation_flag_plays_the_validation_ladders_only():
    plain, chosen = Adapter(cfg(humaneval_limit=2)).eval_sets(), Adapter(cfg(validation=True, humaneval_limit=2)).eval_sets()
    assert set(plain) == {"in_domain", "ood", "humaneval"} and set(chosen) == {"validation"}
    assert len({t.ladder for t in chosen["validation"]}) >= 4
    assert not {t.ladder for t in chosen["validation"]} & {t.ladder for ts in plain.values() for t in ts}


def test_a_program_that_does_not_compile_is_unparseable():
    assert compiles("n = int(input())\nprint(n + 1)\n") and compiles("")
    for bad in ("print(", "Here is the code: print(1)", "x = 1\x00", "(" * 300 + ")" * 300):
        assert not compiles(bad)


def test_a_models_compile_time_warning_is_not_shown():
    """compile() warns (SyntaxWarning) on `"ab"[1, 2]`; a model's program is no reason to print to the user."""
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        assert compiles('x = "ab"[1, 2]\n') and compiles("assert (1, 'never false')\n")
    assert shown == []


def test_wrong_programs_fail():
    a = Adapter(cfg())
    task = next(t for t in a.tasks if t.id == "sum-0")
    res = run_gt([(task, "print(0)"), (task, "a, b = map(int, input().split())\nprint(a + b)"),
                  (task, "while True: pass")], timeout=1.0)
    assert not all(res[0]) and all(res[1]) and not any(res[2])


def test_livebench_format_stdin_and_functional():
    tasks = load_livebench(str(FIXTURES / "livebench_sample.jsonl"))
    assert [t.data["format"] for t in tasks] == ["stdin", "functional"]
    assert len(tasks[0].data["tests"]) == 3                    # 1 public + 2 decoded private
    good_stdin = "s = input()\nprint(sum(c in 'aeiou' for c in s))"
    good_func = ("class Solution:\n    def maxGap(self, nums: List[int]) -> int:\n"
                 "        best, lo = 0, nums[0]\n        for x in nums:\n"
                 "            best, lo = max(best, x - lo), min(lo, x)\n        return best\n")
    res = run_gt([(tasks[0], good_stdin), (tasks[0], "print(1)"), (tasks[1], good_func),
                  (tasks[1], good_func.replace("return best", "return -1"))], timeout=5.0)
    assert [all(r) for r in res] == [True, False, True, False]


def test_livebench_malformed_file_is_a_task_error(tmp_path):
    with pytest.raises(TaskError, match="line 2"):
        load_livebench(str(FIXTURES / "malformed_livebench.jsonl"))
    (tmp_path / "q.jsonl").write_text(json.dumps({"question_id": "x", "turns": ["t"]}) + "\n")
    with pytest.raises(TaskError, match="question 1"):
        load_livebench(str(tmp_path / "q.jsonl"))
    with pytest.raises(TaskError, match="no such file"):
        load_livebench(str(tmp_path / "missing.jsonl"))


def _private_blob(obj) -> str:
    return base64.b64encode(zlib.compress(pickle.dumps(obj))).decode()


class _Pwn:
    """A pickle whose loading would run a shell command (the classic __reduce__ payload)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_crafted_pickle_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    question = {"question_id": "q1", "turns": ["print the input"], "public_test_cases": "[]",
                "private_test_cases": _private_blob(_Pwn(marker))}
    (tmp_path / "q.jsonl").write_text(json.dumps(question) + "\n")
    with pytest.raises(TaskError, match=r"question 1: .*refused: the pickle names a global \(posix.system\)"):
        load_livebench(str(tmp_path / "q.jsonl"))
    assert not marker.exists()
    # the genuine encoding (a pickled JSON string) still loads
    tests = json.dumps([{"input": "1\n", "output": "1\n", "testtype": "stdin"}])
    (tmp_path / "ok.jsonl").write_text(json.dumps({**question, "private_test_cases": _private_blob(tests)}) + "\n")
    assert load_livebench(str(tmp_path / "ok.jsonl"))[0].data["tests"] == [{"input": "1\n", "output": "1\n"}]


@pytest.mark.parametrize("line, needle", [
    ("null", "a question is a JSON object, not NoneType"),
    ("[1, 2, 3]", "a question is a JSON object, not list"),
    (json.dumps({"question_id": "x", "turns": ["t"], "public_test_cases": ["a test"]}), "string 'input' and 'output'"),
    (json.dumps({"question_id": "x", "turns": ["t"], "public_test_cases": [{"input": 1, "output": "2"}]}),
     "string 'input' and 'output'"),
    (json.dumps({"question_id": "x", "turns": ["t"], "private_test_cases": "!!not base64!!"}), "question 1"),
])
def test_bad_data_lines_are_one_line_errors(tmp_path, line, needle):
    (tmp_path / "q.jsonl").write_text(line + "\n")
    with pytest.raises(TaskError, match=re.escape(needle)) as e:
        load_livebench(str(tmp_path / "q.jsonl"))
    assert "\n" not in str(e.value)


def test_empty_data_file_is_an_error(tmp_path):
    (tmp_path / "q.jsonl").write_text("\n\n")
    with pytest.raises(TaskError, match="no questions"):
        load_livebench(str(tmp_path / "q.jsonl"))


def test_humaneval_canonical_passes_wrong_fails():
    tasks = load_humaneval(3, seed=1)
    assert len(tasks) == 3 and len(load_humaneval(-1)) == 164
    res = run_gt([(t, t.data["solution"]) for t in tasks] + [(tasks[0], tasks[0].prompt + "    return None\n")],
                 timeout=10.0)
    assert [all(r) for r in res] == [True, True, True, False]


def test_generated_functional_tests_on_humaneval():
    task = next(t for t in load_humaneval(-1) if t.data["call"] == "has_close_elements")
    tests = [("[1.0, 2.0, 3.9]\n0.3\n", "false\n"), ("[1.0, 1.1]\n0.3\n", "true\n"), None, ("[1.0]\n", "x\n")]
    passes = run_tests([(task, [task.data["solution"]], tests), (task, [], tests),
                        (task, ["print('false')", task.data["solution"]], tests[:1])], timeout=5.0)
    assert passes == [[[True, True, False, False]], [], [[False], [True]]]


@pytest.mark.parametrize("text,code", [
    ("Here:\n```python\nprint(1)\n```\nDone.", "print(1)\n"),
    ("```python\nx = 1\n```\nthen\n```python\nprint(2)\n```", "print(2)\n"),
    ("```\nprint(3)\n```", "print(3)\n"),
    ("```python\nprint(4)\n", "print(4)\n"),            # cut off at max_new_tokens
    ("print(5)", "print(5)"),
])
def test_extract_code(text, code):
    assert extract_code(text) == code


def test_variants_move_along_the_ladder():
    a = Adapter(cfg())
    root = next(t for t in a.train_tasks() if t.ladder == "sum")
    assert root.level == 1
    assert a.variant(root, "harder").id == "sum-2" and a.variant(root, "easier").id == "sum-0"
    assert a.variant(a.variant(root, "easier"), "easier") is None
    assert len(a.train_tasks()) == 12 and {t.data["split"] for t in a.train_tasks()} == {"train"}


def _rewrite(solution, n_tests=4):
    tests = [{"input": f"{i}\n", "output": f"{2 * i}\n"} for i in range(n_tests)]
    return "```json\n" + json.dumps({"problem": "Read n, print 2n.", "tests": tests, "solution": solution}) + "\n```"


def test_parse_rewrite_validates_by_running_the_solution():
    a = Adapter(cfg())
    root = a.train_tasks()[0]
    good = a.parse_rewrite(root, _rewrite("print(2 * int(input()))"))
    assert good is not None and good.origin == "generated" and len(good.data["tests"]) == 4
    assert a.parse_rewrite(root, _rewrite("print(int(input()))")) is None       # unsolved by its own solution
    assert a.parse_rewrite(root, _rewrite("print(2 * int(input()))", 3)) is None  # fewer than 4 tests
    assert a.parse_rewrite(root, "I would make it harder by ...") is None
    assert a.parse_rewrite(root, '{"problem": "x", "tests": 5, "solution": "y"}') is None


class ScriptedEngine:
    """A test double for an LLM engine: returns the given texts in order."""

    def __init__(self, texts):
        self.texts, self.calls, self.tokenizer = list(texts), 0, SimpleNamespace(apply_chat_template=self._chat)
        self.prompts = []

    @staticmethod
    def _chat(messages, tokenize=False, add_generation_prompt=True):
        return messages[-1]["content"]

    def generate(self, prompts, n=1, **kw):
        self.calls += 1
        self.prompts += prompts
        self.stop = kw.get("stop")
        return [[Completion(self.texts.pop(0), [1], [2, 3], "stop") for _ in range(n)] for _ in prompts]


def test_judge_sets_verdicts_from_generated_tests():
    a = Adapter(cfg())
    task = next(t for t in a.tasks if t.id == "sum-0")
    good = "a, b = map(int, input().split())\nprint(a + b)"
    n = len(task.data["tests"])
    rollouts = [Rollout(task.id, [Step("p", [1], "r", [2])], 1, program=good, gt_passes=[True] * n),
                Rollout(task.id, [Step("p", [1], "r", [2])], -1, program="print(3)", gt_passes=[False] * n)]
    g = Group(task, rollouts)
    rm = ScriptedEngine(["1 2\n```\nOutput:\n```\n3\n```", "no test here"])  # continuations of TEST_PREFIX
    a.judge([g], rm, cfg(m=2))
    assert g.test_passes == [[True, False], [True, False]]
    assert [ro.steps[0].verdicts for ro in g.rollouts] == [[1, 0], [1, 0]]

    # E's critic feedback (released code): each test with its input, output and pass rate
    fb = a.feedback(g)
    assert json.dumps({"input": "1 2\n", "output": "3\n", "pass_rate": 1.0}) in fb.split("reward model")[1]
    gt0 = task.data["tests"][0]
    assert json.dumps({"input": gt0["input"], "output": gt0["output"], "pass_rate": 0.5}) in fb
    prompt = a.rewrite_prompt(task, task, "harder", fb, 0.5)
    assert json.dumps({"input": gt0["input"], "output": gt0["output"]}) in prompt.split("Current version")[0]
    assert fb in prompt


E_SAMPLING = Sampling(temperature=0.8, top_p=0.95, max_new_tokens=64)


def test_generate_mode_takes_first_valid_try():
    a = Adapter(cfg())
    root = a.train_tasks()[0]
    slot = env.Slot(root=root, active=root)
    e = ScriptedEngine(["not json", _rewrite("print(2 * int(input()))"), "unused", "unused"])
    [(task, tries)] = env.propose([(slot, "harder", "feedback")], a, "generate", e, E_SAMPLING, retries=4)
    assert task is not None and tries == 2 and e.calls == 1   # the N tries come from one generate call
    e = ScriptedEngine(["nope"] * 3)
    assert env.propose([(slot, "easier", "")], a, "generate", e, E_SAMPLING, retries=3) == [(None, 3)]


def test_given_lines_drop_the_last_line():
    assert given_lines("n = int(input())\nfor i in range(n):\n    print(i)\n") == "n = int(input())\nfor i in range(n):\n"
    assert given_lines("a = 1\nprint(a)") == "a = 1\n"
    assert given_lines("print(1)\n") == ""


def test_code_completion_gives_the_first_lines_and_scores_the_whole_program():
    a = Adapter(cfg(coding_task="completion"))
    assert all(t.data["given"] and t.data["solution"].startswith(t.data["given"]) for t in a.tasks)
    assert "given" not in Adapter(cfg()).tasks[0].data                       # generation: nothing given
    task = next(t for t in a.tasks if t.id == "sum-0")
    assert task.data["given"] == "a, b = map(int, input().split())\n"
    prompt = a.policy_prompt(task, ScriptedEngine([]).tokenizer)
    assert prompt.endswith("```python\na, b = map(int, input().split())\n```") and task.prompt in prompt
    # P continues after the given lines: the stored text holds them, the program is the whole block
    e = ScriptedEngine(["print(a + b)\n```", "print(a - b)\n```"])
    [g] = a.rollout([task], 2, e, cfg(coding_task="completion"))
    assert e.prompts == [prompt + "```python\na, b = map(int, input().split())\n"] and e.stop == "```"
    a.rollout([task], 1, e := ScriptedEngine(["print(a + b)\n```"]), cfg(stop_after_code=False))
    assert e.stop is None                                                     # --no-stop-after-code: on to eos
    assert g.rollouts[0].steps[0].response == "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
    assert [ro.outcome for ro in g.rollouts] == [1, -1]
    # E's generated problems are completed the same way
    good = a.parse_rewrite(task, _rewrite("n = int(input())\nprint(2 * n)"))
    assert good.data["given"] == "n = int(input())\n"


HOSTILE = {
    "fork bomb": "import os\nwhile True:\n    os.fork()",
    "infinite loop": "while True:\n    pass",
    "memory hog": "x = bytearray(4 << 30)\nprint(3)",
    "100 MB print": "print('x' * (100 << 20))",
    "write outside": "open('/work/escape.txt', 'w').write('x')\nprint(3)",
    "network": "import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=1)\nprint(3)",
    "parent env": "import os, glob\nprint(3 if any('RLA_SECRET' in open(p, errors='ignore').read() "
                  "for p in glob.glob('/proc/*/environ')) or 'RLA_SECRET' in os.environ else 'none')",
}


def test_hostile_programs_fail_their_tests_and_the_scorer_goes_on(monkeypatch):
    """Each hostile program is a failed test (on "1 2" the answer is 3, which each prints only if
    its attack worked), and a correct program scored right after still passes."""
    monkeypatch.setenv("RLA_SECRET", "hunter2")
    a = Adapter(cfg())
    task = next(t for t in a.tasks if t.id == "sum-0")
    task.data = {**task.data, "tests": [{"input": "1 2\n", "output": "3\n"}]}
    good = "a, b = map(int, input().split())\nprint(a + b)"
    res = run_gt([(task, p) for p in HOSTILE.values()] + [(task, good)], timeout=2.0)
    assert {name: r[0] for name, r in zip(HOSTILE, res)} == {name: False for name in HOSTILE}
    assert res[-1] == [True]
    assert not Path("/work/escape.txt").exists()


def test_first_failure_stops_a_programs_tests_with_the_same_verdict(monkeypatch):
    import tasks.livebench as lb
    task = next(t for t in Adapter(cfg()).tasks if t.id == "sum-0")
    n = len(task.data["tests"])
    programs = [(task, "print(0)"), (task, "a, b = map(int, input().split())\nprint(a + b)"),
                (task, "while True: pass")]
    full = run_gt(programs, timeout=1.0)
    ran = []
    real = lb.run_many
    monkeypatch.setattr(lb, "run_many", lambda jobs, **kw: ran.append(len(jobs)) or real(jobs, **kw))
    short = run_gt(programs, timeout=1.0, first_failure=True)
    assert [all(r) for r in short] == [all(r) for r in full] == [False, True, False]
    assert short[1] == full[1] == [True] * n and not any(short[2])
    first_fail = full[0].index(False)          # print(0) runs until its first failed test, the hang once
    assert sum(ran) == (first_fail + 1) + n + 1 < 3 * n


def test_rm_funnel_counts_band_ties_and_wrong_tests_by_hand():
    """reward_model's coding reward sees this group: 2 GT codes and a wrong program, R's 3 tests: t1 correct (the
    wrong program fails it), t2 wrong (a GT code fails it), and one that does not parse."""
    ok = [Completion(f"Input: {i}\nOutput: {i}", [], [], "stop") for i in (1, 2)]
    tests = [ok[0], ok[1], Completion("no test here", [], [], "stop")]
    ros = [Rollout("t", [], 1, 1.0), Rollout("t", [], 1, 1.0), Rollout("t", [], -1, 0.0)]
    g = Group(Task("t", "", {}), ros, tests=tests, test_passes=[[True, True, False], [True, False, False],
                                                                 [False, True, False]])
    far = Group(Task("u", "", {}), [Rollout("u", [], -1, 0.0)] * 3, tests=tests, test_passes=[[False] * 3] * 3)
    f = rm_funnel([g, far], wrong_cost=False)
    assert f["rm_band"] == 0.5                       # acc 2/3 is in [0.2, 0.8], acc 0 is not
    assert f["rm_tied"] == 0.0                       # t1 +1, t2 −1, malformed 0: not all equal
    assert f["rm_tied_other"] == 0.0                 # with --wrong-tests-cost t2 still earns −1
    assert f["rm_tests_malformed"] == 2 / 6 and f["rm_tests_distinct"] == 1.0
    assert f["rm_tests_correct"] == 0.5              # of g's 2 parsed tests (far has no GT code), t1 only
