"""Eq. 5 (paper §3.4, "Optimization"): the PPO-clip update with the k3 KL estimate, shared by P and R.

Token log-probs and micro-batches come from plumbing/logprobs.py (packed rows, a chunked vocabulary projection, bf16
autocast where bf16 is native; under torchrun `dist.Lockstep` keeps the ranks in step and the loss is averaged over
every rank's sequences). The optimizer is AdamW with a constant learning rate.
"""
from __future__ import annotations

import math

import torch

from plumbing.logprobs import Batch, LogProbs, inputs, mini_batches
from records import Sample

def token_loss(logp, logp_old, adv, clip_eps: float, log_ratio_clamp: float):
    """Eq. 5 per token: the PPO-clip term and the k3 KL estimate to π_old, with r = π_θ/π_old.

        pg = −min(r·A, clip(r, 1−ε, 1+ε)·A)        kl = π_old/π_θ − log(π_old/π_θ) − 1
    log r is clamped to ±log_ratio_clamp before exp, as in the released code (0: no clamp).
    logp, logp_old: [n, R]; adv: [n]. Returns (pg, kl, r), each [n, R].

        >>> pg, kl, r = token_loss(torch.tensor([[0.0, -1.0]]), torch.tensor([[-1.0, -1.0]]), torch.tensor([2.0]),
        ...                        clip_eps=0.2, log_ratio_clamp=10.0)
        >>> pg.tolist(), round(kl[0, 0].item(), 4)          # r = e clipped to 1.2 → −1.2·2; kl = e^−1 + 1 − 1
        ([[-2.4000000953674316, -2.0]], 0.3679)
    """
    log_ratio = logp - logp_old                                                       # [n, R] log r
    if log_ratio_clamp:
        log_ratio = log_ratio.clamp(-log_ratio_clamp, log_ratio_clamp)
    ratio = torch.exp(log_ratio)                                                      # [n, R]
    a = adv[:, None]                                                                  # [n, 1]
    pg = -torch.minimum(ratio * a, ratio.clamp(1 - clip_eps, 1 + clip_eps) * a)      # Eq. 5 clip
    kl = torch.exp(-log_ratio) + log_ratio - 1                                        # Eq. 5 k3 KL
    return pg, kl, ratio


def clipped(ratio, clip_eps: float):
    """1.0 where Eq. 5's clip is active, |r − 1| > ε, else 0.0: the clip fraction's numerator, per token."""
    return ((ratio - 1).abs() > clip_eps).float()


def sampler_mismatch(logp, logp_sampler):
    """How far the sampler's policy is from the trainer's, per sampled token: |Δ| and the k3 estimate of
    KL(π_sampler ‖ π_trainer), with Δ = log π_trainer − log π_sampler on a token the sampler drew:

        k3 = e^Δ − 1 − Δ   (≥ 0, unbiased for the KL under the sampler's draws; verl's rollout/trainer mismatch)
    Both are 0 when the engine samples exactly the policy PPO trains (before the update). logp, logp_sampler:
    [n, R]. Returns (|Δ|, k3), each [n, R].

        >>> abs_diff, k3 = sampler_mismatch(torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -2.0]]))
        >>> abs_diff.tolist(), round(k3[0, 0].item(), 4)     # Δ = 0.5: e^0.5 − 1.5 = 0.1487
        ([[0.5, 0.0]], 0.1487)
    """
    delta = logp - logp_sampler                    # [n, R] log(π_trainer / π_sampler)
    return delta.abs(), torch.expm1(delta) - delta


# Eq. 5's constants as the released code sets them, which are also Config's generic defaults: scripts and
# tests pass **RELEASED, the loop passes the run's flags.
RELEASED = {"clip_eps": 0.2, "kl_beta": 0.01, "log_ratio_clamp": 10.0, "warmup_steps": 0, "target_kl": 0.0}


