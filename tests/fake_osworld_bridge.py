"""A FAKE OSWorld bridge (a test double): speaks tasks/osworld_bridge.py's protocol (version 1) but
runs no VM. It replays the observations of a replay file (tests/fixtures/osworld/replay.json, written
by hand in desktop-env's observation format: there is no VM on this machine to record from):

    {"task": {...OSWorld task JSON...}, "observations": [obs after reset, after step 1, ...],
     "solution": [the pyautogui actions that solve it]}

Each step moves to the next observation (staying on the last). `evaluate` scores 1.0 iff the actions
received since reset start with the solution, else 0.0 (OSWorld's evaluators give 0/1 on most tasks).
Every request is appended to $FAKE_BRIDGE_LOG (if set) so tests can check what was sent.
"""
import json
import os
import sys


def main() -> None:
    replay = json.loads(open(os.environ["FAKE_BRIDGE_REPLAY"]).read())
    if "--screenshots" not in sys.argv:   # as the real bridge: screenshots only on request
        replay["observations"] = [{**o, "screenshot": None} for o in replay["observations"]]
    log = os.environ.get("FAKE_BRIDGE_LOG")
    k, actions = 0, []
    for line in sys.stdin:
        msg = json.loads(line)
        if log:
            with open(log, "a") as f:
                f.write(json.dumps(msg) + "\n")
        op = msg.get("op")
        if op == "hello":
            answer = {"ok": True, "protocol": 1, "backend": "fake"}
        elif op == "reset":
            k, actions = 0, []
            answer = {"ok": True, "obs": replay["observations"][0]}
        elif op == "step":
            actions.append(msg["action"])
            k = min(k + 1, len(replay["observations"]) - 1)
            done = msg["action"] in ("DONE", "FAIL")
            answer = {"ok": True, "obs": replay["observations"][k], "done": done, "info": {"done": True} if done else {}}
        elif op == "evaluate":
            n = len(replay["solution"])
            answer = {"ok": True, "score": float(actions[:n] == replay["solution"])}
        elif op == "close":
            print(json.dumps({"ok": True}), flush=True)
            return
        else:
            answer = {"ok": False, "error": f"unknown op {op!r}"}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
