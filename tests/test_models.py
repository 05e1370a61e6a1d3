"""plumbing/models.py, plumbing/engines.py, ppo.py: loading (tiny + the embedded default, offline), decoding, log-probs, the Eq. 5 update."""
import pytest
import torch

from plumbing import engines, logprobs, models
import ppo
import records
from plumbing import rundir


@pytest.fixture(scope="module")
def tiny():
    return models.load("tiny", seed=0)


def _prompt_batch(tok, texts):
    ids = [tok(engines.render_chat(tok, t), add_special_tokens=False)["input_ids"] for t in texts]
    width = max(map(len, ids))
    input_ids = torch.tensor([[tok.pad_token_id] * (width - len(x)) + x for x in ids])
    attention = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids])
    return input_ids, attention


def test_greedy_decode_matches_transformers_generate(tiny):
    model, tok = tiny
    input_ids, attention = _prompt_batch(tok, ["hi", "a longer prompt here"])
    ours, _ = engines.decode(model, input_ids, attention, max_new_tokens=20, temperature=0, top_p=1.0,
                             stop_ids=[tok.eos_token_id], amp=False)
    ref = model.generate(input_ids=input_ids, attention_mask=attention, max_new_tokens=20, do_sample=False,
                         pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)[:, input_ids.shape[1]:]
    for row, ref_row in zip(ours, ref.tolist()):
        assert row == ref_row[:len(row)]


def test_engine_completions_and_seeded_sampling(tiny):
    model, tok = tiny
    engine = engines.make_engines("hf", {"p": (model, tok)}, batch_size=3, amp=False)["p"]
    p = engines.render_chat(tok, "x")
    torch.manual_seed(1)
    a = engine.generate([p, p + "y"], n=2, temperature=1.0, top_p=0.9, max_new_tokens=8)
    torch.manual_seed(1)
    b = engine.generate([p, p + "y"], n=2, temperature=1.0, top_p=0.9, max_new_tokens=8)
    assert [[c.ids for c in cs] for cs in a] == [[c.ids for c in cs] for cs in b]
    for cs in a:
        for c in cs:
            assert 1 <= len(c.ids) <= 8 and c.finish_reason in ("stop", "length")
            assert (c.finish_reason == "stop") == (c.ids[-1] == tok.eos_token_id)
    with pytest.raises(models.ModelError):
        engines.make_engines("nope", {"p": (model, tok)})


def test_top_p_keeps_smallest_nucleus():
    torch.manual_seed(0)
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    draws = {engines._sample(logits, 1.0, 0.7).item() for _ in range(200)}
    assert draws == {0, 1}  # 0.5 + 0.3 ≥ 0.7: tokens 2 and 3 are cut


@pytest.mark.parametrize("k", [4, 2])  # k=2: the nucleus is wider than the candidates → full-sort path
def test_top_p_mask_hand_worked(k):
    """Keep token j iff the mass ranked above it is < p. Probabilities 0.5, 0.3, 0.15, 0.05 (shuffled)."""
    logits = torch.log(torch.tensor([[0.15, 0.5, 0.05, 0.3]] * 3))
    kept = ~torch.isinf(engines.top_p_mask(logits.clone(), torch.tensor([0.7, 0.8, 0.9]), k=k))
    assert kept.tolist() == [[False, True, False, True],   # p 0.7: above 0.15 is 0.8 ≥ 0.7
                             [False, True, False, True],   # p 0.8: 0.8 ≥ 0.8, cut
                             [True, True, False, True]]    # p 0.9: 0.8 < 0.9 kept; above 0.05 is 0.95


def test_top_p_mask_equals_full_sort():
    torch.manual_seed(0)
    logits = torch.cat([torch.randn(8, 5000) * 8, torch.randn(8, 5000) * 0.3])  # peaked rows, flat rows
    p = torch.rand(16) * 0.9 + 0.05
    s, order = logits.sort(-1, descending=True)
    probs = torch.softmax(s, -1)
    ref = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, order, (probs.cumsum(-1) - probs) < p[:, None])
    assert torch.equal(~torch.isinf(engines.top_p_mask(logits.clone(), p, k=64)), ref)


def test_chunked_logprobs_match_full_logits(tiny):
    model, tok = tiny
    input_ids, attention = _prompt_batch(tok, ["abc", "hello world"])
    with torch.no_grad():
        full = torch.log_softmax(model(input_ids=input_ids, attention_mask=attention).logits[:, :-1].float(), -1)
        full = full.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
        ours = logprobs.token_logprobs(model, input_ids, attention, chunk=7, amp=False)
    mask = attention[:, 1:].bool()
    assert torch.allclose(ours[mask], full[mask], atol=1e-5)


