"""Plumbing, skip on a first read: the run folder (runs/<name>/). Config, metrics, TensorBoard, the
learning curve, readable samples, and the atomic checkpoint a killed run resumes from (loop.py's
step 7 of Algorithm 1).
"""
from __future__ import annotations

import dataclasses
import fcntl
import json
import math
import os
import shutil
import threading
import time
from pathlib import Path

import torch

from plumbing import dist
import environment as env
import tasks
from plumbing.config import Config, ConfigError
from plumbing.models import machine, save
from plumbing.logprobs import LogProbs
from records import stage

class Run:
    """runs/<name>/: config.json, machine.jsonl, metrics.jsonl, tb/, curve.png, samples/, and ckpt/ — the last finished
    iteration's P, R (HF format + optimizer), environment slots and state, swapped in atomically.

    The folder is locked (`.lock`, fcntl.flock) for the run's lifetime: a second launch on it stops
    with the holder's pid. A folder with no finished iteration (killed during the initial eval) is
    started again from scratch by --resume, with its saved config."""

    def __init__(self, cfg: Config):
        self.cfg, self.dir = cfg, Path(cfg.runs_dir) / cfg.name
        self.ckpt, self.tb, self.writer = self.dir / "ckpt", None, dist.rank() == 0
        if not self.writer:   # under torchrun rank 0 owns the folder; the other ranks read the checkpoint
            dist.gather(None)  # after rank 0 has checked and recovered it
            self.fresh = not (self.ckpt / "state.json").exists()
            return
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._lock = open(self.dir / ".lock", "a+")
        except OSError as e:
            raise ConfigError(f"cannot create the run folder {self.dir}: {e.strerror}") from None
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.seek(0)
            holder = self._lock.read().strip() or "?"
            self._lock.close()
            raise ConfigError(f"run folder {self.dir} is in use by another run (pid {holder})") from None
        self._lock.truncate(0)
        self._lock.write(str(os.getpid()))
        self._lock.flush()
        self._recover()
        self.fresh = not (self.ckpt / "state.json").exists()  # no finished iteration: start from scratch
        if not cfg.resume and any(p.name != ".lock" for p in self.dir.iterdir()):
            self.close()
            raise ConfigError(f"run folder {self.dir} exists: pass --resume to continue it"
                              + (" (it has no finished iteration: it restarts from scratch with its saved config)"
                                 if self.fresh else "") + ", or another --name")
        dist.gather(None)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.tb is not None:
            self.tb.close()
        self.close()

    def close(self) -> None:
        """Release the lock; a folder that holds nothing else (a launch that failed early) is removed."""
        if not self.writer or self._lock.closed:
            return
        if [p.name for p in self.dir.iterdir()] == [".lock"]:
            shutil.rmtree(self.dir, ignore_errors=True)
        self._lock.close()

    def create(self, start: int = 0) -> None:
        """Called once the task and the models loaded, so a bad flag leaves no folder behind. `start`: the
        last finished iteration (TensorBoard drops what a killed run logged after it)."""
        from torch.utils.tensorboard import SummaryWriter

        if not self.writer:
            return
        (self.dir / "samples").mkdir(parents=True, exist_ok=True)
        (self.dir / "config.json").write_text(json.dumps(dataclasses.asdict(self.cfg), indent=2))
        with open(self.dir / "machine.jsonl", "a") as f:   # one line per launch: a resumed run may move
            f.write(json.dumps({"from_iteration": start, **machine()}) + "\n")
        self.tb = SummaryWriter(self.dir / "tb", purge_step=start + 1 if self.cfg.resume else None)

    def finish(self, iteration: int, row: dict, models: dict, slots, t_start: float | None = None) -> None:
        """Close an iteration: write its checkpoint, its metrics line (metrics.jsonl, TensorBoard, the
        curve), then make the checkpoint current. Adds time/checkpoint and time/iteration to the row."""
        with stage(row, "checkpoint"):
            if self.writer:
                self.prepare(models, slots)
            if dist.active():   # every rank writes its optimizer shards into ckpt.tmp (a collective)
                dist.barrier()   # ... once rank 0 has recreated ckpt.tmp, or its rmtree races their mkdirs
                for name, m in models.items():
                    if m.optimizer is not None:
                        dist.save_optimizer(m.module, m.optimizer, self.dir / "ckpt.tmp" / name / "optimizer")
        if not self.writer:
            return
        if t_start is not None:
            row["time/iteration"] = time.perf_counter() - t_start
        row = {"iteration": iteration, **row}
        for k, v in row.items():
            if isinstance(v, (int, float)) and k != "iteration" and not math.isnan(v):
                self.tb.add_scalar(k if "/" in k else f"charts/{k}", v, iteration)
        self.tb.flush()
        self.log(row)
        plot_curve(self.metrics(), self.dir / "curve.png")
        self.commit(iteration)

    def _recover(self):
        """A kill between the two renames of `commit` leaves ckpt.old (+ maybe a complete ckpt.tmp)."""
        tmp, old = self.dir / "ckpt.tmp", self.dir / "ckpt.old"
        if not self.ckpt.exists():
            if (tmp / "state.json").exists():
                os.replace(tmp, self.ckpt)
            elif old.exists():
                os.replace(old, self.ckpt)
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)

    def state(self) -> dict:
        return self.read_json("state.json")

    def slots(self) -> dict:
        """E's slots as the checkpoint left them."""
        try:
            return env.slots_from_json(self.read_json("env_state.json"))
        except (TypeError, KeyError, AttributeError) as e:
            raise ConfigError(f"--resume: {self.ckpt / 'env_state.json'} is damaged ({type(e).__name__})") from None

    def read_json(self, name: str):
        """A file of the checkpoint; a damaged one is a one-line error, not a traceback."""
        try:
            return json.loads((self.ckpt / name).read_text())
        except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ConfigError(f"--resume: {self.ckpt / name} is damaged ({type(e).__name__}); "
                              f"the checkpoint cannot be resumed") from None

    def restart(self) -> None:
        """--resume of a folder with no finished iteration: drop what the killed attempt wrote."""
        if not self.writer:
            return
        for name in ("metrics.jsonl", "curve.png"):
            (self.dir / name).unlink(missing_ok=True)
        for name in ("tb", "samples", "ckpt.tmp"):
            shutil.rmtree(self.dir / name, ignore_errors=True)

    def prepare(self, models: dict, slots) -> None:
        """Write the iteration's checkpoint to ckpt.tmp (the slow part); `commit` makes it current."""
        tmp = self.dir / "ckpt.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        for name, m in models.items():
            if m.saved and not dist.active():   # not updated since the last checkpoint: link its files (R, most
                shutil.copytree(self.ckpt / name, tmp / name, copy_function=os.link)   # iterations), no rewrite
            else:
                save(m.model, m.tokenizer, tmp / name, None if dist.active() else m.optimizer)   # torchrun: `finish`
            m.saved = True
        (tmp / "env_state.json").write_text(json.dumps(env.slots_to_json(slots), indent=1))

    def commit(self, iteration: int) -> None:
        """Called after the iteration's metrics line is written."""
        tmp, old = self.dir / "ckpt.tmp", self.dir / "ckpt.old"
        (tmp / "state.json").write_text(json.dumps({"iteration": iteration}))  # written last: marks tmp complete
        if self.ckpt.exists():
            os.replace(self.ckpt, old)
        os.replace(tmp, self.ckpt)
        shutil.rmtree(old, ignore_errors=True)

    def samples(self, groups, iteration: int) -> None:
        if self.writer:
            write_samples(groups, self.dir / "samples" / f"iter_{iteration:04d}.txt")

    def metrics(self) -> list[dict]:
        path = self.dir / "metrics.jsonl"
        return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []

    def truncate_metrics(self, last: int) -> None:
        """On resume: drop lines of an iteration that never finished (it will be redone)."""
        if not self.writer:
            return
        kept = [r for r in self.metrics() if r["iteration"] <= last]
        (self.dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))

    def log(self, row: dict) -> None:
        with open(self.dir / "metrics.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")


