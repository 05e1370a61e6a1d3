"""The LLM-agent setting (paper §4.1, "ALFWorld"): P acts in ALFWorld's text household games for up
to `max_turns` steps, R judges every step m times, E rewrites a goal's object and receptacle.

- Engine: the real ALFWorld text engine (textworld's PDDL backend, fast-downward planner, ALFWorld's
  wrappers). Games: the official files when ALFWORLD_DATA points at them (after `alfworld-download`),
  else games generated offline from what the `alfworld` wheel ships (tasks/alfworld_games.py).
- Policy step: one prompt with the goal, the room, the recent history and the numbered admissible
  actions; the answer is an index in \\boxed{}. The assistant turn is prefilled with "\\boxed{" (as
  the coding adapter prefills its code fence): a 135M model otherwise rarely answers with an index.
  With a 7B policy, set ANSWER_PREFIX = "" and a larger --max-new-tokens to let it reason first.
  An unparseable answer is a wasted step ("Nothing happens."); the episode goes on.
- R sees the step (goal, history, observation), the chosen action with P's response, and the next
  observation, and writes a short reasoning and \\boxed{1} or \\boxed{-1}. Deviation: R's prompt leaves
  out the list of admissible actions (it judges the action taken, not the menu): 40% shorter prompts.
- Ground truth for R's Process Acc: after every step the planner replans from the new state; a step
  is good iff the game is won by it or the plan got exactly one step shorter (the action lies on a
  shortest plan, as far as the planner's plan is shortest). Labels are computed where Process Acc is
  measured, in evaluation (`plan_labels`); training never uses them (R learns from consistency, Eq. 3),
  so training rollouts skip the planner, most of the engine's time per step.
- E (generate mode, as in the released code): first summarizes each failed rollout in at most two
  sentences, from its trajectory and the steps R judged −1 every time; then, given the scene's initial
  state, the task, its success rate and those summaries, answers \\boxed{OBJ,REC} from the types present
  in the scene; the planner must solve the new game.
"""
from __future__ import annotations

import json
import os
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from plumbing.engines import ANSWER_PREFIX, boxed, render_chat
from records import Group, Step, Task, stage
from tasks import TaskError
from tasks import alfworld_games as games
from tasks.agent import HISTORY, AgentAdapter, Episode, parse_choice

DEFAULTS = {  # CPU defaults for this setting (each one a flag); --help shows the released value next to each
    "tasks_per_iter": 4, "group_size": 8, "max_turns": 15, "max_new_tokens": 6, "m": 3, "rm_max_new_tokens": 48,
    "temperature": 0.8, "rm_temperature": 0.8, "env_mode": "generate", "env_retries": 8, "env_max_new_tokens": 32,
    "policy_steps": 4, "rm_steps": 4, "acc_lower": 1 / 8, "acc_upper": 7 / 8, "drop_zero_adv": True,
    "eval_every": 0, "eval_tasks": 24, "eval_temperature": 0.8, "eval_max_turns": 15, "max_train_samples": 48,
}
# The released code's ALFWorld configuration (configs/alfworld_rl.yaml and sample/alfworld_rl_rollout.py).
REFERENCE = {
    "tasks_per_iter": 16, "group_size": 8, "max_turns": 40, "max_new_tokens": 2000, "temperature": 0.8,
    "top_p": 0.95, "m": 3, "rm_temperature": 0.8, "rm_top_p": 0.95, "rm_max_new_tokens": 4000,
    "env_mode": "generate", "env_retries": 8, "env_temperature": 0.8, "env_top_p": 0.95, "env_max_new_tokens": 8192,
    "policy_steps": 4, "rm_steps": 4, "acc_lower": 1 / 8, "acc_upper": 7 / 8, "drop_zero_adv": True,
    "iterations": 200, "eval_every": 5, "eval_samples": 3, "eval_temperature": 0.8, "eval_max_turns": 60,
    "eval_tasks": 0, "max_train_samples": 0,
}
SPLITS = {"train": "train", "in_domain": "valid_seen", "ood": "valid_unseen"}
TYPE_TEXT = {"pick_and_place_simple": "put an object in a receptacle",
             "look_at_obj_in_light": "look at an object under a lamp",
             "pick_clean_then_place_in_recep": "clean an object and put it in a receptacle",
             "pick_heat_then_place_in_recep": "heat an object and put it in a receptacle",
             "pick_cool_then_place_in_recep": "cool an object and put it in a receptacle",
             "pick_two_obj_and_place": "put two objects in a receptacle"}

POLICY_PROMPT = """You are a household robot in a text game. {room}

{history}Now: {obs}

Admissible actions:
{actions}

Choose the next action. Reply with its number in \\boxed{{}}."""

