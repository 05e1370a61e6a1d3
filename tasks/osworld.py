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
  shows one example action, a click on a random element of the current screen (EXAMPLE_ACTION):
  without it a 135M policy writes almost no parseable action (docs/NOTES.md). A random target keeps
  the example from pointing at the answer; with a 7B policy, set EXAMPLE_ACTION = False.
- Observation: the instruction and the element list (a text model reads these). A vision-language P (the paper's
  is Qwen3-VL-8B; here e.g. --model tiny-vlm, plumbing/vision.py) also reads the step's screenshot, recorded
  whenever P or R is one (--screenshots).
- R sees the previous actions, the screen before and after the step (element lists; a vision-language R also the
  two screenshots, in that order), and P's response.
- E, generate mode (the released code's mechanism): an LLM sees the current task as {template: hint},
  the templates of its family (MiniWoB: the pages of its ladder; released: the task's evaluator
  templates) and the critic feedback, and answers one {template: hint} in JSON: it may switch template
  and add or remove hints. Eq. 4 decides whether the rewrite stays.
- E, variants mode (the CPU default here; this project's pre-verified stand-in, in neither the paper
  nor the released code): one position on a ladder is (page, hint): easier = add the page's hint, or
  go to the previous page; harder = remove the hint, or go to the next page. No LLM call.
"""
from __future__ import annotations

import json
import random
import threading
from dataclasses import dataclass, field

from plumbing.engines import ANSWER_PREFIX, render_chat
from records import Group, Rollout, Step, Task, stage
from tasks import TaskError
from tasks.agent import HISTORY, AgentAdapter, Episode
from tasks.gui import parse_action

DEFAULTS = {  # CPU defaults (each one a flag); --help shows the released value next to each
    "tasks_per_iter": 4, "group_size": 8, "max_turns": 6, "max_new_tokens": 16, "m": 3, "rm_max_new_tokens": 48,
    "temperature": 1.0, "top_p": 0.9, "rm_temperature": 0.8, "rm_top_p": 1.0, "env_mode": "variants",
    "env_retries": 8, "env_max_new_tokens": 48, "policy_steps": 4, "rm_steps": 2, "acc_lower": 0.0,
    "acc_upper": 1.0, "drop_zero_adv": True, "eval_every": 0, "max_train_samples": 32,
    "target_kl": 0.05,   # P's and R's trust region, chosen on the validation split (docs/SWEEP.md); released: none
}  # browsers (--browsers 16): ~240 MiB each; 32 of them + the trainer ran a 24 GiB machine out of memory
# The released code's OSWorld configuration (configs/osworld_rl.yaml and its rollout scripts).
REFERENCE = {
    "tasks_per_iter": 12, "group_size": 8, "max_turns": 30, "max_new_tokens": 4096, "temperature": 1.0,
    "top_p": 0.9, "m": 3, "rm_temperature": 0.8, "rm_top_p": 1.0, "rm_max_new_tokens": 8096, "env_mode": "generate",
    "env_retries": 3, "env_temperature": 0.8, "env_top_p": 0.95, "env_max_new_tokens": 8096, "policy_steps": 4,
    "rm_steps": 2, "acc_lower": 0.0, "acc_upper": 1.0, "drop_zero_adv": True, "iterations": 400, "eval_every": 20,
    "eval_samples": 3, "eval_temperature": 0.0, "eval_max_turns": 30, "max_train_samples": 0,
}
EXAMPLE_ACTION = True        # see the module docstring
SCREEN_CHARS = 1500          # the element list is cut here (OSWorld's trees can be long)

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
TRAIN_SEEDS, VALIDATION_SEEDS, EVAL_SEED0 = range(4), range(500, 504), 1000
PROCESS_SEEDS = range(1100, 1104)   # unseen seeds of the pages with step labels: R's Process Acc over more tasks

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

Was this a good step towards the task? {ask}"""
# R's verdict: a 135M R asked to explain first left 97.7 % of its verdicts unparseable on the validation steps
# (docs/PREMISE.md), so its answer is prefilled with "\\boxed{" and it is asked for the verdict alone, as in the maze.
# With a 7B R (the paper's), set JUDGE_REASONS = True: it explains in one sentence, then answers.
JUDGE_REASONS = False
JUDGE_ASK = ("Explain in one sentence, then answer \\boxed{1} (good) or \\boxed{-1} (bad)." if JUDGE_REASONS else
             "Answer \\boxed{1} (good) or \\boxed{-1} (bad).")

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

# ───────────────────────────── tasks ─────────────────────────────

def ladder_task(ladder: str, rung: int, seed: int, hint: bool = False, split: str = "train") -> Task:
    page, hint_text = LADDERS[ladder][rung]
    return Task(id=f"{split}/{ladder}/{page}/s{seed}" + ("+hint" if hint else ""), prompt=page,
                data={"page": page, "seed": seed, "hint": hint_text if hint else ""},
                ladder=ladder, level=2 * rung + (0 if hint else 1), origin="original")


def miniwob_sets(labelled: set[str]) -> dict[str, list[Task]]:
    """train: every ladder page × TRAIN_SEEDS; validation (for choosing hyperparameters): the same pages ×
    VALIDATION_SEEDS; in_domain: the same pages, an unseen seed each; ood: pages on no ladder, unseen seeds.
    process and ood_process: the pages of in_domain and ood whose steps carry exact labels (`labelled`,
    miniwob_env.RIGHT) × PROCESS_SEEDS, so that R's Process Acc is measured over 4 tasks a page, not one."""
    train = [ladder_task(name, k, s) for name, rungs in LADDERS.items() for k in range(len(rungs)) for s in TRAIN_SEEDS]
    seen = [ladder_task(name, k, EVAL_SEED0 + k, split="eval") for name, rungs in LADDERS.items()
            for k in range(len(rungs))]
    ood = [Task(id=f"ood/{p}/s{EVAL_SEED0}", prompt=p, data={"page": p, "seed": EVAL_SEED0, "hint": ""},
                origin="original") for p in OOD_PAGES]
    validation = [ladder_task(name, k, s, split="validation") for name, rungs in LADDERS.items()
                  for k in range(len(rungs)) for s in VALIDATION_SEEDS]
    process = [ladder_task(name, k, s, split="process") for name, rungs in LADDERS.items()
               for k, (page, _) in enumerate(rungs) if page in labelled for s in PROCESS_SEEDS]
    ood_process = [Task(id=f"ood_process/{p}/s{s}", prompt=p, data={"page": p, "seed": s, "hint": ""},
                        origin="original") for p in OOD_PAGES if p in labelled for s in PROCESS_SEEDS]
    return {"train": train, "validation": validation, "in_domain": seen, "ood": ood, "process": process,
            "ood_process": ood_process}


# ───────────────────────────── episodes ─────────────────────────────

@dataclass(kw_only=True)
class GUIEpisode(Episode):
    env: object = None                           # the backend's handle (a browser, a bridge)
    screen: object = None                        # the current Screen
    instruction: str = ""
    score: float | None = None                   # the backend's final score, once known
    crashed: str = ""
    taken: list = field(default_factory=list)    # (action or None, screen before) per step, for exact labels
    rng: random.Random = field(default_factory=random.Random)   # picks the example action's element


def _history(ep: GUIEpisode) -> str:
    recent = ep.actions[-HISTORY:]
    return "Previous actions: " + "; ".join(recent) + "\n" if recent else ""


def _screen_text(screen) -> str:
    text = screen.text if screen is not None else "(the task ended after this action)"
    return text[:SCREEN_CHARS] or "(no elements)"


class Adapter(AgentAdapter):
    """OSWorld adapter: multi-turn GUI episodes on a real browser (or OSWorld VM); R judges each step."""

    rewrite_prefix = '{"'   # E's JSON answer is prefilled with its opening: a 135M E otherwise writes prose
    judge_prefix = "" if JUDGE_REASONS else ANSWER_PREFIX
    env_stage = "gui"

    def __init__(self, cfg):
        super().__init__(cfg)
        self._lock = threading.Lock()        # episodes step in parallel threads; counts go through it
        if cfg.backend == "miniwob":
            from tasks.gui import Pool
            from tasks.miniwob_env import RIGHT, Browser, MiniWoB, chrome_paths
            try:
                chrome_paths()
            except RuntimeError as e:
                raise TaskError(str(e)) from None
            pool = Pool(lambda: Browser(cfg.screenshots, cfg.browser_timeout))
            self.backend, self.sets = MiniWoB(pool), miniwob_sets(set(RIGHT))
            self.where = "web browser"
        elif cfg.backend == "osworld":
            from tasks.osworld_env import OSWorld, load_tasks
            self.backend, self.sets = OSWorld(cfg), load_tasks(cfg.osworld_tasks, cfg.seed)
            self.where = "computer (Ubuntu desktop)"
        else:
            raise TaskError(f"unknown backend {cfg.backend!r}; choose miniwob or osworld")

    # — one step —
    def _count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self.timings[key] = self.timings.get(key, 0) + n

    def start(self, task: Task, k: int) -> GUIEpisode:
        return GUIEpisode(task=task, rng=random.Random(f"{task.id}/{k}"))   # the screen comes in `play`

    def _reset(self, ep: GUIEpisode) -> None:
        try:
            ep.screen = self.backend.reset(ep.env, ep.task)
            ep.instruction = ep.screen.instruction
        except self.backend.Error as e:
            ep.done, ep.score, ep.crashed = True, 0.0, str(e)
            self._count("sys/env_restarts")

    def act(self, ep: GUIEpisode, prompt: str, completion) -> None:
        """Apply P's answer: one backend step (or a wasted one), one Step."""
        action, before = parse_action(completion.text), ep.screen
        after, taken = before, "none (malformed action)"
        parsed = action is not None and self.backend.valid(action, before)
        if not parsed:
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
        label = self.backend.label(ep.task, before, action if parsed else None, ep.taken)
        ep.taken.append((action if parsed else None, before))
        judge = JUDGE_PROMPT.format(where=self.where, instruction=ep.instruction, history=_history(ep),
                                    before=_screen_text(before), response=completion.text.strip()[:300], action=taken,
                                    after=_screen_text(after), ask=JUDGE_ASK)
        shots = tuple(s.screenshot for s in (before, after) if s is not None and s.screenshot is not None)
        ep.steps.append(Step.sampled(prompt, completion, observation=_screen_text(after)[:300], judge_prompt=judge,
                                     label=label, parsed=parsed, judge_images=shots))
        ep.actions.append(taken)
        ep.screen = after

    def policy_prompt(self, ep: GUIEpisode, tokenizer) -> str:
        hint = f"Hint: {ep.task.data['hint']}\n" if ep.task.data.get("hint") else ""
        ids = list(ep.screen.boxes)
        example = f", for example \\boxed{{click({ep.rng.choice(ids)})}}" if EXAMPLE_ACTION and ids else ""
        return render_chat(tokenizer, POLICY_PROMPT.format(where=self.where, instruction=ep.instruction, hint=hint,
                                                           history=_history(ep), screen=_screen_text(ep.screen),
                                                           example=example), images=len(self.policy_images(ep)))

    def policy_images(self, ep: GUIEpisode) -> tuple:
        return () if ep.screen.screenshot is None else (ep.screen.screenshot,)

    def score(self, ep: GUIEpisode) -> float:
        return ep.score

    def labelled(self, task: Task) -> bool:
        return self.backend.labelled(task)

    def to_rollout(self, ep: GUIEpisode) -> Rollout:
        ro = super().to_rollout(ep)
        ro.first_observation, ro.crashed = ep.instruction, ep.crashed
        return ro

    # — P plays in waves of at most cfg.browsers episodes (one browser or VM each); the backends step concurrently —
    def rollout(self, tasks: list[Task], G: int, engine, cfg, temperature: float | None = None,
                max_turns: int | None = None) -> list[Group]:
        for key in ("sys/env_steps", "sys/env_restarts"):
            self.timings.setdefault(key, 0)
        return super().rollout(tasks, G, engine, cfg, temperature, max_turns)

    def play(self, episodes: list[GUIEpisode], engine, cfg, temperature: float | None, max_turns: int) -> None:
        for w in range(0, len(episodes), cfg.browsers):
            wave = episodes[w:w + cfg.browsers]
            handles = self.backend.acquire(len(wave))
            for ep, h in zip(wave, handles):
                ep.env = h
            try:
                with stage(self.timings, "gui"):
                    self.backend.map(self._reset, wave)
                super().play(wave, engine, cfg, temperature, max_turns)
                with stage(self.timings, "gui"):   # the backend's verdict for episodes cut by the step limit
                    self.backend.map(self._finish, [ep for ep in wave if ep.score is None])
            finally:
                self.backend.release(handles)

    def act_all(self, answers: list[tuple]) -> None:
        with stage(self.timings, "gui"):
            self.backend.map(lambda a: self.act(*a), answers)

    def _finish(self, ep: GUIEpisode) -> None:
        try:
            ep.score = self.backend.final(ep.env)
        except self.backend.Error as e:
            ep.score, ep.crashed = 0.0, str(e)
            self._count("sys/env_restarts")

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
    def why_failed(self, ro: Rollout) -> str:
        return f"the environment failed ({ro.crashed[:80]})" if ro.crashed else "not solved"

    def feedback(self, group: Group) -> str:
        head = f"Instruction seen: {group.rollouts[0].first_observation}\n" if group.rollouts else ""
        return head + super().feedback(group)

