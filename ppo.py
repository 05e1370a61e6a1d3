"""Eq. 5 (paper §3.4, "Optimization"): the PPO-clip update with the k3 KL estimate, shared by P and R.

The token log-probs are computed in sequence chunks (the [B, L, V] logits never exist at once),
under bf16 autocast where bf16 is native; the optimizer is AdamW with a constant learning rate.
Under torchrun each rank updates on its own samples; `dist.Lockstep` keeps the ranks in step (the
loss is averaged over every rank's sequences, and ranks with fewer micro-batches run zero-weight
ones). Without torchrun it changes nothing.
"""
from __future__ import annotations

import math
import random
from typing import NamedTuple

import torch
from torch.utils.checkpoint import checkpoint

from plumbing import dist, vision
from plumbing.models import amp_context
from records import Sample

class Batch(NamedTuple):
    """One right-padded micro-batch (`collate`)."""
    ids: torch.Tensor          # [B, L] prompt + response tokens
    attention: torch.Tensor    # [B, L] 1 on real tokens
    mask: torch.Tensor         # [B, L-1] 1 where token t+1 is a response token (the trained tokens)
    adv: torch.Tensor          # [B] each sequence's advantage
    visions: list              # the rows' pixel inputs (Sample.vision), None for text
    sampled: torch.Tensor      # [B, L-1] the sampler's log-prob of token t+1 (Sample.logprobs), 0 where unknown
    sampled_mask: torch.Tensor  # [B, L-1] 1 on response tokens whose sampler log-prob is known


def collate(samples: list[Sample], pad_id: int, device) -> Batch:
    """Right-padded batch of samples, aligned so that position t predicts token t+1."""
    seqs = [s.prompt_ids + s.response_ids for s in samples]
    width = max(map(len, seqs))
    input_ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)  # [B, L]
    attention = torch.zeros((len(seqs), width), dtype=torch.long)         # [B, L]
    mask = torch.zeros((len(seqs), width - 1))                            # [B, L-1]
    sampled = torch.zeros((len(seqs), width - 1))                         # [B, L-1]
    sampled_mask = torch.zeros((len(seqs), width - 1))                    # [B, L-1]
    for b, (s, seq) in enumerate(zip(samples, seqs)):
        input_ids[b, :len(seq)] = torch.tensor(seq)
        attention[b, :len(seq)] = 1
        response = slice(len(s.prompt_ids) - 1, len(seq) - 1)
        mask[b, response] = 1
        if s.logprobs is not None and len(s.logprobs) == len(s.response_ids):
            sampled[b, response] = torch.tensor(s.logprobs)
            sampled_mask[b, response] = 1
    adv = torch.tensor([s.advantage for s in samples], dtype=torch.float32)  # [B]
    return Batch(input_ids.to(device), attention.to(device), mask.to(device), adv.to(device),
                 [s.vision for s in samples], sampled.to(device), sampled_mask.to(device))


