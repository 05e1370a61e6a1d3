"""dist.py under torchrun: 2 ranks on gloo (CPU). A distributed PPO update (FSDP2) on fixed samples equals
the single-process update, with unequal sample counts per rank; a hang is a timeout, hence a failure."""
import subprocess
import sys
from pathlib import Path

import torch

import dist_worker as w
from models import load
from ppo import LogProbs, make_optimizer

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
    # steps = 1: one optimizer step over all 4 sequences, the same mini-batch as ranks 0 + 1 together
    stats = w.update(lp, optimizer, samples, tok.pad_token_id, steps=1)
    saved = torch.load(tmp_path / "update0.pt")
    got = saved["weights"]
    # the gradient's norm before clipping: the same loss scale as one process (AdamW alone would hide a wrong one)
    assert abs(saved["grad_norm"] - stats["grad_norm"]) <= 1e-5 * stats["grad_norm"]
    assert set(got) == set(model.state_dict())
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())   # it moved
    for k, v in model.state_dict().items():
        torch.testing.assert_close(got[k], v, atol=1e-5, rtol=0)
    # steps = 2 with rank 1's second mini-batch empty: finished on both ranks (no hang) and moved again
    second = torch.load(tmp_path / "update1.pt")["weights"]
    assert any(not torch.equal(got[k], second[k]) for k in got)