JUDGE_PROMPT = """A household robot plays a text game. Its task: {goal}.

{history}Before the step: {obs}

The robot answered: {response}
Action taken: {action}
Result: {next_obs}

Was this a good step towards the task? Explain in one sentence, then answer \\boxed{{1}} (good) or \\boxed{{-1}} (bad)."""

REWRITE_PROMPT = """You design tasks for a household robot in a text game. Make the task below {direction} for the \
robot by choosing a new {what} from this room. Harder: rarer types, more searching. Easier: common types that are \
easy to find.

Task type: {type_text}
Current task: {goal}
The robot's success rate on the current task: {acc}
Objects in this room (type × count): {objects}
{rec_label} in this room (type × count): {receptacles}

Why the robot failed, summarized from its failed attempts:
{feedback}

Answer with your choice as \\boxed{{OBJECT,{rec_upper}}}, for example \\boxed{{{example}}}."""

SUMMARY_PROMPT = """A household robot did not finish its task in a text game within {steps} steps.
Task: {goal}
Steps a reviewer judged bad every time: {risky}

What happened:
{trajectory}
In at most two sentences, say the most likely reasons it failed. Put the summary in \\boxed{{}}."""

def step_label(plan_before: list[str], plan_after: list[str], won: bool) -> int:
    """Planner ground truth of a step: +1 iff it won the game or the plan got exactly one step shorter."""
    return 1 if won or (plan_before and len(plan_after) == len(plan_before) - 1) else -1


# ───────────────────────────── games → tasks ─────────────────────────────

def task_from_game(path: Path, split: str, doc: dict | None = None) -> Task:
    """A game as a Task (`doc`: the game's JSON, when the caller has read it already)."""
    doc = doc or json.loads(path.read_text())
    traj = json.loads((path.parent / "traj_data.json").read_text())
    p = traj["pddl_params"]
    return Task(id=f"{split}/{path.parent.parent.name}/{path.parent.name}", prompt=games.goal_from_game(doc),
                origin="original", data={"game": str(path), "split": split, "task_type": traj["task_type"],
                                         "obj": p["object_target"], "recep": p["parent_target"],
                                         "toggle": p["toggle_target"], "plan": len(doc.get("walkthrough") or [])})


def load_split(root: Path, split: str) -> list[Task]:
    """Every solvable game of one split in alfworld-download's layout (root/json_2.1.1/<split>/<task>/<trial>/),
    skipping what ALFWorld skips (movable-receptacle and sliced tasks, games marked unsolvable)."""
    tasks = []
    for path in sorted((root / "json_2.1.1" / split).glob("*/*/game.tw-pddl")):
        if ("movable" in str(path) or "Sliced" in str(path) or path.parent.name.endswith(".tmp")  # .tmp: unfinished
                or not (path.parent / "traj_data.json").exists()):
            continue
        try:
            doc = json.loads(path.read_text())
            if doc.get("solvable", True) is not False:
                tasks.append(task_from_game(path, split, doc))
        except (json.JSONDecodeError, KeyError) as e:
            raise TaskError(f"{path}: not an ALFWorld game ({e!r})") from None
    return tasks


def scene_of(task: Task) -> dict:
    """The scene of a task's game: scene.json (generated games), else read back from its PDDL problem."""
    path = Path(task.data["game"])
    if (path.parent / "scene.json").exists():
        return json.loads((path.parent / "scene.json").read_text())
    return games.scene_from_problem(json.loads(path.read_text())["pddl_problem"])


# ───────────────────────────── episodes ─────────────────────────────

@dataclass(kw_only=True)
class GameEpisode(Episode):
    env: object
    room: str                                   # the first observation: the room and the task
    obs: str                                    # the current observation
    admissible: list[str]
    plan: list[str] | None                      # the planner's plan from the current state (labels only)
    history: list[tuple[str | None, str]] = field(default_factory=list)   # (action or None if invalid, observation)


def _clean(text: str) -> str:
    return text.replace("-= Welcome to TextWorld, ALFRED! =-", "").strip()


def _history(ep: GameEpisode) -> str:
    """The last HISTORY actions taken and what followed (wasted steps, with no action, are not shown:
    a small model copies their placeholder text)."""
    recent = [(a, o) for a, o in ep.history if a is not None][-HISTORY:]
    return "".join(f"> {a}\n{o[:300]}\n" for a, o in recent) + "\n" if recent else ""


