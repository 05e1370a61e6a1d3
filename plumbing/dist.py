"""Plumbing, skip on a first read: running the loop on several processes (torchrun), for models that
outgrow one device.

The design is TRL's colocate mode and verl's hybrid engine, kept small: every rank runs the whole
loop on its own share of the tasks, trains one FSDP2-sharded copy of P and R, and samples with its
own engine. Launched without torchrun, every function here is the single-process identity, so a
reader of the method can skip this file.

- Process group: `init()` reads torchrun's environment (RANK, WORLD_SIZE, ...); NCCL on GPU, gloo on CPU.
- Training: `shard()` applies FSDP2 (`fully_shard`) to each decoder layer, then to the root, which is the
  log-prob module of ppo.py (so every forward goes through the root's hooks). A VLM's frozen vision tower
  stays whole on every rank; LoRA adapters are sharded with their layers.
- Equal work: ranks hold different sample counts (zero advantages are dropped), but every optimizer
  step must run the same collectives on every rank; `all_max` sizes the padding, `all_sum` the
  global sequence count the loss is averaged over (ppo.ppo_update).
- Sampling: each rank's engine samples from a full copy of the weights, refreshed tensor by tensor from
  the shards after every update (`Synced`). With vLLM, every rank starts its own engine (tp = 1) inside
  torchrun's process group (`external_launcher`, engines.py), and the full copy waits on the CPU.
- Data: tasks are sharded, not rollouts (`shard_tasks`), so a group stays on one rank and Eq. 2 / Eq. 3
  stay local; `gather` collects what E and the logs need from every rank.
- Exit: `exit_process` leaves without the interpreter's teardown, where gloo can abort a finished rank.
"""
from __future__ import annotations

import atexit
import os
import sys

import torch
import torch.distributed as td

from plumbing import vision


def active() -> bool:
    """Several ranks are running (vLLM's own one-process group does not count)."""
    return td.is_available() and td.is_initialized() and td.get_world_size() > 1


def rank() -> int:
    return td.get_rank() if active() else 0


def world_size() -> int:
    return td.get_world_size() if active() else 1


def init() -> tuple[int, int]:
    """Join torchrun's process group when launched by torchrun; (rank, world size), (0, 1) otherwise."""
    if int(os.environ.get("WORLD_SIZE", 1)) > 1 and "RANK" in os.environ and not td.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        td.init_process_group(backend)
    return rank(), world_size()


def exit_process(code: int) -> None:
    """Exit with `code`. Under torchrun: destroy the process group, run the exit handlers, flush, and
    skip the interpreter's teardown (os._exit). A gloo worker thread can still be releasing the last
    collective's tensors when teardown begins; it then waits for the GIL of a finalizing interpreter,
    and the rank dies with SIGABRT ("terminate called without an active exception") after its work
    is done. destroy_process_group does not stop those threads (a core dump showed them in runLoop)."""
    if not active():
        sys.exit(code)
    td.destroy_process_group()
    atexit._run_exitfuncs()   # what a normal exit runs first (the osworld task's browser cleanup)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _reduce(x: float, op) -> float:
    if not active():
        return x
    t = torch.tensor([float(x)], dtype=torch.float64,
                     device="cuda" if td.get_backend() == "nccl" else "cpu")
    td.all_reduce(t, op=op)
    return t.item()


def all_sum(x: float) -> float:
    return _reduce(x, td.ReduceOp.SUM)


def all_max(x: int) -> int:
    return int(_reduce(x, td.ReduceOp.MAX))


def barrier() -> None:
    """Every rank waits here until all arrive (no-op in one process)."""
    if active():
        td.barrier()


def gather(obj) -> list:
    """Every rank's `obj`, in rank order, on every rank ([obj] without torchrun)."""
    if not active():
        return [obj]
    out = [None] * world_size()
    td.all_gather_object(out, obj)
    return out


def shard_tasks(items: list) -> list:
    """This rank's share of a list: items[rank::world]."""
    return items[rank()::world_size()]


