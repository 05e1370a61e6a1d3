"""The teaching setting: grid mazes, small enough that all three parts of RLAnything learn on a
laptop CPU in minutes. Not a setting of the paper; it has the shape of its agent settings (§4.1):
multi-turn episodes, R judging every step, E moving tasks along a difficulty ladder.

- Simplification, for a 135M model on a CPU: P's and R's answers are prefilled with "\\boxed{", so P
  answers a move number and R a verdict straight away, without reasoning first.
- A maze is a grid of '#' (wall), '.' (floor), 'S' (start) and 'G' (goal); outside the grid is
  wall. P sees the map, the goal's and its own coordinates, its last moves and the numbered moves
  it can make with the cell each leads to (a move into a wall is not offered), and answers a
  number. An unparseable answer is a wasted step and the episode goes on. Outcome: the goal reached
  within `max_turns` steps. With `--maze-no-slack` (issue 43's candidate, not the default) an episode ends at
  its first step off a shortest path, so its outcome is the AND of its step labels.
- Exact step labels, computed the way ALFWorld's planner labels are: a step is good iff it reaches
  the goal or shortens the breadth-first-search distance to the goal by one (it lies on a shortest
  path). R's Process Acc is therefore exact here.
- Difficulty ladder, for E's `variants` mode: LEVELS, from a 3×3 room with the goal next to the
  start to a 5×5 maze with walls and a shortest path of 4-6 steps (larger mazes give the initial
  model no success at all: no signal for any part, only cost; docs/NOTES.md);
  a variant is the training maze at the same position one level up or down. In `generate` mode E
  draws a new maze in \\boxed{} (rows separated by '/'); it is kept only if the solver (BFS) finds
  a path and it is no eval maze.
- Splits: train = LEVELS × TRAIN_SEEDS; in-domain eval = the same levels, other seeds; OOD eval =
  mazes of a layout never trained on (a long corridor with side pockets); validation (`--validation`,
  for choosing hyperparameters) = VALIDATION_LEVELS × VALIDATION_SEEDS, disjoint from all three.
"""
from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass

from plumbing.engines import ANSWER_PREFIX, last_boxed, render_chat
from records import Step, Task
from tasks.agent import HISTORY, AgentAdapter, Episode, parse_choice

# The teaching setting's CPU defaults (each one a flag); run times are in docs/STUDIES.md. The step size was chosen on
# the validation split (docs/SWEEP.md): P's and R's updates in fp32 (bf16 rounding alone moves their 1-3-token
# answers' log-probs by ~0.1), LR 3e-6 and a trust region of KL 0.01 per update; the AdamW stays the released
# fresh one per iteration (docs/METHOD.md, deviation 28). Sampling is fp32 too (amp off): the embedded model's
# weights come from a 4-bit GGUF and 8 % of them sit exactly halfway between two bf16 values, so an update far
# below bf16's resolution flips them all in its own direction, and a bf16 sampler acts on a much larger step
# than the trainer took (after one R update: P(verdict −1) 0.24 → 0.30 in fp32, 0.25 → 0.78 sampled in bf16;
# scripts/sampler_check.py, docs/NOTES.md). P and R are evaluated before and after training only, as in coding: a
# mid-run eval took 7 of a cell's 64 minutes on a 2-core AVX2 machine and changes nothing that is learned
# (--eval-every 4 for a curve).
DEFAULTS = {
    "tasks_per_iter": 6, "group_size": 8, "max_turns": 6, "max_new_tokens": 3, "m": 3, "rm_max_new_tokens": 3,
    "temperature": 1.0, "top_p": 1.0, "rm_temperature": 1.0, "rm_top_p": 1.0, "env_mode": "variants",
    "env_retries": 4, "env_max_new_tokens": 64, "policy_steps": 2, "rm_steps": 2, "acc_lower": 1 / 8,
    "acc_upper": 7 / 8, "drop_zero_adv": True, "iterations": 8, "eval_every": 0, "eval_samples": 2,
    "eval_temperature": 1.0, "eval_tasks": 0, "micro_batch": 16, "max_train_samples": 32, "lr": 3e-6, "rm_lr": 3e-6,
    "target_kl": 0.01, "amp": False, "train_amp": False, "grad_checkpointing": False,
}
# The maze is in neither the paper nor the released code: it has no REFERENCE, so --preset reference gives it
# the released trainer only (tasks.RELEASED_TRAINER), a new AdamW every iteration at a constant LR of 1e-6.
MOVES = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
# (rows, cols, walls, shortest-path length range): easy → hard
LEVELS = [(3, 3, 0, (1, 1)), (3, 3, 0, (2, 2)), (4, 4, 0, (3, 4)), (5, 5, 3, (4, 6))]
TRAIN_SEEDS, EVAL_SEEDS, VALIDATION_SEEDS = range(0, 12), range(1000, 1012), range(2000, 2012)
# The validation split's levels: the 3×3 levels have too few distinct mazes for a third split (level 0 has 24,
# all in train or in_domain), so its 3×3 mazes have one wall, which no train or eval maze of those levels has.
VALIDATION_LEVELS = [(3, 3, 1, (1, 1)), (3, 3, 1, (2, 2)), LEVELS[2], LEVELS[3]]
MAX_SIDE = 9                 # E's mazes: at most 9 × 9