class Adapter(AgentAdapter):
    """ALFWorld adapter: multi-turn episodes on the real engine, R judges each step (Eq. 3)."""

    rewrite_prefix = ANSWER_PREFIX  # E's answer starts "\\boxed{" too: a 135M E otherwise never writes one
    env_stage = "engine"

    def __init__(self, cfg):
        super().__init__(cfg)
        official = os.environ.get("ALFWORLD_DATA")
        if official:
            self.root = Path(official)
            if not (self.root / "json_2.1.1").is_dir():
                raise TaskError(f"ALFWORLD_DATA={official}: no json_2.1.1/ folder (run alfworld-download, or unset it)")
        else:
            self.root = games.games_root(cfg.seed)
            if not (self.root / "report.json").exists():
                print(f"[alfworld] generating games offline into {self.root} (once; resumes if interrupted)")
                report = games.generate(cfg.seed, workers=max(os.cpu_count() or 1, 1), root=self.root)
                (self.root / "report.json").write_text(json.dumps(report, indent=1))
        self.sets = {name: load_split(self.root, folder) for name, folder in SPLITS.items()}
        if not self.sets["train"]:
            raise TaskError(f"no ALFWorld training games under {self.root}/json_2.1.1/train")
        self.rewrites = self.root / "rewrites"
        self._envs: dict[str, list] = {}     # planning mode → idle engines, reused for any game (see start)
        self.plan_labels = False             # planner labels for every step (set during evaluation)

    # — the engine —
    def start(self, task: Task, k: int) -> GameEpisode:
        """An episode on an idle engine, which loads this game. Each engine holds its own copy of
        fast-downward's library, never unloaded, so engines are reused rather than opened per game
        (docs/NOTES.md). The pool is as large as the most episodes ever run at once."""
        idle = self._envs.setdefault("step" if self.plan_labels else "none", [])
        if idle:
            env = idle.pop()
            env.load(task.data["game"])
        else:
            env = games.open_env(Path(task.data["game"]), "step" if self.plan_labels else "none")
        state = env.reset()
        room = _clean(state["feedback"])
        return GameEpisode(task=task, env=env, room=room, obs=room, admissible=list(state["admissible_commands"]),
                           plan=list(state["extra.expert_plan"]) if self.plan_labels else None)

    def play(self, episodes: list[GameEpisode], engine, cfg, temperature: float | None, max_turns: int) -> None:
        try:
            super().play(episodes, engine, cfg, temperature, max_turns)
        finally:   # the engines go back to the pool
            self._envs.setdefault("step" if self.plan_labels else "none", []).extend(ep.env for ep in episodes)

    def act(self, ep: GameEpisode, prompt: str, completion) -> None:
        """Apply P's answer: one engine step (or a wasted one), one Step with its planner label."""
        choice = parse_choice(completion.text, len(ep.admissible))
        label = None
        if choice is None:
            action, obs, ep.invalid = None, "Nothing happens.", ep.invalid + 1
            label = -1 if self.plan_labels else None
        else:
            action = ep.admissible[choice - 1]
            state, _, _ = ep.env.step(action)
            obs, ep.won, ep.admissible = _clean(state["feedback"]), bool(state["won"]), list(state["admissible_commands"])
            ep.done = ep.won
            if self.plan_labels:
                plan = list(state["extra.expert_plan"])
                label, ep.plan = step_label(ep.plan, plan, ep.won), plan
        judge = JUDGE_PROMPT.format(goal=ep.task.prompt, history=_history(ep), obs=ep.obs[:600],
                                    response=completion.text.strip()[:300],
                                    action=action or "none (no valid action number)", next_obs=obs[:600])
        ep.steps.append(Step.sampled(prompt, completion, observation=obs,
                                     judge_prompt=judge, label=label, parsed=action is not None))
        ep.history.append((action, obs))
        ep.actions.append(action or "(invalid)")
        ep.obs = obs

    def policy_prompt(self, ep: GameEpisode, tokenizer) -> str:
        actions = "\n".join(f"{i}. {a}" for i, a in enumerate(ep.admissible, 1))
        return render_chat(tokenizer, POLICY_PROMPT.format(room=ep.room, history=_history(ep), obs=ep.obs[:600],
                                                           actions=actions))

    def to_rollout(self, ep: GameEpisode) -> Rollout:
        ro = super().to_rollout(ep)
        ro.first_observation = ep.room
        return ro

    # — evaluation: the paper's Table 1 columns for ALFWorld —
    def evaluate(self, sets: dict[str, list[Task]], policy, rm, cfg) -> dict:
        """Success per eval set, and with R: Process Acc (planner labels) and Outcome Acc."""
        self.plan_labels = True
        try:
            return super().evaluate(sets, policy, rm, cfg)
        finally:
            self.plan_labels = False

    # — E: a new object / receptacle for the goal, checked by the planner —
    def summary_prompt(self, group: Group, r: int, risky: list[int]) -> str:
        """E's prompt to summarize failed rollout r (released code): the task, R's high-risk step indices
        and the numbered trajectory."""
        ro = group.rollouts[r]
        lines = [f"[0] observation: {ro.first_observation[:300]}"]
        for k, (action, st) in enumerate(zip(ro.actions, ro.steps)):
            lines += [f"[{k}] action: {action}", f"[{k + 1}] observation: {st.observation[:150]}"]
        return SUMMARY_PROMPT.format(steps=len(ro.steps), goal=group.task.prompt,
                                     risky=", ".join(map(str, risky)) or "none", trajectory="\n".join(lines))

    def rewrite_prompt(self, root: Task, active: Task, direction: str, feedback: str, acc: float | None = None) -> str:
        """E's rewrite prompt (released code's content): the scene's initial state by type, the task, its
        success rate and E's own failure summaries; the answer is two types in \\boxed{OBJ,REC}."""
        scene = scene_of(root)
        objects, receptacles = games.scene_types(scene)
        counts = Counter(t for t, _ in [*scene["objects"].values(), *scene["receptacles"].values()])
        look = root.data["task_type"] == "look_at_obj_in_light"
        movable = [o for o in objects if o not in games.LAMPS]
        recs = [o for o in objects if o in games.LAMPS] if look else receptacles
        example = f"{movable[0] if movable else 'Apple'},{recs[0] if recs else 'Fridge'}"
        return REWRITE_PROMPT.format(direction=direction, what="object and lamp" if look else "object and receptacle",
                                     type_text=TYPE_TEXT[root.data["task_type"]], goal=active.prompt,
                                     acc="unknown" if acc is None else f"{acc:.2f}",
                                     objects=", ".join(f"{o} × {counts.get(o, 1)}" for o in movable),
                                     rec_label="Lamps" if look else "Receptacles",
                                     receptacles=", ".join(f"{r} × {counts.get(r, 1)}" for r in recs),
                                     feedback=feedback or "(none)", rec_upper="LAMP" if look else "RECEPTACLE",
                                     example=example)

    def parse_rewrite(self, root: Task, text: str) -> Task | None:
        """A valid rewrite names an object and a receptacle (lamp) present in the scene, poses a goal the
        scene allows, and the planner wins the new game on the engine."""
        boxes = boxed(text)
        parts = [p.strip() for p in boxes[-1].split(",")] if boxes else []
        if len(parts) != 2:
            return None
        return self.make_variant(root, *parts)

    def make_variant(self, root: Task, obj: str, rec: str) -> Task | None:
        scene = scene_of(root)
        objects, receptacles = games.scene_types(scene)
        canon = {t.lower(): t for t in objects + receptacles}
        obj, rec = canon.get(obj.lower().replace(" ", "")), canon.get(rec.lower().replace(" ", ""))
        if obj is None or rec is None:
            return None  # a type absent from the scene
        look = root.data["task_type"] == "look_at_obj_in_light"
        goal = games.Goal(root.data["task_type"], obj, "" if look else rec, rec if look else "")
        if games.goal_problems(scene, goal) is not None:
            return None
        folder = self.rewrites / games.game_id(scene, goal) / "trial_0"
        if not (folder / "game.tw-pddl").exists():
            scratch = games.write_game(folder.with_name("trial_0.tmp"), scene, goal, [])
            with stage(self.timings, "engine"):
                plan = games.solve(scratch)
            if plan is None:
                return None
            games.write_game(folder, scene, goal, plan)
        task = task_from_game(folder / "game.tw-pddl", "train")
        task.origin = "generated"
        return task

    # — E, variants mode: another goal of the same type in the same scene, ranked by difficulty —
    def difficulty(self, task: Task) -> tuple[int, int]:
        """(planner's plan length, −instances of the target object): a longer plan, or fewer objects to
        find, is harder."""
        objs = [t for t, _ in scene_of(task)["objects"].values()]
        return task.data["plan"], -objs.count(task.data["obj"])

    def variant(self, task: Task, direction: str) -> Task | None:
        """The nearest harder (easier) of up to 8 other planner-checked goals of the scene."""
        scene = scene_of(task)
        rng = random.Random(f"{task.id}-{direction}")
        options = dict.fromkeys(g for g in (games.sample_goal(scene, task.data["task_type"], rng) for _ in range(8)) if g)
        found = [v for g in options if (v := self.make_variant(task, g.obj, g.recep or g.toggle))]
        here, sign = self.difficulty(task), 1 if direction == "harder" else -1
        found = [v for v in found if (self.difficulty(v) > here if sign > 0 else self.difficulty(v) < here)]
        return min(found, key=lambda v: tuple(sign * x for x in self.difficulty(v)), default=None)

