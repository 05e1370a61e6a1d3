"""The real-OSWorld backend of the GUI-agent setting (paper §4.1, "OSWorld"): our side of the bridge.

desktop-env runs its tasks in full Ubuntu VMs and pins old torch/transformers/numpy, so it lives in
its own venv and is driven through tasks/osworld_bridge.py, one bridge process (one VM) per parallel
episode, speaking JSON lines (protocol in that file). Here:
- `linearize`: desktop-env's accessibility-tree XML → the numbered element list P and R read, with
  the same node filter as OSWorld's own agents (mm_agents: judge_node): visible, showing, enabled or
  editable, with a name or text, and a box on screen.
- `to_pyautogui`: the action vocabulary → the pyautogui code desktop-env executes in the VM. Model
  text only reaches it as a Python string literal (repr), and it runs inside the VM, OSWorld's own
  sandbox.
- `load_tasks`: OSWorld's evaluation_examples (test_all.json + examples/<domain>/<id>.json) → train,
  in_domain (a held-out fifth of each training domain) and ood (OOD_DOMAINS, never trained on).
  The paper does not state its split; this one is ours.
"""
from __future__ import annotations

import json
import random
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np

from plumbing.vision import to_image
from records import Task
from tasks import TaskError
from tasks.gui import Action, Backend, Guarded, Pool, Screen, ScreenError, center, ids_known, kill_tree

NS = "https://accessibility.ubuntu.example.org/ns/"
KEEP_SUFFIX = ("item", "button", "heading", "label", "scrollbar", "searchbox", "textbox", "link", "tabelement",
               "textfield", "textarea", "menu")
KEEP_TAGS = {"alert", "canvas", "check-box", "combo-box", "entry", "icon", "image", "paragraph", "scroll-bar",
             "section", "slider", "static", "table-cell", "terminal", "text"}
OOD_DOMAINS = ("multi_apps",)
BRIDGE = Path(__file__).with_name("osworld_bridge.py")
PAUSE = 2.0   # seconds desktop-env waits after an action before observing (its default)


def _pair(text: str | None) -> tuple[float, float] | None:
    try:
        a, b = (float(x) for x in (text or "").strip("() ").split(","))
        return a, b
    except ValueError:
        return None


def linearize(xml: str | None) -> tuple[str, dict]:
    """The accessibility tree as `[k] tag "name" text` lines, k = 1.. in document order; boxes k → (x, y, w, h)."""
    if not xml:
        return "", {}
    lines, boxes = [], {}
    for node in ET.fromstring(xml).iter():
        tag, st = node.tag, lambda s: node.get(f"{{{NS}state}}{s}") == "true"
        kept = tag.startswith("document") or tag.endswith(KEEP_SUFFIX) or tag in KEEP_TAGS
        name, text = node.get("name", ""), " ".join((node.text or "").split())
        pos, size = _pair(node.get(f"{{{NS}component}}screencoord")), _pair(node.get(f"{{{NS}component}}size"))
        if not (kept and st("showing") and st("visible") and (st("enabled") or st("editable") or st("expandable")
                or st("checkable")) and (name or text) and pos and size and min(pos) >= 0 and min(size) > 0):
            continue
        k = len(boxes) + 1
        boxes[k] = (*pos, *size)
        lines.append(f'[{k}] {tag} "{(name or text)[:60]}"' + (f" {text[:80]}" if name and text and text != name else ""))
    return "\n".join(lines), boxes


def to_pyautogui(action: Action, screen: Screen) -> str:
    """The vocabulary as desktop-env's pyautogui action (or its special WAIT / DONE / FAIL)."""
    v, a = action.verb, action.args
    if v in ("wait", "done", "fail"):
        return v.upper()
    if v == "click":
        x, y = center(screen, a[0]) if len(a) == 1 else a
        return f"pyautogui.click({x:.0f}, {y:.0f})"
    if v == "double_click":
        x, y = center(screen, a[0]) if len(a) == 1 else a
        return f"pyautogui.doubleClick({x:.0f}, {y:.0f})"
    if v == "type":
        focus = "pyautogui.click({:.0f}, {:.0f}); ".format(*center(screen, a[0])) if len(a) == 2 else ""
        return f"{focus}pyautogui.typewrite({a[-1]!r}, interval=0.02)"
    if v == "key":
        keys = [k.strip().lower() for k in a[0].split("+")]
        return f"pyautogui.hotkey({', '.join(repr(k) for k in keys)})" if len(keys) > 1 else f"pyautogui.press({keys[0]!r})"
    amount = 5 if a[-1] == "up" else -5   # scroll
    if len(a) == 2:
        x, y = center(screen, a[0])
        return f"pyautogui.scroll({amount}, x={x:.0f}, y={y:.0f})"
    return f"pyautogui.scroll({amount})"


