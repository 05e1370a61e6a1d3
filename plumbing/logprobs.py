"""Plumbing, skip on a first read: the token log-probs of Eq. 5 (ppo.py, paper §3.4), `LogProbs`, and the
micro-batches they are computed on, packed so that the responses to one prompt share its forward pass.

P's G samples of a task share one prompt (coding: the whole problem statement), and R's m judgments of a step share
theirs, so padding each sample to a row of its own computes every prompt G or m times. A packed row holds the prompt
once, then each response, with an attention mask that lets a response see the prompt and its own earlier tokens only,
and position ids that continue the prompt's for every response: each response token's log-prob is the one it would
have in a row of its own (tests/test_models.py checks both ways give the same update).
"""
from __future__ import annotations

import dataclasses
import random
from typing import NamedTuple

import torch
from torch.utils.checkpoint import checkpoint

from plumbing import dist, vision
from plumbing.models import amp_context
from records import Sample


class Batch(NamedTuple):
    """One micro-batch, packed by `collate`: the responses to one prompt share a row, the prompt first, then each
    response, which attends to the prompt and to its own earlier tokens only. The prompt's forward (and backward)
    pass is computed once for all its responses, and every response token sees exactly what it would see in a
    row of its own. Outputs are per response: [n, R], sample i's token j at [i, j]."""
    ids: torch.Tensor              # [rows, L] packed rows, right-padded
    attention: torch.Tensor        # [rows, 1, L, L] bool: token t attends to token u (rows with images: [rows, L])
    positions: torch.Tensor | None  # [rows, L] position ids: each response continues its prompt's (images: None)
    src: torch.Tensor              # [n, R] flat index (row · L + t) of the hidden state that predicts token j of sample i
    tgt: torch.Tensor              # [n, R] flat index of that token
    mask: torch.Tensor             # [n, R] 1 on response tokens (the trained tokens)
    adv: torch.Tensor              # [n] each sample's advantage
    visions: list                  # the rows' pixel inputs (Sample.vision), None for text
    sampled: torch.Tensor          # [n, R] the sampler's log-prob of each response token (Sample.logprobs), 0 where unknown
    sampled_mask: torch.Tensor     # [n, R] 1 on response tokens whose sampler log-prob is known
    tokens: int                    # real (not padding) tokens in the rows: one forward pass's work


def pack_order(samples: list[Sample]) -> list[Sample]:
    """The samples with every prompt's responses next to each other (prompts by length, responses by length), so
    that micro-batches cut from the list share prompts (`collate`) and pad little."""
    by_prompt: dict[tuple, list[Sample]] = {}
    for s in samples:
        by_prompt.setdefault(tuple(s.prompt_ids), []).append(s)
    groups = sorted(by_prompt.values(), key=lambda g: len(g[0].prompt_ids))
    return [s for g in groups for s in sorted(g, key=lambda s: len(s.response_ids))]