class LogProbs(torch.nn.Module):
    """log π(x_{t+1} | x_{≤t}) for every position, as a module around a causal LM: [B, L-1].

    The vocabulary projection runs in sequence chunks under activation checkpointing, so the full
    [B, L, V] fp32 logits never sit in memory at once. A module, not a function, so that FSDP2 can
    wrap it as the root: every forward then passes through the root's hooks (plumbing/dist.py's `shard`)."""

    def __init__(self, model, chunk: int = 256):
        super().__init__()
        self.model, self.chunk = model, chunk

    def forward(self, input_ids, attention, amp: bool = True, entropy_at=None, visions=None):
        """[B, L-1] log-probs. With entropy_at, a [B, L-1] bool mask (the response tokens), also the
        [B, L-1] entropy of π at those positions (0 elsewhere; no gradient), from the same chunked logits.
        visions: the rows' screenshots (Completion.vision, or None), for a vision-language model (plumbing/vision.py)."""
        images = vision.batch_inputs(self.model, input_ids, visions or [])
        trunk = vision.backbone(self.model) if images else self.model.get_decoder()   # with the vision tower
        with amp_context(amp):
            hidden = trunk(input_ids=input_ids, attention_mask=attention, use_cache=False,
                           **images).last_hidden_state  # no KV cache in training
        hidden, targets = hidden[:, :-1], input_ids[:, 1:]  # [B, L-1, H], [B, L-1]
        head = self.model.get_output_embeddings()

        def chunk_logprobs(h, t, at=None):
            with amp_context(amp):
                logits = head(h)  # [B, c, V]
            logp = torch.log_softmax(logits.float(), dim=-1)  # [B, c, V]
            picked = logp.gather(-1, t.unsqueeze(-1)).squeeze(-1)  # [B, c]
            if at is None:
                return picked
            with torch.no_grad():
                ent = torch.zeros_like(picked)  # [B, c]
                ent[at] = token_entropy(logp[at])  # [n] at the n masked positions only
            return picked, ent

        parts = []
        for s in range(0, targets.shape[1], self.chunk):
            args = (hidden[:, s:s + self.chunk], targets[:, s:s + self.chunk])
            args += (entropy_at[:, s:s + self.chunk],) if entropy_at is not None else ()
            parts.append(checkpoint(chunk_logprobs, *args, use_reentrant=False) if torch.is_grad_enabled()
                         else chunk_logprobs(*args))
        if entropy_at is not None:
            return torch.cat([p for p, _ in parts], dim=1), torch.cat([e for _, e in parts], dim=1)  # [B, L-1] ×2
        return torch.cat(parts, dim=1)  # [B, L-1]


def token_entropy(logp):
    """H(π) = −Σ_v π(v) log π(v) over the last axis, from log-probs: [..., V] → [...].

        >>> round(token_entropy(torch.log(torch.tensor([0.5, 0.25, 0.25]))).item(), 4)   # 1.5 bits = 1.0397 nats
        1.0397
    """
    return -(logp.exp() * logp).nan_to_num().sum(-1)   # 0·log 0 = 0 where π(v) = 0


def token_logprobs(model, input_ids, attention, chunk: int = 256, amp: bool = True):
    """`LogProbs` of a causal LM for one batch: [B, L-1]."""
    return LogProbs(model, chunk)(input_ids, attention, amp)


