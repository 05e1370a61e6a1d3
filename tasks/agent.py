"""The multi-turn agent settings' shared episode runner (paper §4.1: ALFWorld, OSWorld; also the maze).

An agent setting subclasses `AgentAdapter` and supplies four things: how an episode starts
(`start`), P's prompt at the current state (`policy_prompt`), how an answer changes the state
(`act`, which appends one Step, with the prompt R will judge it by), and how a finished episode
scores (`score`; O_τ = +1 iff score > 0). The rest is here, once:
- batched play: at every turn ONE generate call serves every live episode of every task;
- the groups of G rollouts per task;
- R's judgments (m per step, one call; reward_model.judge_steps), or the labels in their place (`--rm-oracle`);
- evaluation (success ± its standard error; R's Process Acc where steps carry labels, Outcome Acc, and
  Theorem 1's quantities);
- the critic feedback E reads about failed rollouts.
"""
from __future__ import annotations

from abc import abstractmethod
from contextlib import nullcontext
from dataclasses import dataclass, field

from plumbing.engines import ANSWER_PREFIX, boxed, prefilled
from records import Group, Rollout, Step, Task, stage
from reward_model import judge_steps, theorem1_metrics
from tasks import AdapterBase, accuracy, agent_metrics, bacc_se, eval_groups, process_counts

HISTORY = 3   # P and R see the last HISTORY actions


def parse_choice(text: str, n: int) -> int | None:
    """The 1-based index in the last \\boxed{k} of an answer, if 1 <= k <= n (a numbered-menu action)."""
    found = [b.strip() for b in boxed(text) if b.strip().isdecimal()]   # what int() reads: not "¹"
    return int(found[-1]) if found and 1 <= int(found[-1]) <= n else None


def label_verdicts(groups: list[Group], m: int) -> None:
    """--rm-oracle, a control outside the method: every step's m verdicts are its exact label, so R_τ in Eq. 1
    is O_τ + λ·label (integrated) or λ·label (stepwise), the step signal of a judge that is never wrong.

        >>> st = Step("", [], "", [], label=-1)
        >>> label_verdicts([Group(Task("t", "", {}), [Rollout("t", [st], -1)])], m=3); st.verdicts
        [-1, -1, -1]
    """
    for g in groups:
        for ro in g.rollouts:
            for st in ro.steps:
                if st.label not in (1, -1):
                    raise ValueError(f"--rm-oracle: a step of task {ro.task_id} has no exact label ({st.label!r})")
                st.verdicts = [st.label] * m


@dataclass(kw_only=True)
class Episode:
    """One live episode. Each setting subclasses it with the state it needs."""
    task: Task
    steps: list[Step] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)   # the actions taken, as P and R are shown them
    done: bool = False          # the episode ended before the turn limit (won, or the agent stopped)
    won: bool = False
    invalid: int = 0            # answers that named no valid action (a wasted step each)