def ppo_update(model, optimizer, samples: list[Sample], pad_id: int, *, steps: int, micro_batch: int, amp: bool,
               seed: int, clip_eps: float, kl_beta: float, log_ratio_clamp: float, warmup_steps: int,
               target_kl: float, max_grad_norm: float = 1.0, pack: bool = True, sampler_old_kl: float = 0.0) -> dict:
    """Eq. 5: `steps` PPO-clip optimizer steps over this iteration's samples. Per token t of sample i, with
    r = π_θ/π_old and the k3 KL estimate to π_old, the policy that sampled the data (the weights before this
    update; no separate frozen reference model), as `token_loss` computes them:
        ℓ_t = −min(r·A_i, clip(r, 1−ε, 1+ε)·A_i) + β·(π_old/π_θ − log(π_old/π_θ) − 1)
    The loss is the token-mean per sequence, then the mean over the mini-batch.
    π_old: the first mini-batch's own forward pass (π_θ = π_old before the first step); the later ones', a no-grad
    pass before that step (the released code), or the sampler's log-probs where the first mini-batch measured the
    sampler within sampler_old_kl (k3; fp32 samplers about 1e-10, bf16 1e-3, docs/NOTES.md): `sampler_matches`.

    The trust region (target_kl > 0; not in the released code): an update whose KL to π_old exceeds target_kl is
    scaled back into it (`line_search`). CleanRL's --target-kl only stops before a further step; here the first
    step is the one that overshoots (AdamW's first step is a sign step). Returns `Diagnostics.summary` ({}: no
    rank has a sample)."""
    lp = model if isinstance(model, LogProbs) else LogProbs(model)
    ranks, minibatches = mini_batches(samples, pad_id, lp, micro_batch, steps, seed, pack)
    if not ranks.sum(len(samples)):
        return {}
    log = Diagnostics()
    lp.train()
    params = [p for p in lp.parameters() if p.requires_grad]
    start = [p.detach().clone() for p in params] if target_kl else []   # θ_old, for the line search
    old, from_sampler = {}, False   # π_old per micro-batch (key → [n, R]); the later ones' from the sampler?
    for i, mb in enumerate(minibatches):   # one optimizer step per mini-batch
        n_seq = ranks.sequences(mb)
        if not n_seq:
            continue
        optimizer.zero_grad(set_to_none=True)
        for k, b in ranks.batches(mb):
            if i == 0:   # on-policy: this pass is π_old
                logp, ent = lp(**inputs(b), amp=amp, entropy_at=b.mask.bool())        # [n, R] each
                old[k] = log.old(k, b, logp, ent)
            else:
                logp = lp(**inputs(b), amp=amp)                                       # [n, R]
                if from_sampler:
                    old[k] = b.sampled
            pg, kl, ratio = token_loss(logp, old[k], b.adv, clip_eps, log_ratio_clamp)  # [n, R] each
            per_seq = ((pg + kl_beta * kl) * b.mask).sum(-1) / b.mask.sum(-1).clamp(min=1)  # [n] token-mean
            ranks.backward(per_seq, k, n_seq)                                         # mean over the mini-batch
            log.micro_batch(k, b, per_seq, clipped(ratio, clip_eps), kl)
        if i == 0:   # θ is still θ_old: the later mini-batches' π_old, before the first step
            later = [k for later_mb in minibatches[1:] for k in later_mb]
            if not (from_sampler := sampler_matches(ranks, later, log, sampler_old_kl)):
                with torch.no_grad():
                    for k, b in ranks.batches(later):
                        old[k] = log.old(k, b, *lp(**inputs(b), amp=amp, entropy_at=b.mask.bool()))
                        log.work["tokens_forward"] += b.tokens
        log.grad_norm(torch.nn.utils.clip_grad_norm_(lp.parameters(), max_grad_norm))
        warm_up(optimizer, warmup_steps)
        optimizer.step()
    measure = lambda: update_size(lp, ranks, minibatches, old, log, amp, clip_eps, log_ratio_clamp)  # noqa: E731
    alpha, kl, clip = 1.0, *measure()
    if target_kl and kl > target_kl:
        alpha, kl, clip = line_search(params, start, measure, kl, target_kl)
    lp.eval()
    return log.summary(ranks, len(samples), alpha, kl, clip) | {"old_from_sampler": float(from_sampler)}


