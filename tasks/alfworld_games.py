"""ALFWorld games without the download (paper §4.1, the LLM-agent setting; docs/METHOD.md, "The settings").

ALFWorld's official games come from ALFRED trajectories recorded in AI2-THOR. Offline we
build games of the same form from what the `alfworld` wheel itself ships:
- the PDDL domain and the text grammar (`alfworld.info`);
- the 120 AI2-THOR scene layouts: the object types of each scene and the positions of
  its receptacles (`alfworld/gen/layouts/FloorPlan*-{objects,openable}.json`, `-layout.npy`);
- the affordance tables: what fits where, what can be cleaned, heated, cooled or toggled
  (`alfworld.gen.constants`);
- the goal templates: the PDDL goal and the English task text (`alfworld.gen.goal_library`).

A game is the JSON `game.tw-pddl` the engine loads (pddl_domain, grammar with the task
text, pddl_problem), next to a `traj_data.json` with the task type and its parameters: the
layout `alfworld-download` leaves, so the official-files route reads both.

Differences from ALFRED's games, stated: object instances are placed by sampling (up to 10
of the object types the scene holds, plus its lamps; 1 to 3 instances each, 1.75 on average;
each in a receptacle that can hold it) instead of by the physics simulator. Fewer objects
than ALFRED's scenes: the planner's time grows fast with them (a kitchen pick-two game with
49 objects took 89 s to verify, with 16 objects 13 s); receptacles whose position the layout does not record get a random
reachable point of the scene; pick-two goals are posed only in rooms with at most 20
receptacles (the kitchens have 25 to 36, and there fast-downward needs about 24 s per plan of
a pick-two goal, which the step labels need after every step); slicing and movable-receptacle tasks are left out, as in
ALFWorld's text games. A game is kept only if the planner (fast-downward, through
textworld's PDDL backend) finds a plan and that plan wins on the engine.

    python -m tasks.alfworld_games [--seed 0] [--workers 2]     # generate all splits, print the report
"""
from __future__ import annotations

import hashlib
import json
import random
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

TASK_TYPES = ("pick_and_place_simple", "look_at_obj_in_light", "pick_clean_then_place_in_recep",
              "pick_heat_then_place_in_recep", "pick_cool_then_place_in_recep", "pick_two_obj_and_place")
TOOL = {"pick_clean_then_place_in_recep": "SinkBasin", "pick_heat_then_place_in_recep": "Microwave",
        "pick_cool_then_place_in_recep": "Fridge"}  # the receptacle the domain's clean/heat/cool action needs
AFFORDANCE = {"pick_clean_then_place_in_recep": "Cleanable", "pick_heat_then_place_in_recep": "Heatable",
              "pick_cool_then_place_in_recep": "Coolable"}
LAMPS = ("DeskLamp", "FloorLamp")
BASIN = {"Sink": "SinkBasin", "Bathtub": "BathtubBasin"}  # the layouts record the fixture, the domain uses the basin
MAX_TYPES = 10                 # object types placed per scene (besides lamps)
INSTANCES = (1, 1, 2, 3)       # instances per object type placed, sampled (ALFRED's scenes hold 1 to 3)
MAX_RECEPTACLES_PICK_TWO = 20  # kitchens have 25-36: fast-downward then needs ~24 s per pick-two plan


def _alfworld():
    import alfworld
    import alfworld.gen.constants as constants
    import alfworld.gen.goal_library as goals
    import alfworld.info as info
    return Path(alfworld.__file__).parent, constants, goals, info


def mangle(text: str) -> str:
    """ALFRED's object ids in PDDL-safe form (the Demangler turns them back into "apple 1")."""
    for a, b in (("-", "_minus_"), ("|", "_bar_"), ("+", "_plus_"), (".", "_dot_"), (",", "_comma_")):
        text = text.replace(a, b)
    return text


# ───────────────────────────── scenes ─────────────────────────────

