"""Run by tests/test_dist.py under torchrun (2 ranks, gloo, CPU): FSDP2-sharded PPO updates (Eq. 5) on
unequal sample counts per rank. Rank 0 saves the full weights after each update for the test to compare.
The second argument picks the model: "text" (the tiny model), "vlm" (the tiny Qwen3-VL, its vision tower
frozen, samples with screenshots), "vlm-tower" (its tower trained too) or "lora" (the tiny model with LoRA
adapters); for those three each rank then refreshes a transformers engine's full copy from the shards
(dist.Synced) and saves its weights.
"vllm": the text model, then each rank's vLLM engine (external_launcher), started on the initial weights, is
refreshed from the shards and decodes PROMPTS greedily; rank 0 decodes once more alone, as it does when it
holds more eval tasks than rank 1. Each rank saves its tokens."""
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from plumbing import dist, vision  # noqa: E402
from plumbing.engines import HFEngine, render_chat  # noqa: E402
from plumbing.models import add_lora, load  # noqa: E402
from plumbing.logprobs import LogProbs  # noqa: E402
from ppo import RELEASED, make_optimizer, ppo_update  # noqa: E402
from records import Sample  # noqa: E402

PROMPTS = ["the cat", "print(", "x = 2"]
TEXTS = ["the cat sat", "a b c d e", "print(1)", "x = 2 + 2; y = x * 3"]
ADVANTAGES = [1.0, -1.0, 0.5, -0.5]


def build(kind: str):
    """(model, tokenizer) for "text", "vllm", "vlm" (its vision tower frozen, as the loop trains it), "vlm-tower"
    (the tower trained too: --train-vision) or "lora"."""
    model, tok = load(vision.TINY_VLM if kind.startswith("vlm") else "tiny", seed=0)
    vision.freeze_tower(model, train=kind == "vlm-tower")
    return (add_lora(model, 4) if kind == "lora" else model), tok


def fixed_samples(tok, kind: str = "text") -> list[Sample]:
    """TEXTS as responses to one prompt; for "vlm" the prompt shows a screenshot, a different one per sample."""
    if not kind.startswith("vlm"):
        prompt = tok("question: ", add_special_tokens=False)["input_ids"]
        return [Sample(prompt, tok(t, add_special_tokens=False)["input_ids"], a) for t, a in zip(TEXTS, ADVANTAGES)]
    shots = np.random.default_rng(0).integers(0, 256, (len(TEXTS), 64, 96, 3), dtype=np.uint8)
    shown = [vision.encode(tok, render_chat(tok, "question: ", images=1), (shot,)) for shot in shots]
    return [Sample(ids, tok(t, add_special_tokens=False)["input_ids"], a, v)
            for (ids, v), t, a in zip(shown, TEXTS, ADVANTAGES)]


def share(samples: list[Sample], rank: int) -> list[Sample]:
    """Unequal on purpose: rank 0 holds 3 samples, rank 1 holds 1."""
    return samples[:3] if rank == 0 else samples[3:]


TARGET_KL = 1e-3   # the first update's trust region: small enough that its line search runs


def update(lp, optimizer, samples, pad_id, steps, target_kl=0.0):
    """One PPO update. With target_kl every rank must take the line search's decisions from the KL over every
    rank's tokens, as one process does."""
    return ppo_update(lp, optimizer, samples, pad_id, steps=steps, micro_batch=1, amp=False, seed=1,
                      **{**RELEASED, "target_kl": target_kl})


if __name__ == "__main__":
    out, kind = Path(sys.argv[1]), (sys.argv[2:] or ["text"])[0]
    rank, world = dist.init()
    model, tok = build(kind)
    lp = dist.shard(LogProbs(model))
    optimizer = make_optimizer(lp, 1e-2)
    mine = share(fixed_samples(tok, kind), rank)
    for call, steps in enumerate((1, 2)):   # 2 steps: rank 1 has an empty mini-batch and must pad it
        stats = update(lp, optimizer, mine, tok.pad_token_id, steps, TARGET_KL if call == 0 else 0.0)
        weights = {k.removeprefix("model."): v for k, v in dist.full_state_dict(lp).items()}
        if rank == 0:
            torch.save({"weights": weights, "grad_norm": stats["grad_norm"], "step_scale": stats["step_scale"]},
                       out / f"update{call}.pt")
    if kind in ("vlm", "vlm-tower", "lora"):   # every rank's engine copy, refreshed from the shards
        engine = dist.Synced(HFEngine(build(kind)[0], tok, amp=False), lp)
        engine.sync()
        torch.save(engine.engine.model.state_dict(), out / f"synced{rank}.pt")
    if kind == "vllm":
        from plumbing.engines import make_engines

        initial, _ = load("tiny", seed=0)
        engine = dist.Synced(make_engines("vllm", {"p": (initial, tok)}, amp=False, max_model_len=512)["p"], lp)
        engine.sync()
        greedy = [c[0].ids for c in engine.generate(PROMPTS, temperature=0.0, max_new_tokens=8)]
        alone = [c[0].ids for c in engine.generate(PROMPTS, temperature=0.0, max_new_tokens=8)] \
            if rank == 0 else greedy
        torch.save({"greedy": greedy, "alone": alone}, out / f"vllm{rank}.pt")
    dist.gather(rank)   # every rank got here
    dist.exit_process(0)
