"""The loop end to end on the tiny model: every ablation through the CLI, training on a mixed
group (with a scripted engine double), SIGKILL + --resume, and one-line errors for bad input."""
import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

from plumbing import config
import loop
from plumbing import models, rundir
from golden import continuation
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
    assert ("eval/in_domain/ut_gain_se" in rows[-1] and "eval/in_domain/detect_se" in rows[0]) == (ablation != "grpo")
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
                    text = f"{continuation(self.solutions[key], prompt)}```"  # after CODE_PREFIX (+ given lines)
                else:
                    continue
                c.text, c.ids = text, self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return outs


def test_loop_trains_policy_and_rm_on_mixed_groups(tmp_path, monkeypatch):
    rows = load_builtin()
    solutions = {r["prompt"]: r["solution"] for r in rows}
    tests = {r["prompt"]: (r["tests"][0]["input"], r["tests"][0]["output"]) for r in rows}
    real = loop.make_engines
    monkeypatch.setattr(loop, "make_engines", lambda *a, **k: {name: ScriptedPolicy(e, solutions, tests)
                                                              for name, e in real(*a, **k).items()})
    before = {}
    orig_load = models.load

    def load(name, seed=0):
        model, tok = orig_load(name, seed)
        before[id(model)] = [p.detach().clone() for p in model.parameters()]
        return model, tok

    monkeypatch.setattr(loop, "load", load)
    cfg = loop.parse_args([*TINY, "--iterations", "2", "--runs-dir", str(tmp_path), "--name", "mixed",
                           "--humaneval-limit", "0", "--lr", "1e-3", "--rm-lr", "1e-3"])
    loop.train(cfg)
    rows = [json.loads(x) for x in (tmp_path / "mixed" / "metrics.jsonl").read_text().splitlines()]
    train_rows = rows[1:]
    assert all(r["train/acc"] == 0.5 for r in train_rows)          # one scripted solution per group of 2
    assert all(r["train/policy_samples"] == 2 * r["train/tasks"] for r in train_rows)
    assert all(r["train/rm_samples"] > 0 for r in train_rows)
    assert all(r["losses/policy_kl"] >= 0 for r in train_rows)
    # the dynamics a collapse shows in, for P and for R (tests/test_math.py checks their values by hand)
    for who in ("policy", "rm"):
        for key in (f"losses/{who}_entropy", f"losses/{who}_update_kl", f"losses/{who}_update_clipfrac",
                    f"losses/{who}_grad_norm", f"train/{who}_unparseable", f"train/{who}_response_len"):
            assert all(key in r and r[key] == r[key] for r in train_rows), key
    assert all(r["losses/policy_entropy"] > 0 and r["losses/policy_update_kl"] > 0 for r in train_rows)
    assert all(0 <= r["train/policy_unparseable"] <= 1 and r["train/policy_response_len"] > 0 for r in train_rows)
    # Theorem 1's quantities on the training steps (S_j: a program passes R's test j); no step labels in coding
    for r in train_rows:
        assert 0 <= r["train/thm1_mu"] <= 2 and 0 <= r["train/thm1_precision"] <= 1 and 0 <= r["train/thm1_bound"] < 1
        assert r["train/thm1_mu"] == r["train/thm1_p_plus"] + r["train/thm1_p_minus"]
        assert "train/thm1_label_mu" not in r
        # coding R's funnel: acc 0.5 puts every group in R's band; the shares are shares
        assert r["train/rm_band"] == 1.0 and 0 <= r["train/rm_tied"] <= 1 and 0 <= r["train/rm_tied_other"] <= 1
        assert 0 < r["train/rm_tests_distinct"] <= 1 and 0 <= r["train/rm_tests_malformed"] <= 1
    # acc 0.5 is inside [α_low, α_high]: no proposals; every slot stays at its original
    slots = json.loads((tmp_path / "mixed" / "ckpt" / "env_state.json").read_text())
    assert all(s["active"]["id"] == sid for sid, s in slots.items())
    saved = models.load(str(tmp_path / "mixed" / "ckpt" / "policy"))[0]
    first = next(iter(before.values()))
    assert any(not torch.equal(a, b) for a, b in zip(first, saved.parameters()))  # P moved


