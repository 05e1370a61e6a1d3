"""The GUI-agent setting: the action vocabulary (hand-worked), MiniWoB++ in real headless Chromium
(a scripted solution wins a task of every ladder, malformed actions cost a step, a killed or hung
browser is recovered), E's moves along the ladders, the real-OSWorld backend against a fake bridge,
and 2 loop iterations per ablation."""
import itertools
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import psutil
import pytest

from plumbing import models
import loop
from loop_cli import SETTING_ROWS, two_iterations
from records import Completion
from tasks import TaskError
from tasks import osworld as ow
from tasks.miniwob_env import RIGHT, key_name, render_elements, step_label
from tasks.gui import Action, parse_action

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "osworld"
CFG = SimpleNamespace(max_turns=4, max_new_tokens=8, top_p=1.0, temperature=1.0, m=2, rm_temperature=1.0,
                      rm_top_p=1.0, rm_oracle=False, browsers=3, rm_max_new_tokens=4)


@pytest.fixture(scope="module")
def adapter():
    ad = ow.Adapter(loop.parse_args(["--task", "osworld", "--browser-timeout", "5"]))
    yield ad
    ad.backend.pool.close()


# ───────────────────────────── the action vocabulary ─────────────────────────────

@pytest.mark.parametrize("text,expected", [
    ("\\boxed{click(5)}", Action("click", (5,))),
    ("I will press it. \\boxed{ click(10, 20) }", Action("click", (10, 20))),
    ('\\boxed{type(7, "Jerald")}', Action("type", (7, "Jerald"))),
    ("\\boxed{type('hi')}", Action("type", ("hi",))),
    ('\\boxed{key("ctrl+a")}', Action("key", ("ctrl+a",))),
    ('\\boxed{scroll(4, "down")}', Action("scroll", (4, "down"))),
    ("\\boxed{done}", Action("done")),
    ("\\boxed{wait()}", Action("wait")),
    ("\\boxed{click(1)} then \\boxed{fail()}", Action("fail")),   # the last box counts
])
def test_parse_action_hand_worked(text, expected):
    assert parse_action(text) == expected


@pytest.mark.parametrize("text", [
    "click(5)",                                  # no box
    "\\boxed{click(}", "\\boxed{}", "\\boxed{click('5')}", "\\boxed{click(True)}", "\\boxed{type(5)}",
    "\\boxed{scroll('sideways')}", "\\boxed{done(1)}", "\\boxed{rm(5)}", "\\boxed{click(x=5)}",
    "\\boxed{__import__('os').system('touch /tmp/pwned')}", "\\boxed{click(1+1)}", "\\boxed{os.click(5)}",
])
def test_parse_action_rejects_malformed_and_never_evaluates(text):
    assert parse_action(text) is None
    assert not Path("/tmp/pwned").exists()


def test_key_names_and_element_rendering_hand_worked():
    assert [key_name(k) for k in ("enter", "Tab", "ctrl+a", "shift+Left", "x", "hyper+a", "f13")] == \
        ["<Enter>", "<Tab>", "C-a", "S-<ArrowLeft>", "x", None, None]

    def el(ref, parent, tag, text="", w=10.0, value="", focused=0, leaf=1):
        return {"ref": ref, "parent": parent, "tag": tag, "text": text, "value": value, "left": np.array([1.0]),
                "top": np.array([2.0]), "width": np.array([w]), "height": np.array([5.0]),
                "flags": np.array([focused, 0, 0, leaf])}
    elements = [el(1, 0, "body", leaf=0), el(2, 1, "div", leaf=0), el(3, 2, "label", leaf=0), el(-1, 3, "t", "Blue"),
                el(4, 3, "input_checkbox"), el(5, 2, "input_text", value="ab", focused=1), el(6, 2, "button", "Go"),
                el(7, 2, "button", "Hidden", w=0.0)]
    text, boxes, kinds = render_elements(elements)
    assert text.splitlines() == ['[3] label "Blue"', "[4] input_checkbox", '[5] input_text value="ab" (focused)',
                                 '[6] button "Go"']
    assert boxes[6] == (1.0, 2.0, 10.0, 5.0) and 7 not in boxes and -1 not in boxes
    assert kinds == {3: ("label", "Blue"), 4: ("input_checkbox", ""), 5: ("input_text", ""), 6: ("button", "Go")}


