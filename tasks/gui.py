"""The GUI pieces both OSWorld backends share (paper §4.1, "OSWorld"): the agent's action vocabulary,
what a backend must provide, one observation (`Screen`), and the guarded external processes
(browsers, OSWorld bridges) with their pool.

The backends: tasks/miniwob_env.py (MiniWoB++ in headless Chromium) and tasks/osworld_env.py (real
OSWorld through a bridge process). The adapter, tasks/osworld.py, sees only what is here.
"""
from __future__ import annotations

import ast
import atexit
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from plumbing.engines import last_boxed

VERBS = {"click", "double_click", "type", "key", "scroll", "wait", "done", "fail"}


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
    body = (last_boxed(text, outer=True) or "").strip()
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


# ───────────────────────────── backends and their processes ─────────────────────────────

class ScreenError(Exception):
    """The browser (or OSWorld bridge) crashed or hung; it has been killed and starts afresh on next use."""


class Guarded:
    """Runs every call to an external process in one worker thread with a timeout. A crash or no
    answer within `timeout` seconds kills the process (`kill`, subclass) and raises ScreenError.
    Starting the process and loading a page get `START_S` instead: a cold Chromium start next to two
    others on a busy 2-core machine took more than 5 s, and is not a hang."""

    START_S = 120.0

    def __init__(self, timeout: float):
        self.timeout, self.restarts = timeout, 0
        self._pool = ThreadPoolExecutor(1)

    def kill(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.kill()
        self._pool.shutdown(wait=False)

    def _call(self, fn, *args, slow: bool = False):
        fut = self._pool.submit(fn, *args)
        try:
            return fut.result(timeout=max(self.timeout, self.START_S) if slow else self.timeout)
        except Exception as e:  # noqa: BLE001 (a dead or hung process raises many kinds of errors)
            self.kill()
            self._pool.shutdown(wait=False)     # a hung call may still hold the old thread
            self._pool, self.restarts = ThreadPoolExecutor(1), self.restarts + 1
            what = "hung" if isinstance(e, TimeoutError) else "crashed"
            raise ScreenError(f"{type(self).__name__.lower()} {what}: {e!r:.200}") from e


def kill_tree(pid: int) -> None:
    """Kill a process and every process it started."""
    import psutil

    try:
        root = psutil.Process(pid)
        family = root.children(recursive=True) + [root]
    except psutil.NoSuchProcess:
        return
    for p in family:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(family, timeout=10)


@dataclass
class Screen:
    """One observation: what the policy reads (text), where elements are (for coordinate actions)."""
    instruction: str
    text: str                                                 # the accessibility-tree-like element list
    boxes: dict[int, tuple[float, float, float, float]] = field(default_factory=dict)  # ref → (left, top, w, h)
    screenshot: np.ndarray | None = None                      # (H, W, 3) uint8, when recorded (--screenshots)
    kinds: dict[int, tuple[str, str]] = field(default_factory=dict)   # ref → (tag, text), where the backend has them


class Pool:
    """One environment process (browser, bridge) per parallel episode, started on demand by `make` and
    kept for the next rollout; all are killed at exit."""

    def __init__(self, make, workers: int = 8):
        self.make = make
        self.idle: list = []
        self.every: list = []                        # idle or in use
        self.lock = threading.Lock()
        self.threads = ThreadPoolExecutor(workers)   # separate processes: step them concurrently
        atexit.register(self.close)

    def take(self, n: int) -> list:
        with self.lock:
            while len(self.idle) < n:
                self.idle.append(self.make())
                self.every.append(self.idle[-1])
            out, self.idle = self.idle[:n], self.idle[n:]
        return out

    def give(self, handles: list) -> None:
        with self.lock:
            self.idle.extend(handles)

    def map(self, fn, items: list) -> list:
        return list(self.threads.map(fn, items))

    def close(self) -> None:
        for h in self.every:
            h.close()
        self.idle, self.every = [], []


class Backend:
    """What the adapter needs of a backend: handles from a pool (one per parallel episode), and
    reset / valid / step / final on a handle. Failures raise self.Error (miniwob_env.ScreenError).
    A backend with exact step labels on some tasks overrides `labelled` and `label`."""

    def __init__(self, pool):
        self.pool, self.Error = pool, ScreenError

    def acquire(self, n: int) -> list:
        return self.pool.take(n)

    def release(self, handles: list) -> None:
        self.pool.give(handles)

    def map(self, fn, items: list) -> list:
        return self.pool.map(fn, items)

    def labelled(self, task) -> bool:
        """Whether the task's steps get exact labels."""
        return False

    def label(self, task, screen, action: Action | None, earlier: list) -> int | None:
        """The exact label (±1) of `action` on `screen` (None: a malformed answer), after the episode's `earlier`
        (action, screen) pairs; None where the task has no labels."""
        return None


def center(screen, ref: int) -> tuple[float, float]:
    left, top, w, h = screen.boxes[ref]
    return left + w / 2, top + h / 2


def ids_known(action: Action, screen) -> bool:
    """The element ids an action names are on the screen's list."""
    ref_args = {"click": 1, "double_click": 1, "scroll": 2, "type": 2}.get(action.verb)
    return not (ref_args and len(action.args) == ref_args and action.args[0] not in screen.boxes)