def load_scene(floorplan: int, seed: int) -> dict:
    """One AI2-THOR scene with objects placed: receptacles {id: [type, loc]}, objects {id: [type, receptacle id]},
    the agent's start location. Deterministic per (floorplan, seed)."""
    root, c, _, _ = _alfworld()
    layouts = root / "gen" / "layouts"
    rng = random.Random(f"scene-{floorplan}-{seed}")
    types = json.loads((layouts / f"FloorPlan{floorplan}-objects.json").read_text())
    positioned = json.loads((layouts / f"FloorPlan{floorplan}-openable.json").read_text())
    import numpy as np
    points = np.load(layouts / f"FloorPlan{floorplan}-layout.npy").tolist()  # reachable (x, z), metres
    static = set(c.RECEPTACLES) - set(c.MOVABLE_RECEPTACLES)

    def loc(x, z, rot, horizon):  # ALFRED's grid location: 0.25 m steps, rotation in quarter turns
        return f"loc|{round(x / 0.25)}|{round(z / 0.25)}|{round(rot / 90) % 4}|{round(horizon)}"

    receptacles = {}
    for rid, (x, z, rot, horizon) in positioned.items():
        rtype = rid.split("|")[0]
        if rtype in BASIN:  # ALFRED names a basin "Sink|x|y|z|SinkBasin" (the Demangler reads "sinkbasin 1")
            rid, rtype = "|".join(rid.split("|")[:4] + [BASIN[rtype]]), BASIN[rtype]
        if rtype in static and rtype in types:
            receptacles[rid] = [rtype, loc(x, z, rot, horizon)]
    for rtype in sorted(set(types) & static - {r[0] for r in receptacles.values()}):
        x, z = rng.choice(points)
        fixture = {v: k for k, v in BASIN.items()}.get(rtype, rtype)
        suffix = f"|{rtype}" if rtype in BASIN.values() else ""
        receptacles[f"{fixture}|{x:+06.2f}|+00.90|{z:+06.2f}{suffix}"] = [rtype, loc(x, z, rng.randrange(4) * 90, 30)]
    holders = {}  # object type → receptacle ids that can hold it
    for rid, (rtype, _) in sorted(receptacles.items()):
        for otype in c.VAL_RECEPTACLE_OBJECTS.get(rtype, ()):
            holders.setdefault(otype, []).append(rid)
    furniture = [rid for rid, (rtype, _) in sorted(receptacles.items()) if rtype not in c.OPENABLE_CLASS_SET]
    objects = {}
    placeable = [t for t in sorted(set(types) & set(c.OBJECTS) - static) if holders.get(t) or t in LAMPS and furniture]
    kinds = [t for t in placeable if t in LAMPS] + rng.sample([t for t in placeable if t not in LAMPS],
                                                             min(MAX_TYPES, len([t for t in placeable if t not in LAMPS])))
    for otype in sorted(kinds):
        where = holders.get(otype) or furniture
        for _ in range(1 if otype in LAMPS else rng.choice(INSTANCES)) if where else ():
            rid = rng.choice(where)
            jitter = [f"{float(v) + rng.uniform(-0.3, 0.3):+06.2f}" for v in rid.split("|")[1:4]]
            objects[f"{otype}|{'|'.join(jitter)}"] = [otype, rid]
    x, z = rng.choice(points)
    return {"floorplan": floorplan, "receptacles": receptacles, "objects": objects,
            "start": loc(x, z, rng.randrange(4) * 90, 30)}


def scene_types(scene: dict) -> tuple[list[str], list[str]]:
    """(object types, receptacle types) present: what a goal may name."""
    return (sorted({t for t, _ in scene["objects"].values()}), sorted({t for t, _ in scene["receptacles"].values()}))


def demangle(name: str) -> str:
    for a, b in (("_minus_", "-"), ("_bar_", "|"), ("_plus_", "+"), ("_dot_", "."), ("_comma_", ",")):
        name = name.replace(a, b)
    return name


