"""Does the sampler act on the weights the trainer has? R in the maze (paper §3.2), before and after one R update made
as the loop makes it (Eq. 3 samples, Eq. 5 with the run's flags), measured two ways:
- R's first verdict token: the trainer's probability of "1" and "-" (fp32 forward) next to the sampler's frequencies;
- the sampler/trainer mismatch on R's sampled judgments (`ppo.sampler_mismatch`: mean |Δ log p| and k3 KL between
  the engine's log-probs and the trainer's, the trainer in the run's training precision), as the loop logs it.

    python scripts/sampler_check.py                       # the maze's defaults
    python scripts/sampler_check.py --amp --fix none      # bf16 sampling, weights rounded to nearest at each sync
    python scripts/sampler_check.py --amp --fix dither    # ... master weights dithered off the bf16 lattice at load
    python scripts/sampler_check.py --amp --fix stochastic   # ... stochastic rounding at each sync
    python scripts/sampler_check.py --amp --fix fp16      # the engine in fp16 instead of bf16

Plumbing, skip on a first read. Any loop flag passes through; --fix and --samples are this script's own.
"""
import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # the project's modules are one folder up

import torch  # noqa: E402

import environment as env  # noqa: E402
import loop  # noqa: E402
import policy  # noqa: E402
import ppo  # noqa: E402
import reward_model  # noqa: E402
import tasks  # noqa: E402
from plumbing import logprobs  # noqa: E402
from plumbing.config import parse_args  # noqa: E402
from plumbing.engines import ANSWER_PREFIX, make_engines, render_chat  # noqa: E402
from plumbing.models import dither_off_bf16, seed_everything  # noqa: E402
from records import Sample  # noqa: E402

FIXES = ("none", "dither", "stochastic", "fp16")