# P's and R's prompts start with what is fixed for the maze (the map, the goal) and end with what
# changes per step, so the engine's prefix cache serves the shared start of every step's prompt.
POLICY_PROMPT = """You walk through a grid maze to the goal. Map ('#' wall, '.' floor, 'S' start, 'G' goal):
{map}
The goal is at row {gr}, column {gc}.
You are at row {r}, column {c}.
{history}Moves:
{moves}
Choose the move that brings you closer to the goal. Reply with its number ({choices}) in \\boxed{{}}."""

JUDGE_PROMPT = """A player walks through a grid maze to the goal at row {gr}, column {gc}. \
Map ('#' wall, '.' floor, 'S' start, 'G' goal):
{map}
Before the step it was at row {r}, column {c}.
It answered: {response}
Move taken: {action}
After the step it is at row {r2}, column {c2}.

Was this a good step towards the goal? Answer \\boxed{{1}} (good) or \\boxed{{-1}} (bad)."""

REWRITE_PROMPT = """You design grid mazes for a player who walks to the goal. Make the maze below {direction}: \
{how}
Current maze (rows separated by '/'; '#' wall, '.' floor, 'S' start, 'G' goal):
{maze}
The player's success rate on it: {acc}

What the critics saw:
{feedback}

Answer with the new maze in \\boxed{{}}, rows separated by '/', for example \\boxed{{#####/#S.G#/#####}}."""

# ───────────────────────────── mazes ─────────────────────────────

def find(grid: list[str], ch: str) -> tuple[int, int]:
    return next((r, row.index(ch)) for r, row in enumerate(grid) if ch in row)


def free(grid: list[str], r: int, c: int) -> bool:
    return 0 <= r < len(grid) and 0 <= c < len(grid[0]) and grid[r][c] != "#"


def distances(grid: list[str]) -> dict[tuple[int, int], int]:
    """The solver: BFS distance to the goal from every reachable cell."""
    goal = find(grid, "G")
    dist, queue = {goal: 0}, deque([goal])
    while queue:
        r, c = queue.popleft()
        for dr, dc in MOVES.values():
            nxt = (r + dr, c + dc)
            if free(grid, *nxt) and nxt not in dist:
                dist[nxt] = dist[(r, c)] + 1
                queue.append(nxt)
    return dist


def moves_from(grid: list[str], pos: tuple[int, int]) -> list[tuple[str, tuple[int, int]]]:
    """The moves P is offered at pos, in a fixed order: (name, cell it leads to)."""
    return [(name, (pos[0] + dr, pos[1] + dc)) for name, (dr, dc) in MOVES.items() if free(grid, pos[0] + dr, pos[1] + dc)]