def test_ppo_update_moves_logprob_in_the_advantage_direction(tiny):
    model, tok = tiny
    model = models.load("tiny", seed=0)[0]
    prompt = tok(engines.render_chat(tok, "q"), add_special_tokens=False)["input_ids"]
    good, bad = tok("good", add_special_tokens=False)["input_ids"], tok("bad!", add_special_tokens=False)["input_ids"]
    samples = [records.Sample(prompt, good, 1.0), records.Sample(prompt, bad, -1.0)]

    def token_lps(resp):
        ids = torch.tensor([prompt + resp])
        with torch.no_grad():
            lp = logprobs.token_logprobs(model, ids, torch.ones_like(ids), amp=False)
        return lp[0, len(prompt) - 1:]   # [len(resp)]

    def seq_logprob(resp):
        return token_lps(resp).sum().item()

    before = seq_logprob(good), seq_logprob(bad)
    old = torch.cat([token_lps(good), token_lps(bad)])
    opt = ppo.make_optimizer(model, 1e-2)
    stats = ppo.ppo_update(model, opt, samples, tok.pad_token_id, steps=1, micro_batch=2, amp=False, seed=0,
                           **ppo.RELEASED)
    assert stats["kl"] == pytest.approx(0.0, abs=1e-6)      # first step: π_θ = π_old, ratio 1, k3 KL 0
    assert stats["clipfrac"] == 0.0
    assert stats["loss"] == pytest.approx(0.0, abs=1e-6)    # −(1·1 + 1·(−1))/2
    after = seq_logprob(good), seq_logprob(bad)
    assert after[0] > before[0] and after[1] < before[1]
    # the whole update's size, measured after its step: the token mean of the k3 KL of the new log-probs
    # against the old ones, and the share of tokens with |r − 1| > ε (one micro-batch holds both samples)
    d = torch.cat([token_lps(good), token_lps(bad)]) - old                        # log r per response token
    assert stats["update_kl"] == pytest.approx((torch.exp(-d) + d - 1).mean().item(), rel=1e-4)
    assert stats["update_clipfrac"] == pytest.approx(((d.exp() - 1).abs() > 0.2).float().mean().item())
    assert stats["update_kl"] > 0 and stats["entropy"] > 0
    assert ppo.ppo_update(model, opt, [], tok.pad_token_id, steps=1, micro_batch=2, amp=False, seed=0,
                          **ppo.RELEASED) == {}


def test_entropy_of_the_trained_tokens_is_that_of_the_full_distribution(tiny):
    """LogProbs(entropy_at=mask) gives −Σ π log π at the masked positions (0 elsewhere), the same as from the
    full [B, L, V] logits."""
    model, tok = tiny
    input_ids, attention = _prompt_batch(tok, ["hi", "a longer prompt here"])
    at = torch.rand(input_ids[:, 1:].shape, generator=torch.Generator().manual_seed(0)) < 0.5   # [B, L-1]
    with torch.no_grad():
        logp, ent = logprobs.LogProbs(model, chunk=5)(input_ids, attention, amp=False, entropy_at=at)   # [B, L-1] each
        full = torch.log_softmax(model(input_ids=input_ids, attention_mask=attention).logits[:, :-1].float(), -1)
    assert torch.allclose(ent, torch.where(at, -(full.exp() * full).sum(-1), 0.0), atol=1e-4)
    assert torch.allclose(logp, full.gather(-1, input_ids[:, 1:, None]).squeeze(-1), atol=1e-5)


def test_token_entropy_hand_values():
    """(0.5, 0.25, 0.25): 0.5·ln 2 + 2·0.25·ln 4 = 1.5·ln 2 = 1.0397 nats; uniform over 8: ln 8; one-hot: 0."""
    dists = torch.tensor([[0.5, 0.25, 0.25, 0, 0, 0, 0, 0], [1 / 8] * 8, [1.0] + [0.0] * 7])
    assert logprobs.token_entropy(torch.log(dists)).tolist() == pytest.approx([1.5 * 0.693147, 2.079442, 0.0], abs=1e-5)


