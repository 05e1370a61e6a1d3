"""The offline GUI backend of the OSWorld setting (paper §4.1, "OSWorld"; docs/METHOD.md, "The settings"):
MiniWoB++ pages (the `miniwob` package bundles them) in real headless Chromium (Debian `chromium` +
`chromium-driver`), one browser per parallel episode, reused across episodes and tasks.

- Observation: the task's instruction, the DOM elements rendered as an accessibility-tree-like list
  (`[ref] tag "text"`), and, with `screenshots=True`, the screenshot (H × W × 3 uint8) for a
  vision-language policy.
- Actions: the adapter's vocabulary (tasks/gui.py `Action`) mapped onto MiniWoB's action types
  (`MiniWoB`, the backend the adapter drives).
- Outcome: MiniWoB's raw episode reward > 0.
- Deviation: MiniWoB ends an episode after 10 s of wall clock. An LLM on a CPU takes seconds per
  step, so the timer is set to an hour and the adapter's step limit (`--max-turns`) bounds episodes,
  as OSWorld's step limit does.
- A crashed or hung browser (no answer within `timeout` seconds) is killed with every process it
  started and a fresh one started; the episode it was playing is reported as crashed (counted failed).
"""
from __future__ import annotations

import os
import re
import shutil

import numpy as np

from records import Task
from tasks.gui import Action, Backend, Guarded, Screen, center, ids_known, kill_tree

TIMER_MS = 3_600_000      # MiniWoB's episode timer (10 s upstream), see the module docstring
INPUTS = {"button", "a", "textarea", "select", "option", "input", "input_text", "input_password", "input_checkbox",
          "input_radio", "input_number", "input_date", "input_time", "input_email", "input_search", "input_tel"}
KEYS = {"enter": "<Enter>", "tab": "<Tab>", "backspace": "<Backspace>", "delete": "<Delete>", "space": "<Space>",
        "up": "<ArrowUp>", "down": "<ArrowDown>", "left": "<ArrowLeft>", "right": "<ArrowRight>",
        "pageup": "<PageUp>", "pagedown": "<PageDown>"}
MODIFIERS = {"ctrl": "C-", "control": "C-", "shift": "S-", "alt": "A-", "cmd": "M-", "command": "M-"}


def chrome_paths() -> tuple[str, str]:
    """Chromium and chromedriver: MINIWOB_CHROME_BINARY / MINIWOB_CHROMEDRIVER, else Debian's paths on PATH."""
    binary = os.environ.get("MINIWOB_CHROME_BINARY") or shutil.which("chromium") or shutil.which("chromium-browser")
    driver = os.environ.get("MINIWOB_CHROMEDRIVER") or shutil.which("chromedriver")
    if not binary or not driver:
        raise RuntimeError("headless Chromium not found: apt-get install chromium chromium-driver "
                           "(or set MINIWOB_CHROME_BINARY and MINIWOB_CHROMEDRIVER)")
    return binary, driver


def render_elements(elements: list[dict]) -> tuple[str, dict, dict]:
    """MiniWoB's DOM elements as `[ref] tag "text" value=… (focused)` lines, in document order: form
    controls, links and buttons, and any element with text. Text nodes (tag "t", negative refs, not
    clickable) are folded into their parent's line; invisible (zero-size) elements are left out.
    Also each listed element's box (ref → left, top, w, h) and kind (ref → tag, text)."""
    inner: dict[int, list[str]] = {}
    for e in elements:
        if e["tag"] == "t":
            inner.setdefault(int(e["parent"]), []).append(str(e["text"]))
    lines, boxes, kinds = [], {}, {}
    for e in elements:
        w, h = float(np.asarray(e["width"]).item()), float(np.asarray(e["height"]).item())
        text = " ".join(" ".join([str(e["text"])] + inner.get(int(e["ref"]), [])).split())[:80]
        if e["tag"] == "t" or w <= 0 or h <= 0 or not (e["tag"] in INPUTS or text):
            continue
        boxes[int(e["ref"])] = (float(np.asarray(e["left"]).item()), float(np.asarray(e["top"]).item()), w, h)
        kinds[int(e["ref"])] = (e["tag"], text)
        value = f' value="{e["value"]}"' if e["value"] not in ("", None) else ""
        lines.append(f'[{e["ref"]}] {e["tag"]}' + (f' "{text}"' if text else "") + value
                     + (" (focused)" if e["flags"][0] else ""))
    return "\n".join(lines), boxes, kinds