def token_loss(logp, logp_old, adv, clip_eps: float, log_ratio_clamp: float):
    """Eq. 5 per token: the PPO-clip term and the k3 KL estimate to π_old, with r = π_θ/π_old.

        pg = −min(r·A, clip(r, 1−ε, 1+ε)·A)        kl = π_old/π_θ − log(π_old/π_θ) − 1
    log r is clamped to ±log_ratio_clamp before exp, as in the released code (0: no clamp).
    logp, logp_old: [b, L-1]; adv: [b]. Returns (pg, kl, r), each [b, L-1].

        >>> pg, kl, r = token_loss(torch.tensor([[0.0, -1.0]]), torch.tensor([[-1.0, -1.0]]), torch.tensor([2.0]),
        ...                        clip_eps=0.2, log_ratio_clamp=10.0)
        >>> pg.tolist(), round(kl[0, 0].item(), 4)          # r = e clipped to 1.2 → −1.2·2; kl = e^−1 + 1 − 1
        ([[-2.4000000953674316, -2.0]], 0.3679)
    """
    log_ratio = logp - logp_old                                                       # [b, L-1] log r
    if log_ratio_clamp:
        log_ratio = log_ratio.clamp(-log_ratio_clamp, log_ratio_clamp)
    ratio = torch.exp(log_ratio)                                                      # [b, L-1]
    a = adv[:, None]                                                                  # [b, 1]
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
    [b, L-1]. Returns (|Δ|, k3), each [b, L-1].

        >>> abs_diff, k3 = sampler_mismatch(torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -2.0]]))
        >>> abs_diff.tolist(), round(k3[0, 0].item(), 4)     # Δ = 0.5: e^0.5 − 1.5 = 0.1487
        ([[0.5, 0.0]], 0.1487)
    """
    delta = logp - logp_sampler                    # [b, L-1] log(π_trainer / π_sampler)
    return delta.abs(), torch.expm1(delta) - delta


# Eq. 5's constants as the released code sets them, which are also Config's generic defaults: scripts and
# tests pass **RELEASED, the loop passes the run's flags.
RELEASED = {"clip_eps": 0.2, "kl_beta": 0.01, "log_ratio_clamp": 10.0, "warmup_steps": 0, "target_kl": 0.0}


def ppo_update(model, optimizer, samples: list[Sample], pad_id: int, *, steps: int, micro_batch: int, amp: bool,
               seed: int, clip_eps: float, kl_beta: float, log_ratio_clamp: float, warmup_steps: int,
               target_kl: float, max_grad_norm: float = 1.0) -> dict:
    """Eq. 5: `steps` PPO-clip optimizer steps over this iteration's samples.

    Per token t of sample i, with r = π_θ/π_old and the k3 KL estimator to π_old, the policy that
    sampled the data (the weights before this update; no separate frozen reference model), as
    `token_loss` computes them:
        ℓ_t = −min(r·A_i, clip(r, 1−ε, 1+ε)·A_i) + β·(π_old/π_θ − log(π_old/π_θ) − 1)
    The loss is the token-mean per sequence, then the mean over the mini-batch.
    "Old" log-probs are recomputed here by the trained model, never taken from the sampler; where the samples
    carry the sampler's log-probs, the two are compared (`sampler_mismatch`).

    The trust region (target_kl > 0; not in the released code, which keeps every step): when the whole
    update's KL to π_old exceeds target_kl, the update is scaled back, θ ← θ_old + α·(θ − θ_old), with α
    shrunk until the KL is at most target_kl (`line_search`). CleanRL's --target-kl only stops before a
    further step; here the first step is the one that overshoots (AdamW's first step is a sign step).

    Diagnostics returned: clipfrac and kl during the update, means over micro-batches of the token mean
    (CleanRL's convention: the first mini-batch is on-policy, r = 1); entropy, π_old's entropy on the
    trained response tokens; update_clipfrac and update_kl, π as the update leaves it against π_old, token
    means over every trained token of every rank (one more forward pass): how far the whole update moved
    π, whatever `steps` is; step_scale, the α kept (1 without a line search); sampler_abs_diff and sampler_kl,
    the mean |log π_old − log π_sampler| and k3 KL(π_sampler ‖ π_old) over every trained token whose sampler
    log-prob is known (0 when the engine samples the trained policy; a bf16 sampler, stale weights or an engine
    bug show here).
    """
    lp = model if isinstance(model, LogProbs) else LogProbs(model)
    device = next(lp.parameters()).device
    samples = sorted(samples, key=lambda s: len(s.prompt_ids) + len(s.response_ids))  # similar lengths: less padding
    micro = [samples[i:i + micro_batch] for i in range(0, len(samples), micro_batch)]
    ranks = dist.Lockstep(micro, lambda batch: collate(batch, pad_id, device), blank=[Sample([pad_id], [pad_id], 0.0)])
    if not ranks.sum(len(samples)):
        return {}
    order = list(range(len(micro)))
    random.Random(seed).shuffle(order)
    per_step = [order[s::steps] for s in range(steps)]   # `steps` mini-batches of micro-batches
    stats = {"loss": [], "clipfrac": [], "kl": [], "entropy": [], "grad_norm": []}
    drift = torch.zeros(3)   # Σ |Δ|, Σ k3, tokens: the sampler against π_old (`sampler_mismatch`)

    def record(name, values, mask):
        stats[name].append(((values * mask).sum() / mask.sum().clamp(min=1)).item())

    def set_old(k, b: Batch, logp, ent):
        """π_old of micro-batch k, its entropy, and how far the sampler that drew its tokens was from it."""
        old[k] = logp.detach()                                                        # [b, L-1]
        if k is not None:
            record("entropy", ent, b.mask)
            abs_diff, k3 = sampler_mismatch(old[k], b.sampled)                        # [b, L-1] each
            drift.add_(torch.stack([(abs_diff * b.sampled_mask).sum(), (k3 * b.sampled_mask).sum(),
                                    b.sampled_mask.sum()]).cpu())

    lp.train()
    params = [p for p in lp.parameters() if p.requires_grad]
    start = [p.detach().clone() for p in params] if target_kl else []   # θ_old, for the line search
    old = {}   # π_old per micro-batch: a no-grad pass for those that train after the first optimizer step; the
    with torch.no_grad():   # first mini-batch's own forward pass gives its π_old (π_old = π_θ there: one pass saved)
        for k, b in ranks.batches([k for group in per_step[1:] for k in group]):
            set_old(k, b, *lp(b.ids, b.attention, amp=amp, entropy_at=b.mask.bool(), visions=b.visions))
    for group in per_step:
        n_seq = ranks.sequences(group)
        if not n_seq:
            continue
        optimizer.zero_grad(set_to_none=True)
        for k, b in ranks.batches(group):
            if k not in old:   # on-policy
                logp, ent = lp(b.ids, b.attention, amp=amp, entropy_at=b.mask.bool(), visions=b.visions)
                set_old(k, b, logp, ent)
            else:
                logp = lp(b.ids, b.attention, amp=amp, visions=b.visions)                # [b, L-1]
            pg, kl, ratio = token_loss(logp, old[k], b.adv, clip_eps, log_ratio_clamp)  # [b, L-1] each
            per_seq = ((pg + kl_beta * kl) * b.mask).sum(-1) / b.mask.sum(-1).clamp(min=1)  # [b] token-mean
            ranks.backward(per_seq, k, n_seq)                                         # mean over the mini-batch
            if k is None:
                continue
            with torch.no_grad():
                stats["loss"].append(per_seq.mean().item())
                record("clipfrac", clipped(ratio, clip_eps), b.mask)
                record("kl", kl, b.mask)
        norm = torch.nn.utils.clip_grad_norm_(lp.parameters(), max_grad_norm)
        stats["grad_norm"].append(float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm))
        warm_up(optimizer, warmup_steps)
        optimizer.step()

    @torch.no_grad()
    def update_size() -> tuple[float, float]:
        """(KL, clip fraction) of π now against π_old: token means over every trained token of every rank."""
        kl_sum = clip_sum = tokens = 0.0
        ranks.reshard(lp)        # the line search moves the shards in place: gather them afresh
        for k, b in ranks.batches([k for group in per_step for k in group]):
            logp = lp(b.ids, b.attention, amp=amp, visions=b.visions)                 # [b, L-1]
            if k is not None:
                _, kl, ratio = token_loss(logp, old[k], b.adv, clip_eps, log_ratio_clamp)
                kl_sum += (kl * b.mask).sum().item()
                clip_sum += (clipped(ratio, clip_eps) * b.mask).sum().item()
                tokens += b.mask.sum().item()
        tokens = max(ranks.sum(tokens), 1)
        return ranks.sum(kl_sum) / tokens, ranks.sum(clip_sum) / tokens

    alpha, kl, clip = 1.0, *update_size()
    if target_kl and kl > target_kl:
        alpha, kl, clip = line_search(params, start, update_size, kl, target_kl)
    stats["step_scale"], stats["update_kl"], stats["update_clipfrac"] = [alpha], [kl], [clip]
    if (known := ranks.sum(drift[2].item())) > 0:   # token means over every rank's tokens with a sampler log-prob
        stats["sampler_abs_diff"], stats["sampler_kl"] = [ranks.sum(drift[0].item()) / known], \
            [ranks.sum(drift[1].item()) / known]
    lp.eval()
    return {k: sum(v) / len(v) for k, v in stats.items() if v} | {"samples": len(samples),
                                                                   "steps": len(stats["grad_norm"])}


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