def stochastic_bf16(tensor: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """fp32 → bf16 rounded up or down at random, up with probability (w − down) / ulp: unbiased, E[bf16(w)] = w.
    Adds 16 random low bits to the fp32 bit pattern, then truncates them.

        >>> g = torch.Generator().manual_seed(0); w = torch.full((10000,), 1 + 2 ** -9)   # a quarter of the way up
        >>> round((stochastic_bf16(w, g).float() > 1).float().mean().item(), 1)
        0.2
    """
    if tensor.dtype != torch.float32:
        return tensor.to(torch.bfloat16)
    bits = tensor.contiguous().view(torch.int32)
    noise = torch.randint(0, 1 << 16, tensor.shape, generator=generator, dtype=torch.int32)
    return ((bits + noise) & -65536).view(torch.float32).to(torch.bfloat16)   # low 16 bits cleared: exact in bf16


def mismatch(trained, engine, prompts: list[str], cfg, n: int) -> dict:
    """R samples n judgments per prompt with the engine; the trainer (in its training precision) scores the same
    tokens: mean |Δ log p| and mean k3 over every sampled token."""
    outs = engine.generate(prompts, n=n, temperature=cfg.rm_temperature, top_p=cfg.rm_top_p,
                           max_new_tokens=cfg.rm_max_new_tokens)
    samples = [Sample(c.prompt_ids, c.ids, 0.0, logprobs=c.logprobs) for cs in outs for c in cs]
    lp = logprobs.LogProbs(trained.model)
    sums = torch.zeros(3)   # Σ |Δ|, Σ k3, tokens
    with torch.no_grad():
        for i in range(0, len(samples), 32):
            b = logprobs.collate(samples[i:i + 32], trained.tokenizer.pad_token_id, "cpu")
            abs_diff, k3 = ppo.sampler_mismatch(lp(**logprobs.inputs(b), amp=cfg.amp and cfg.train_amp), b.sampled)
            sums += torch.stack([(abs_diff * b.sampled_mask).sum(), (k3 * b.sampled_mask).sum(), b.sampled_mask.sum()])
    return {"abs_diff": (sums[0] / sums[2]).item(), "kl": (sums[1] / sums[2]).item(), "tokens": int(sums[2])}


def main(argv: list[str]) -> None:
    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--fix", default="none", choices=FIXES, help="how the bf16 sampler copies the fp32 weights")
    own.add_argument("--samples", type=int, default=8, help="R's judgments per step prompt for the mismatch")
    mine, rest = own.parse_known_args(argv)
    cfg = parse_args(["--task", "maze", *rest])
    print(json.dumps({"amp": cfg.amp, "train_amp": cfg.train_amp, "rm_lr": cfg.rm_lr, "target_kl": cfg.target_kl,
                      "fix": mine.fix}), flush=True)
    adapter = tasks.get("maze", cfg, env_mode=None)
    models, engines = loop.build_models(cfg, True, cfg.model, cfg.model)
    if mine.fix == "fp16":   # the same models, served by a vLLM in fp16
        engines = make_engines("vllm", {k: (m.model, m.tokenizer) for k, m in models.items()}, dtype="float16",
                               seed=cfg.seed, max_model_len=cfg.max_model_len)
    R = models["reward_model"]
    if mine.fix == "dither":
        ties = dither_off_bf16(R.model, cfg.seed)
        engines["reward_model"].sync()
        print(json.dumps({"ties_before_dither": ties}), flush=True)
    if mine.fix == "stochastic":
        g = torch.Generator().manual_seed(cfg.seed)
        engines["reward_model"].server.to_engine = lambda v: stochastic_bf16(v, g)
        engines["reward_model"].sync()
    tok = R.tokenizer
    vocab = [tok.decode([i]) for i in range(len(tok))]
    plus = torch.tensor([v.startswith("1") for v in vocab])   # [V]: tokens that start a verdict +1
    minus = torch.tensor([v.startswith("-") for v in vocab])  # [V]: ... −1
    seed_everything(0)
    val = adapter.sets["validation"][::4]
    groups = adapter.rollout(val, 2, engines["policy"], cfg, temperature=1.0)
    steps = [st for g in groups for ro in g.rollouts for st in ro.steps][:48]
    prompts = [render_chat(tok, st.judge_prompt) + ANSWER_PREFIX for st in steps]

    def trainer_probs():
        m, out = R.model, []
        m.eval()
        with torch.no_grad():
            for p in prompts:
                ids = torch.tensor([tok(p, add_special_tokens=False)["input_ids"]])
                pr = torch.softmax(m(input_ids=ids).logits[0, -1].float(), -1)   # [V]
                out.append((pr[plus].sum().item(), pr[minus].sum().item()))
        return [round(sum(x[k] for x in out) / len(out), 4) for k in (0, 1)]

    def sampler_freq(n=32):
        outs = engines["reward_model"].generate(prompts, n=n, temperature=1.0, top_p=1.0, max_new_tokens=1)
        cs = [c for o in outs for c in o]
        return [round(sum(c.text.startswith(s) for c in cs) / len(cs), 4) for s in ("1", "-")]

    def report(when: str) -> None:
        print(json.dumps({"when": when, "trainer_p1_pminus": trainer_probs(), "sampler_f1_fminus": sampler_freq(),
                          "mismatch": mismatch(R, engines["reward_model"], prompts, cfg, mine.samples)}), flush=True)

    report("before")
    # one R update exactly as the loop makes it (rm_screen's step)
    slots = env.make_slots(adapter.train_tasks())
    it = 1
    seed_everything(loop.iteration_seed(cfg, it))
    picked = env.pick_tasks(slots, cfg.tasks_per_iter, random.Random(loop.iteration_seed(cfg, it)))
    tg = adapter.rollout([t for _, t in picked], cfg.group_size, engines["policy"], cfg)
    adapter.judge(tg, engines["reward_model"], cfg)
    policy.score_steps(tg, lam=cfg.lam, zero_single=cfg.zero_single, reward=cfg.policy_reward)
    samples = reward_model.rm_samples(tg, "steps", drop_zero=cfg.drop_zero_adv, balance=cfg.rm_balance, norm=cfg.rm_norm,
                                      wrong_cost=cfg.wrong_tests_cost)
    stats = loop.optimize(cfg, R, engines["reward_model"], samples, it, "rm")
    print(json.dumps({"update": {k.removeprefix("losses/rm_"): round(v, 6) for k, v in stats.items()}}), flush=True)
    report("after one R update")


if __name__ == "__main__":
    main(sys.argv[1:])
