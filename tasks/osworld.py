"""The GUI-agent setting (paper §4.1, "OSWorld"): P operates a screen for up to `max_turns` steps with
a pyautogui-style action vocabulary, R judges every step m times, E moves tasks along their variants.

Two backends behind one action vocabulary (`--backend`):
- `miniwob` (default, offline): MiniWoB++ pages in real headless Chromium (tasks/miniwob_env.py).
  Tasks are (page, seed) pairs on ladders of related pages, easy → hard; in-domain eval uses the
  ladders' pages with unseen seeds, OOD eval uses pages on no ladder.
- `osworld`: real OSWorld through desktop-env in its own venv, behind a bridge process
  (tasks/osworld_env.py, tasks/osworld_bridge.py). Outcome: OSWorld's evaluator score > 0.

- Actions (P answers one in \\boxed{}): click(id) or click(x, y), double_click(...), type("text") or
  type(id, "text"), key("enter") or key("ctrl+a"), scroll("up"|"down") or scroll(id, "down"),
  wait(), done(), fail(). Ids are the [numbers] of the screen's element list. A malformed action or
  an unknown id is a wasted step; the episode goes on. done() / fail() end the episode, and the
  outcome is the backend's verdict (MiniWoB: the page's reward; OSWorld: its evaluator).
- The answer is prefilled with "\\boxed{" for a 135M policy (as in the ALFWorld adapter), and the prompt
  shows one example action, a click on a random element of the current screen (EXAMPLE_ACTION).
  Measured on SmolLM2-135M (18 ladder pages × 8 samples): 0 of 144 answers parsed without the
  example, 88 of 144 with it. A random target keeps the example from pointing at the answer; with a
  7B policy, set EXAMPLE_ACTION = False.
- Observation: the instruction and the element list (a text model reads these); with --screenshots the
  screenshot is recorded too, for a vision-language policy. Deviation: llm.py's engines take text
  only, so no policy here reads the screenshot yet; the paper's policy is Qwen3-VL-8B.
- R sees the previous actions, the screen before and after the step, and P's response.
- E, generate mode (the released code's mechanism): an LLM sees the current task as {template: hint},
  the templates of its family (MiniWoB: the pages of its ladder; released: the task's evaluator
  templates) and the critic feedback, and answers one {template: hint} in JSON: it may switch template
  and add or remove hints. Eq. 4 decides whether the rewrite stays.
- E, variants mode (the CPU default here; this project's pre-verified stand-in, in neither the paper
  nor the released code): one position on a ladder is (page, hint): easier = add the page's hint, or
  go to the previous page; harder = remove the hint, or go to the next page. No LLM call.
"""
from __future__ import annotations

import ast
import json
import random
import threading
from dataclasses import dataclass, field

from llm import render_chat
from tasks import (Group, Rollout, Step, Task, TaskError, agent_results, eval_groups, eval_subsets,
                   judge_steps, play_turns, stage)

DEFAULTS = {  # CPU defaults (each one a flag); --help shows the released value next to each
    "tasks_per_iter": 4, "group_size": 8, "max_turns": 6, "max_new_tokens": 16, "m": 3, "rm_max_new_tokens": 48,
    "temperature": 1.0, "top_p": 0.9, "rm_temperature": 0.8, "rm_top_p": 1.0, "env_mode": "variants",
    "env_retries": 8, "env_max_new_tokens": 48, "policy_steps": 4, "rm_steps": 2, "acc_lower": 0.0,
    "acc_upper": 1.0, "drop_zero_adv": True, "eval_every": 0, "max_train_samples": 32,
}  # browsers (--browsers 16): ~240 MiB each; 32 of them + the trainer ran a 24 GiB machine out of memory
# The released code's OSWorld configuration (configs/osworld_rl.yaml and its rollout scripts).
REFERENCE = {
    "tasks_per_iter": 12, "group_size": 8, "max_turns": 30, "max_new_tokens": 4096, "temperature": 1.0,
    "top_p": 0.9, "m": 3, "rm_temperature": 0.8, "rm_top_p": 1.0, "rm_max_new_tokens": 8096, "env_mode": "generate",
    "env_retries": 3, "env_temperature": 0.8, "env_top_p": 0.95, "env_max_new_tokens": 8096, "lr": 1e-6,
    "rm_lr": 1e-6, "policy_steps": 4, "rm_steps": 2, "acc_lower": 0.0, "acc_upper": 1.0, "drop_zero_adv": True,
    "fresh_optimizer": True, "log_ratio_clamp": 10.0, "iterations": 400, "eval_every": 20, "eval_samples": 3,
    "eval_temperature": 0.0, "eval_max_turns": 30, "max_train_samples": 0,
}
EXAMPLE_ACTION = True        # see the module docstring
HISTORY = 3
SCREEN_CHARS = 1500          # the element list is cut here (OSWorld's trees can be long)
VERBS = {"click", "double_click", "type", "key", "scroll", "wait", "done", "fail"}

