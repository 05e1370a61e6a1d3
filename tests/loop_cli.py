"""The end-to-end check every setting's tests share: loop.py for 2 iterations of one Table 1 row on the tiny
model (transformers engine, tiny sizes), in a process of its own."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# The Table 1 rows that the other settings' end-to-end tests run. A row only switches parts on and off in loop.py
# and policy.score_steps (config.Row); no adapter sees it. Coding (tests/test_loop.py, one step per episode) and the
# maze (tests/test_maze.py, the multi-turn runner the agent settings share) run all five rows; every setting runs
# these two, which reach each adapter method: grpo without R, full with R judging and training and E rewriting.
SETTING_ROWS = ["grpo", "full"]


def two_iterations(task: str, ablation: str, tmp_path: Path, *flags: str, env: dict | None = None) -> list[dict]:
    """Run it, check that it finished both iterations (E only in the full row), and return its metrics rows;
    `flags` are the setting's own sizes, `env` the process's environment."""
    args = ["--task", task, "--model", "tiny", "--engine", "hf", "--iterations", "2", "--ablation", ablation,
            "--tasks-per-iter", "2", "--group-size", "2", "--m", "2", "--rm-max-new-tokens", "8",
            "--runs-dir", str(tmp_path), "--name", "x", *flags]
    r = subprocess.run([sys.executable, str(ROOT / "loop.py"), *args], cwd=ROOT, capture_output=True, text=True,
                       timeout=900, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(x) for x in (tmp_path / "x" / "metrics.jsonl").read_text().splitlines()]
    assert [row["iteration"] for row in rows] == [0, 1, 2]
    assert ("env/proposed" in rows[1]) == (ablation == "full")
    return rows