# ───────────────────────────── the bridge client ─────────────────────────────

class Bridge(Guarded):
    """One bridge process (one desktop-env, one VM), started on first use, restarted after a crash."""

    def __init__(self, command: list[str], timeout: float):
        super().__init__(timeout)
        self.command, self.proc = command, None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            kill_tree(self.proc.pid)
        self.proc = None

    def _start(self) -> None:
        self.proc = subprocess.Popen(self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     bufsize=1)
        hello = self._roundtrip({"op": "hello"})
        if hello.get("protocol") != 1:
            raise RuntimeError(f"bridge speaks protocol {hello.get('protocol')!r}, not 1")

    def _roundtrip(self, msg: dict) -> dict:
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"bridge exited (code {self.proc.poll()})")
        answer = json.loads(line)
        if not answer.get("ok"):
            raise RuntimeError(f"bridge error: {answer.get('error')}")
        return answer

    def call(self, msg: dict) -> dict:
        if self.proc is None:
            self._call(self._start, slow=True)
        return self._call(self._roundtrip, msg)


def screen_of(obs: dict) -> Screen:
    text, boxes = linearize(obs.get("accessibility_tree"))
    shot = obs.get("screenshot")
    try:   # the bridge's base64 PNG, decoded once here: a screenshot is untrusted input
        image = np.asarray(to_image(shot)) if shot else None
    except ValueError as e:
        raise ScreenError(str(e)) from None
    return Screen(obs.get("instruction", ""), text, boxes, image)


class OSWorld(Backend):
    """The `osworld` backend: desktop-env through bridge processes."""

    def __init__(self, cfg):
        python = cfg.osworld_python
        if not python or not Path(python).exists():
            raise TaskError(f"--backend osworld needs --osworld-python: the python of desktop-env's venv "
                            f"(got {python!r}; see docs/SETTINGS.md, OSWorld)")
        command = [python, str(BRIDGE), "--provider", cfg.osworld_provider] + (
            ["--path-to-vm", cfg.osworld_vm] if cfg.osworld_vm else []) + (["--screenshots"] if cfg.screenshots else [])
        super().__init__(Pool(lambda: Bridge(command, cfg.browser_timeout)))

    def reset(self, bridge: Bridge, task: Task) -> Screen:
        return screen_of(bridge.call({"op": "reset", "task": task.data["config"]})["obs"])

    def valid(self, action: Action, screen) -> bool:
        return ids_known(action, screen)

    def step(self, bridge: Bridge, action: Action, screen):
        """(screen after, done, score when done): DONE / FAIL end the episode and run OSWorld's evaluator."""
        answer = bridge.call({"op": "step", "action": to_pyautogui(action, screen), "pause": PAUSE})
        after = screen_of(answer["obs"])
        if answer["done"]:
            return after, True, self.final(bridge)
        return after, False, 0.0

    def final(self, bridge: Bridge) -> float:
        return float(bridge.call({"op": "evaluate"})["score"])


def load_tasks(path: str, seed: int) -> dict[str, list[Task]]:
    """OSWorld's evaluation_examples folder → train / in_domain / ood (see the module docstring)."""
    root = Path(path) if path else None
    if root is None or not (root / "examples").is_dir():
        raise TaskError(f"--osworld-tasks must be OSWorld's evaluation_examples folder (with examples/); got {path!r}")
    index = root / "test_all.json"
    if index.exists():
        pairs = [(d, i) for d, ids in json.loads(index.read_text()).items() for i in ids]
    else:
        pairs = [(p.parent.name, p.stem) for p in sorted(root.glob("examples/*/*.json"))]
    sets = {"train": [], "in_domain": [], "ood": []}
    rng = random.Random(seed)
    for domain, tid in pairs:
        file = root / "examples" / domain / f"{tid}.json"
        try:
            config = json.loads(file.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise TaskError(f"{file}: not an OSWorld task ({e.__class__.__name__})") from None
        task = Task(id=f"{domain}/{tid}", prompt=config.get("instruction", ""), origin="original",
                    data={"config": config, "domain": domain, "hint": ""})
        split = "ood" if domain in OOD_DOMAINS else ("in_domain" if rng.random() < 0.2 else "train")
        sets[split].append(task)
    if not sets["train"]:
        raise TaskError(f"no OSWorld training tasks under {root} (all in OOD domains {OOD_DOMAINS}?)")
    return sets


if __name__ == "__main__":  # a quick look at a tree: python -m tasks.osworld_env tree.xml
    print(linearize(Path(sys.argv[1]).read_text())[0])