def key_name(key: str) -> str | None:
    """pyautogui-style key ("enter", "ctrl+a", "a") → MiniWoB's key string ("<Enter>", "C-a", "a")."""
    *mods, base = [k.strip().lower() for k in key.split("+")]
    if any(m not in MODIFIERS for m in mods):
        return None
    base = KEYS.get(base, base if len(base) == 1 else None)
    return base and "".join(MODIFIERS[m] for m in mods) + base


class Browser(Guarded):
    """One headless Chromium playing MiniWoB pages; reused across episodes and tasks."""

    def __init__(self, screenshots: bool = False, timeout: float = 30.0):
        super().__init__(timeout)
        self.screenshots = screenshots
        self.instance, self.page = None, None

    # — lifecycle —
    def _start(self):
        from miniwob.action import ActionSpaceConfig
        from miniwob.selenium_instance import SeleniumInstance
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        binary, driver = chrome_paths()
        options = webdriver.ChromeOptions()
        for arg in ("headless", "disable-gpu", "no-sandbox", "disable-dev-shm-usage"):
            options.add_argument(arg)
        options.binary_location = binary
        self.service = Service(executable_path=driver)
        inst = SeleniumInstance(index=0, subdomain="click-test", headless=True)
        inst.driver = webdriver.Chrome(service=self.service, options=options)
        inst.driver.implicitly_wait(0)
        inst.inner_width, inst.inner_height = inst.driver.execute_script(
            "return [window.innerWidth, window.innerHeight];")
        self.instance, self.page = inst, None
        self.actions = ActionSpaceConfig.get_preset("all_supported")
        self.actions.screen_width, self.actions.screen_height = inst.task_width, inst.task_height

    def kill(self) -> None:
        """Kill chromedriver and every Chromium process it started."""
        proc = getattr(getattr(self, "service", None), "process", None)
        if proc is not None and proc.poll() is None:
            kill_tree(proc.pid)
        self.instance = self.page = None

    # — episodes —
    def _open(self, page: str) -> None:
        inst = self.instance
        inst.url = f"file://{_html_dir()}/miniwob/{page}.html"
        inst.driver.get(inst.url)
        inst.field_extractor = _field_extractor(page)
        self.page = page

    def _reset(self, seed) -> Screen:
        inst = self.instance
        inst.record_screenshots = self.screenshots
        inst.force_stop()
        inst.driver.execute_script(f"core.EPISODE_MAX_TIME = {TIMER_MS};")
        inst.begin_task(seed=seed)
        return self._observe(cached=False)

    def _observe(self, cached: bool) -> Screen:
        obs, _ = self.instance.get_observation(use_cached_fields=cached)
        text, boxes, kinds = render_elements(obs["dom_elements"])
        return Screen(obs["utterance"], text, boxes, obs["screenshot"] if self.screenshots else None, kinds)

    def _step(self, kind: str, kwargs: dict) -> tuple[Screen | None, bool, float]:
        inst = self.instance
        action = None if kind == "NONE" else _make_action(self.actions, kind, kwargs)
        inst.perform(action, self.actions)
        meta = inst.get_metadata()
        done = bool(meta["done"])
        return (None if done else self._observe(cached=True)), done, float(meta["raw_reward"]) if done else 0.0

    def reset(self, page: str, seed) -> Screen:
        """Load a MiniWoB page (if another one is open) and start its episode for `seed`."""
        if self.instance is None:
            self._call(self._start, slow=True)
        if page != self.page:
            self._call(self._open, page, slow=True)
        return self._call(self._reset, seed)

    def step(self, kind: str, **kwargs) -> tuple[Screen | None, bool, float]:
        """One MiniWoB action (ActionTypes name, its fields): (screen or None when done, done, raw reward)."""
        return self._call(self._step, kind, kwargs)


def _make_action(config, kind: str, fields: dict) -> dict:
    """A MiniWoB action dict for ActionTypes `kind` with the given fields (ref, coords, text, key)."""
    from miniwob.action import ActionTypes

    action = {"action_type": config.action_types.index(ActionTypes[kind]), "coords": np.zeros(2, np.float32),
              "ref": 0, "key": 0, "text": "", "field": 0}
    if "key" in fields:
        fields = {**fields, "key": list(config.allowed_keys).index(fields["key"])}
    if "coords" in fields:
        fields = {**fields, "coords": np.asarray(fields["coords"], np.float32)}
    return action | fields


def _html_dir() -> str:
    import miniwob
    return os.path.join(os.path.dirname(miniwob.__file__), "html")