def test_step_labels_hand_worked():
    """click-button: the right click hits a button with the quoted text, by id or at a point in its box; the
    sequence page wants its named buttons in order, one click each."""
    from tasks.gui import Screen
    screen = Screen('Click on the "ok" button.', "", {4: (0, 0, 10, 10), 5: (20, 0, 10, 10), 6: (40, 0, 10, 10)},
                    kinds={4: ("button", "ok"), 5: ("button", "no"), 6: ("div", "ok")})
    label = lambda action, earlier=(), page="click-button", sc=screen: step_label(page, sc, action, list(earlier))
    assert [label(Action("click", (r,))) for r in (4, 5, 6)] == [1, -1, -1]     # a div saying "ok" is no button
    assert [label(Action("click", xy)) for xy in ((5, 5), (25, 5), (45, 5), (15, 5))] == [1, -1, -1, -1]
    assert label(Action("double_click", (4,))) == 1                                    # its first click ends the page
    assert [label(a) for a in (Action("done"), Action("type", (4, "ok")), None)] == [-1, -1, -1]
    seq = Screen("Click button ONE, then click button TWO.", "", screen.boxes, kinds={4: ("button", "ONE"),
                                                                                     5: ("button", "TWO")})
    one, two, nothing = (Action("click", (4,)), seq), (Action("click", (5,)), seq), (None, seq)
    assert [label(Action("click", (r,)), earlier, "click-button-sequence", seq) for r, earlier in
            ((4, []), (5, []), (5, [one]), (5, [nothing, one]), (4, [one]), (4, [two]), (5, [one, two]))] == \
        [1, -1, 1, 1, -1, -1, -1]   # ONE then TWO; a malformed answer between is harmless; TWO first dooms the page
    assert label(Action("double_click", (4,)), [], "click-button-sequence", seq) == -1   # two pushes of ONE lose
    assert step_label("enter-text", screen, Action("click", (4,)), []) is None         # a page with no rule


@pytest.mark.parametrize("page", sorted(RIGHT))
def test_step_labels_agree_with_the_pages_own_reward(page):
    """Every element of a labelled page, on three seeds (click-dialog-2 names "x" on seed 3): clicking it is labelled
    +1 exactly when the page then pays; on the sequence page, every pair of clicks, the second labelled +1 exactly
    when the pair wins."""
    from tasks.miniwob_env import Browser
    b = Browser()
    try:
        for seed in (0, 3, 1000):   # 1000: the eval seed
            screen = b.reset(page, seed)
            for ref in screen.boxes:
                screen = b.reset(page, seed)
                label = step_label(page, screen, Action("click", (ref,)), [])
                after, done, reward = b.step("CLICK_ELEMENT", ref=ref)
                if page == "click-button-sequence" and not done:   # the second push: each button, from a replay
                    earlier = [(Action("click", (ref,)), screen)]
                    for second in after.boxes:
                        b.reset(page, seed)
                        b.step("CLICK_ELEMENT", ref=ref)
                        label2 = step_label(page, after, Action("click", (second,)), earlier)
                        _, done, reward = b.step("CLICK_ELEMENT", ref=second)
                        assert (label2 == 1) == (done and reward > 0), (page, seed, ref, second, label2, reward)
                    continue
                assert (label == 1) == (done and reward > 0), (page, seed, screen.text, ref, label, reward)
            assert any(step_label(page, screen, Action("click", (r,)), []) == 1 for r in screen.boxes)
    finally:
        b.close()


# ───────────────────────────── MiniWoB++ in real Chromium ─────────────────────────────