def scene_from_problem(pddl: str) -> dict:
    """A scene read back from a game's PDDL problem (an official game has no scene.json)."""
    init = pddl[pddl.index("(:init"):pddl.index("(:goal")]
    facts = lambda name: re.findall(rf"\({name}\s+(\S+)\s+(\S+?)\)", init)  # noqa: E731
    rtype = {r: t.removesuffix("Type") for r, t in facts("receptacleType")}
    at = dict(facts("receptacleAtLocation"))
    inside = dict(facts("inReceptacle"))
    start = dict(facts("atLocation")).get("agent1", "")
    return {"floorplan": 0, "start": demangle(start),
            "receptacles": {demangle(r): [t, demangle(at.get(r, ""))] for r, t in rtype.items()},
            "objects": {demangle(o): [t.removesuffix("Type"), demangle(inside[o])]
                        for o, t in facts("objectType") if o in inside and inside[o] in rtype}}


# ───────────────────────────── goals and problems ─────────────────────────────

@dataclass(frozen=True)
class Goal:
    task_type: str
    obj: str
    recep: str = ""
    toggle: str = ""

    def params(self) -> dict:
        return {"object_target": self.obj, "parent_target": self.recep, "toggle_target": self.toggle,
                "mrecep_target": "", "object_sliced": False}


def goal_problems(scene: dict, goal: Goal) -> str | None:
    """Why a goal can't be posed in a scene (a one-line reason), or None when it can."""
    _, c, _, _ = _alfworld()
    objs, receps = scene_types(scene)
    counts = {}
    for t, _ in scene["objects"].values():
        counts[t] = counts.get(t, 0) + 1
    if goal.task_type not in TASK_TYPES:
        return f"unknown task type {goal.task_type}"
    if goal.obj not in objs or goal.obj in LAMPS:
        return f"no movable {goal.obj} in this room"
    if goal.task_type == "look_at_obj_in_light":
        return None if goal.toggle in objs and goal.toggle in LAMPS else f"no lamp {goal.toggle} in this room"
    if goal.recep not in receps:
        return f"no {goal.recep} in this room"
    if goal.obj not in c.VAL_RECEPTACLE_OBJECTS.get(goal.recep, ()):
        return f"a {goal.obj} does not go in a {goal.recep}"
    if goal.task_type in TOOL:
        if TOOL[goal.task_type] not in receps:
            return f"no {TOOL[goal.task_type]} in this room"
        if goal.obj not in c.VAL_ACTION_OBJECTS[AFFORDANCE[goal.task_type]]:
            return f"a {goal.obj} is not {AFFORDANCE[goal.task_type].lower()}"
    if goal.task_type == "pick_two_obj_and_place" and counts[goal.obj] < 2:
        return f"fewer than two {goal.obj}s in this room"
    if goal.task_type == "pick_two_obj_and_place" and len(scene["receptacles"]) > MAX_RECEPTACLES_PICK_TWO:
        return "too many receptacles in this room for the planner to check a pick-two goal"
    if any(t == goal.obj and scene["receptacles"][rid][0] == goal.recep for t, rid in scene["objects"].values()):
        return f"a {goal.obj} is in a {goal.recep} already"
    return None


def sample_goal(scene: dict, task_type: str, rng: random.Random) -> Goal | None:
    """A random goal of this type that the scene can pose (None when it can pose none)."""
    objs, receps = scene_types(scene)
    options = []
    for obj in objs:
        if task_type == "look_at_obj_in_light":
            options += [Goal(task_type, obj, toggle=t) for t in objs if t in LAMPS]
        else:
            options += [Goal(task_type, obj, r) for r in receps if r != TOOL.get(task_type)]
    options = [g for g in options if goal_problems(scene, g) is None]
    return rng.choice(options) if options else None


