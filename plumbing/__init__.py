"""Plumbing, skip on a first read. What the method runs on, not the method itself (paper §3 lives in
loop.py, policy.py, reward_model.py, environment.py, ppo.py, records.py and tasks/):

- config.py   every flag, each setting's defaults and --preset reference, one-line errors;
- rundir.py   the run folder: metrics, TensorBoard, curve.png, samples, atomic checkpoints, resume;
- models.py   loading and saving models (the embedded SmolLM2, the tiny test model, LoRA), the machine;
- engines.py  sampling with vLLM or transformers behind one interface, the chat template, the answer prefix;
- vision.py   vision-language models (OSWorld's screenshots): the tiny VLM, image prompts, frozen vision tower;
- dist.py     torchrun: FSDP2 sharding, keeping the ranks in step; each call does nothing in one process.
"""
