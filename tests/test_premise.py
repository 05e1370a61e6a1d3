"""scripts/premise.py: the premise check runs on the tiny model end to end, and refuses what it cannot check.
Its numbers are checked by hand in its doctests (premise.premise, premise.fixed_judges)."""
import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scripts import premise  # noqa: E402


def test_tiny_maze_prints_the_table_and_writes_the_numbers(tmp_path, capsys):
    out = tmp_path / "premise.json"
    assert premise.main(["--task", "maze", "--model", "tiny", "--engine", "hf", "--tasks", "4", "--group-size", "2",
                         "--m", "2", "--json", str(out)]) == 0
    q = json.loads(out.read_text())
    assert (q["task"], q["tasks"], q["rollouts"], q["m"]) == ("maze", 4, 8, 2) and q["labelled_steps"] > 0
    assert 0 <= q["base_rate"] <= 1 and 0 <= q["in_band"] <= q["mixed"] <= 1   # the band lies inside (0, 1)
    assert 0 <= q["rm_unparseable"] <= 1 and 0 <= q["invalid"] <= 1 and "cpu" in q["machine"]
    for key, (least, _) in premise.GATES.items():   # a gate passes exactly when its number reaches the bar
        assert q[f"pass_{key}"] == (not math.isnan(q[key]) and q[key] >= least)
    printed = capsys.readouterr().out
    assert "| P's base rate; its answers that are no valid action |" in printed and printed.count("| ≥ ") == len(premise.GATES)


def test_a_setting_without_step_labels_or_a_bad_flag_is_one_line():
    for args, needle in ((["--task", "livebench"], "needs a validation split with step labels"),
                         (["--task", "maze", "--tasks", "-1"], "--tasks: must be >= 0")):
        r = subprocess.run([sys.executable, "scripts/premise.py", *args, "--model", "tiny", "--engine", "hf"],
                           cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert r.returncode != 0 and needle in r.stderr and "Traceback" not in r.stderr, r.stderr