INTERRUPTED = threading.Event()


def on_sigint(*_):
    """loop.py's Ctrl-C: KeyboardInterrupt, as Python's own handler raises it, and remembered, because one that lands
    inside a destructor (a progress bar's __del__) is printed and dropped there: `train` stops after the iteration."""
    INTERRUPTED.set()
    raise KeyboardInterrupt


# curve.png's dynamics panels, for P and for R: shares on a linear axis (a collapse takes the unparseable
# share to 1, a constant R its mean verdict to ±1), then entropy and the update's KL on a log axis, then how far
# the engine's sampling policy was from the trainer's (mean |Δ log p| and k3 KL: ppo.sampler_mismatch), then
# R's Theorem 1 quantities (a constant R has μ = 1 and 𝒜 = 0; reward_model.theorem1), and in coding the share of
# groups in R's band, of those whose tests tie, and of R's tests that are distinct and correct.
DYNAMICS = [("P: answers and update", ["train/policy_unparseable", "losses/policy_update_clipfrac"], (0, 1)),
            ("R: answers and update", ["train/rm_unparseable", "losses/rm_update_clipfrac", "train/verdict_mean"],
             (-1, 1)),
            ("P: entropy and KL per update", ["losses/policy_entropy", "losses/policy_update_kl"], "log"),
            ("R: entropy and KL per update", ["losses/rm_entropy", "losses/rm_update_kl"], "log"),
            ("sampler vs trainer before each update (0: on-policy)",
             ["losses/policy_sampler_abs_diff", "losses/policy_sampler_kl", "losses/rm_sampler_abs_diff",
              "losses/rm_sampler_kl"], "log"),
            ("R: Theorem 1, training steps (μ > 1: beats a constant)",
             ["train/thm1_mu", "train/thm1_precision", "train/thm1_bound", "train/thm1_label_mu"], (0, 2)),
            ("coding R: where its signal goes (rm_funnel)",
             ["train/rm_band", "train/rm_tied", "train/rm_tied_other", "train/rm_tests_distinct",
              "train/rm_tests_correct"], (0, 1))]