def _field_extractor(page: str):
    from miniwob.fields import get_field_extractor
    return get_field_extractor(page)


# ───────────────────────────── exact step labels (not in the paper; issue 43) ─────────────────────────────
# The pages whose right next action can be read off the instruction, the element list and the episode's earlier
# clicks: which element to click. page → (instruction, screen, earlier) → the refs a right click hits now, where
# `earlier` holds the episode's earlier (action, screen) pairs. A step is labelled +1 when it clicks one of them (by
# id, or at a point inside its box), −1 otherwise: a click elsewhere, any other action, a malformed answer.
# `tests/test_osworld.py` checks every rule against the page's own reward.

def _named(screen, tags: set[str], text: str | None = None) -> set[int]:
    return {ref for ref, (tag, x) in screen.kinds.items() if tag in tags and text in (None, x)}


def _quoted(instruction: str) -> str:
    return re.search(r'"(.*)"', instruction).group(1)


def hits(action: Action | None, screen) -> list[int]:
    """The listed elements an action clicks, in order: click(id) or click(x, y) (the smallest box holding the
    point) once, double_click twice; nothing for any other action or a malformed one."""
    if action is None or action.verb not in ("click", "double_click"):
        return []
    if len(action.args) == 1:
        refs = [action.args[0]] if action.args[0] in screen.boxes else []
    else:
        x, y = action.args
        inside = [(w * h, ref) for ref, (left, top, w, h) in screen.boxes.items()
                  if left <= x <= left + w and top <= y <= top + h]
        refs = [min(inside)[1]] if inside else []
    return refs * (2 if action.verb == "double_click" else 1)


def _next_button(instruction: str, screen, earlier) -> set[int]:
    """click-button-sequence: the page ends at the second button pushed, and pays if they were the named two in
    order; so the right click is the next named button, and after a wrong push there is none."""
    words = re.findall(r"button (\S+?)[,.]", instruction)
    pushed = [sc.kinds[r][1] for a, sc in earlier for r in hits(a, sc) if sc.kinds[r][0] == "button"]
    if len(pushed) >= len(words) or pushed != words[:len(pushed)]:
        return set()
    return _named(screen, {"button"}, words[len(pushed)])


def _nth_textbox(n: int, screen) -> set[int]:
    """focus-text-2: the n-th text input, in document order (refs grow in document order)."""
    boxes = sorted(_named(screen, {"input_text"}))
    return {boxes[n - 1]} if 0 < n <= len(boxes) else set()


RIGHT = {
    "click-test": lambda ins, sc, earlier: _named(sc, {"button"}),
    "click-test-2": lambda ins, sc, earlier: _named(sc, {"button"}, re.fullmatch(r"Click button (.+)\.", ins).group(1)),
    "click-button": lambda ins, sc, earlier: _named(sc, {"button"}, _quoted(ins)),
    "click-link": lambda ins, sc, earlier: _named(sc, {"span", "a"}, _quoted(ins)),
    "click-dialog": lambda ins, sc, earlier: _named(sc, {"button"}, "Close"),
    "click-button-sequence": _next_button,
    "focus-text": lambda ins, sc, earlier: _named(sc, {"input_text"}),
    # two pages on no ladder (the OOD eval set)
    "click-dialog-2": lambda ins, sc, earlier: _named(sc, {"button"}, {"x": "Close"}.get(q := _quoted(ins), q)),
    "focus-text-2": lambda ins, sc, earlier: _nth_textbox(int(re.search(r"(\d+)\D\D input", ins).group(1)), sc),
}


def step_label(page: str, screen, action: Action | None, earlier: list) -> int | None:
    """The exact label of `action` (None: malformed, or naming no element on the screen) taken on `screen`, after
    the episode's `earlier` (action, screen) pairs; None on a page with no rule in RIGHT. A double click is right
    where its first click ends the page; on click-button-sequence it pushes one button twice, which loses."""
    if page not in RIGHT:
        return None
    clicked = hits(action, screen)
    single = len(clicked) == 1 or (clicked and page != "click-button-sequence")
    return 1 if single and clicked[0] in RIGHT[page](screen.instruction, screen, earlier) else -1


class MiniWoB(Backend):
    """The `miniwob` backend: maps the action vocabulary onto MiniWoB++ in headless Chromium."""

    def __init__(self, pool):
        super().__init__(pool)
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

    def labelled(self, task: Task) -> bool:
        return task.data["page"] in RIGHT

    def label(self, task: Task, screen, action: Action | None, earlier: list) -> int | None:
        return step_label(task.data["page"], screen, action, earlier)