def test_a_model_not_updated_since_the_last_checkpoint_is_linked_not_rewritten(tmp_path):
    """R often has no samples in its band and takes no step: its checkpoint files are hard links of the previous
    checkpoint's (same inode, same bytes); P, updated, is written afresh. Both read back as the models."""
    cfg = config.Config(task="livebench", runs_dir=str(tmp_path), name="r")
    trained = {}
    for name in ("policy", "reward_model"):
        model, tok = models.load("tiny", seed=0)
        trained[name] = models.Trained(model, tok, loop.make_optimizer(model, 1e-3), model)
    with rundir.Run(cfg) as run:
        run.prepare(trained, {})
        run.commit(0)
        assert trained["policy"].saved and trained["reward_model"].saved
        before = {n: (run.ckpt / n / "model.safetensors").stat().st_ino for n in trained}
        with torch.no_grad():
            trained["policy"].model.lm_head.weight.add_(1.0)
        trained["policy"].saved = False   # what `loop.optimize` does after a step
        run.prepare(trained, {})
        run.commit(1)
        after = {n: (run.ckpt / n / "model.safetensors").stat().st_ino for n in trained}
    assert after["reward_model"] == before["reward_model"] and after["policy"] != before["policy"]
    for name, m in trained.items():
        back, _ = models.load(str(tmp_path / "r" / "ckpt" / name))
        assert all(torch.equal(a, b) for a, b in zip(back.state_dict().values(), m.model.state_dict().values()))
        assert (tmp_path / "r" / "ckpt" / name / "optimizer.pt").exists()


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
    model, _ = models.load(str(ckpt / "policy"))
    assert hasattr(model, "peft_config") and any(p.requires_grad for n, p in model.named_parameters() if "lora_" in n)
    r = run_cli([*TINY, "--eval-only", "--checkpoint", str(tmp_path / "lora"), "--humaneval-limit", "0"])
    assert r.returncode == 0 and "in_domain" in r.stdout, r.stderr[-3000:]


def test_each_launch_records_its_machine(tmp_path):
    cfg = loop.parse_args(["--runs-dir", str(tmp_path), "--name", "r"])
    run = rundir.Run(cfg)
    run.create()
    run.create(start=3)   # a resumed launch appends
    run.close()
    lines = [json.loads(x) for x in (run.dir / "machine.jsonl").read_text().splitlines()]
    assert [x["from_iteration"] for x in lines] == [0, 3]
    assert lines[0]["torch"] == torch.__version__ and lines[0]["cpus"] == os.cpu_count()
    assert lines[0]["cpu_isa"] in ("amx_bf16", "avx512_bf16", "avx512f", "avx2", "")


def test_recover_from_kill_between_renames(tmp_path):
    cfg = loop.parse_args(["--runs-dir", str(tmp_path), "--name", "r"])
    run = rundir.Run(cfg)
    run.create()
    (run.dir / "ckpt.old").mkdir()
    (run.dir / "ckpt.old" / "state.json").write_text('{"iteration": 4}')
    (run.dir / "ckpt.tmp").mkdir()   # incomplete: no state.json
    run.close()
    cfg.resume = True
    run = rundir.Run(cfg)
    assert run.state() == {"iteration": 4}
    run.close()
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
    (["--top-p", "0"], "--top-p"),
    (["--top-p", "5"], "--top-p"),
    (["--gen-batch", "0"], "--gen-batch"),
    (["--rm-max-new-tokens", "0"], "--rm-max-new-tokens"),
    (["--env-retries", "-1"], "--env-retries"),
    (["--sandbox-timeout", "0"], "--sandbox-timeout"),
    (["--rm-temperature", "-1"], "--rm-temperature"),
    (["--lr", "nan"], "--lr"),
    (["--name", "/tmp/escape"], "--name"),
    (["--name", "../escape"], "--name"),
])
def test_bad_input_is_one_line(tmp_path, args, needle):
    r = run_cli([*args, "--runs-dir", str(tmp_path)])
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], r.stderr
    assert "Traceback" not in r.stderr
    assert not Path("/tmp/escape").exists() and not (tmp_path.parent / "escape").exists()


