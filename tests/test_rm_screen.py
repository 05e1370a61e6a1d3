"""scripts/rm_screen.py on the tiny model: R alone learns from a frozen P's maze rollouts, is measured on the
validation rollouts before and after, a finished cell is skipped, and the table reads the cells."""
import json
import subprocess
import sys
from pathlib import Path

from scripts import rm_screen

ROOT = Path(__file__).resolve().parent.parent
FLAGS = ["--configs", "paper,batch", "--model", "tiny", "--engine", "hf", "--iterations", "2", "--eval-every", "2",
         "--tasks-per-iter", "2", "--group-size", "2", "--m", "2", "--max-turns", "3", "--eval-samples", "1",
         "--val-tasks", "4"]


def screen(tmp_path, *extra):
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "rm_screen.py"), *FLAGS, "--out", str(tmp_path),
                           *extra], cwd=ROOT, capture_output=True, text=True, timeout=900)


def test_screen_trains_r_alone_and_reports(tmp_path):
    done = screen(tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for name in ("paper", "batch"):
        cell = tmp_path / f"{name}-s0"
        rows = [json.loads(x) for x in (cell / "metrics.jsonl").read_text().splitlines()]
        assert [r["iteration"] for r in rows] == [0, 1, 2]
        assert "val/process_bacc" in rows[0] and "val/process_bacc" in rows[2] and "val/process_bacc" not in rows[1]
        assert "losses/policy_loss" not in rows[1]                 # P is frozen: only R's update runs
        assert "train/rm_samples" in rows[1] and "train/thm1_label_mu" in rows[1] and "train/oracle_label_mu" in rows[1]
        for key in ("val/oracle_label_mu", "val/oracle_outcome_bacc", "val/oracle_valid_bacc"):   # the same validation rollouts (NaN too)
            assert str(rows[0][key]) == str(rows[2][key])
        for r in (rows[0], rows[2]):
            assert 0 <= r["val/process_bacc"] <= 1 and -1 <= r["val/verdict_mean"] <= 1
        cfg = json.loads((cell / "config.json").read_text())
        assert cfg["config"] == name and cfg["flags"] == rm_screen.CONFIGS[name]
        assert (cell / "machine.jsonl").exists() and (cell / "done").exists()
    assert json.loads((tmp_path / "batch-s0" / "config.json").read_text())["rm_norm"] == "batch"
    table = [line for line in done.stdout.splitlines() if line.startswith("| paper") or line.startswith("| batch")]
    assert len(table) == 2 and all(line.count("|") == 10 for line in table)
    assert "Fixed judges on seed 0's validation rollouts (balanced Process Acc; μ against the outcomes): label " in done.stdout
    # a second call skips the finished cells: it reads, it does not run
    again = screen(tmp_path)
    assert again.returncode == 0 and "[rm_screen]" not in again.stdout and table[0] in again.stdout


def test_collapse_rule():
    assert rm_screen.collapsed({"val/verdict_mean": -0.85, "val/unparseable": 0.0})
    assert rm_screen.collapsed({"val/verdict_mean": 0.1, "val/unparseable": 0.25})
    assert not rm_screen.collapsed({"val/verdict_mean": 0.5, "val/unparseable": 0.1})


def test_flags_the_screen_sets_are_refused():
    for flag in ("--task", "--seed", "--ablation", "--validation"):   # --task x: no such setting
        try:
            rm_screen.parse([flag, "x"])
        except SystemExit as e:
            assert e.code == 2
        else:
            raise AssertionError(flag)


def test_screen_runs_where_only_some_validation_tasks_are_labelled(tmp_path):
    """osworld: R is measured on the labelled MiniWoB pages of the validation split only, in real Chromium."""
    flags = [f for f in FLAGS if f != "paper,batch"]
    flags[flags.index("--configs") + 1:flags.index("--configs") + 1] = ["paper"]
    flags[flags.index("--iterations") + 1] = flags[flags.index("--eval-every") + 1] = "1"
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "rm_screen.py"), "--task", "osworld", *flags,
                           "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [json.loads(x) for x in (tmp_path / "paper-s0" / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [0, 1] and "losses/policy_loss" not in rows[1]
    assert 0.5 <= rows[0]["val/process_majority"] <= 1 and 0.5 <= rows[1]["val/process_majority"] <= 1   # labelled
    assert json.loads((tmp_path / "paper-s0" / "config.json").read_text())["task"] == "osworld"
