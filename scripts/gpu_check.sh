#!/usr/bin/env bash
# GPU check for a lent device machine (no internet, ≤64 MiB travels): one PPO update (Eq. 5) on CUDA that
# must move the weights and sync the engine, the vision-language path on the tiny VLM (with vLLM: its greedy
# answer on a screenshot against the transformers engine's), then the closed loop for 2 iterations on CUDA with the
# transformers engine and the tiny model, and its per-stage times; with vLLM installed, the same loop
# with --engine vllm; with 2 or more GPUs, the loop on 2 ranks (torchrun, NCCL, FSDP2), also with one vLLM
# engine per rank when vLLM is installed, and the tiny VLM's FSDP2 update on 2 ranks against one process's.
# Under 5 minutes.
# Run from the repo root:  bash scripts/gpu_check.sh     (the device image has torch/transformers/peft;
# it has no bubblewrap, so model-written code runs under the sandbox's rlimit mode, said out loud)
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 RLANYTHING_SANDBOX="${RLANYTHING_SANDBOX:-rlimit}"
python3 -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print('device:', torch.cuda.get_device_name())"
python3 - <<'PY'
import torch
from plumbing.engines import make_engines
from plumbing.models import bf16_fast, load
from ppo import RELEASED, make_optimizer, ppo_update
from records import Sample
model, tok = load("tiny")
assert next(model.parameters()).device.type == "cuda"
engine = make_engines("hf", {"p": (model, tok)}, batch_size=8, amp=bf16_fast())["p"]
prompts = ["Write a program.", "Add two numbers."]
outs = engine.generate(prompts, n=4, temperature=1.0, max_new_tokens=16)
samples = [Sample(c.prompt_ids, c.ids, adv) for cs in outs for c, adv in zip(cs, (1.0, -1.0, 0.5, -0.5))]
before = {k: v.detach().clone() for k, v in model.named_parameters()}
stats = ppo_update(model, make_optimizer(model, 1e-3), samples, tok.pad_token_id, steps=2,
                   micro_batch=4, amp=bf16_fast(), seed=0, **RELEASED)
moved = sum(not torch.equal(before[k], v) for k, v in model.named_parameters())
engine.sync()
print(f"PPO update on CUDA: {stats}, {moved}/{len(before)} tensors moved, bf16 {bf16_fast()}")
assert moved > 0 and all(torch.isfinite(torch.tensor(v)).all() for v in stats.values() if isinstance(v, float))
PY
python3 - <<'PY'
# the vision-language path on CUDA (tiny-vlm): a greedy answer on a screenshot, one PPO step with images that
# leaves the frozen vision tower equal, and with vLLM installed its greedy answer against the transformers engine's
import numpy as np, torch
from plumbing import vision
from plumbing.engines import HFEngine, make_engines, render_chat
from plumbing.models import load
from ppo import RELEASED, make_optimizer, ppo_update
from records import Sample
model, tok = load(vision.TINY_VLM)
vision.freeze_tower(model, train=False)
shots = [(np.random.default_rng(k).integers(0, 256, (210, 160, 3), dtype=np.uint8),) for k in range(2)]
prompts = [render_chat(tok, f"Task {k}: click OK.", images=1) for k in range(2)]
hf = HFEngine(model, tok, amp=False)
greedy = [c.ids for (c,) in hf.generate(prompts, images=shots, temperature=0, max_new_tokens=8)]
try:
    vl = make_engines("vllm", {"p": (model, tok)}, amp=False)["p"]
    print("VLM greedy, vLLM == transformers:", [c.ids for (c,) in vl.generate(prompts, images=shots, temperature=0,
                                                                              max_new_tokens=8)] == greedy)