def problem_pddl(scene: dict, goal: Goal, name: str) -> str:
    """The PDDL problem: the scene's facts (types, positions, affordances, what can hold what) and the goal."""
    _, c, goals, _ = _alfworld()
    recs, objs = scene["receptacles"], scene["objects"]
    otypes, rtypes = sorted({t for t, _ in objs.values()}), sorted({t for t, _ in recs.values()})  # the types present
    locations = sorted({loc for _, loc in recs.values()} | {scene["start"]})
    affordance = {k: set(v) for k, v in c.VAL_ACTION_OBJECTS.items()}
    decl = [("agent1", "agent")] + [(o, "object") for o in sorted(objs)] + [(r, "receptacle") for r in sorted(recs)]
    decl += [(l, "location") for l in locations] + [(f"{t}Type", "otype") for t in otypes]
    decl += [(f"{t}Type", "rtype") for t in rtypes]
    init = [f"(atLocation agent1 {scene['start']})"]
    for rid, (rtype, loc) in sorted(recs.items()):
        init += [f"(receptacleType {rid} {rtype}Type)", f"(receptacleAtLocation {rid} {loc})"]
        init += [f"(openable {rid})"] if rtype in c.OPENABLE_CLASS_SET else []
    for oid, (otype, rid) in sorted(objs.items()):
        init += [f"(objectType {oid} {otype}Type)", f"(inReceptacle {oid} {rid})", f"(objectAtLocation {oid} {recs[rid][1]})"]
        init += [f"(toggleable {oid})"] if otype in LAMPS else [f"(pickupable {oid})"]
        init += [f"({fact} {oid})" for key, fact in (("Cleanable", "cleanable"), ("Heatable", "heatable"),
                                                       ("Coolable", "coolable")) if otype in affordance[key]]
    present = {t for t, _ in objs.values()}
    init += [f"(canContain {r}Type {o}Type)" for r in sorted({t for t, _ in recs.values()})
             for o in sorted(present & set(c.VAL_RECEPTACLE_OBJECTS.get(r, ())))]
    goal_text = goals.gdict[goal.task_type]["pddl"].format(obj=goal.obj, recep=goal.recep, toggle=goal.toggle,
                                                          mrecep="").replace("#", "-")
    body = (f"(define (problem {name})\n(:domain alfred)\n(:objects\n  " + "\n  ".join(f"{mangle(n)} - {t}" for n, t in decl)
            + "\n)\n(:init\n  " + "\n  ".join(mangle(f) for f in init) + "\n)\n")
    return body + goal_text.strip() + "\n"


def task_text(goal: Goal, variant: int = 0) -> str:
    """ALFWorld's templated English goal ("put a clean apple in fridge")."""
    _, _, goals, _ = _alfworld()
    templates = goals.gdict[goal.task_type]["templates"]
    return templates[variant % len(templates)].format(obj=goal.obj.lower(), recep=goal.recep.lower(),
                                                      toggle=goal.toggle.lower(), mrecep="")


def game_json(scene: dict, goal: Goal, name: str, variant: int = 0) -> dict:
    """A game.tw-pddl document (the engine's input)."""
    _, _, _, info = _alfworld()
    grammar = Path(info.ALFRED_TWL2_PATH).read_text().replace("UNKNOWN GOAL", task_text(goal, variant))
    return {"pddl_domain": Path(info.ALFRED_PDDL_PATH).read_text(), "grammar": grammar,
            "pddl_problem": problem_pddl(scene, goal, name), "solvable": True}


def game_id(scene: dict, goal: Goal) -> str:
    digest = hashlib.sha1(json.dumps([scene, goal.__dict__], sort_keys=True).encode()).hexdigest()[:10]
    return f"{goal.task_type}-{goal.obj}-{goal.recep or goal.toggle}-{scene['floorplan']}-{digest}"