def solve(prompt: str) -> str:
    """A scripted policy for the ladders' pages: reads the instruction and the element list in P's
    prompt, answers the next correct action."""
    task = re.search(r"Task: (.*)", prompt).group(1)
    elements = {int(m.group(1)): (m.group(2), m.group(3) or "")
                for m in re.finditer(r'^\[(-?\d+)\] (\S+)(?: "(.*?)")?', prompt, re.M)}
    done = re.search(r"Previous actions: (.*)", prompt)
    done = done.group(1) if done else ""

    def find(tag, text=None):
        return next(r for r, (t, x) in elements.items() if t == tag and (text is None or x == text))
    quoted = re.search(r'"(.*?)"', task)
    if task.startswith("Click on the") and "button" in task:                  # click-button
        return f"click({find('button', quoted.group(1))})"
    if task.startswith("Enter") and "text field" in task:                     # enter-text
        return f"click({find('button', 'Submit')})" if done else f'type({find("input_text")}, "{quoted.group(1)}")'
    if task.startswith("Select"):                                             # click-option
        word = re.match(r"Select (\S+) and", task).group(1)
        return f"click({find('button', 'Submit')})" if done else f"click({find('label', word)})"
    if task.startswith("Click on Tab"):                                       # click-tab
        return f"click({find('a', task.removeprefix('Click on ').rstrip('.'))})"
    raise AssertionError(f"no script for {task!r}")


class ScriptedEngine:
    """A test double for an engine: answers `fn(prompt)` in \\boxed{} (the tiny model's tokenizer)."""

    def __init__(self, fn, on_call=None):
        self.fn, self.on_call, self.calls = fn, on_call, 0
        self.tokenizer = models.load("tiny")[1]

    def generate(self, prompts, n=1, **kw):
        self.calls += 1
        if self.on_call:
            self.on_call(self.calls)
        # prompts end with the prefilled "\\boxed{" (engines.prefilled adds it back to the text)
        return [[Completion(f"{self.fn(p)}}}", [1], [2, 3], "stop") for _ in range(n)] for p in prompts]


@pytest.mark.parametrize("ladder,page", [("click", "click-button"), ("type", "enter-text"), ("select", "click-option"),
                                         ("navigate", "click-tab")])
def test_scripted_solution_wins_a_task_of_every_ladder(adapter, ladder, page):
    rung = [p for p, _ in ow.LADDERS[ladder]].index(page)
    tasks = [ow.ladder_task(ladder, rung, seed) for seed in (0, 1)]
    groups = adapter.rollout(tasks, 2, ScriptedEngine(solve), CFG)
    for g in groups:
        assert [ro.outcome for ro in g.rollouts] == [1, 1], [(ro.actions, ro.crashed) for ro in g.rollouts]
        assert all(ro.score > 0 and ro.invalid == 0 for ro in g.rollouts)
    steps = groups[0].rollouts[0].steps
    assert len(steps) == (2 if ladder in ("type", "select") else 1)
    assert [st.label for st in steps] == ([1] if page in RIGHT else [None] * len(steps))   # exact labels, if any
    assert steps[-1].observation == "(the task ended after this action)"


def test_an_episode_on_the_sequence_page_is_labelled_step_by_step(adapter):
    """A malformed answer and a wait are −1 and harmless, ONE is right, TWO wins; in another episode TWO first
    dooms the page, so ONE after it is −1 too (the page then ends, lost)."""
    task = ow.ladder_task("click", 5, 0)   # click-button-sequence: [4] ONE, [5] TWO
    assert adapter.labelled(task) and not adapter.labelled(ow.ladder_task("type", 1, 0))
    for script, labels, outcome in ((["click(", "wait()", "click(4)", "click(5)"], [-1, -1, 1, 1], 1),
                                    (["click(5)", "click(4)"], [-1, -1], -1)):
        answers = iter(script)
        ro = adapter.rollout([task], 1, ScriptedEngine(lambda p: next(answers)), CFG)[0].rollouts[0]
        assert [st.label for st in ro.steps] == labels and ro.outcome == outcome, (script, ro.actions)


def test_screenshots_are_recorded_on_request():
    from tasks.miniwob_env import Browser
    b = Browser(screenshots=True)
    try:
        screen = b.reset("click-test", 0)
        assert screen.screenshot.shape == (210, 160, 3) and screen.screenshot.dtype == np.uint8
        assert screen.screenshot.std() > 0 and '"Click Me!"' in screen.text   # a rendered page, not a blank
    finally:
        b.close()
    assert b.instance is None