def test_every_numeric_flag_has_a_range_and_refuses_a_bad_value():
    numeric = {f.name for f in dataclasses.fields(loop.Config) if f.type in ("int", "float")}
    assert numeric == {name for name, _, _ in config.RANGES}          # a new numeric flag needs a range
    for name, ok, _ in config.RANGES:
        kind = next(f.type for f in dataclasses.fields(loop.Config) if f.name == name)
        flag = "--" + name.replace("_", "-")
        for bad in ((-10**9,) if kind == "int" else (-1e9, float("nan"), float("inf"))):
            assert kind == "float" or not ok(bad)
            with pytest.raises(loop.ConfigError, match=flag):
                loop.parse_args([flag, str(bad)])


def test_rm_target_kl_gives_r_its_own_trust_region():
    maze = loop.parse_args(["--task", "maze"])
    assert maze.target_kl_of("policy") == maze.target_kl_of("rm") == 0.01          # -1: R shares P's
    own = loop.parse_args(["--task", "maze", "--rm-target-kl", "0.05"])
    assert (own.target_kl_of("policy"), own.target_kl_of("rm")) == (0.01, 0.05)
    assert loop.parse_args(["--task", "maze", "--rm-target-kl", "0"]).target_kl_of("rm") == 0.0   # R's off
    with pytest.raises(loop.ConfigError, match="--rm-target-kl"):
        loop.parse_args(["--rm-target-kl", "-0.5"])


def test_each_setting_shows_its_own_defaults_and_the_released_values():
    out = {t: run_cli(["--task", t, "--help"]).stdout for t in ("livebench", "alfworld", "osworld")}
    flat = {t: " ".join(o.split()) for t, o in out.items()}
    m = "--m M, --judgments M R samples per step (coding: generated tests per task); under torchrun write --judgments (torchrun reads --m as an abbreviation of its own flags)"
    assert m + " [released code: 16] (default: 4)" in flat["livebench"]
    assert m + " (default: 3)" in flat["alfworld"] and m + " (default: 3)" in flat["osworld"]
    assert "--policy-steps POLICY_STEPS policy optimizer steps per iteration (default: 4)" in flat["alfworld"]
    assert "--rm-steps RM_STEPS reward-model optimizer steps per iteration (default: 2)" in flat["osworld"]
    assert "--rm-steps RM_STEPS reward-model optimizer steps per iteration (default: 4)" in flat["alfworld"]
    assert "keeps its state across iterations and checkpoints it (default: True)" in flat["livebench"]
    assert "[released code: 60] (default: 15)" in flat["alfworld"]          # --eval-max-turns, a CPU deviation
    for t in out:
        assert "E sampling temperature (generate mode) (default: 0.8)" in flat[t]
        assert "before exp in the loss (Eq. 5; 0: off) (default: 10.0)" in flat[t]
    assert "R nucleus sampling (default: 0.95)" in flat["alfworld"] and "R nucleus sampling (default: 1.0)" in flat["osworld"]
    cfg = loop.parse_args(["--task", "alfworld"])
    assert (cfg.eval_temperature, cfg.acc_lower, cfg.acc_upper, cfg.drop_zero_adv) == (0.8, 1 / 8, 7 / 8, True)
    cfg = loop.parse_args(["--task", "osworld"])
    assert (cfg.acc_lower, cfg.acc_upper, cfg.drop_zero_adv, cfg.policy_steps, cfg.rm_steps) == (0.0, 1.0, True, 4, 2)
    cfg = loop.parse_args(["--task", "livebench"])
    # coding: the paper's filter, not the released [0.2, 0.8] (METHOD.md deviation 2), on code completion (27)
    assert (cfg.acc_lower, cfg.acc_upper, cfg.drop_zero_adv, cfg.fresh_optimizer) == (1 / 8, 7 / 8, False, True)
    assert cfg.coding_task == "completion" and "[released code: generation] (default: completion)" in flat["livebench"]
    # one line at start-up says what differs from Config's generic defaults; Config holds what livebench runs
    line = loop.describe(cfg)
    changed = set(line.removeprefix("livebench: ").split(", ")) - {"amp=False"}   # fp32 where bf16 is not native
    assert line.startswith("livebench: ") and changed == {"drop_zero_adv=False", "eval_samples=8", "eval_temperature=1",
                                                    "eval_every=0", "humaneval_limit=0", "grad_checkpointing=False",
                                                    "target_kl=0.05"}
    assert "seed=2" in loop.describe(loop.parse_args(["--task", "livebench", "--seed", "2"]))