# Ladders of related MiniWoB pages, easy → hard, each with the hint E can add (variants mode).
LADDERS = {
    "click": [("click-test", "Answer click(N), where N is the number of the button."),
              ("click-test-2", "Click the button whose text the task names: click(N) with its number."),
              ("click-button", "Find the button with the quoted text and answer click(N) with its number."),
              ("click-link", "Find the element with the quoted text and answer click(N) with its number."),
              ("click-dialog", "The x is the Close button: answer click(N) with its number."),
              ("click-button-sequence", "Click the first named button, then the second, one click per step.")],
    "type": [("focus-text", "Click the text box: click(N) with its number."),
             ("enter-text", 'Use type(N, "text") with the input\'s number and the quoted text, then click Submit.'),
             ("enter-text-2", 'Change the case as asked, use type(N, "text") on the input, then click Submit.'),
             ("enter-password", 'Type the password into both inputs with type(N, "text"), then click Submit.'),
             ("login-user", 'Type the username and the password with type(N, "text"), then click Login.')],
    "select": [("click-option", "Click the label with the named word, then click Submit."),
               ("click-checkboxes", "Click the label of each named word, then click Submit."),
               ("click-checkboxes-large", "Click the label of each named word (there are several), then Submit.")],
    "navigate": [("click-tab", "Click the link with the named tab's text: click(N)."),
                 ("click-collapsible", "Click the section heading to open it, then click Submit."),
                 ("click-tab-2-easy", "The link may be on another tab: click the tab, then the link."),
                 ("click-tab-2", "Click each tab until the named link is shown, then click it.")],
}
OOD_PAGES = ["click-dialog-2", "click-widget", "focus-text-2", "enter-text-dynamic", "login-user-popup",
             "click-checkboxes-soft", "click-collapsible-2", "click-tab-2-hard", "navigate-tree"]
TRAIN_SEEDS, EVAL_SEED0 = range(4), 1000

POLICY_PROMPT = """You operate a {where} to complete a task.
Task: {instruction}
{hint}
{history}Screen elements ([id] kind "text"):
{screen}

Actions: click(id), double_click(id), type(id, "text"), type("text"), key("enter"), scroll("down"), wait(), done(), fail().
Reply with the next action in \\boxed{{}}{example}."""

JUDGE_PROMPT = """An agent operates a {where} to complete a task: {instruction}

{history}Screen before the step:
{before}

The agent answered: {response}
Action taken: {action}
Screen after the step:
{after}

Was this a good step towards the task? Explain in one sentence, then answer \\boxed{{1}} (good) or \\boxed{{-1}} (bad)."""

REWRITE_PROMPT = """You design tasks for a computer-use agent. The agent's success on the current task says it \
should be {direction}: choose one task template of the same family, and write a hint to show the agent with \
its instruction. To make it easier, pick an easier template or add a helpful hint; to make it harder, pick a \
harder template or remove hints. Keep the hint short, and do not invent templates.

Current task: {current}
Task templates of this family (name: a hint that would help): {templates}

What the critics saw when the agent tried the current task:
{feedback}

Answer with JSON only, exactly one key, the template's name, and the hint as its value ("" for no hint), \
for example {example}"""

# ───────────────────────────── the action vocabulary ─────────────────────────────