def test_line_search_scales_the_update_back_into_its_trust_region_by_hand():
    """θ_old = 0, θ_new = (2, −4), a KL that is quadratic in the step: KL(α) = α²·4. Target 0.25: the first try
    shrinks by min(1/2, 0.9·√(0.25/4)) = 0.225 → KL 0.2025 ≤ 0.25, done, θ = 0.225·(2, −4). Target 0.01: tries
    0.045 (KL 0.0081)."""
    w, start = torch.nn.Parameter(torch.tensor([2.0, -4.0])), [torch.zeros(2)]
    kl_of = lambda: (4 * (w[0].item() / 2) ** 2, 0.5)   # noqa: E731
    alpha, kl, clip = ppo.line_search([w], start, kl_of, kl_of()[0], 0.25)
    assert (alpha, kl, clip) == pytest.approx((0.225, 0.2025, 0.5)) and w.tolist() == pytest.approx([0.45, -0.9])
    w.data = torch.tensor([2.0, -4.0])
    assert ppo.line_search([w], start, kl_of, 4.0, 0.01)[:2] == pytest.approx((0.045, 0.0081))
    # a KL that does not fall (1.0) shrinks α by 0.9·√0.01 = 0.09 at each of the `tries` tries, and the last is kept
    assert ppo.line_search([w], start, lambda: (1.0, 1.0), 1.0, 0.01, tries=3)[0] == pytest.approx(0.09 ** 3)


def test_ppo_update_with_a_target_kl_stays_inside_it(tiny):
    """At LR 1e-2 one step moves the tiny model far (update KL ≫ 0.01): with target_kl 0.01 the update is
    scaled back until its measured KL to π_old is at most 0.01, and it still moves the right way."""
    model, tok = models.load("tiny", seed=0)
    prompt = tok(engines.render_chat(tok, "q"), add_special_tokens=False)["input_ids"]
    samples = [records.Sample(prompt, tok(t, add_special_tokens=False)["input_ids"], a)
               for t, a in (("good", 1.0), ("bad!", -1.0), ("fine", 0.5), ("nope", -0.5))]
    free = ppo.ppo_update(model, ppo.make_optimizer(model, 1e-2), samples, tok.pad_token_id, steps=2, micro_batch=2,
                          amp=False, seed=0, **ppo.RELEASED)
    assert free["update_kl"] > 0.01 and free["step_scale"] == 1.0
    model = models.load("tiny", seed=0)[0]
    held = ppo.ppo_update(model, ppo.make_optimizer(model, 1e-2), samples, tok.pad_token_id, steps=2, micro_batch=2,
                          amp=False, seed=0, **{**ppo.RELEASED, "target_kl": 0.01})
    assert 0 < held["update_kl"] <= 0.01 and held["step_scale"] < 1.0


def _shared_prompt_samples(tok):
    """Two prompts with 3 and 2 responses of different lengths, and one prompt with a single response."""
    prompts = [tok(engines.render_chat(tok, t), add_special_tokens=False)["input_ids"] for t in ("q", "a longer one", "z")]
    responses = [tok(t, add_special_tokens=False)["input_ids"] for t in ("good", "bad answer!", "ok", "fine then", "x y")]
    g = torch.Generator().manual_seed(0)
    pairs = [(0, 0), (0, 1), (0, 2), (1, 3), (1, 4), (2, 1)]
    return [records.Sample(prompts[p], responses[r], float(torch.randn(1, generator=g)),
                           logprobs=[-1.0] * len(responses[r])) for p, r in pairs]


def test_packed_rows_give_each_response_its_own_log_probs(tiny):
    """A packed micro-batch (the responses to one prompt in one row, each seeing the prompt and itself only) gives
    the same log-probs and entropies as one padded row per sample, and needs fewer rows."""
    model, tok = tiny
    samples = _shared_prompt_samples(tok)
    lp = logprobs.LogProbs(model, chunk=3)
    packed, plain = (logprobs.collate(samples, tok.pad_token_id, "cpu", pack=p) for p in (True, False))
    assert packed.ids.shape[0] == 3 and plain.ids.shape[0] == 6
    assert packed.ids.numel() < plain.ids.numel()
    assert torch.equal(packed.mask, plain.mask) and torch.equal(packed.sampled_mask, plain.sampled_mask)
    with torch.no_grad():
        a, ent_a = lp(**logprobs.inputs(packed), amp=False, entropy_at=packed.mask.bool())   # [n, R] each
        b, ent_b = lp(**logprobs.inputs(plain), amp=False, entropy_at=plain.mask.bool())
        whole = [logprobs.token_logprobs(model, torch.tensor([s.prompt_ids + s.response_ids]),
                                    torch.ones(1, len(s.prompt_ids) + len(s.response_ids), dtype=torch.long),
                                    amp=False)[0, len(s.prompt_ids) - 1:] for s in samples]   # each sample alone
    m = packed.mask.bool()
    assert torch.allclose(a[m], b[m], atol=1e-5) and torch.allclose(ent_a[m], ent_b[m], atol=1e-4)
    for i, w in enumerate(whole):
        assert torch.allclose(a[i, :len(w)], w, atol=1e-5)