class AgentAdapter(AdapterBase):
    """A multi-turn setting: R judges steps (Eq. 3). Steps may carry exact ground-truth labels (`Step.label`,
    for Process Acc); subclasses set `env_stage` to time their environment's share of a rollout, and
    `judge_prefix` to prefill R's answer."""

    judge_kind = "steps"
    env_stage: str | None = None
    judge_prefix = ""
    required = ("start", "policy_prompt", "act")   # checked at start-up (tasks.check)

    # — what a setting supplies —
    @abstractmethod
    def start(self, task: Task, k: int) -> Episode:
        """A new episode of `task`; k is its index in the group."""

    @abstractmethod
    def policy_prompt(self, ep: Episode, tokenizer) -> str:
        """P's chat-templated prompt at the episode's current state."""

    @abstractmethod
    def act(self, ep: Episode, prompt: str, completion) -> None:
        """Apply P's answer: change the state and append one Step, with the prompt R will judge it by."""

    def policy_images(self, ep: Episode) -> tuple:
        """The images P is shown with its prompt (GUI: the screenshot), read by a vision-language P only."""
        return ()

    def score(self, ep: Episode) -> float:
        """The episode's graded score; success (O_τ = +1) is score > 0."""
        return float(ep.won)

    def to_rollout(self, ep: Episode) -> Rollout:
        """A finished episode as a Rollout: its steps, O_τ and score, and what E's prompts and the logs read."""
        score = self.score(ep)
        return Rollout(ep.task.id, ep.steps, 1 if score > 0 else -1, score, actions=ep.actions, invalid=ep.invalid)

    def why_failed(self, ro: Rollout) -> str:
        return "not solved"

    def labelled(self, task: Task) -> bool:
        """Whether the task's steps get exact labels (scripts/premise.py plays only those tasks)."""
        return True

    # — P plays: every live episode in one generate call per turn —
    def rollout(self, tasks: list[Task], G: int, engine, cfg, temperature: float | None = None,
                max_turns: int | None = None) -> list[Group]:
        with self.timed():
            episodes = [self.start(t, k) for t in tasks for k in range(G)]
        self.play(episodes, engine, cfg, temperature, max_turns or cfg.max_turns)
        return [Group(t, [self.to_rollout(ep) for ep in episodes[i * G:(i + 1) * G]]) for i, t in enumerate(tasks)]

    def play(self, episodes: list[Episode], engine, cfg, temperature: float | None, max_turns: int) -> None:
        """Batched play: at every turn ONE generate call serves every live episode (not done and under
        max_turns steps), its answer prefilled with ANSWER_PREFIX; then `act_all` applies the answers."""
        for _ in range(max_turns):
            live = [ep for ep in episodes if not ep.done and len(ep.steps) < max_turns]
            if not live:
                return
            prompts = [self.policy_prompt(ep, engine.tokenizer) for ep in live]
            outs = prefilled(engine, prompts, ANSWER_PREFIX, n=1, max_new_tokens=cfg.max_new_tokens, top_p=cfg.top_p,
                             temperature=cfg.temperature if temperature is None else temperature,
                             images=[self.policy_images(ep) for ep in live])
            self.act_all([(ep, p + ANSWER_PREFIX, c) for ep, p, (c,) in zip(live, prompts, outs)])

    def act_all(self, answers: list[tuple]) -> None:
        """Apply one turn's answers, [(episode, prompt, completion)]; a setting may step them in parallel."""
        with self.timed():
            for a in answers:
                self.act(*a)

    def timed(self):
        """Adds the time spent in the block to the setting's environment stage, if it times one."""
        return stage(self.timings, self.env_stage) if self.env_stage else nullcontext()

    # — R judges every step m times, in one batched call —
    def judge(self, groups: list[Group], engine, cfg) -> None:
        if cfg.rm_oracle:
            label_verdicts(groups, cfg.m)
        else:
            judge_steps(groups, engine, cfg, prefix=self.judge_prefix)

    # — evaluation: the paper's Table 1 columns for an agent setting —
    def evaluate(self, sets: dict[str, list[Task]], policy, rm, cfg) -> dict:
        """Per eval set: success (± its standard error), and with R its Outcome Acc, and its Process Acc
        where the set's steps carry ground-truth labels (with the two references of tasks.agent_metrics:
        the majority label's share and the balanced accuracy; the balanced accuracy's standard error over the
        tasks, and each task's `process_counts`, which `tasks.gains` pairs against iteration 0)."""
        out = {}
        for name, mine in eval_groups(self, sets, policy, rm, cfg).items():
            out |= accuracy(f"{name}/success", mine)
            if rm is not None:
                rollouts = [ro for g in mine for ro in g.rollouts]
                m = agent_metrics(rollouts)
                labels = any(st.label is not None for ro in rollouts for st in ro.steps)
                if labels:
                    out |= {f"{name}/{k}": m[k] for k in ("process_acc", "process_majority", "process_bacc")}
                    out[f"{name}/process_counts_tasks"] = counts = [process_counts(g.rollouts) for g in mine]
                    out[f"{name}/process_bacc_se"] = bacc_se(counts)
                out[f"{name}/outcome_acc"] = m["outcome_acc"]
                out |= {f"{name}/{k}": v for k, v in theorem1_metrics(rollouts, cfg.m, labels).items()}
        return out

    # — critic feedback for E —
    def feedback(self, group: Group) -> str:
        lines = [f"rollout {k}: {self.why_failed(ro)} after {len(ro.steps)} steps ({ro.invalid} invalid "
                 f"answers); actions: {'; '.join(ro.actions[-4:])}"
                 for k, ro in enumerate(group.rollouts) if ro.outcome < 0]
        return "\n".join(lines[:4]) or f"all {len(group.rollouts)} rollouts succeeded"