def collate(samples: list[Sample], pad_id: int, device, pack: bool = True) -> Batch:
    """A micro-batch (`Batch`). pack=False, or a prompt with images (whose multimodal positions the model computes
    itself), gives each sample a row of its own: plain right padding."""
    images = any(s.vision for s in samples)
    rows: dict = {}   # row key → the indices of its samples
    for i, s in enumerate(samples):
        rows.setdefault(tuple(s.prompt_ids) if pack and not images else i, []).append(i)
    width = max(len(samples[idx[0]].prompt_ids) + sum(len(samples[i].response_ids) for i in idx)
                for idx in rows.values())
    longest = max(len(s.response_ids) for s in samples)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)        # [rows, L]
    positions = torch.zeros((len(rows), width), dtype=torch.long)         # [rows, L]
    segment = torch.full((len(rows), width), -1, dtype=torch.long)        # [rows, L] 0 prompt, k response k, -1 pad
    src = torch.zeros((len(samples), longest), dtype=torch.long)          # [n, R]
    tgt = torch.zeros((len(samples), longest), dtype=torch.long)          # [n, R]
    mask = torch.zeros((len(samples), longest))                           # [n, R]
    sampled = torch.zeros((len(samples), longest))                        # [n, R]
    sampled_mask = torch.zeros((len(samples), longest))                   # [n, R]
    for r, idx in enumerate(rows.values()):
        prompt = samples[idx[0]].prompt_ids
        n_prompt = at = len(prompt)
        ids[r, :n_prompt], positions[r, :n_prompt], segment[r, :n_prompt] = torch.tensor(prompt), \
            torch.arange(n_prompt), 0
        for k, i in enumerate(idx, start=1):
            s, n = samples[i], len(samples[i].response_ids)
            ids[r, at:at + n], positions[r, at:at + n], segment[r, at:at + n] = torch.tensor(s.response_ids), \
                torch.arange(n_prompt, n_prompt + n), k
            # token j of the response is predicted by the hidden state before it: the prompt's last for j = 0
            src[i, :n] = r * width + torch.tensor([n_prompt - 1, *range(at, at + n - 1)])
            tgt[i, :n] = r * width + torch.arange(at, at + n)
            mask[i, :n] = 1
            if s.sampler_known:
                sampled[i, :n], sampled_mask[i, :n] = torch.tensor(s.logprobs), 1
            at += n
    if images:
        attention, positions = (segment >= 0).long(), None                 # [rows, L] padding mask
    else:
        causal = torch.ones(width, width, dtype=torch.bool).tril()           # [L, L]
        same = segment[:, :, None] == segment[:, None, :]                    # [rows, L, L]
        attention = (causal & (same | (segment[:, None, :] == 0)))[:, None]  # [rows, 1, L, L] (padding: harmless)
    adv = torch.tensor([s.advantage for s in samples], dtype=torch.float32)  # [n]
    return Batch(ids.to(device), attention.to(device), None if positions is None else positions.to(device),
                 src.to(device), tgt.to(device), mask.to(device), adv.to(device), [s.vision for s in samples],
                 sampled.to(device), sampled_mask.to(device), int((segment >= 0).sum()))


def mini_batches(samples: list[Sample], pad_id: int, lp, micro_batch: int, steps: int, seed: int, pack: bool):
    """The update's data for the log-prob module `lp`: micro-batches of `micro_batch` samples, a prompt's responses
    together so that they share its forward pass (`collate`; pack=False gives every sample a padded row), kept in
    step over the ranks (`dist.Lockstep`: ranks with fewer micro-batches run zero-weight ones), and the micro-batches
    of each of the `steps` mini-batches (one per optimizer step), shuffled by `seed`. Returns (the Lockstep, each
    mini-batch's micro-batch indices)."""
    samples, device = pack_order(samples), next(lp.parameters()).device
    micro = [samples[i:i + micro_batch] for i in range(0, len(samples), micro_batch)]
    pad = blank(samples, pad_id, shown=vision.tower_trains(lp.model))
    ranks = dist.Lockstep(micro, lambda batch: collate(batch, pad_id, device, pack), blank=pad)
    order = list(range(len(micro)))
    random.Random(seed).shuffle(order)
    return ranks, [order[s::steps] for s in range(steps)]


def blank(samples: list[Sample], pad_id: int, shown: bool) -> list[Sample]:
    """The sample of a micro-batch that trains nothing (`dist.Lockstep` pads a rank with it): one pad token, or,
    when the vision tower trains (`shown`) and any rank's samples carry screenshots, a zero-advantage copy of one of
    them, so that every rank's forward runs the tower (its blocks are then sharded, and each forward gathers them on
    every rank; a frozen tower is whole on each rank and needs no such pass). A collective under torchrun when
    `shown`."""
    pick = shown and next((s for s in dist.gather(next((s for s in samples if s.vision), None)) if s is not None), None)
    return [dataclasses.replace(pick, advantage=0.0, logprobs=None) if pick else Sample([pad_id], [pad_id], 0.0)]