def test_malformed_action_costs_a_step_and_the_episode_goes_on(adapter):
    tasks = [ow.ladder_task("type", 1, 0)]  # enter-text
    answers = itertools.cycle(["click(", "click(999)", 'key("hyper+q")'])
    groups = adapter.rollout(tasks, 2, ScriptedEngine(lambda p: next(answers)), CFG)
    for ro in groups[0].rollouts:
        assert ro.outcome == -1 and len(ro.steps) == 4 and ro.invalid >= 3
        assert ro.actions[0] == "none (malformed action)"
    prompt = groups[0].rollouts[0].steps[0].judge_prompt
    assert "Action taken: none (malformed action)" in prompt and "input_text" in prompt.split("Screen after")[1]
    adapter.judge(groups, ScriptedEngine(lambda p: "Bad. \\boxed{-1"), CFG)
    assert groups[0].rollouts[0].steps[0].verdicts == [-1, -1]


def _chromium_of(browser) -> list:
    return [p for p in psutil.Process(browser.service.process.pid).children(recursive=True) if "chrom" in p.name()]


@pytest.mark.parametrize("how", ["killed", "hung"])
def test_a_killed_or_hung_browser_is_recovered(adapter, how):
    """Mid-episode (after P's first answer), one episode's Chromium is killed (SIGKILL) or frozen
    (SIGSTOP, until the 5 s browser timeout): that episode ends failed with the crash recorded, the
    other one wins, the pool wins the next rollout, and the broken browser plays again."""
    tasks = [ow.ladder_task("type", 1, 0)]
    taken = adapter.backend.pool.take(2)
    adapter.backend.pool.give(taken)
    victim = adapter.backend.pool.idle[0]   # rollout takes browsers from the front of the idle list
    restarts = victim.restarts

    def sabotage(call):
        if call == 2:   # the first turn's actions are applied; the second turn's will hit the dead browser
            for p in _chromium_of(victim):
                os.kill(p.pid, signal.SIGKILL if how == "killed" else signal.SIGSTOP)
    groups = adapter.rollout(tasks, 2, ScriptedEngine(solve, on_call=sabotage), CFG)
    broken, fine = groups[0].rollouts
    assert broken.outcome == -1 and fine.outcome == 1
    assert broken.crashed.startswith({"killed": "browser crashed", "hung": "browser hung"}[how])
    again = adapter.rollout(tasks, 2, ScriptedEngine(solve), CFG)
    assert [ro.outcome for ro in again[0].rollouts] == [1, 1]
    assert victim.restarts == restarts + 1 and "button" in victim.reset("click-test", 0).text  # a fresh Chromium
    assert _chromium_of(victim)


# ───────────────────────────── E along the ladders ─────────────────────────────

def test_variants_move_along_the_ladder_through_hints(adapter):
    t = ow.ladder_task("click", 1, 3)                       # click-test-2, no hint: level 3
    easier = adapter.variant(t, "easier")
    assert (easier.data["page"], bool(easier.data["hint"]), easier.level) == ("click-test-2", True, 2)
    assert adapter.variant(easier, "easier").data["page"] == "click-test"       # no hint, one page down
    harder = adapter.variant(t, "harder")                   # the next page, with its hint first
    assert (harder.data["page"], bool(harder.data["hint"]), harder.data["seed"]) == ("click-button", True, 3)
    assert adapter.variant(harder, "harder").data["hint"] == ""
    top = ow.ladder_task("click", len(ow.LADDERS["click"]) - 1, 0)
    assert adapter.variant(top, "harder") is None and adapter.variant(ow.ladder_task("click", 0, 0, hint=True), "easier") is None