def step_label(dist: dict, before: tuple[int, int], after: tuple[int, int] | None) -> int:
    """Exact ground truth of a step: +1 iff it shortens the distance to the goal by one."""
    return 1 if after is not None and dist.get(after, 10**9) == dist[before] - 1 else -1


def random_maze(rows: int, cols: int, walls: int, span: tuple[int, int], rng: random.Random) -> list[str]:
    """A maze of the given shape whose shortest path from S to G is within span (rejection sampling)."""
    while True:
        cells = [["."] * cols for _ in range(rows)]
        for r, c in rng.sample([(r, c) for r in range(rows) for c in range(cols)], walls):
            cells[r][c] = "#"
        open_cells = [(r, c) for r in range(rows) for c in range(cols) if cells[r][c] == "."]
        start, goal = rng.sample(open_cells, 2)
        cells[start[0]][start[1]], cells[goal[0]][goal[1]] = "S", "G"
        grid = ["".join(row) for row in cells]
        d = distances(grid).get(start)
        if d is not None and span[0] <= d <= span[1]:
            return grid


def corridor_maze(length: int, rng: random.Random) -> list[str]:
    """The OOD layout: a one-row corridor with dead-end pockets above it, S and G at its two ends."""
    top = "".join("." if k % 2 and rng.random() < 0.7 else "#" for k in range(length))
    middle = "S" + "." * (length - 2) + "G"
    if rng.random() < 0.5:
        middle = middle[::-1]
    return [top, middle, "#" * length]


def maze_task(grid: list[str], tid: str, level: int | None, split: str, origin: str = "original") -> Task:
    return Task(id=tid, prompt=" / ".join(grid), data={"grid": grid, "split": split,
                                                       "dist": distances(grid)[find(grid, "S")]},
                ladder="maze" if level is not None else None, level=level, origin=origin)


def maze_sets() -> dict[str, list[Task]]:
    """train: every level × len(TRAIN_SEEDS) mazes; in_domain: every level × len(EVAL_SEEDS) other mazes
    (no grid of the train set: the small levels have few distinct grids, so seeds are skipped until
    a new one comes up); ood: corridor mazes, a layout never trained on; validation (for choosing
    hyperparameters, never for reporting): VALIDATION_LEVELS × len(VALIDATION_SEEDS) mazes, none of them
    in another split."""
    seen, sets = set(), {}
    for split, seeds, levels in (("train", TRAIN_SEEDS, LEVELS), ("in_domain", EVAL_SEEDS, LEVELS),
                                 ("validation", VALIDATION_SEEDS, VALIDATION_LEVELS)):
        sets[split] = []
        for k in range(len(levels)):
            s = seeds[0]
            for _ in seeds:
                while (grid := tuple(random_maze(*levels[k], random.Random(f"{k}/{s}")))) in seen:
                    s += 1
                seen.add(grid)
                sets[split].append(maze_task(list(grid), f"{split}/L{k}/s{s}", k, split))
                s += 1
    sets["ood"] = [maze_task(corridor_maze(4 + s % 3, random.Random(f"ood/{s}")), f"ood/corridor/s{s}", None, "ood")
                   for s in EVAL_SEEDS[:8]]
    return sets


def parse_maze(text: str) -> list[str] | None:
    """A maze written by E: the last \\boxed{...}, rows separated by '/'; rectangular, at most
    MAX_SIDE × MAX_SIDE, one S, one G, only '#.SG', and solvable (BFS). None otherwise."""
    rows = [r.strip() for r in (last_boxed(text) or "").split("/") if r.strip()]
    if not (1 <= len(rows) <= MAX_SIDE and all(len(r) == len(rows[0]) <= MAX_SIDE for r in rows)):
        return None
    if set("".join(rows)) - set("#.SG") or "".join(rows).count("S") != 1 or "".join(rows).count("G") != 1:
        return None
    return rows if find(rows, "S") in distances(rows) else None


# ───────────────────────────── episodes ─────────────────────────────

@dataclass(kw_only=True)
class MazeEpisode(Episode):
    pos: tuple[int, int]
    dist: dict                                      # BFS distance to the goal, every reachable cell


