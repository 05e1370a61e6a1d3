"""How far a tiny weight change moves the trainer's log-probs, in bf16 autocast and in fp32 (Eq. 5's ratio).

    python scripts/logprob_noise.py            # the embedded model on 16 maze prompts, ~2 minutes on 2 cores
    python scripts/logprob_noise.py --dither   # the same after moving the weights off the bf16 lattice at load

One PPO update (fresh AdamW, LR 3e-5, 2 steps: the maze's old default) moves θ_old to θ_new. For α in
1, 0.1, ..., 1e-4, 0 the script sets θ = θ_old + α·(θ_new − θ_old) and prints the k3 KL and the clip fraction
(|r − 1| > 0.2) of π_θ against π_θold on the response tokens, as ppo.ppo_update measures an update. In fp32
the KL falls like α²; under bf16 autocast it stays near 0.1 down to α = 1e-4, a floor of rounding, not of
learning: every forward re-rounds the weights and activations to bf16, and a changed weight set rounds
differently. PPO's ratio and clip read that floor as a step (docs/NOTES.md). --dither first moves every
weight to a random point of its bf16 rounding cell (models.dither_off_bf16): a small change then re-rounds
only the weights it carries across a cell boundary.
"""
from __future__ import annotations

import random
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from plumbing import config  # noqa: E402
from plumbing import logprobs, models  # noqa: E402
import ppo  # noqa: E402
from plumbing.engines import ANSWER_PREFIX  # noqa: E402
from records import Sample  # noqa: E402
from tasks import maze as mz  # noqa: E402


def maze_samples(tok, n: int = 16) -> list[Sample]:
    """n training-maze prompts of step 0, each with a short answer and an advantage of ±1."""
    adapter, rng = mz.Adapter(config.parse_args(["--task", "maze"])), random.Random(0)
    out = []
    for k, task in enumerate(adapter.sets["train"][:n]):
        ep = adapter.start(task, 0)
        prompt = tok(adapter.policy_prompt(ep, tok) + ANSWER_PREFIX, add_special_tokens=False)["input_ids"]
        answer = tok(rng.choice(["1}", "2}", "3}", "12"]), add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        out.append(Sample(prompt, answer, 1.0 if k % 2 else -1.0))
    return out


def main(dither: bool) -> None:
    tok = models.load("smollm2", 0)[1]
    samples = maze_samples(tok)
    batch = logprobs.collate(samples, tok.pad_token_id, "cpu")
    print("| forward | α | KL to π_old | clip fraction |\n|---|---|---|---|")
    for amp in ((True, False) if models.bf16_fast() else (False,)):
        lp = logprobs.LogProbs(models.load("smollm2", 0)[0])
        if dither:
            models.dither_off_bf16(lp, 0)
        lp.train()
        params = [p for p in lp.parameters() if p.requires_grad]
        start = [p.detach().clone() for p in params]
        with torch.no_grad():
            old = lp(**logprobs.inputs(batch), amp=amp)                                        # [n, R]
        ppo.ppo_update(lp, ppo.make_optimizer(lp, 3e-5), samples, tok.pad_token_id, steps=2, micro_batch=8, amp=amp,
                       seed=0, **ppo.RELEASED)
        new = [p.detach().clone() for p in params]
        for alpha in (1, 0.1, 0.01, 1e-3, 1e-4, 0):
            with torch.no_grad():
                for p, p0, p1 in zip(params, start, new):
                    p.copy_(p0 + alpha * (p1 - p0))
                _, kl, ratio = ppo.token_loss(lp(**logprobs.inputs(batch), amp=amp), old, batch.adv, clip_eps=0.2,
                                              log_ratio_clamp=10.0)                               # [n, R] each
            mask = batch.mask
            n = mask.sum()
            clip = (ppo.clipped(ratio, 0.2) * mask).sum() / n
            print(f"| {'bf16 autocast' if amp else 'fp32'} | {alpha:g} | {((kl * mask).sum() / n).item():.6f} | "
                  f"{clip.item():.3f} |")


if __name__ == "__main__":
    main("--dither" in sys.argv[1:])