def test_generated_rewrites_choose_a_template_and_a_hint(adapter):
    """generate mode (released code): E answers {template: hint} in JSON, one key, a template of the task's
    family (MiniWoB: the pages of its ladder); it may switch template and add or remove hints."""
    root = ow.ladder_task("type", 1, 2)                      # enter-text, seed 2
    hint = adapter.parse_rewrite(root, '{"enter-text": "Type the quoted word into the box, then click Submit."}')
    assert (hint.data["page"], hint.data["seed"], hint.origin) == ("enter-text", 2, "generated")
    assert hint.data["hint"].startswith("Type the quoted") and hint.level == 2
    harder = adapter.parse_rewrite(root, 'I pick a harder page. {"login-user": ""}')
    assert (harder.data["page"], harder.data["hint"], harder.data["seed"], harder.level) == ("login-user", "", 2, 9)
    easier = adapter.parse_rewrite(root, '{"focus-text": "Click the box."}')   # a lower page is allowed too
    assert easier.data["page"] == "focus-text" and easier.level == 0
    for bad in ('{"click-test": "x"}',                     # a page of another family
                '{"enter-text": "a", "login-user": "b"}',  # two keys
                '{"enter-text": 3}', "no json", '{"enter-text": "' + "x" * 301 + '"}'):
        assert adapter.parse_rewrite(root, bad) is None
    prompt = adapter.rewrite_prompt(root, root, "harder", "rollout 0: not solved", 1.0)
    assert '{"enter-text": ""}' in prompt and '"login-user": ' in prompt and "rollout 0: not solved" in prompt
    assert adapter.rewrite_prefix == '{"'


def test_hint_reaches_the_policy_prompt(adapter):
    groups = adapter.rollout([ow.ladder_task("click", 0, 0, hint=True)], 2, ScriptedEngine(lambda p: "wait()"), CFG)
    assert "Hint: Answer click(N)" in groups[0].rollouts[0].steps[0].prompt


# ───────────────────────────── real OSWorld, through a fake bridge ─────────────────────────────

@pytest.fixture()
def fake_osworld(tmp_path, monkeypatch):
    """The osworld backend with tests/fake_osworld_bridge.py (a FAKE bridge: replays observations)."""
    from tasks import osworld_env
    monkeypatch.setenv("FAKE_BRIDGE_REPLAY", str(FIXTURES / "replay.json"))
    monkeypatch.setenv("FAKE_BRIDGE_LOG", str(tmp_path / "bridge.log"))
    monkeypatch.setattr(osworld_env, "BRIDGE", ROOT / "tests" / "fake_osworld_bridge.py")
    cfg = loop.parse_args(["--task", "osworld", "--backend", "osworld", "--osworld-python", sys.executable,
                           "--osworld-tasks", str(FIXTURES / "evaluation_examples"), "--browser-timeout", "10"])
    ad = ow.Adapter(cfg)
    yield ad, tmp_path / "bridge.log"
    ad.backend.pool.close()


def test_fake_bridge_protocol_and_scoring(fake_osworld):
    ad, log = fake_osworld
    assert [len(ad.sets[k]) for k in ("train", "in_domain", "ood")] in ([2, 0, 1], [1, 1, 1])
    task = ad.sets["ood"][0]
    script = {0: "click(960, 550)", 1: 'type("hello world")', 2: 'key("ctrl+s")'}   # by actions taken so far
    good = ad.rollout([task], 1, ScriptedEngine(lambda p: script.get(p.count("; ") + ("Previous actions" in p), "done()")),
                      SimpleNamespace(**{**vars(CFG), "max_turns": 5}))
    for ro in good[0].rollouts:
        assert ro.outcome == 1 and ro.score == 1.0 and ro.actions[-1] == "done()"
        assert "Type 'hello world'" in ro.first_observation
    sent = [json.loads(x) for x in log.read_text().splitlines()]
    assert sent[0] == {"op": "hello"} and sent[1]["op"] == "reset" and sent[1]["task"]["id"] == "fake-0003"
    steps = [m["action"] for m in sent if m["op"] == "step"]
    assert steps[:4] == ["pyautogui.click(960, 550)", "pyautogui.typewrite('hello world', interval=0.02)",
                         "pyautogui.hotkey('ctrl', 's')", "DONE"]
    # clicking by element id: [2] is the Save button at (1700, 40) + (80, 34)/2
    bad = ad.rollout([task], 1, ScriptedEngine(lambda p: "click(2)"), SimpleNamespace(**{**vars(CFG), "max_turns": 2}))
    assert bad[0].rollouts[0].outcome == -1 and bad[0].rollouts[0].score == 0.0   # the evaluator ran at the step limit
    sent = [json.loads(x) for x in log.read_text().splitlines()]
    assert sent[-2]["action"] == "pyautogui.click(1740, 57)" and sent[-1] == {"op": "evaluate"}