class Adapter(AgentAdapter):
    """Grid mazes: multi-turn episodes, exact step labels, a difficulty ladder, solver-checked rewrites."""

    rewrite_prefix = judge_prefix = ANSWER_PREFIX

    def __init__(self, cfg):
        super().__init__(cfg)
        self.sets = maze_sets()

    def start(self, task: Task, k: int) -> MazeEpisode:
        return MazeEpisode(task=task, pos=find(task.data["grid"], "S"), dist=distances(task.data["grid"]))

    def policy_prompt(self, ep: MazeEpisode, tokenizer) -> str:
        grid = ep.task.data["grid"]
        (gr, gc), options = find(grid, "G"), moves_from(grid, ep.pos)
        moves = "\n".join(f"{i}. {name} → row {r}, column {c}" for i, (name, (r, c)) in enumerate(options, 1))
        history = f"Your last moves: {', '.join(ep.actions[-HISTORY:])}\n" if ep.actions else ""
        choices = ", ".join(str(i) for i in range(1, len(options) + 1))
        return render_chat(tokenizer, POLICY_PROMPT.format(map="\n".join(grid), r=ep.pos[0], c=ep.pos[1], gr=gr,
                                                           gc=gc, history=history, moves=moves, choices=choices))

    def act(self, ep: MazeEpisode, prompt: str, completion) -> None:
        grid = ep.task.data["grid"]
        options = moves_from(grid, ep.pos)
        choice = parse_choice(completion.text, len(options))
        before = ep.pos
        if choice is None:
            ep.invalid += 1
            action, after = "none (no valid move number)", None
        else:
            action, after = options[choice - 1]
            ep.pos = after
            ep.won = ep.done = grid[after[0]][after[1]] == "G"
        gr, gc = find(grid, "G")
        judge = JUDGE_PROMPT.format(gr=gr, gc=gc, r=before[0], c=before[1], map="\n".join(grid),
                                    response=completion.text.strip()[:200], action=action, r2=ep.pos[0], c2=ep.pos[1])
        label = step_label(ep.dist, before, after)
        ep.steps.append(Step.sampled(prompt, completion, observation=f"at row {ep.pos[0]}, column {ep.pos[1]}",
                                     judge_prompt=judge, label=label, parsed=choice is not None))
        if label < 0 and self.cfg.maze_no_slack:   # the goal is out of reach in the fewest steps: the episode is lost
            ep.done = True
        ep.actions.append(action if choice is not None else "none")

    def why_failed(self, ro) -> str:
        return "not at the goal"

    # — E, variants mode: the training maze at the same position one level up or down —
    def variant(self, task: Task, direction: str) -> Task | None:
        if task.level is None:
            return None
        level = task.level + (1 if direction == "harder" else -1)
        if not 0 <= level < len(LEVELS):
            return None
        here = [t for t in self.sets["train"] if t.level == task.level]
        there = [t for t in self.sets["train"] if t.level == level]
        new = there[next(i for i, t in enumerate(here) if t.data["grid"] == task.data["grid"]) % len(there)]
        return Task(new.id, new.prompt, new.data, new.ladder, new.level, origin="variant")

    # — E, generate mode: a new maze, kept only if the solver finds a path —
    def rewrite_prompt(self, root: Task, active: Task, direction: str, feedback: str, acc: float | None = None) -> str:
        how = ("a longer shortest path, more walls, dead ends." if direction == "harder"
               else "a shorter path from S to G, fewer walls.")
        return REWRITE_PROMPT.format(direction=direction, how=how, maze="/".join(active.data["grid"]),
                                     acc="unknown" if acc is None else f"{acc:.2f}", feedback=feedback or "(none)")

    def parse_rewrite(self, root: Task, text: str) -> Task | None:
        """A valid, solvable maze (`parse_maze`) that is none of the eval or validation mazes (never train on those)."""
        grid = parse_maze(text)
        if grid is None or any(grid == t.data["grid"] for name in ("in_domain", "ood", "validation")
                               for t in self.sets[name]):
            return None
        return maze_task(grid, f"{root.id}~gen", root.level, "train", origin="generated")
