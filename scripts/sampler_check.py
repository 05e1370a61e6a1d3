"""Does the sampler act on the weights the trainer has? R's first verdict token in the maze (paper §3.2), before and
after one R update made as the loop makes it (Eq. 3 samples, Eq. 5 with the run's flags): the trainer's probability
of "1" and "-" (fp32 forward) next to the sampler's frequencies (its engine and dtype, T 1).

    python scripts/sampler_check.py              # the maze's defaults (fp32 sampling)
    python scripts/sampler_check.py --amp        # sampling in bf16, where it is native: the two part after the update

Plumbing, skip on a first read. Any loop flag passes through.
"""
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # the project's modules are one folder up

import torch  # noqa: E402

import environment as env  # noqa: E402
import loop  # noqa: E402
import policy  # noqa: E402
import reward_model  # noqa: E402
import tasks  # noqa: E402
from plumbing.config import parse_args  # noqa: E402
from plumbing.engines import ANSWER_PREFIX, render_chat  # noqa: E402
from plumbing.models import seed_everything  # noqa: E402


def main(argv: list[str]) -> None:
    cfg = parse_args(["--task", "maze", *argv])
    print("amp", cfg.amp, "train_amp", cfg.train_amp, "rm_lr", cfg.rm_lr, "target_kl", cfg.target_kl, flush=True)
    adapter = tasks.get("maze", cfg, env_mode=None)
    models, engines = loop.build_models(cfg, True, cfg.model, cfg.model)
    R = models["reward_model"]
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
        return [sum(x[k] for x in out) / len(out) for k in (0, 1)]

    def sampler_freq(n=32):
        outs = engines["reward_model"].generate(prompts, n=n, temperature=1.0, top_p=1.0, max_new_tokens=1)
        cs = [c for o in outs for c in o]
        return [sum(c.text.startswith(s) for c in cs) / len(cs) for s in ("1", "-")]

    print("before: trainer P(1), P(-)", trainer_probs(), "sampler", sampler_freq(), flush=True)
    engines["reward_model"].sync()
    print("re-synced, no update: sampler", sampler_freq(), flush=True)
    # one R update exactly as the loop makes it (rm_screen's step)
    slots = env.make_slots(adapter.train_tasks())
    it = 1
    seed_everything(loop.iteration_seed(cfg, it))
    picked = env.pick_tasks(slots, cfg.tasks_per_iter, random.Random(loop.iteration_seed(cfg, it)))
    tg = adapter.rollout([t for _, t in picked], cfg.group_size, engines["policy"], cfg)
    adapter.judge(tg, engines["reward_model"], cfg)
    policy.score_steps(tg, lam=cfg.lam, keep_single=not cfg.zero_single, reward=cfg.coding_reward)
    samples = reward_model.rm_samples(tg, "steps", drop_zero=cfg.drop_zero_adv, balance=cfg.rm_balance, norm=cfg.rm_norm,
                                   wrong_cost=cfg.wrong_tests_cost)
    print("train verdict mean", sum(v for g in tg for ro in g.rollouts for st in ro.steps for v in st.verdicts) /
          max(1, sum(len(st.verdicts) for g in tg for ro in g.rollouts for st in ro.steps)), "samples", len(samples),
          "mean adv", sum(s.advantage for s in samples) / max(1, len(samples)), flush=True)
    stats = loop.optimize(cfg, R, engines["reward_model"], samples, it, "rm")
    print({k: round(v, 4) for k, v in stats.items()}, flush=True)
    print("after: trainer P(1), P(-)", trainer_probs(), "sampler", sampler_freq(), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
