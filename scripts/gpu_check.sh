#!/usr/bin/env bash
# GPU check for a lent device machine (no internet, ≤64 MiB travels): the closed loop for 2 iterations
# on CUDA with the transformers engine and the tiny model, then its per-stage times.
# Run from the repo root:  bash scripts/gpu_check.sh     (the device image has torch/transformers/peft;
# it has no bubblewrap, so model-written code runs under the sandbox's rlimit mode, said out loud)
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 RLANYTHING_SANDBOX="${RLANYTHING_SANDBOX:-rlimit}"
python3 -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print('device:', torch.cuda.get_device_name())"
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