def test_preset_reference_is_the_released_configuration_and_flags_still_win():
    import ppo
    assert {k: getattr(loop.Config, k) for k in ppo.RELEASED} == ppo.RELEASED   # Eq. 5's constants, one truth
    cfg = loop.parse_args(["--task", "livebench", "--preset", "reference"])
    assert (cfg.policy_reward, cfg.group_size, cfg.m, cfg.lr, cfg.policy_steps) == ("reference", 32, 16, 1e-6, 2)
    cfg = loop.parse_args(["--task", "alfworld", "--preset", "reference", "--group-size", "4"])
    assert (cfg.group_size, cfg.max_turns, cfg.eval_max_turns, cfg.eval_samples) == (4, 40, 60, 3)
    for task in ("livebench", "alfworld", "osworld", "maze"):   # the released optimizer: fresh AdamW, constant LR
        cfg = loop.parse_args(["--task", task, "--preset", "reference"])
        assert (cfg.fresh_optimizer, cfg.warmup_steps, cfg.target_kl, cfg.train_amp, cfg.lr, cfg.sampler_old_kl) == \
            (True, 0, 0, True, 1e-6, 0), task
        assert {k: getattr(cfg, k) for k in ppo.RELEASED} == ppo.RELEASED, task   # tasks.RELEASED_TRAINER agrees


def test_existing_run_is_not_overwritten(tmp_path):
    run = tmp_path / "livebench-full-s0"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"iteration": 0}\n')
    r = run_cli(["--model", "tiny", "--runs-dir", str(tmp_path)])
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"error: run folder {run} exists: pass --resume to continue it (it has no finished iteration: it restarts "
        "from scratch with its saved config), or another --name"], r.stderr
    (run / "ckpt").mkdir()
    (run / "ckpt" / "state.json").write_text('{"iteration": 1}')   # a finished iteration
    r = run_cli(["--model", "tiny", "--runs-dir", str(tmp_path)])
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"error: run folder {run} exists: pass --resume to continue it, or another --name"], r.stderr
    assert (run / "metrics.jsonl").read_text() == '{"iteration": 0}\n'


# ── run folders (hardening) ──
FAST = [*TINY, "--humaneval-limit", "0", "--eval-every", "-1"]


def test_second_launch_on_a_locked_folder_names_the_holder(tmp_path):
    cfg = loop.parse_args(["--runs-dir", str(tmp_path), "--name", "busy"])
    holder = rundir.Run(cfg)                    # holds runs/busy/.lock for its lifetime
    try:
        r = run_cli(["--model", "tiny", "--runs-dir", str(tmp_path), "--name", "busy", "--resume"])
        assert r.returncode == 2 and f"in use by another run (pid {os.getpid()})" in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
    finally:
        holder.close()
    assert not (tmp_path / "busy").exists()   # it held nothing but the lock: removed


@pytest.mark.slow
def test_folder_without_a_finished_iteration_resumes_from_scratch(tmp_path):
    """A kill during the initial eval leaves config.json, metrics and samples but no committed
    iteration: a fresh start is refused (no data silently replaced), --resume restarts it."""
    run = tmp_path / "k"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({**dataclasses.asdict(loop.parse_args(
        [*FAST, "--iterations", "1", "--runs-dir", str(tmp_path), "--name", "k"]))}))
    (run / "metrics.jsonl").write_text('{"iteration": 0, "eval/in_domain/code": 0.5}\n')
    (run / "ckpt.tmp").mkdir()                # an unfinished checkpoint write
    r = run_cli(["--model", "tiny", "--runs-dir", str(tmp_path), "--name", "k"])
    assert r.returncode == 2 and "restarts from scratch" in r.stderr
    r = run_cli(["--runs-dir", str(tmp_path), "--name", "k", "--resume"])
    assert r.returncode == 0, r.stderr[-3000:]
    assert "no finished iteration: starting it again from scratch" in r.stdout
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [row["iteration"] for row in rows] == [0, 1] and "eval/in_domain/code" not in rows[0]
    assert json.loads((run / "ckpt" / "state.json").read_text()) == {"iteration": 1}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """One finished 1-iteration run (with a persistent optimizer), copied by the damage tests."""
    root = tmp_path_factory.mktemp("runs")
    r = run_cli([*FAST, "--iterations", "1", "--no-fresh-optimizer", "--runs-dir", str(root), "--name", "base"])
    assert r.returncode == 0, r.stderr[-3000:]
    return root / "base"