def write_game(folder: Path, scene: dict, goal: Goal, plan: list[str], variant: int = 0, seconds: float = 0.0) -> Path:
    """game.tw-pddl + traj_data.json (+ scene.json, which lets E rewrite the goal) in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    doc = game_json(scene, goal, folder.name, variant)
    doc["walkthrough"] = plan
    (folder / "traj_data.json").write_text(json.dumps({"task_type": goal.task_type, "pddl_params": goal.params(),
                                                       "scene": {"floor_plan": f"FloorPlan{scene['floorplan']}"},
                                                       "task_desc": task_text(goal, variant),
                                                       "generation_seconds": seconds}))
    (folder / "scene.json").write_text(json.dumps(scene))
    tmp = folder / "game.tw-pddl.tmp"
    tmp.write_text(json.dumps(doc))
    tmp.replace(folder / "game.tw-pddl")  # written last: a folder with game.tw-pddl is complete
    return folder / "game.tw-pddl"


_TASK = re.compile(r"Your task is to: (.*?)\.\"")


def goal_from_game(doc: dict) -> str:
    """The English task text a game carries in its grammar."""
    m = _TASK.search(doc["grammar"])
    return m.group(1) if m else ""


# ───────────────────────────── the engine ─────────────────────────────

def _speed_up_engine() -> None:
    """Two memoizations of textworld's PDDL backend, same outputs (docs/NOTES.md has the speed-ups):
    - it translates the PDDL problem with fast-downward (twice) on every load and reset, the same
      result each time: cached per problem text;
    - it re-parses the grammar's templates with tatsu for every admissible command at every step:
      cached per template, each use gets a deep copy."""
    import copy
    import functools

    import fast_downward
    import textworld.envs.pddl.textgen as textgen
    from textworld.logic import Rule
    if hasattr(fast_downward.pddl2sas, "cache_info"):
        return
    fast_downward.pddl2sas = functools.lru_cache(maxsize=64)(fast_downward.pddl2sas)
    parse = functools.lru_cache(maxsize=4096)(textgen._parse_and_convert)
    textgen._parse_and_convert = lambda text, rule_name=None, **kw: copy.deepcopy(parse(text, rule_name=rule_name))
    Rule.parse_conjunctive_query = classmethod(functools.lru_cache(maxsize=4096)(Rule.parse_conjunctive_query.__func__))


PLANNING = ("step", "reset", "none")


def open_env(game: Path, planning: str = "step"):
    """The real ALFWorld text engine on one game: textworld's PDDL backend with ALFWorld's own wrappers
    (AlfredDemangler names objects "apple 1"). planning="step" adds AlfredExpert in planner mode: the
    planner's plan from the current state after every step, as `extra.expert_plan` (the step labels);
    "reset" plans once, at reset (`extra.walkthrough`); "none" never plans (training rollouts)."""
    import textworld
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredExpert, AlfredExpertType
    _speed_up_engine()
    infos = textworld.EnvInfos(won=True, admissible_commands=True,
                               extras=["gamefile"] + (["walkthrough"] if planning == "reset" else []))
    wrappers = [AlfredDemangler()] + ([AlfredExpert(expert_type=AlfredExpertType.PLANNER)] if planning == "step" else [])
    return textworld.start(str(game), request_infos=infos, wrappers=wrappers)


def solve(game: Path) -> list[str] | None:
    """The planner's plan if it wins the game on the engine (and the game is not won at the start), else None."""
    env = open_env(game, planning="reset")
    try:
        state = env.reset()
        plan = list(state["extra.walkthrough"] or [])
        if state["won"] or not plan:
            return None
        for command in plan:
            state, _, _ = env.step(command)
        return plan if state["won"] else None
    finally:
        env.close()


# ───────────────────────────── the game sets ─────────────────────────────

# split → (scenes, layout seeds): ALFRED's train scenes for training and the in-domain eval (other
# placements, as valid_seen), its test scenes, never trained on, for the OOD eval (as valid_unseen)
SPLITS = {"train": ("TRAIN_SCENE_NUMBERS", 1, (0, 1)), "valid_seen": ("TRAIN_SCENE_NUMBERS", 4, (2,)),
          "valid_unseen": ("TEST_SCENE_NUMBERS", 1, (0, 1))}  # name: (scenes, every k-th scene, layout seeds)
VERSION = "v1"  # bump when generation changes: the cache folder is per version and seed


