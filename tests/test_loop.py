"""The loop end to end on the tiny model: every ablation through the CLI, training on a mixed
group (with a scripted engine double), SIGKILL + --resume, and one-line errors for bad input."""
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import llm
import loop
from tasks.livebench import load_builtin

ROOT = Path(__file__).resolve().parent.parent
TINY = ["--task", "livebench", "--model", "tiny", "--tasks-per-iter", "2", "--group-size", "2", "--m", "2",
        "--max-new-tokens", "12", "--rm-max-new-tokens", "12", "--humaneval-limit", "2", "--eval-every", "0",
        "--sandbox-timeout", "3", "--engine", "hf"]


def run_cli(args, **kw):
    return subprocess.run([sys.executable, str(ROOT / "loop.py"), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=900, **kw)


@pytest.mark.slow
@pytest.mark.parametrize("ablation", list(loop.ABLATIONS))
def test_cli_two_iterations_each_ablation(tmp_path, ablation):
    r = run_cli([*TINY, "--iterations", "2", "--ablation", ablation, "--runs-dir", str(tmp_path), "--name", "x"])
    assert r.returncode == 0, r.stderr[-3000:]
    run = tmp_path / "x"
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [row["iteration"] for row in rows] == [0, 1, 2]
    assert "eval/in_domain/code" in rows[0] and "eval/ood/code" in rows[-1]
    assert ("eval/in_domain/ut" in rows[0]) == (ablation != "grpo")   # grpo has no R
    assert json.loads((run / "ckpt" / "state.json").read_text()) == {"iteration": 2}
    assert (run / "ckpt" / "policy" / "config.json").exists()
    assert (run / "ckpt" / "reward_model").exists() == (ablation != "grpo")
    assert (run / "curve.png").stat().st_size > 1000
    assert list((run / "tb").glob("events.out.tfevents.*"))
    assert (run / "samples" / "iter_0002.txt").read_text().startswith("=")
    slots = json.loads((run / "ckpt" / "env_state.json").read_text())
    assert len(slots) == 12
    assert "it   2 | acc" in r.stdout


class ScriptedPolicy:
    """A test double around the real tiny engine: it keeps the tiny model's token sampling but
    overwrites some completions with scripted text (a correct program, or a well-formed test),
    so that groups are mixed and every training path runs on the real tiny model."""

    def __init__(self, inner, solutions: dict[str, str], tests: dict[str, tuple[str, str]]):
        self.inner, self.tokenizer, self.solutions, self.tests = inner, inner.tokenizer, solutions, tests

    def sync(self):
        self.inner.sync()

    def generate(self, prompts, **kw):
        outs = self.inner.generate(prompts, **kw)
        for prompt, cs in zip(prompts, outs):
            key = next((k for k in self.solutions if k in prompt), None)
            if key is None:
                continue
            for j, c in enumerate(cs):
                if "unit test" in prompt:
                    stdin, out = self.tests[key]
                    text = f"{stdin}```\nOutput:\n```\n{out if j % 2 == 0 else 'wrong'}\n```"  # after TEST_PREFIX
                elif j % 2 == 0:
                    text = f"{self.solutions[key]}```"  # after CODE_PREFIX
                else:
                    continue
                c.text, c.ids = text, self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return outs


def test_loop_trains_policy_and_rm_on_mixed_groups(tmp_path, monkeypatch):
    rows = load_builtin()
    solutions = {r["prompt"]: r["solution"] for r in rows}
    tests = {r["prompt"]: (r["tests"][0]["input"], r["tests"][0]["output"]) for r in rows}
    real = llm.make_engines
    monkeypatch.setattr(llm, "make_engines", lambda *a, **k: {name: ScriptedPolicy(e, solutions, tests)
                                                              for name, e in real(*a, **k).items()})
    before = {}
    orig_load = llm.load

    def load(name, seed=0):
        model, tok = orig_load(name, seed)
        before[id(model)] = [p.detach().clone() for p in model.parameters()]
        return model, tok

    monkeypatch.setattr(llm, "load", load)
    cfg = loop.parse_args([*TINY, "--iterations", "2", "--runs-dir", str(tmp_path), "--name", "mixed",
                           "--humaneval-limit", "0", "--lr", "1e-3", "--rm-lr", "1e-3"])
    loop.train(cfg)
    rows = [json.loads(x) for x in (tmp_path / "mixed" / "metrics.jsonl").read_text().splitlines()]
    train_rows = rows[1:]
    assert all(r["train/acc"] == 0.5 for r in train_rows)          # one scripted solution per group of 2
    assert all(r["train/policy_samples"] == 2 * r["train/tasks"] for r in train_rows)
    assert all(r["train/rm_samples"] > 0 for r in train_rows)
    assert all(r["losses/policy_kl"] >= 0 for r in train_rows)
    # acc 0.5 is inside [α_low, α_high]: no proposals; every slot stays at its original
    slots = json.loads((tmp_path / "mixed" / "ckpt" / "env_state.json").read_text())
    assert all(s["active"]["id"] == sid for sid, s in slots.items())
    saved = llm.load(str(tmp_path / "mixed" / "ckpt" / "policy"))[0]
    first = next(iter(before.values()))
    assert any(not torch.equal(a, b) for a, b in zip(first, saved.parameters()))  # P moved


@pytest.mark.slow
def test_sigkill_mid_iteration_then_resume(tmp_path):
    args = [*TINY, "--iterations", "3", "--runs-dir", str(tmp_path), "--name", "k", "--humaneval-limit", "0"]
    proc = subprocess.Popen([sys.executable, str(ROOT / "loop.py"), *args], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    state = tmp_path / "k" / "ckpt" / "state.json"
    deadline = time.time() + 600
    while time.time() < deadline and not (state.exists() and json.loads(state.read_text())["iteration"] >= 1):
        time.sleep(0.2)
    time.sleep(1.0)  # now inside iteration 2
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = json.loads(state.read_text())["iteration"]
    assert done in (1, 2)
    slots_before = json.loads((tmp_path / "k" / "ckpt" / "env_state.json").read_text())
    r = run_cli(["--runs-dir", str(tmp_path), "--name", "k", "--resume"])  # the saved config supplies the rest
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"resuming {tmp_path / 'k'} after iteration {done}" in r.stdout
    rows = [json.loads(x) for x in (tmp_path / "k" / "metrics.jsonl").read_text().splitlines()]
    assert [row["iteration"] for row in rows] == [0, 1, 2, 3]           # none lost, none repeated
    assert json.loads(state.read_text()) == {"iteration": 3}
    slots_after = json.loads((tmp_path / "k" / "ckpt" / "env_state.json").read_text())
    assert set(slots_after) == set(slots_before)


@pytest.mark.slow
def test_lora_run_saves_adapters_resumes_and_evaluates(tmp_path):
    """--lora-rank: adapters train, the checkpoint holds them (+ the base's name), resume and eval load them."""
    args = [*TINY, "--lora-rank", "4", "--runs-dir", str(tmp_path), "--name", "lora", "--humaneval-limit", "0"]
    r = run_cli([*args, "--iterations", "1", "--eval-every", "-1"])
    assert r.returncode == 0, r.stderr[-3000:]
    ckpt = tmp_path / "lora" / "ckpt"
    assert (ckpt / "policy" / "adapter_config.json").exists() and not (ckpt / "policy" / "config.json").exists()
    rows = [json.loads(x) for x in (tmp_path / "lora" / "metrics.jsonl").read_text().splitlines()]
    assert not any(k.startswith("eval/") for row in rows for k in row)   # --eval-every -1: never
    r = run_cli(["--runs-dir", str(tmp_path), "--name", "lora", "--resume", "--iterations", "2"])
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads((ckpt / "state.json").read_text()) == {"iteration": 2}
    model, _ = llm.load(str(ckpt / "policy"))
    assert hasattr(model, "peft_config") and any(p.requires_grad for n, p in model.named_parameters() if "lora_" in n)
    r = run_cli([*TINY, "--eval-only", "--checkpoint", str(tmp_path / "lora"), "--humaneval-limit", "0"])
    assert r.returncode == 0 and "in_domain" in r.stdout, r.stderr[-3000:]


def test_recover_from_kill_between_renames(tmp_path):
    cfg = loop.parse_args(["--runs-dir", str(tmp_path), "--name", "r"])
    run = loop.Run(cfg)
    run.create()
    (run.dir / "ckpt.old").mkdir()
    (run.dir / "ckpt.old" / "state.json").write_text('{"iteration": 4}')
    (run.dir / "ckpt.tmp").mkdir()   # incomplete: no state.json
    cfg.resume = True
    run = loop.Run(cfg)
    assert run.state() == {"iteration": 4}
    assert not (run.dir / "ckpt.tmp").exists() and not (run.dir / "ckpt.old").exists()


@pytest.mark.parametrize("args,needle", [
    (["--task", "nope"], "--task"),
    (["--model", "/no/such/model"], "/no/such/model"),
    (["--data", "tests/fixtures/malformed_livebench.jsonl"], "malformed_livebench.jsonl"),
    (["--group-size", "1"], "--group-size"),
    (["--alpha-low", "0.9", "--alpha-high", "0.1"], "--alpha-low"),
    (["--iterations", "many"], "--iterations"),
    (["--eval-only"], "--checkpoint"),
    (["--frobnicate"], "--frobnicate"),
])
def test_bad_input_is_one_line(tmp_path, args, needle):
    r = run_cli([*args, "--runs-dir", str(tmp_path)])
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_existing_run_is_not_overwritten(tmp_path):
    (tmp_path / "livebench-full-s0").mkdir()
    (tmp_path / "livebench-full-s0" / "metrics.jsonl").write_text('{"iteration": 0}\n')
    r = run_cli(["--model", "tiny", "--runs-dir", str(tmp_path)])
    assert r.returncode == 2 and "--resume" in r.stderr
    assert (tmp_path / "livebench-full-s0" / "metrics.jsonl").read_text() == '{"iteration": 0}\n'
