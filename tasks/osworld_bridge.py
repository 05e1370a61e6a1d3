"""The OSWorld bridge (paper §4.1, "OSWorld"): runs INSIDE desktop-env's own venv, so its pins (old
torch, transformers, numpy<2) never touch ours. Standard library + desktop-env only; do not import
project modules here.

    <desktop-env venv>/bin/python tasks/osworld_bridge.py --provider docker [--path-to-vm VM] [--screenshots]

Protocol (version 1): one JSON object per line on stdin, one answer per line on stdout; logs go to
stderr. Every answer has "ok" (and "error" when false).
    {"op": "hello"}                          → {"ok": true, "protocol": 1, "backend": "..."}
    {"op": "reset", "task": {...}}           → {"ok": true, "obs": OBS}          (an OSWorld task JSON)
    {"op": "step", "action": "...", "pause": 2.0}
                                             → {"ok": true, "obs": OBS, "done": bool, "info": {...}}
      action: pyautogui code, or "WAIT" / "DONE" / "FAIL" (desktop-env's special actions)
    {"op": "evaluate"}                       → {"ok": true, "score": float}   (OSWorld's evaluator)
    {"op": "close"}                          → {"ok": true}, then the bridge exits
OBS = {"instruction": str, "accessibility_tree": str | null, "screenshot": base64 PNG | null}
"""
import argparse
import base64
import json
import sys

PROTOCOL = 1


def _obs(raw: dict, screenshots: bool) -> dict:
    shot = raw.get("screenshot")
    return {"instruction": raw.get("instruction") or "", "accessibility_tree": raw.get("accessibility_tree"),
            "screenshot": base64.b64encode(shot).decode() if screenshots and shot else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--provider", default="docker")
    ap.add_argument("--path-to-vm", default=None)
    ap.add_argument("--screenshots", action="store_true")
    args = ap.parse_args()
    from desktop_env.desktop_env import DesktopEnv  # noqa: PLC0415 (only inside desktop-env's venv)

    env = DesktopEnv(provider_name=args.provider, path_to_vm=args.path_to_vm or None, action_space="pyautogui",
                     headless=True, require_a11y_tree=True)
    out = sys.stdout
    for line in sys.stdin:
        msg = json.loads(line)
        try:
            op = msg["op"]
            if op == "hello":
                answer = {"protocol": PROTOCOL, "backend": "desktop-env"}
            elif op == "reset":
                answer = {"obs": _obs(env.reset(task_config=msg["task"]), args.screenshots)}
            elif op == "step":
                obs, _, done, info = env.step(msg["action"], msg.get("pause", 2.0))
                answer = {"obs": _obs(obs, args.screenshots), "done": bool(done), "info": info or {}}
            elif op == "evaluate":
                answer = {"score": float(env.evaluate())}
            elif op == "close":
                env.close()
                out.write(json.dumps({"ok": True}) + "\n")
                out.flush()
                return
            else:
                raise ValueError(f"unknown op {op!r}")
            out.write(json.dumps({"ok": True, **answer}) + "\n")
        except Exception as e:  # noqa: BLE001 (the client decides; the bridge stays up)
            out.write(json.dumps({"ok": False, "error": f"{type(e).__name__}: {e}"[:500]}) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