def unshard(mine: list) -> list:
    """The inverse of `shard_tasks`: every rank's items back in their original order, on every rank."""
    parts = gather(mine)
    return [parts[i % len(parts)][i // len(parts)] for i in range(sum(map(len, parts)))]


def broadcast(obj):
    """Rank 0's `obj` on every rank (decisions that must agree: E's); `obj` itself in one process."""
    if not active():
        return obj
    box = [obj]
    td.broadcast_object_list(box, src=0)
    return box[0]


def shard(root, bf16: bool = False):
    """FSDP2 on each decoder layer of the model that `root` (the log-prob module, plumbing/logprobs.py) wraps, then on
    `root` (call before building the optimizer). bf16: compute in bf16 with fp32 gradient reduction (the loop passes --amp, on where bf16 is
    native). A vision-language model's tower (plumbing/vision.py): frozen, it stays whole on every rank, outside
    FSDP2 (`ignored_params`: no rank changes it, so gathering it at every forward would buy nothing); trained
    (--train-vision), each of its blocks is sharded as a decoder layer is. LoRA adapters are sharded with the layer
    they sit in, next to its frozen base weights (a parameter group may mix trainable and frozen tensors)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else \
        MixedPrecisionPolicy()
    model = root.model
    units, ignored = list(model.get_decoder().layers), set()
    if vision.tower_trains(model):
        units += list(vision.backbone(model).visual.blocks)
    elif vision.is_vlm(model):
        ignored = set(vision.backbone(model).visual.parameters())
    for unit in units:
        fully_shard(unit, mp_policy=mp)
    fully_shard(root, mp_policy=mp, ignored_params=ignored or None)
    return root


def reshard(module) -> None:
    """Drop the gathered copies FSDP2 may keep of the parameters (the root keeps its own after a forward),
    so that the next forward gathers the shards again: needed after the shards were changed in place
    outside an optimizer step (ppo.line_search). Without FSDP2 nothing happens."""
    from torch.distributed.fsdp import FSDPModule

    for m in module.modules():
        if isinstance(m, FSDPModule):
            m.reshard()


def full_tensors(module):
    """(name, full tensor) for each entry of the module's state dict, one at a time: a sharded tensor is
    gathered (`full_tensor()`, a collective: every rank must iterate), so one tensor is in flight."""
    for name, value in module.state_dict().items():
        yield name, value.full_tensor() if hasattr(value, "full_tensor") else value


def full_state_dict(model) -> dict[str, torch.Tensor]:
    """The model's full (unsharded) weights, on every rank, on the CPU. A collective: every rank must call it."""
    return {k: v.detach().cpu() for k, v in full_tensors(model)}


def save_optimizer(model, optimizer, folder) -> None:
    """The optimizer's state, every rank's shards, in torch.distributed.checkpoint's format (a collective);
    it loads at any world size."""
    from torch.distributed.checkpoint import save
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    save({"optimizer": get_optimizer_state_dict(model, optimizer)}, checkpoint_id=str(folder))


def load_optimizer(model, optimizer, folder) -> bool:
    """`save_optimizer`'s checkpoint into this run's optimizer (resharded to this world size); False if none."""
    if not (folder / ".metadata").exists():
        return False
    from torch.distributed.checkpoint import load
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    state = {"optimizer": get_optimizer_state_dict(model, optimizer)}
    load(state, checkpoint_id=str(folder))
    set_optimizer_state_dict(model, optimizer, state["optimizer"])
    return True


class Lockstep:
    """The rank plumbing of one Eq. 5 update (ppo.ppo_update), so that the update itself reads as Eq. 5.

    Under torchrun FSDP2 runs collectives inside every forward and backward pass, so every rank must run
    as many passes as the busiest one: `batches` pads a rank's micro-batches with zero-weight blanks
    (key None). FSDP2 averages the gradients over the ranks, so `backward` scales the loss by the world
    size, and the mini-batch mean divides by every rank's sequences (`sequences`). In one process the
    blanks never occur, the scale is 1 and the sums are local.

    micro: this rank's micro-batches (lists of samples); collate(list) → a batch; blank: a one-sample
    list whose batch trains nothing."""

    def __init__(self, micro: list[list], collate, blank: list):
        self.micro, self.collate, self.blank = micro, collate, blank

    def batches(self, keys: list[int]):
        """(key, batch) for each micro-batch key, then (None, blank batch) up to the busiest rank's count."""
        for k in keys + [None] * (all_max(len(keys)) - len(keys)):
            yield k, self.collate(self.micro[k] if k is not None else self.blank)

    def sequences(self, keys: list[int]) -> int:
        """The sequences in these micro-batches, summed over every rank."""
        return int(all_sum(sum(len(self.micro[k]) for k in keys)))

    @staticmethod
    def backward(per_seq, key, n_seq: int) -> None:
        """Backward of this micro-batch's share of the mini-batch mean, Σ per_seq / n_seq (per_seq: [b]);
        a blank's loss is multiplied by 0 but still runs backward, for the collectives."""
        if key is None:
            per_seq = per_seq * 0.0
        (per_seq.sum() * world_size() / n_seq).backward()

    sum = staticmethod(all_sum)
    reshard = staticmethod(reshard)


class Synced:
    """The engine of a sharded model: it samples from a full copy of the weights (`engine.model`), which
    `sync()` refreshes from the shards after every update (a collective), then pushes to the engine."""

    def __init__(self, engine, trainer):
        self.engine, self.trainer, self.tokenizer = engine, trainer, engine.tokenizer
        if hasattr(engine, "server"):   # vLLM samples from its own copy: the full one only feeds it and the
            engine.model.to("cpu")      # checkpoints, so it waits in host memory, not on the GPU

    def generate(self, *args, **kw):
        return self.engine.generate(*args, **kw)

    def sync(self) -> None:
        """One tensor at a time (each `full_tensor()` is a collective): the transient is one tensor,
        not a full copy of the model."""
        target = self.engine.model.state_dict(keep_vars=True)
        with torch.no_grad():
            for name, full in full_tensors(self.trainer):
                target[name.removeprefix("model.")].copy_(full)
        self.engine.sync()