def test_real_bridge_speaks_the_protocol_with_a_stub_desktop_env(tmp_path):
    """tasks/osworld_bridge.py itself, with a STUB desktop_env package (a test double) on its path."""
    pkg = tmp_path / "desktop_env"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "desktop_env.py").write_text(
        "class DesktopEnv:\n"
        "    def __init__(self, **kw): self.kw, self.acts = kw, []\n"
        "    def reset(self, task_config): return {'instruction': task_config['instruction'], 'screenshot': b'PNG',"
        " 'accessibility_tree': '<desktop-frame/>'}\n"
        "    def step(self, action, pause=2): self.acts.append(action); return self.reset({'instruction': 'x'}), 0,"
        " action in ('DONE', 'FAIL'), {}\n"
        "    def evaluate(self): return 1.0 if self.acts == ['pyautogui.click(1, 2)', 'DONE'] else 0.0\n"
        "    def close(self): pass\n")
    msgs = [{"op": "hello"}, {"op": "reset", "task": {"instruction": "do it"}},
            {"op": "step", "action": "pyautogui.click(1, 2)"}, {"op": "step", "action": "DONE"}, {"op": "evaluate"},
            {"op": "nope"}, {"op": "close"}]
    r = subprocess.run([sys.executable, str(ROOT / "tasks" / "osworld_bridge.py"), "--provider", "docker",
                        "--screenshots"], input="".join(json.dumps(m) + "\n" for m in msgs), capture_output=True,
                       text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(tmp_path)})
    out = [json.loads(x) for x in r.stdout.splitlines()]
    assert out[0] == {"ok": True, "protocol": 1, "backend": "desktop-env"}
    assert out[1]["obs"] == {"instruction": "do it", "accessibility_tree": "<desktop-frame/>", "screenshot": "UE5H"}
    assert out[3]["done"] is True and out[4] == {"ok": True, "score": 1.0}
    assert out[5]["ok"] is False and "unknown op" in out[5]["error"] and out[6] == {"ok": True}


def test_osworld_backend_input_errors(tmp_path):
    for args, msg in [(["--osworld-python", "/nope/python"], "--osworld-python"),
                      (["--osworld-python", sys.executable, "--osworld-tasks", str(tmp_path)], "evaluation_examples")]:
        with pytest.raises(TaskError, match=msg):
            ow.Adapter(loop.parse_args(["--task", "osworld", "--backend", "osworld", *args]))


# ───────────────────────────── the loop ─────────────────────────────

@pytest.mark.parametrize("ablation", SETTING_ROWS)
def test_cli_two_iterations_each_ablation(tmp_path, ablation):
    rows = two_iterations("osworld", ablation, tmp_path, "--max-turns", "2", "--eval-tasks", "2",
                          "--env-max-new-tokens", "8")
    assert "eval/ood/success" in rows[0] and "eval/in_domain/success" in rows[-1]
    assert ("eval/ood/outcome_acc" in rows[-1]) == (ablation != "grpo")
    assert rows[1]["time/gui"] > 0 and rows[1]["sys/env_restarts"] == 0 and rows[1]["train/tasks"] >= 2
    assert ("eval/process/process_bacc" in rows[-1]) == (ablation != "grpo")   # the labelled pages' set
    if ablation == "full":  # --eval-only prints success per eval set, R's Outcome Acc, and its Process Acc
        r = subprocess.run([sys.executable, str(ROOT / "loop.py"), "--task", "osworld", "--model", "tiny", "--engine",
                            "hf", "--max-turns", "2", "--eval-tasks", "2", "--m", "2", "--rm-max-new-tokens", "8",
                            "--eval-only", "--checkpoint", str(tmp_path / "x")], cwd=ROOT, capture_output=True,
                           text=True, timeout=900)
        assert r.returncode == 0, r.stderr[-3000:]
        header, *rows = [line.split() for line in r.stdout.splitlines()
                         if line.startswith(("eval set", "in_domain", "ood", "process"))]
        assert header[:3] == ["eval", "set", "SUCCESS"]   # then the columns in the order the sets first report them
        assert sorted(header[3:]) == ["OUTCOME_ACC", "PROCESS_ACC", "PROCESS_BACC", "PROCESS_MAJORITY"]
        assert [x[0] for x in rows] == ["in_domain", "ood", "ood_process", "process"]