def test_packed_update_equals_the_padded_update():
    """Eq. 5 on packed micro-batches moves the weights as on padded ones (fp32), with the same diagnostics."""
    results = []
    for pack in (True, False):
        model, tok = models.load("tiny", seed=0)
        stats = ppo.ppo_update(model, ppo.make_optimizer(model, 1e-3), _shared_prompt_samples(tok), tok.pad_token_id,
                               steps=2, micro_batch=3, amp=False, seed=0, pack=pack, **ppo.RELEASED)
        results.append((stats, {k: v.detach().clone() for k, v in model.state_dict().items()}))
    (s1, w1), (s2, w2) = results
    for k in ("loss", "kl", "clipfrac", "entropy", "update_kl", "grad_norm", "sampler_abs_diff"):
        assert s1[k] == pytest.approx(s2[k], rel=1e-4, abs=1e-7), k
    assert s1["update_kl"] > 0
    for k in w1:
        torch.testing.assert_close(w1[k], w2[k], atol=2e-6, rtol=0)


def test_sampler_mismatch_hand_values():
    """Δ = log π_trainer − log π_sampler = (0.5, −0.2, 0): |Δ| = (0.5, 0.2, 0); k3 = e^Δ − 1 − Δ =
    (e^0.5 − 1.5, e^−0.2 − 0.8, 0) = (0.148721, 0.018731, 0)."""
    abs_diff, k3 = ppo.sampler_mismatch(torch.tensor([[-1.0, -2.2, -0.3]]), torch.tensor([[-1.5, -2.0, -0.3]]))
    assert abs_diff[0].tolist() == pytest.approx([0.5, 0.2, 0.0])
    assert k3[0].tolist() == pytest.approx([0.148721, 0.018731, 0.0], abs=1e-6)


def _sampled(engine, tok, n=4):
    """Samples of `engine` (T 1, top-p 0.9) on two prompts, with advantages ±1 and the sampler's log-probs."""
    prompts = [engines.render_chat(tok, "hi"), engines.render_chat(tok, "a longer prompt here")]
    outs = engine.generate(prompts, n=n, temperature=1.0, top_p=0.9, max_new_tokens=12)
    return [records.Sample(c.prompt_ids, c.ids, (-1.0) ** k, logprobs=c.logprobs)
            for cs in outs for k, c in enumerate(cs)]


def test_fp32_sampler_agrees_with_the_trainer_and_a_stale_one_does_not():
    """The transformers engine in fp32 samples the trained policy: its raw log-probs (KV-cache decoding of
    left-padded prompts) equal the trainer's (right-padded, chunked) to about 1e-5, so the update reports a
    mismatch near 0 on P's tokens. A sampler left on the weights before an update (never synced) draws from the old
    policy: the next update reports it."""
    import copy

    model, tok = models.load("tiny", seed=0)
    stale = copy.deepcopy(model)
    engine = engines.make_engines("hf", {"p": (model, tok)}, amp=False)["p"]
    torch.manual_seed(0)
    samples = _sampled(engine, tok)
    assert all(len(s.logprobs) == len(s.response_ids) > 0 for s in samples)
    first = ppo.ppo_update(model, ppo.make_optimizer(model, 1e-2), samples, tok.pad_token_id, steps=2, micro_batch=2,
                           amp=False, seed=0, **ppo.RELEASED)
    assert first["sampler_abs_diff"] < 1e-5 and 0 <= first["sampler_kl"] < 1e-9
    assert first["update_kl"] > 1e-3                   # the update moved the trained policy ...
    stale_engine = engines.make_engines("hf", {"p": (stale, tok)}, amp=False)["p"]
    stale_samples = _sampled(stale_engine, tok)        # ... and this sampler still has the weights before it
    second = ppo.ppo_update(model, ppo.make_optimizer(model, 1e-6), stale_samples, tok.pad_token_id, steps=2,
                            micro_batch=2, amp=False, seed=0, **ppo.RELEASED)
    assert second["sampler_abs_diff"] > 1e-2 and second["sampler_kl"] > 1e-4