@dataclass(frozen=True)
class Action:
    verb: str                  # one of VERBS
    args: tuple = ()

    def __str__(self):
        return f"{self.verb}({', '.join(repr(a) for a in self.args)})"


def _arity_ok(verb: str, args: tuple) -> bool:
    ints = [isinstance(a, int) and not isinstance(a, bool) for a in args]
    strs = [isinstance(a, str) for a in args]
    if verb in ("click", "double_click"):
        return ints in ([True], [True, True])
    if verb == "type":
        return (strs == [True]) or (ints == [True, False] and strs == [False, True])
    if verb == "key":
        return len(args) == 1 and strs[0] and 0 < len(args[0]) <= 32
    if verb == "scroll":
        direction_ok = bool(args) and strs[-1] and args[-1] in ("up", "down")
        return direction_ok and (len(args) == 1 or (len(args) == 2 and ints[0]))
    return not args  # wait, done, fail


def parse_action(text: str) -> Action | None:
    """The action in the last \\boxed{...} of an answer, or None if malformed. Model text is parsed,
    never evaluated: only a call of a known verb with literal int / str arguments passes."""
    start = text.rfind("\\boxed{")
    body = text[start + len("\\boxed{"):] if start >= 0 else ""
    body = body[:body.rfind("}")] if "}" in body else ""
    body = body.strip()
    if body in ("wait", "done", "fail"):
        body += "()"
    if not body or len(body) > 200:
        return None
    try:
        call = ast.parse(body, mode="eval").body
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and not call.keywords):
            return None
        args = tuple(ast.literal_eval(a) for a in call.args)
    except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError):
        return None
    verb = call.func.id
    return Action(verb, args) if verb in VERBS and _arity_ok(verb, args) else None


# ───────────────────────────── tasks ─────────────────────────────

def ladder_task(ladder: str, rung: int, seed: int, hint: bool = False, split: str = "train") -> Task:
    page, hint_text = LADDERS[ladder][rung]
    return Task(id=f"{split}/{ladder}/{page}/s{seed}" + ("+hint" if hint else ""), prompt=page,
                data={"page": page, "seed": seed, "hint": hint_text if hint else ""},
                ladder=ladder, level=2 * rung + (0 if hint else 1), origin="original")


def miniwob_sets() -> dict[str, list[Task]]:
    """train: every ladder page × TRAIN_SEEDS; in_domain: the same pages, an unseen seed each;
    ood: pages on no ladder, unseen seeds."""
    train = [ladder_task(name, k, s) for name, rungs in LADDERS.items() for k in range(len(rungs)) for s in TRAIN_SEEDS]
    seen = [ladder_task(name, k, EVAL_SEED0 + k, split="eval") for name, rungs in LADDERS.items()
            for k in range(len(rungs))]
    ood = [Task(id=f"ood/{p}/s{EVAL_SEED0}", prompt=p, data={"page": p, "seed": EVAL_SEED0, "hint": ""},
                origin="original") for p in OOD_PAGES]
    return {"train": train, "in_domain": seen, "ood": ood}


# ───────────────────────────── episodes ─────────────────────────────

@dataclass
class Episode:
    task: Task
    env: object                                  # the backend's handle (a browser, a bridge)
    screen: object = None                        # the current Screen
    instruction: str = ""
    history: list[str] = field(default_factory=list)     # actions taken (str), for the prompts
    steps: list[Step] = field(default_factory=list)
    judge_prompts: list[str] = field(default_factory=list)
    done: bool = False
    score: float | None = None                   # the backend's final score, once known
    invalid: int = 0
    crashed: str = ""
    rng: random.Random = field(default_factory=random.Random)   # picks the example action's element


def _history(ep: Episode) -> str:
    recent = ep.history[-HISTORY:]
    return "Previous actions: " + "; ".join(recent) + "\n" if recent else ""


def _screen_text(screen) -> str:
    text = screen.text if screen is not None else "(the task ended after this action)"
    return text[:SCREEN_CHARS] or "(no elements)"