def inputs(b: Batch) -> dict:
    """`LogProbs`' inputs for a packed micro-batch, as keyword arguments."""
    return {"input_ids": b.ids, "attention": b.attention, "visions": b.visions, "positions": b.positions,
            "src": b.src, "tgt": b.tgt}


class LogProbs(torch.nn.Module):
    """log π of chosen tokens, as a module around a causal LM. Plain rows ([B, L] ids, a [B, L] padding mask):
    log π(x_{t+1} | x_{≤t}) at every position, [B, L-1]. A packed micro-batch (`Batch`: its attention, positions,
    src and tgt): log π of each response token, [n, R].

    The vocabulary projection runs in sequence chunks under activation checkpointing, so the full
    [B, L, V] fp32 logits never sit in memory at once. A module, not a function, so that FSDP2 can
    wrap it as the root: every forward then passes through the root's hooks (plumbing/dist.py's `shard`)."""

    def __init__(self, model, chunk: int = 256):
        super().__init__()
        self.model, self.chunk = model, chunk

    def forward(self, input_ids, attention, amp: bool = True, entropy_at=None, visions=None, positions=None,
                src=None, tgt=None):
        """The log-probs, and with entropy_at, a bool mask of their shape (the response tokens), also the entropy
        of π at those positions (0 elsewhere; no gradient), from the same chunked logits. visions: the rows'
        screenshots (Completion.vision, or None), for a vision-language model (plumbing/vision.py)."""
        images = vision.batch_inputs(self.model, input_ids, visions or [])
        trunk = vision.backbone(self.model) if images else self.model.get_decoder()   # with the vision tower
        with amp_context(amp):
            hidden = trunk(input_ids=input_ids, attention_mask=attention, position_ids=positions, use_cache=False,
                           **images).last_hidden_state  # [rows, L, H], no KV cache in training
        if src is None:   # plain rows: position t predicts token t+1
            grid = torch.arange(input_ids.numel(), device=input_ids.device).view(input_ids.shape)  # [B, L]
            src, tgt = grid[:, :-1], grid[:, 1:]
        hidden, targets = hidden.flatten(0, 1)[src], input_ids.flatten()[tgt]  # [n, R, H], [n, R]
        head = self.model.get_output_embeddings()

        def chunk_logprobs(h, t, at=None):
            with amp_context(amp):
                logits = head(h)  # [n, c, V]
            logp = torch.log_softmax(logits.float(), dim=-1)  # [n, c, V]
            picked = logp.gather(-1, t.unsqueeze(-1)).squeeze(-1)  # [n, c]
            if at is None:
                return picked
            with torch.no_grad():
                ent = torch.zeros_like(picked)  # [n, c]
                ent[at] = token_entropy(logp[at])  # [k] at the k masked positions only
            return picked, ent

        parts = []
        for s in range(0, targets.shape[1], self.chunk):
            args = (hidden[:, s:s + self.chunk], targets[:, s:s + self.chunk])
            args += (entropy_at[:, s:s + self.chunk],) if entropy_at is not None else ()
            parts.append(checkpoint(chunk_logprobs, *args, use_reentrant=False) if torch.is_grad_enabled()
                         else chunk_logprobs(*args))
        if entropy_at is not None:
            return torch.cat([p for p, _ in parts], dim=1), torch.cat([e for _, e in parts], dim=1)  # [n, R] ×2
        return torch.cat(parts, dim=1)  # [n, R]


def token_entropy(logp):
    """H(π) = −Σ_v π(v) log π(v) over the last axis, from log-probs: [..., V] → [...].

        >>> round(token_entropy(torch.log(torch.tensor([0.5, 0.25, 0.25]))).item(), 4)   # 1.5 bits = 1.0397 nats
        1.0397
    """
    return -(logp.exp() * logp).nan_to_num().sum(-1)   # 0·log 0 = 0 where π(v) = 0


def token_logprobs(model, input_ids, attention, chunk: int = 256, amp: bool = True):
    """`LogProbs` of a causal LM for one batch: [B, L-1]."""
    return LogProbs(model, chunk)(input_ids, attention, amp)