def plot_curve(rows: list[dict], path: Path) -> None:
    """Learning curve: training accuracy and the paper's Table 1 metrics per iteration (top), and P's and
    R's dynamics (`DYNAMICS`: docs/METHOD.md, "Training dynamics")."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    evals = sorted({k for r in rows for k in r if k.startswith("eval/") and tasks.headline(k)})
    thm1 = sorted({k for r in rows for k in r if k.startswith("eval/") and k.endswith(("thm1_mu", "thm1_label_mu"))})
    fig, axes = plt.subplots(5, 2, figsize=(11, 16))
    panels = [("training accuracy (active tasks)", ["train/acc"], None),
              ("eval: the paper's Table 1 columns", evals, None), *DYNAMICS,
              ("R: Theorem 1's μ at eval (_label_: against step labels)", thm1, (0, 2))]
    for ax, (title, group, scale) in zip(axes.flat, panels):   # scale: "log", fixed (low, high) limits, or None
        for k in group:
            pts = [(r["iteration"], r[k]) for r in rows if k in r and not math.isnan(r[k]) and (scale != "log" or r[k] > 0)]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=k)
        ax.set_title(title)
        ax.set_xlabel("iteration")
        if ax.lines:
            ax.legend(fontsize=7)
            if scale == "log":
                ax.set_yscale("log")
            elif scale:
                ax.set_ylim(scale[0] - 0.03, scale[1] + 0.03)
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(panels):]:
        ax.axis("off")
    fig.subplots_adjust(left=0.06, right=0.98, bottom=0.03, top=0.98, hspace=0.3, wspace=0.15)  # tight_layout's cost
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_samples(groups, path: Path, limit: int = 4) -> None:
    """Readable rollouts: the prompt, each response with its outcome, verdicts, reward and advantage."""
    lines = []
    for g in groups[:limit]:
        lines += ["=" * 100, f"TASK {g.task.id} (acc {g.acc:.2f})", g.task.prompt.strip(), ""]
        for r, ro in enumerate(g.rollouts):
            for k, st in enumerate(ro.steps):
                lines += [f"--- rollout {r} step {k} | outcome {ro.outcome:+d} | verdicts {st.verdicts} | "
                          f"R {st.reward:+.3f} | A {st.advantage:+.3f} | {st.observation}", st.response.strip()]
        for k, t in enumerate(g.tests):
            lines += [f"--- R's test {k}", t.text.strip()]
    path.write_text("\n".join(lines) + "\n")


def load_optimizer(optimizer, path: str | Path, model=None) -> bool:
    """The optimizer state saved next to a checkpoint (optimizer.pt; under torchrun the sharded
    optimizer/ folder, dist.save_optimizer); False when there is none."""
    file = Path(path) / "optimizer.pt"
    if file.exists() and not dist.active():
        optimizer.load_state_dict(torch.load(file, weights_only=True))
        return True
    root = model if isinstance(model, LogProbs) else LogProbs(model)   # the names the shards were saved under
    return dist.load_optimizer(root, optimizer, Path(path) / "optimizer")