def test_pi_old_from_a_matching_sampler_saves_a_pass_and_a_drifted_one_is_recomputed():
    """sampler_old_kl > 0: the fp32 sampler's k3 KL on the first mini-batch (about 1e-10) is within 1e-6, so the
    second mini-batch takes π_old from the sampler's log-probs: its no-grad pass is saved, and the weights move as
    with π_old recomputed, to float noise. Log-probs shifted by 0.05 (k3 = e^0.05 − 1.05 ≈ 1.3e-3) fail the check:
    π_old is recomputed and the update is the recomputing one exactly."""
    import copy
    import dataclasses

    model, tok = models.load("tiny", seed=0)
    torch.manual_seed(0)
    samples = _sampled(engines.make_engines("hf", {"p": (model, tok)}, amp=False)["p"], tok)
    drifted = [dataclasses.replace(s, logprobs=[x - 0.05 for x in s.logprobs]) for s in samples]

    def update(data, tolerance):
        trained = copy.deepcopy(model)
        stats = ppo.ppo_update(trained, ppo.make_optimizer(trained, 1e-2), data, tok.pad_token_id, steps=2,
                               micro_batch=2, amp=False, seed=0, **ppo.RELEASED | {"sampler_old_kl": tolerance})
        return stats, trained.state_dict()

    (full, w_full), (saved, w_saved) = update(samples, 0.0), update(samples, 1e-6)
    assert full["old_from_sampler"] == 0 and saved["old_from_sampler"] == 1
    assert saved["sampler_kl"] < 1e-9 and saved["update_kl"] > 1e-3
    second_half = sum(len(s.prompt_ids) + len(s.response_ids) for s in samples) / 2   # packed rows hold it less
    assert 0 < full["tokens_forward"] - saved["tokens_forward"] <= second_half
    assert saved["update_kl"] == pytest.approx(full["update_kl"], rel=1e-3)
    for k in w_full:
        torch.testing.assert_close(w_saved[k], w_full[k], atol=1e-5, rtol=0)
    (redo, w_redo), (off, w_off) = update(drifted, 1e-6), update(drifted, 0.0)
    assert redo["old_from_sampler"] == 0 and redo["sampler_kl"] > 1e-3
    assert redo["tokens_forward"] == off["tokens_forward"] == full["tokens_forward"]
    for k in w_off:
        assert torch.equal(w_redo[k], w_off[k]), k


def test_samples_without_sampler_logprobs_report_no_mismatch(tiny):
    """A sample whose engine gave no log-probs (transformers' generate for a VLM) is left out of the mismatch;
    with none known, the update reports none, and its π_old is never taken from the sampler."""
    model, tok = models.load("tiny", seed=0)
    prompt = tok(engines.render_chat(tok, "q"), add_special_tokens=False)["input_ids"]
    samples = [records.Sample(prompt, tok(t, add_special_tokens=False)["input_ids"], a)
               for t, a in (("good", 1.0), ("bad!", -1.0))]
    stats = ppo.ppo_update(model, ppo.make_optimizer(model, 1e-3), samples, tok.pad_token_id, steps=1, micro_batch=2,
                           amp=False, seed=0, **ppo.RELEASED)
    assert "sampler_kl" not in stats and "sampler_abs_diff" not in stats
    stats = ppo.ppo_update(model, ppo.make_optimizer(model, 1e-3), samples * 2, tok.pad_token_id, steps=2,
                           micro_batch=2, amp=False, seed=0, **ppo.RELEASED | {"sampler_old_kl": 1.0})
    assert stats["old_from_sampler"] == 0               # no sampler log-probs: π_old recomputed, whatever the bound