except Exception as e:   # not installed, or the build cannot run the VLM: said, not hidden
    print(f"VLM on vLLM: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
tower = {k: v.clone() for k, v in vision.backbone(model).visual.state_dict().items()}
outs = hf.generate(prompts, images=shots, temperature=1.0, max_new_tokens=8)
stats = ppo_update(model, make_optimizer(model, 1e-3), [Sample(c.prompt_ids, c.ids, a, c.vision)
                   for (c,), a in zip(outs, (1.0, -1.0))], tok.pad_token_id, steps=1, micro_batch=2, amp=False,
                   seed=0, **RELEASED)
assert all(torch.equal(tower[k], v) for k, v in vision.backbone(model).visual.state_dict().items())
print(f"VLM PPO step on CUDA: update KL {stats['update_kl']:.4f}, vision tower unchanged")
PY
runs="${OUT:-/tmp}/gpu-check"
rm -rf "$runs"
python3 loop.py --task livebench --model tiny --engine hf --iterations 2 --eval-every -1 --humaneval-limit 0 \
    --runs-dir "$runs" --name gpu
python3 - "$runs/gpu/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(x) for x in open(sys.argv[1])][1:]
for r in rows:
    times = " ".join(f"{k[5:]} {v:.2f}s" for k, v in r.items() if k.startswith("time/"))
    print(f"iteration {r['iteration']}: acc {r['train/acc']:.2f} | {times}")
import torch
assert all(r["train/tasks"] > 0 for r in rows)
print("GPU check passed")
PY
check() {   # the metrics of a finished 2-iteration run: every iteration trained on tasks
    python3 - "$1" <<'PY'
import json, sys
rows = [json.loads(x) for x in open(sys.argv[1])][1:]
assert [r["iteration"] for r in rows] == [1, 2] and all(r["train/tasks"] > 0 for r in rows), rows
print("ok:", sys.argv[1])
PY
}
if python3 -c "import vllm" 2>/dev/null; then
    python3 loop.py --task livebench --model tiny --engine vllm --iterations 2 --eval-every -1 --humaneval-limit 0 \
        --runs-dir "$runs" --name gpu-vllm
    check "$runs/gpu-vllm/metrics.jsonl"
fi
if [ "$(python3 -c 'import torch; print(torch.cuda.device_count())')" -ge 2 ]; then
    torchrun --standalone --nproc-per-node 2 loop.py --task livebench --model tiny --engine hf --iterations 2 \
        --eval-every -1 --humaneval-limit 0 --runs-dir "$runs" --name gpu-2ranks
    check "$runs/gpu-2ranks/metrics.jsonl"
    if python3 -c "import vllm" 2>/dev/null; then   # one vLLM engine per rank (external_launcher), NCCL
        torchrun --standalone --nproc-per-node 2 loop.py --task livebench --model tiny --engine vllm --iterations 2 \
            --eval-every -1 --humaneval-limit 0 --vllm-gpu-memory 0.2 --runs-dir "$runs" --name gpu-2ranks-vllm
        check "$runs/gpu-2ranks-vllm/metrics.jsonl"
    fi
    # the vision-language model on 2 ranks (FSDP2 over NCCL, its frozen tower whole on each rank, a screenshot per
    # sample): the update must equal one process's, and each rank's engine copy must hold the updated weights
    mkdir -p "$runs/vlm-2ranks"
    torchrun --standalone --nproc-per-node 2 tests/dist_worker.py "$runs/vlm-2ranks" vlm
    python3 - "$runs/vlm-2ranks" <<'PY'
import sys, torch
sys.path.insert(0, "tests")
import dist_worker as w
from plumbing.logprobs import LogProbs
from ppo import make_optimizer
model, tok = w.build("vlm")
lp = LogProbs(model)
w.update(lp, make_optimizer(lp, 1e-2), w.fixed_samples(tok, "vlm"), tok.pad_token_id, steps=1, target_kl=w.TARGET_KL)
got = torch.load(f"{sys.argv[1]}/update0.pt")["weights"]
diff = max((got[k].cpu() - v.cpu()).abs().max().item() for k, v in model.state_dict().items())
last = torch.load(f"{sys.argv[1]}/update1.pt")["weights"]
synced = all(torch.equal(torch.load(f"{sys.argv[1]}/synced{r}.pt")[k].cpu(), last[k].cpu()) for r in (0, 1) for k in last)
print(f"VLM update on 2 GPU ranks against one process: max |dw| {diff:.2e}; engines synced: {synced}")
assert diff < 1e-4 and synced
PY
fi
echo "GPU check finished"
