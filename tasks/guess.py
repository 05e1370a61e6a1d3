"""An example setting, the template for your own (docs/ADDING_A_SETTING.md): guess a hidden number.

Multi-turn like the paper's agent settings (§4.1): P guesses a whole number from 1 to N and is told "higher",
"lower" or "correct"; R judges every guess; E moves a task along a ladder of ranges (`variants` mode). A guess's
exact label: good iff it lies in the range the answers so far leave open (R's Process Acc is exact). Splits: per
range the hidden numbers are shuffled once; train takes the first, in-domain eval the next (disjoint); OOD: the
ranges 64 and 128, never trained on.
"""

import random
from dataclasses import dataclass

from plumbing.engines import ANSWER_PREFIX, render_chat
from records import Step, Task
from tasks.agent import AgentAdapter, Episode, parse_choice

# the setting's CPU defaults (loop.Config fields; each still a flag): short answers, short episodes
DEFAULTS = {"tasks_per_iter": 4, "group_size": 8, "max_turns": 6, "max_new_tokens": 4, "m": 3, "rm_max_new_tokens": 3,
            "iterations": 8, "eval_every": 4, "eval_samples": 2, "eval_temperature": 1.0}
RANGES, OOD_RANGES = [4, 8, 16, 32], [64, 128]   # N of "from 1 to N": the ladder (easy → hard), and OOD
PER_SPLIT = 6                # hidden numbers per range and split (at most half the range)

POLICY_PROMPT = """I am thinking of a whole number from 1 to {n}. Find it in as few guesses as you can.
{history}Reply with your next guess in \\boxed{{}}."""
JUDGE_PROMPT = """A player guesses a hidden whole number from 1 to {n}.
{history}It guessed: {guess}. Was that a good guess, one that fits everything it had been told?
Answer \\boxed{{1}} (good) or \\boxed{{-1}} (bad)."""


def guess_task(n: int, secret: int, split: str, level: int | None) -> Task:
    return Task(f"{split}/N{n}/{secret}", f"a number from 1 to {n}", {"n": n, "secret": secret},
                ladder="guess" if level is not None else None, level=level)


def guess_sets() -> dict[str, list[Task]]:
    sets = {"train": [], "in_domain": [], "ood": []}
    for level, n in enumerate(RANGES + OOD_RANGES):
        secrets, k = random.Random(n).sample(range(1, n + 1), n), min(PER_SPLIT, n // 2)
        if n in OOD_RANGES:
            sets["ood"] += [guess_task(n, s, "ood", None) for s in secrets[:k]]
        else:
            sets["train"] += [guess_task(n, s, "train", level) for s in secrets[:k]]
            sets["in_domain"] += [guess_task(n, s, "in_domain", level) for s in secrets[k:2 * k]]
    return sets


@dataclass(kw_only=True)
class GuessEpisode(Episode):
    low: int                     # the range the answers so far leave open
    high: int
    told: list[str]              # "8: higher", ...


def history(ep: GuessEpisode) -> str:
    return f"Guesses so far: {'; '.join(ep.told)}.\n" if ep.told else ""


class Adapter(AgentAdapter):
    """Number guessing: multi-turn episodes, exact step labels, a ladder of ranges."""

    judge_prefix = ANSWER_PREFIX     # P's and R's answers are prefilled with "\boxed{" (as in the maze)

    def __init__(self, cfg):
        super().__init__(cfg)
        self.sets = guess_sets()

    def start(self, task: Task, k: int) -> GuessEpisode:
        return GuessEpisode(task=task, low=1, high=task.data["n"], told=[])

    def policy_prompt(self, ep: GuessEpisode, tokenizer) -> str:
        return render_chat(tokenizer, POLICY_PROMPT.format(n=ep.task.data["n"], history=history(ep)))

    def act(self, ep: GuessEpisode, prompt: str, completion) -> None:
        n, secret = ep.task.data["n"], ep.task.data["secret"]
        guess = parse_choice(completion.text, n)            # a number from 1 to n in the last \boxed{}, or None
        judge = JUDGE_PROMPT.format(n=n, history=history(ep), guess=guess if guess is not None else "nothing valid")
        label = 1 if guess is not None and ep.low <= guess <= ep.high else -1
        answer = "no valid guess" if guess is None else ("correct" if guess == secret else
                                                        "higher" if guess < secret else "lower")
        if guess is None:
            ep.invalid += 1
        elif guess < secret:
            ep.low = max(ep.low, guess + 1)
        elif guess > secret:
            ep.high = min(ep.high, guess - 1)
        ep.won = ep.done = guess == secret
        ep.told.append(f"{guess}: {answer}" if guess is not None else answer)
        ep.actions.append(ep.told[-1])
        ep.steps.append(Step.sampled(prompt, completion, observation=answer,
                                     judge_prompt=judge, label=label, parsed=guess is not None))

    def variant(self, task: Task, direction: str) -> Task | None:
        """The same position in the next range up or down the ladder."""
        level = task.level + (1 if direction == "harder" else -1) if task.level is not None else -1
        if not 0 <= level < len(RANGES):
            return None
        here = [t.id for t in self.sets["train"] if t.level == task.level]
        there = [t for t in self.sets["train"] if t.level == level]
        return there[here.index(task.id) % len(there)] if task.id in here else None
