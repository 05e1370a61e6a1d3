"""The data one iteration passes around (paper §3, Algorithm 1): tasks, the rollouts P plays on them
with R's verdicts on every step, the samples P and R train on, and the iteration's timings.

Plain dataclasses, no behaviour beyond a group's accuracy. The loop owns them; policy.py,
reward_model.py, environment.py and the adapters in tasks/ are functions over them.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass
class Task:
    id: str
    prompt: str                    # what the policy is asked (problem statement, goal, ...)
    data: dict                     # what the checker needs (tests, reference solution, scene, ...)
    ladder: str | None = None      # variants of one task, easy → hard (E's `variants` mode)
    level: int | None = None
    origin: str | None = None      # how it came to be: "original", "variant", "generated"


@dataclass(frozen=True)
class Sampling:
    """How an engine samples: `generate`'s keyword arguments besides the prompts, n and desc."""
    temperature: float
    top_p: float
    max_new_tokens: int


@dataclass
class Completion:
    """One sampled continuation: the text, its token ids and why it stopped."""
    text: str
    prompt_ids: list[int]
    ids: list[int]          # response token ids, ending with eos when finish_reason == "stop"
    finish_reason: str      # "stop" (eos) or "length" (max_new_tokens)
    vision: dict | None = None   # a vision-language model's prompt: its screenshots and patch grid (plumbing/vision.py)
    logprobs: list[float] | None = None   # the sampler's log π(token) of each of `ids` (raw logits, T = 1); None
                                          # where the engine gives none (transformers' generate for a VLM)


@dataclass
class Step:
    """One policy step; also one training sample of its own."""
    prompt: str
    prompt_ids: list[int]
    response: str
    response_ids: list[int]
    observation: str = ""                                     # what the environment answered
    judge_prompt: str = ""                                    # what R is asked about this step (agent tasks)
    verdicts: list[int] = field(default_factory=list)         # S_{τ_i,j} ∈ {+1, −1, 0}, j = 1..m
    judgments: list[Completion] = field(default_factory=list)  # R's m outputs for this step (agent tasks)
    reward: float = 0.0                                       # R_{τ_i}, Eq. 1
    advantage: float = 0.0                                    # Eq. 2
    label: int | None = None                                  # ground-truth step quality, where known
    parsed: bool = True                                       # P's answer was a valid action / a program
    vision: dict | None = None                                # P's screenshots (Completion.vision), GUI with a VLM
    judge_images: tuple = ()                                  # the screenshots R is shown with judge_prompt (GUI)
    logprobs: list[float] | None = None                       # the sampler's log-probs of response_ids (Completion)

    @classmethod
    def sampled(cls, prompt: str, c: Completion, **fields) -> "Step":
        """A step from P's completion `c` of `prompt`: its tokens, the sampler's log-probs and the screenshots."""
        return cls(prompt, c.prompt_ids, c.text, c.ids, logprobs=c.logprobs, vision=c.vision, **fields)


@dataclass
class Rollout:
    """One episode (agent settings) or one program (coding) of a group, with what E's feedback and the
    logs read about it. The agent fields stay empty in coding, the coding fields in the agent settings."""
    task_id: str
    steps: list[Step]
    outcome: int                  # O_τ ∈ {+1, −1}: +1 iff score > 0 (agents) or every GT test passes (coding)
    score: float = 0.0            # the graded outcome (agents: 1/0, OSWorld its checker's score; coding: GT share)
    actions: list[str] = field(default_factory=list)   # agents: each step's action as P and R were shown it
    invalid: int = 0              # agents: answers that named no valid action (a wasted step each)
    first_observation: str = ""   # agents: what the episode showed first (ALFWorld's room, OSWorld's instruction)
    crashed: str = ""             # agents: why the environment failed mid-episode ("" when it did not)
    program: str = ""             # coding: the program P wrote
    gt_passes: list[bool] = field(default_factory=list)  # coding: which GT tests the program passes


@dataclass
class Group:
    """The G rollouts of one task in one iteration, plus R's task-level outputs (coding: tests)."""
    task: Task
    rollouts: list[Rollout]
    tests: list[Completion] = field(default_factory=list)       # coding: R's m generated tests
    test_passes: list[list[bool]] = field(default_factory=list)  # coding: [program i][test k]

    @property
    def acc(self) -> float:
        return sum(r.outcome > 0 for r in self.rollouts) / max(len(self.rollouts), 1)


@dataclass
class Sample:
    """One training sequence for P or R: a constant advantage for every response token (Eq. 5)."""
    prompt_ids: list[int]
    response_ids: list[int]
    advantage: float
    vision: dict | None = None     # the prompt's screenshots (a vision-language model; Completion.vision)
    logprobs: list[float] | None = None   # the sampler's log-probs of response_ids, for the mismatch metric

    @property
    def sampler_known(self) -> bool:
        """Whether the sampler's log-prob of every response token is known (ppo.py's mismatch and π_old)."""
        return self.logprobs is not None and len(self.logprobs) == len(self.response_ids)


@contextmanager
def stage(timings: dict, name: str):
    """Adds the seconds spent inside the block to timings["time/<name>"] (an iteration's timings row)."""
    t0 = time.perf_counter()
    yield
    timings[f"time/{name}"] = timings.get(f"time/{name}", 0.0) + time.perf_counter() - t0