class Adapter:
    """OSWorld adapter: multi-turn GUI episodes on a real browser (or OSWorld VM); R judges each step."""

    judge_kind = "steps"
    rewrite_prefix = '{"'   # E's JSON answer is prefilled with its opening: a 135M E otherwise writes prose

    def __init__(self, cfg):
        self.cfg, self.timings = cfg, {}
        self._lock = threading.Lock()        # episodes step in parallel threads; counts go through it
        if cfg.backend == "miniwob":
            from tasks.miniwob_env import Browser, Pool, chrome_paths
            try:
                chrome_paths()
            except RuntimeError as e:
                raise TaskError(str(e)) from None
            pool = Pool(lambda: Browser(cfg.screenshots, cfg.browser_timeout))
            self.backend, self.sets = MiniWoB(pool), miniwob_sets()
            self.where = "web browser"
        elif cfg.backend == "osworld":
            from tasks.osworld_env import OSWorld, load_tasks
            self.backend, self.sets = OSWorld(cfg), load_tasks(cfg.osworld_tasks, cfg.seed)
            self.where = "computer (Ubuntu desktop)"
        else:
            raise TaskError(f"unknown backend {cfg.backend!r}; choose miniwob or osworld")

    def train_tasks(self) -> list[Task]:
        return self.sets["train"]

    def eval_sets(self) -> dict[str, list[Task]]:
        return eval_subsets(self.sets, self.cfg.eval_tasks, self.cfg.seed)

    # — one step —
    def _count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self.timings[key] = self.timings.get(key, 0) + n

    def _start(self, ep: Episode) -> None:
        try:
            ep.screen = self.backend.reset(ep.env, ep.task)
            ep.instruction = ep.screen.instruction
        except self.backend.Error as e:
            ep.done, ep.score, ep.crashed = True, 0.0, str(e)
            self._count("sys/env_restarts")

    def _act(self, ep: Episode, prompt: str, completion) -> None:
        """Apply P's answer: one backend step (or a wasted one), one Step."""
        action, before = parse_action(completion.text), ep.screen
        after, taken = before, "none (malformed action)"
        if action is None or not self.backend.valid(action, before):
            ep.invalid += 1
        else:
            taken = str(action)
            try:
                after, ep.done, score = self.backend.step(ep.env, action, before)
                ep.score = score if ep.done else None
                self._count("sys/env_steps")
            except self.backend.Error as e:
                after, ep.done, ep.score, ep.crashed = None, True, 0.0, str(e)
                self._count("sys/env_restarts")
        ep.judge_prompts.append(JUDGE_PROMPT.format(
            where=self.where, instruction=ep.instruction, history=_history(ep), before=_screen_text(before),
            response=completion.text.strip()[:300], action=taken, after=_screen_text(after)))
        ep.steps.append(Step(prompt, completion.prompt_ids, completion.text, completion.ids,
                             observation=_screen_text(after)[:300]))
        ep.history.append(taken)
        ep.screen = after

    def policy_prompt(self, ep: Episode, tokenizer) -> str:
        hint = f"Hint: {ep.task.data['hint']}\n" if ep.task.data.get("hint") else ""
        ids = list(ep.screen.boxes)
        example = f", for example \\boxed{{click({ep.rng.choice(ids)})}}" if EXAMPLE_ACTION and ids else ""
        return render_chat(tokenizer, POLICY_PROMPT.format(where=self.where, instruction=ep.instruction, hint=hint,
                                                           history=_history(ep), screen=_screen_text(ep.screen),
                                                           example=example))

    # — P plays: every live episode in one generate call per turn; the backends step concurrently —
    def rollout(self, tasks: list[Task], G: int, engine, cfg, temperature: float | None = None,
                max_turns: int | None = None) -> list[Group]:
        """G episodes per task, played in waves of at most cfg.browsers (one browser or VM each)."""
        for key in ("sys/env_steps", "sys/env_restarts"):
            self.timings.setdefault(key, 0)
        episodes = [Episode(t, None, rng=random.Random(f"{t.id}/{k}")) for t in tasks for k in range(G)]
        for w in range(0, len(episodes), cfg.browsers):
            self._play(episodes[w:w + cfg.browsers], engine, cfg, temperature, max_turns or cfg.max_turns)
        groups = []
        for k, task in enumerate(tasks):
            groups.append(Group(task, [Rollout(task.id, ep.steps, 1 if ep.score > 0 else -1, ep.score,
                                               info={"judge_prompts": ep.judge_prompts, "invalid": ep.invalid,
                                                     "crashed": ep.crashed, "actions": ep.history,
                                                     "instruction": ep.instruction})
                                       for ep in episodes[k * G:(k + 1) * G]]))
        return groups

    def _play(self, episodes: list[Episode], engine, cfg, temperature: float | None, max_turns: int) -> None:
        handles = self.backend.acquire(len(episodes))
        for ep, h in zip(episodes, handles):
            ep.env = h
        try:
            with stage(self.timings, "gui"):
                self.backend.map(self._start, episodes)

            def act_all(answers):
                with stage(self.timings, "gui"):
                    self.backend.map(lambda a: self._act(*a), answers)

            play_turns(episodes, lambda ep: ep.done, self.policy_prompt, act_all, engine, cfg, temperature, max_turns)
            with stage(self.timings, "gui"):   # the backend's verdict for episodes cut by the step limit
                self.backend.map(self._finish, [ep for ep in episodes if ep.score is None])
        finally:
            self.backend.release(handles)

    def _finish(self, ep: Episode) -> None:
        try:
            ep.score = self.backend.final(ep.env)
        except self.backend.Error as e:
            ep.score, ep.crashed = 0.0, str(e)
            self._count("sys/env_restarts")

    # — R judges every step m times, in one batched call —
    def judge(self, groups: list[Group], engine, cfg) -> None:
        judge_steps(groups, engine, cfg)

    # — evaluation: success in-domain and OOD, and R's Outcome Acc —
    def evaluate(self, sets: dict[str, list[Task]], policy, rm, cfg) -> dict:
        return agent_results(eval_groups(self, sets, policy, rm, cfg), rm, process=False)  # no labels: no Process Acc

    # — E, variants mode: one position along the ladder —
    def variant(self, task: Task, direction: str) -> Task | None:
        if task.ladder is None:
            return None
        level = task.level + (1 if direction == "harder" else -1)
        if not 0 <= level < 2 * len(LADDERS[task.ladder]):
            return None
        new = ladder_task(task.ladder, level // 2, task.data["seed"], hint=level % 2 == 0)
        new.origin = "variant"
        return new

    # — E, generate mode (released code): choose a template of the task's family, add or remove hints —
    def templates(self, task: Task) -> dict[str, str]:
        """The task's family, as E sees it: template name → a hint that helps. MiniWoB: the pages of its
        ladder; a task on no ladder (real OSWorld) is its own single template."""
        if task.ladder in LADDERS:
            return dict(LADDERS[task.ladder])
        return {task.data.get("page") or task.id: task.data.get("hint", "")}

    def rewrite_prompt(self, root: Task, active: Task, direction: str, feedback: str, acc: float | None = None) -> str:
        """E's prompt: the current task as {template: hint}, the family's templates and the critic feedback.
        Like the released code's, it does not show the accuracy."""
        key = active.data.get("page") or active.id
        example = json.dumps({key: active.data.get("hint") or "Click the button named in the task."})
        return REWRITE_PROMPT.format(direction=direction, current=json.dumps({key: active.data.get("hint", "")}),
                                     templates=json.dumps(self.templates(root)), feedback=feedback or "(none)",
                                     example=example)

    def parse_rewrite(self, root: Task, text: str) -> Task | None:
        """A valid rewrite is a JSON object with exactly one key, a template of the root's family, whose
        value is a hint of at most 300 characters. The rewrite keeps the root's seed (MiniWoB) or task
        file (OSWorld)."""
        start = text.rfind('{"')
        try:
            obj = json.loads(text[start:text.rfind("}") + 1]) if start >= 0 else None
        except json.JSONDecodeError:
            return None
        if not (isinstance(obj, dict) and len(obj) == 1):
            return None
        (name, hint), = obj.items()
        families = self.templates(root)
        if name not in families or not isinstance(hint, str) or len(hint) > 300:
            return None
        hint = " ".join(hint.split())
        if root.ladder in LADDERS:
            task = ladder_task(root.ladder, list(families).index(name), root.data["seed"], hint=bool(hint))
            task.data["hint"] = hint
        else:
            task = Task(id=f"{root.id}+hint", prompt=root.prompt, data={**root.data, "hint": hint}, origin="generated")
        task.origin = "generated"
        return task

    # — critic feedback for E: failure summaries —
    def feedback(self, group: Group) -> str:
        lines = []
        for k, ro in enumerate(group.rollouts):
            if ro.outcome < 0:
                why = f"the environment failed ({ro.info['crashed'][:80]})" if ro.info["crashed"] else "not solved"
                lines.append(f"rollout {k}: {why} after {len(ro.steps)} steps ({ro.info['invalid']} malformed); "
                             f"actions: {'; '.join(ro.info['actions'][-4:])}")
        head = f"Instruction seen: {group.rollouts[0].info['instruction']}\n" if group.rollouts else ""
        return head + ("\n".join(lines[:4]) or f"all {len(group.rollouts)} rollouts succeeded")


class Backend:
    """What the adapter needs of a backend: handles from a pool (one per parallel episode), and
    reset / valid / step / final on a handle. Failures raise self.Error (miniwob_env.ScreenError)."""

    def __init__(self, pool):
        from tasks.miniwob_env import ScreenError
        self.pool, self.Error = pool, ScreenError

    def acquire(self, n: int) -> list:
        return self.pool.take(n)

    def release(self, handles: list) -> None:
        self.pool.give(handles)

    def map(self, fn, items: list) -> list:
        return self.pool.map(fn, items)


def center(screen, ref: int) -> tuple[float, float]:
    left, top, w, h = screen.boxes[ref]
    return left + w / 2, top + h / 2


def ids_known(action: Action, screen) -> bool:
    """The element ids an action names are on the screen's list."""
    ref_args = {"click": 1, "double_click": 1, "scroll": 2, "type": 2}.get(action.verb)
    return not (ref_args and len(action.args) == ref_args and action.args[0] not in screen.boxes)


class MiniWoB(Backend):
    """The `miniwob` backend: maps the action vocabulary onto MiniWoB++ in headless Chromium."""

    def __init__(self, pool):
        super().__init__(pool)
        from tasks.miniwob_env import key_name
        self.key_name = key_name

    def reset(self, browser, task: Task):
        return browser.reset(task.data["page"], task.data["seed"])

    def valid(self, action: Action, screen) -> bool:
        """Ids must be on the screen's list; keys must be ones MiniWoB can press."""
        return ids_known(action, screen) and (action.verb != "key" or self.key_name(action.args[0]) is not None)

    def step(self, browser, action: Action, screen):
        """(screen after, done, score when done)."""
        v, a = action.verb, action.args
        if v in ("done", "fail"):   # the agent stops; MiniWoB's verdict is its current (unfinished) reward
            return screen, True, 0.0
        if v == "click":
            kind, kw = ("CLICK_ELEMENT", {"ref": a[0]}) if len(a) == 1 else ("CLICK_COORDS", {"coords": a})
        elif v == "double_click":
            kind, kw = "DBLCLICK_COORDS", {"coords": center(screen, a[0]) if len(a) == 1 else a}
        elif v == "type":
            kind, kw = ("TYPE_TEXT", {"text": a[0]}) if len(a) == 1 else ("FOCUS_ELEMENT_AND_TYPE_TEXT",
                                                                          {"ref": a[0], "text": a[1]})
        elif v == "key":
            kind, kw = "PRESS_KEY", {"key": self.key_name(a[0])}
        elif v == "scroll":
            where = center(screen, a[0]) if len(a) == 2 else (80.0, 105.0)  # the task area's middle
            kind, kw = ("SCROLL_UP_COORDS" if a[-1] == "up" else "SCROLL_DOWN_COORDS"), {"coords": where}
        else:
            kind, kw = "NONE", {}
        return browser.step(kind, **kw)

    def final(self, browser) -> float:
        return 0.0   # MiniWoB ends an episode itself when the task is solved; unfinished = not solved