@pytest.mark.slow
@pytest.mark.parametrize("damage,needle", [
    ("state.json", "state.json is damaged"),
    ("env_state.json", "env_state.json is damaged"),
    ("config.json", "config.json is damaged"),
])
def test_damaged_checkpoint_files_are_one_line_errors(finished_run, tmp_path, damage, needle):
    run = tmp_path / "d"
    shutil.copytree(finished_run, run)
    path = run / damage if damage == "config.json" else run / "ckpt" / damage
    path.write_text(path.read_text()[:7])     # truncated mid-write by hand or a full disk
    r = run_cli(["--runs-dir", str(tmp_path), "--name", "d", "--resume", "--iterations", "2"])
    assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_missing_optimizer_state_is_one_warning_line(finished_run, tmp_path):
    run = tmp_path / "o"
    shutil.copytree(finished_run, run)
    assert (run / "ckpt" / "policy" / "optimizer.pt").exists()    # --no-fresh-optimizer saves it
    (run / "ckpt" / "policy" / "optimizer.pt").unlink()
    r = run_cli(["--runs-dir", str(tmp_path), "--name", "o", "--resume", "--iterations", "2"])
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count("optimizer.pt is missing: policy goes on with a fresh AdamW state") == 1


@pytest.mark.slow
def test_fresh_optimizer_by_default_saves_no_optimizer_state(tmp_path):
    r = run_cli([*FAST, "--iterations", "1", "--runs-dir", str(tmp_path), "--name", "f"])
    assert r.returncode == 0, r.stderr[-3000:]
    assert (tmp_path / "f" / "ckpt" / "policy" / "config.json").exists()
    assert not list((tmp_path / "f" / "ckpt").glob("*/optimizer.pt"))  # a new AdamW every iteration


def test_runs_dir_under_a_file_is_one_line(tmp_path):
    (tmp_path / "file").write_text("x")
    r = run_cli(["--model", "tiny", "--runs-dir", str(tmp_path / "file" / "runs")])
    assert r.returncode == 2 and "cannot create the run folder" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow
def test_ctrl_c_is_one_line_with_the_resume_command(tmp_path):
    proc = subprocess.Popen([sys.executable, str(ROOT / "loop.py"), *FAST, "--iterations", "50", "--runs-dir",
                             str(tmp_path), "--name", "c"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    state = tmp_path / "c" / "ckpt" / "state.json"
    deadline = time.time() + 600
    while time.time() < deadline and not state.exists():
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("interrupted")
    assert f"--name c --runs-dir {tmp_path} --resume" in err
    cfg = loop.parse_args(["--runs-dir", str(tmp_path), "--name", "c", "--resume"])
    rundir.Run(cfg).close()                                     # free to take again


def test_leftover_sandbox_folders_of_a_killed_run_are_removed_at_the_next_start(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()                                   # a pid that no longer runs: a killed trainer's
    stale = Path(tempfile.gettempdir()) / f"rlanything-sandbox-{dead.pid}-test"
    (stale / "sub").mkdir(parents=True)
    (stale / "sub" / "main.py").write_text("print(1)")
    r = run_cli(["--model", "/no/such/model", "--runs-dir", str(tmp_path)])   # starts, cleans, then fails
    assert r.returncode == 2 and not stale.exists()
    assert re.search(r"removed \d+ leftover sandbox folder\(s\) of killed runs", r.stdout)


def test_a_renamed_field_still_reads_from_an_old_run_folder_and_its_old_flag(tmp_path):
    """`--coding-reward` became `--policy-reward` (every setting reads it): the old flag still works, and --resume of a
    folder whose config.json has the old key reads it as the new field."""
    assert config.parse_args(["--task", "livebench", "--coding-reward", "reference"]).policy_reward == "reference"
    saved = dataclasses.asdict(config.Config(task="livebench", name="old"))
    saved["coding_reward"] = saved.pop("policy_reward") and "reference"
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "config.json").write_text(json.dumps(saved))
    cfg = config.parse_args(["--runs-dir", str(tmp_path), "--name", "old", "--resume"])
    assert cfg.policy_reward == "reference" and cfg.task == "livebench"