def sampler_matches(ranks, keys: list[int], log, tolerance: float) -> bool:
    """Whether micro-batches `keys` take π_old from the sampler: every sample of every rank has its sampler
    log-probs, and the k3 KL(π_sampler ‖ π_old) measured so far is at most tolerance (> 0). Alike on all ranks."""
    missing = sum(not s.sampler_known for k in keys for s in ranks.micro[k])
    return bool(tolerance) and not ranks.sum(missing) and (drift := log.mismatch(ranks)) is not None \
        and drift[1] <= tolerance


@torch.no_grad()
def update_size(lp, ranks, minibatches, old: dict, log, amp: bool, clip_eps: float,
                log_ratio_clamp: float) -> tuple[float, float]:
    """(KL, clip fraction) of π now against π_old: token means over every trained token of every rank, from one
    more forward pass: how far the whole update moved π, whatever the number of steps."""
    kl_sum = clip_sum = tokens = 0.0
    ranks.reshard(lp)        # the line search moves the shards in place: gather them afresh
    for k, b in ranks.batches([k for mb in minibatches for k in mb]):
        logp = lp(**inputs(b), amp=amp)                                              # [n, R]
        log.work["tokens_forward"] += b.tokens
        if k is not None:
            _, kl, ratio = token_loss(logp, old[k], b.adv, clip_eps, log_ratio_clamp)
            kl_sum += (kl * b.mask).sum().item()
            clip_sum += (clipped(ratio, clip_eps) * b.mask).sum().item()
            tokens += b.mask.sum().item()
    tokens = max(ranks.sum(tokens), 1)
    return ranks.sum(kl_sum) / tokens, ranks.sum(clip_sum) / tokens


class Diagnostics:
    """What `ppo_update` logs. clipfrac and kl during the update, means over micro-batches of the token mean
    (CleanRL's convention: the first mini-batch is on-policy, r = 1); entropy, π_old's entropy on the trained
    response tokens; update_clipfrac and update_kl, π as the update leaves it against π_old (`update_size`);
    step_scale, the α the line search kept (1 without one); sampler_abs_diff and sampler_kl, the mean
    |log π_old − log π_sampler| and k3 KL(π_sampler ‖ π_old) over every trained token whose sampler log-prob is
    known (0 when the engine samples the trained policy; a bf16 sampler, stale weights or an engine bug show
    here); tokens_forward and tokens_backward, this rank's real tokens through forward and backward passes
    (scripts/bench.py). Blank micro-batches (`dist.Lockstep`, key None) count work only. Where π_old came from
    the sampler (old_from_sampler), entropy and the sampler pair cover the first mini-batch's tokens only."""

    def __init__(self):
        self.stats = {"loss": [], "clipfrac": [], "kl": [], "entropy": [], "grad_norm": []}
        self.drift = torch.zeros(3)   # Σ |Δ|, Σ k3, tokens: the sampler against π_old (`sampler_mismatch`)
        self.work = {"tokens_forward": 0, "tokens_backward": 0}

    def mean(self, name: str, values, mask) -> None:
        self.stats[name].append(((values * mask).sum() / mask.sum().clamp(min=1)).item())

    def old(self, k, b: Batch, logp, ent):
        """Micro-batch k's π_old (returned, detached), its entropy, and how far the sampler was from it."""
        logp = logp.detach()                                                          # [n, R]
        if k is not None:
            self.mean("entropy", ent, b.mask)
            abs_diff, k3 = sampler_mismatch(logp, b.sampled)                          # [n, R] each
            self.drift.add_(torch.stack([(abs_diff * b.sampled_mask).sum(), (k3 * b.sampled_mask).sum(),
                                         b.sampled_mask.sum()]).cpu())
        return logp

    @torch.no_grad()
    def micro_batch(self, k, b: Batch, per_seq, clip, kl) -> None:
        self.work["tokens_forward"] += b.tokens
        self.work["tokens_backward"] += b.tokens
        if k is not None:
            self.stats["loss"].append(per_seq.mean().item())
            self.mean("clipfrac", clip, b.mask)
            self.mean("kl", kl, b.mask)

    def grad_norm(self, norm) -> None:   # a DTensor under FSDP2
        self.stats["grad_norm"].append(float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm))

    def mismatch(self, ranks) -> tuple[float, float] | None:
        """(mean |Δ|, mean k3) of the sampler against π_old over every rank's tokens so far; None: none known."""
        abs_sum, k3_sum, known = (ranks.sum(x) for x in self.drift.tolist())
        return (abs_sum / known, k3_sum / known) if known > 0 else None

    def summary(self, ranks, samples: int, alpha: float, kl: float, clip: float) -> dict:
        self.stats["step_scale"], self.stats["update_kl"], self.stats["update_clipfrac"] = [alpha], [kl], [clip]
        if drift := self.mismatch(ranks):
            self.stats["sampler_abs_diff"], self.stats["sampler_kl"] = [drift[0]], [drift[1]]
        means = {k: sum(v) / len(v) for k, v in self.stats.items() if v}
        return means | {"samples": samples, "steps": len(self.stats["grad_norm"])} | self.work