def games_root(seed: int) -> Path:
    from plumbing.models import cache_dir
    return cache_dir() / f"alfworld-games-{VERSION}-s{seed}"


def _candidate(args) -> dict:
    """Build and verify one candidate game: (split, floorplan, layout seed, task type, seed, root)."""
    split, floorplan, layout, task_type, seed, root = args
    scene = load_scene(floorplan, seed * 1000 + layout)
    goal = sample_goal(scene, task_type, random.Random(f"goal-{floorplan}-{layout}-{task_type}-{seed}"))
    if goal is None:
        return {"split": split, "task_type": task_type, "status": "not posable"}
    result = {"split": split, "task_type": task_type, "status": "kept"}
    folder = Path(root) / "json_2.1.1" / split / game_id(scene, goal) / "trial_0"
    if (folder / "game.tw-pddl").exists():  # made by an earlier run: its own time
        return result | {"seconds": json.loads((folder / "traj_data.json").read_text()).get("generation_seconds")}
    t0 = time.perf_counter()
    variant = random.Random(f"text-{floorplan}-{layout}-{task_type}").randrange(2)
    scratch = folder.with_name("trial_0.tmp")
    plan = solve(write_game(scratch, scene, goal, [], variant))
    shutil.rmtree(scratch, ignore_errors=True)
    if plan is None:
        if not any(folder.parent.iterdir()):
            folder.parent.rmdir()
        return result | {"status": "unsolvable", "seconds": time.perf_counter() - t0}
    write_game(folder, scene, goal, plan, variant, seconds=time.perf_counter() - t0)
    return result | {"seconds": time.perf_counter() - t0}


def generate(seed: int = 0, workers: int = 2, root: Path | None = None, splits: dict | None = None,
             progress: bool = True) -> dict:
    """Generate (or complete) every split under `root` in alfworld-download's layout; returns the report.
    `splits`: name → (floorplans, layout seeds); default SPLITS. Deterministic per seed; games already
    on disk are kept, so an interrupted run resumes."""
    import multiprocessing as mp

    from tqdm import tqdm
    _, c, _, _ = _alfworld()
    root = Path(root or games_root(seed))
    splits = splits or {name: (getattr(c, scenes)[::k], layouts) for name, (scenes, k, layouts) in SPLITS.items()}
    jobs = [(split, fp, layout, tt, seed, str(root)) for split, (floorplans, layouts) in splits.items()
            for fp in floorplans for layout in layouts for tt in TASK_TYPES]
    with mp.get_context("spawn").Pool(workers) as pool:
        results = list(tqdm(pool.imap_unordered(_candidate, jobs), total=len(jobs), disable=not progress,
                            desc="ALFWorld games"))
    return report(results)


def report(results: list[dict]) -> dict:
    kept = [r for r in results if r["status"] == "kept"]
    verified = [r for r in results if r["status"] != "not posable"]
    timed = sorted(r["seconds"] for r in verified if r.get("seconds"))  # candidate → verified game (or not)
    out = {"games_per_split": {}, "games_per_task_type": {}, "candidates": len(results),
           "not_posable": len(results) - len(verified), "unsolvable": len(verified) - len(kept),
           "rejected_share": (len(verified) - len(kept)) / max(len(verified), 1),
           "seconds_per_game": timed[len(timed) // 2] if timed else None,
           "seconds_per_game_mean": sum(timed) / len(timed) if timed else None}
    for r in kept:
        out["games_per_split"][r["split"]] = out["games_per_split"].get(r["split"], 0) + 1
        out["games_per_task_type"][r["task_type"]] = out["games_per_task_type"].get(r["task_type"], 0) + 1
    return out


if __name__ == "__main__":
    import argparse
    parser = argparse.ArgumentParser(description="Generate ALFWorld games offline; print the generator's report.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    rep = generate(args.seed, args.workers)
    (games_root(args.seed) / "report.json").write_text(json.dumps(rep, indent=1))
    print(json.dumps(rep, indent=1))