def test_dither_takes_weights_off_the_bf16_ties_and_small_updates_reach_bf16_in_proportion():
    """A weight halfway between two bf16 values flips a whole bf16 step under any update, in the update's direction.
    After `dither_off_bf16` no weight sits on a tie, the bf16 copy is unchanged, and an update of δ = ulp/10 changes
    the bf16 copy of about a tenth of the weights (the mean change is δ, as for the fp32 weights)."""
    ulp = 2.0 ** -7                                                     # bf16 spacing in [1, 2)
    w = torch.nn.Linear(4000, 1, bias=False)
    k = torch.arange(4000)
    w.weight.data = 1.25 + ulp * (k % 2) / 2 + ulp * (k % 4 == 3)       # half on a bf16 value, half on a tie
    before = w.weight.detach().to(torch.bfloat16)
    assert models.dither_off_bf16(w, seed=0) == 0.5
    assert torch.equal(w.weight.detach().to(torch.bfloat16), before)     # the sampler's copy is the same
    down = w.weight.detach().to(torch.bfloat16).float()
    assert not ((w.weight - down).abs() * 2 == ulp).any()                # no tie left
    flipped = ((w.weight + ulp / 10).to(torch.bfloat16).float() != down).float().mean().item()
    assert 0.08 < flipped < 0.12
    tie = torch.full((2000,), 1.25 + ulp / 2)                            # undithered: a tie flips under any update
    assert ((tie + ulp / 1000).to(torch.bfloat16) != tie.to(torch.bfloat16)).all()


def test_warm_up_scales_each_step_by_hand():
    """N = 4: the optimizer's steps 1, 2, 3, 4, 5 take lr · 1/4, 2/4, 3/4, 1, 1; N = 0 leaves lr alone."""
    w = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([w], lr=0.1)
    lrs = []
    for _ in range(5):
        ppo.warm_up(opt, 4)
        lrs.append(opt.param_groups[0]["lr"])
        w.grad = torch.ones(1)
        opt.step()
    assert lrs == pytest.approx([0.025, 0.05, 0.075, 0.1, 0.1])
    # AdamW's first step is lr · g / (|g| + eps) ≈ lr · sign(g) whatever |g| (m̂/√v̂ = ±1): a gradient of 1e-6
    # moves its weight by 0.1 · 1e-6 / (1e-6 + 1e-8) = 0.099, one of 3 by 0.1; the warm-up is what shrinks it
    v = torch.nn.Parameter(torch.zeros(2))
    fresh = torch.optim.AdamW([v], lr=0.1, weight_decay=0.0)
    v.grad = torch.tensor([1e-6, -3.0])
    fresh.step()
    assert v.detach().tolist() == pytest.approx([-0.1 * 1e-6 / (1e-6 + 1e-8), 0.1], rel=1e-5)
    ppo.warm_up(opt := torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=0.1), 0)
    assert opt.param_groups[0]["lr"] == 0.1


def test_save_load_roundtrip(tmp_path, tiny):
    model, tok = tiny
    opt = ppo.make_optimizer(model, 1e-3)
    models.save(model, tok, tmp_path / "ck", opt)
    models.save(model, tok, tmp_path / "ck", opt)   # overwrite in place, atomically
    m2, t2 = models.load(str(tmp_path / "ck"))
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), m2.parameters()))
    assert t2.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False) == \
        tok.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False)
    rundir.load_optimizer(ppo.make_optimizer(m2, 1e-3), tmp_path / "ck")


@pytest.mark.parametrize("name", ["/no/such/dir", "./missing", "not a model"])
def test_bad_model_names(name):
    with pytest.raises(models.ModelError):
        models.load(name)


@pytest.mark.slow
def test_embedded_smollm2_offline_route(tmp_path, monkeypatch):
    """The PyPI GGUF → HF folder conversion, with the hub switched off; then the cache is reused."""
    monkeypatch.setenv("RLANYTHING_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model, tok = models.load("smollm2")
    assert (tmp_path / "SmolLM2-135M-Instruct" / "config.json").exists()
    assert 134e6 < sum(p.numel() for p in model.parameters()) < 135e6
    assert tok.eos_token == "<|im_end|>" and len(tok) == 49152
    engine = engines.make_engines("hf", {"p": (model, tok)})["p"]
    out = engine.generate([engines.render_chat(tok, "What is the capital of France? Answer in one word.")],
                          temperature=0, max_new_tokens=12)[0][0]
    assert "Paris" in out.text
    again, _ = models.load("smollm2")  # from the cache now
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters()))


def test_boxed_answers_hand_worked():
    text = "think \\boxed{1} then \\boxed{ click(3) } and \\boxed{type(\"{x}\")} end"
    assert engines.boxed(text) == ["1", " click(3) "]                       # closed boxes without braces inside
    assert engines.last_boxed(text) == 'type("{x'                            # up to the first "}"
    assert engines.last_boxed(text, outer=True) == 'type("{x}")'             # up to the last "}"
    assert engines.last_boxed("\\boxed{open ended") is None
    assert engines.last_boxed("\\boxed{open ended", closed=False) == "open ended"
    assert engines.last_boxed("no box") is None