@torch.no_grad()
def line_search(params, start, measure, kl: float, target_kl: float, tries: int = 8) -> tuple[float, float, float]:
    """Scale an update back into its trust region: θ ← θ_old + α·(θ_new − θ_old), α < 1, until
    measure() (the update's (KL, clip fraction) to π_old) gives KL ≤ target_kl. For small steps the KL
    grows like α², so each try takes α ← α · min(1/2, 0.9·√(target_kl / KL)). After `tries` the last α is
    kept. params: the trained tensors, moved in place; start: their values before the update (θ_old).
    Returns (α, KL, clip fraction) of the update kept.

        >>> w = torch.nn.Parameter(torch.tensor([4.0])); kl_of = lambda: ((w.item() / 4) ** 2, 0.0)  # KL = (α·1)²
        >>> alpha, kl, _ = line_search([w], [torch.zeros(1)], kl_of, 1.0, 0.01)   # α = 0.9·√0.01 = 0.09
        >>> round(alpha, 4), round(kl, 4), round(w.item(), 4)                      # KL 0.09² = 0.0081 ≤ 0.01
        (0.09, 0.0081, 0.36)
    """
    alpha = 1.0
    for _ in range(tries):
        shrink = min(0.5, 0.9 * math.sqrt(target_kl / kl)) if kl > 0 else 0.5
        for p, p0 in zip(params, start):
            p.lerp_(p0, 1 - shrink)          # p0 + shrink·(p − p0): the new α is alpha·shrink
        alpha *= shrink
        kl, clipped = measure()
        if kl <= target_kl:
            break
    return alpha, kl, clipped


def warm_up(optimizer, warmup_steps: int) -> None:
    """Linear warm-up before each step: the optimizer's n-th step (n = 1, 2, ...) takes lr · min(1, n / N).
    AdamW's first step moves every weight by about lr whatever its gradient's size (m̂/√v̂ = ±1 at n = 1),
    so a warm-up is what bounds it. N = 0: the constant LR of the released code.

        >>> opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
        >>> warm_up(opt, 4); opt.param_groups[0]["lr"]    # before its first step: 0.1 · 1/4
        0.025
    """
    if not warmup_steps:
        return
    for group in optimizer.param_groups:
        base = group.setdefault("base_lr", group["lr"])
        taken = next((int(st["step"]) for p in group["params"] if "step" in (st := optimizer.state.get(p, {}))), 0)
        group["lr"] = base * min(1.0, (taken + 1) / warmup_steps)


def make_optimizer(model, lr: float):
    """AdamW with a constant learning rate (Eq. 5); `warm_up` may ramp its first steps."""
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
