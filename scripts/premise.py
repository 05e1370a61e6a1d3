"""Premise check (paper §3.2, Eq. 3 and Theorem 1; not in the paper): before any training, can consistency
feedback teach R in this setting?

Per-step Eq. 3 z-scores R_τ·S_j over a step's m judgments, so only the sign of R_τ = O + λ·mean S survives, and at
m = 3, λ = 1 that is the sign of the outcome O: R is paid for predicting its rollout's outcome from each step
(docs/RM_SCREEN.md). It can learn step quality only as far as the steps' labels agree with their outcomes.

    python scripts/premise.py --task maze                      # any loop flag may follow (--m, --group-size, ...)
    python scripts/premise.py --task maze --tasks 24 --json premise.json

On the setting's validation split (never the eval sets) the initial P plays each task --group-size times and the
initial R judges every step m times; nothing trains. It prints:
  - P's base rate (the share of rollouts that succeed), its share of answers that are no valid action, and the
    share of tasks in R's accuracy band
    (reward_model.RM_ACC_RANGE: the only tasks Eq. 3 reads);
  - the fixed judges (`fixed_judges`): the label judge's μ against the outcomes, with Theorem 1's
    bound at the run's m; the outcome judge's balanced Process Acc, the most per-step Eq. 3 can teach; the
    easy-feature judge (no valid action is bad);
  - the untrained R: its balanced Process Acc, its μ against the labels, and μ/(1 − u), u its unparseable share
    (μ among the verdicts it gave), and what the first box of its unparseable answers holds (`first_boxes`);
and the gates a setting must pass before R is worth studying there (GATES). Settings with exact step labels only
(the maze; osworld's MiniWoB pages with a label rule, tasks/miniwob_env.RIGHT), and there only the labelled tasks.
"""
from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))   # run as a script from anywhere: the project's modules are one folder up

import loop  # noqa: E402
import reward_model  # noqa: E402
import tasks  # noqa: E402
from plumbing.config import parse_args  # noqa: E402
from plumbing.engines import boxed  # noqa: E402
from plumbing.models import machine, seed_everything  # noqa: E402

# key → (the least value that passes, what it says), fixed before any candidate setting was measured (issue 43)
GATES = {
    "oracle_outcome_bacc": (0.80, "what per-step Eq. 3 can teach at most: the outcome judge's balanced Process Acc"),
    "oracle_label_mu": (1.40, "steps and outcomes agree: the label judge's μ against the outcomes"),
    "in_band": (0.40, "tasks that feed R: the share of tasks in R's accuracy band"),
}


def fixed_judges(rollouts) -> dict:
    """Three judges that need no training, scored on labelled steps, to read R's numbers against:
    - label: says each step's exact label (the judge R would be at best);
    - outcome: says its rollout's outcome at every step, which is what per-step Eq. 3 pays in full (the sign of
      R_τ = O + λ·mean S is the sign of O at m = 3, λ = 1), so its balanced Process Acc is the most Eq. 3 can teach;
    - valid: says −1 exactly on the steps whose answer was no valid action (`Step.parsed`), the easiest feature.
    For each, oracle_<judge>_bacc is its balanced Process Acc against the labels (as `agent_metrics`), and
    oracle_<judge>_mu its Theorem 1 μ against the outcomes (as `theorem1_metrics`, one verdict per step): a judge
    with μ > 1 is one that consistency feedback ranks above a constant one.

        >>> from records import Rollout, Step
        >>> step = lambda y, ok=True: Step("", [], "", [], label=y, parsed=ok)
        >>> won = Rollout("t", [step(1), step(1), step(-1)], 1)
        >>> lost = Rollout("t", [step(1), step(-1, ok=False)], -1)
        >>> q = fixed_judges([won, lost])
        >>> round(q["oracle_label_mu"], 4)    # p₊ = P(label +1 | step of a success) = 2/3, p₋ = 1/2
        1.1667
        >>> round(q["oracle_outcome_bacc"], 4)   # hits on +1 steps 2/3, on −1 steps 1/2
        0.5833
        >>> q["oracle_valid_bacc"], q["oracle_valid_mu"]   # hits 3/3 and 1/2; p₊ = 3/3, p₋ = 1/2
        (0.75, 1.5)
    """
    judges = {"label": lambda st, o: st.label, "outcome": lambda st, o: 1 if o > 0 else -1,
              "valid": lambda st, o: 1 if st.parsed else -1}
    out = {}
    for name, judge in judges.items():   # each judge scored as an R with m = 1 on the labelled steps
        judged = [replace(ro, steps=[replace(st, verdicts=[judge(st, ro.outcome)]) for st in ro.steps
                                     if st.label is not None]) for ro in rollouts]
        out[f"oracle_{name}_bacc"] = tasks.agent_metrics(judged)["process_bacc"]
        out[f"oracle_{name}_mu"] = reward_model.theorem1_metrics(judged, 1, labels=False)["thm1_mu"]
    return out


def judged(rollouts, m: int) -> dict:
    """What R's verdicts on labelled rollouts score (shared with scripts/rm_screen.py): its Process Acc
    (`agent_metrics`), Theorem 1 against the outcomes and the labels (`theorem1_metrics`), its mean verdict and
    unparseable share, and the fixed judges on the same steps (`fixed_judges`)."""
    verdicts = [v for ro in rollouts for st in ro.steps for v in st.verdicts]
    nan = float("nan")
    return {**tasks.agent_metrics(rollouts), **reward_model.theorem1_metrics(rollouts, m, labels=True),
            "verdict_mean": statistics.fmean(verdicts) if verdicts else nan,
            "unparseable": statistics.fmean(v == 0 for v in verdicts) if verdicts else nan, **fixed_judges(rollouts)}


def first_boxes(rollouts, top: int = 4) -> list[tuple[str, float]]:
    """R's unparseable answers by what their first \\boxed{} holds ("none" when no box is closed): the `top`
    contents, each with its share of all of R's answers. Learning the verdict's format (one box, "1" or "-1")
    turns these answers into verdicts; this says which way they start.

        >>> from records import Completion, Rollout, Step
        >>> said = lambda *texts: [Completion(t, [], [], "stop") for t in texts]
        >>> st = Step("", [], "", [], verdicts=[1, 0, 0, 0], judgments=said(
        ...     "\\\\boxed{1}", "\\\\boxed{1} or \\\\boxed{-1}", "\\\\boxed{bad}", "\\\\boxed{1} (good) \\\\boxed{1}"))
        >>> first_boxes([Rollout("t", [st], 1)])
        [('1', 0.5), ('bad', 0.25)]
    """
    answers = [(c.text, v) for ro in rollouts for st in ro.steps for c, v in zip(st.judgments, st.verdicts)]
    first = collections.Counter((boxed(text) or ["none"])[0].strip() for text, v in answers if v == 0)
    return [(box, n / len(answers)) for box, n in first.most_common(top)]


def premise(groups, m: int, band: tuple[float, float] = reward_model.RM_ACC_RANGE) -> dict:
    """The premise numbers of judged, labelled groups (the module docstring), and pass_<key> for each of GATES.

        >>> from records import Group, Rollout, Step, Task
        >>> step = lambda y, vs: Step("", [], "", [], label=y, verdicts=vs)
        >>> won = Rollout("t", [step(1, [1, 1]), step(-1, [1, 0])], 1)        # a success with one bad step
        >>> lost = Rollout("t", [step(-1, [-1, 1])], -1)
        >>> q = premise([Group(Task("t", "", {}), [won, lost])], m=2)
        >>> q["base_rate"], q["in_band"], q["invalid"]        # 1 of 2 rollouts won; acc 0.5 is in band; all valid
        (0.5, 1.0, 0.0)
        >>> q["oracle_label_mu"], round(q["oracle_label_bound"], 4)   # p₊ = 1/2 (won's steps), p₋ = 1: 1 − exp(−2/16)
        (1.5, 0.1175)
        >>> q["oracle_outcome_bacc"]                          # label +1: 1 of 1 hit; label −1: 1 of 2
        0.75
        >>> q["rm_mu"], q["rm_unparseable"], q["rm_mu_parsed"]   # R: p₊ = 2/2 on +1 steps, p₋ = 1/4; u = 1/6
        (1.25, 0.16666666666666666, 1.5)
        >>> q["pass_oracle_outcome_bacc"], q["pass_oracle_label_mu"], q["pass_in_band"]
        (False, True, True)
    """
    rollouts = [ro for g in groups for ro in g.rollouts]
    r = judged(rollouts, m)
    out = {"tasks": len(groups), "rollouts": len(rollouts),
           "labelled_steps": sum(st.label is not None for ro in rollouts for st in ro.steps),
           "base_rate": statistics.fmean(ro.outcome > 0 for ro in rollouts),
           "invalid": statistics.fmean(not st.parsed for ro in rollouts for st in ro.steps),
           "in_band": statistics.fmean(band[0] <= g.acc <= band[1] for g in groups),
           "mixed": statistics.fmean(0 < g.acc < 1 for g in groups)}
    out |= {k: v for k, v in r.items() if k.startswith("oracle_")}
    out["oracle_label_bound"] = reward_model.theorem1_bound(out["oracle_label_mu"], m)
    u = r["unparseable"]
    out |= {"rm_bacc": r["process_bacc"], "rm_mu": r["thm1_label_mu"], "rm_mu_outcomes": r["thm1_mu"],
            "rm_unparseable": u, "rm_mu_parsed": r["thm1_label_mu"] / (1 - u) if u < 1 else float("nan"),
            "rm_verdict_mean": r["verdict_mean"], "rm_first_boxes": first_boxes(rollouts)}
    if len({st.label for ro in rollouts for st in ro.steps} - {None}) < 2:   # one label class: no balanced accuracy
        out |= {k: float("nan") for k in ("oracle_label_bacc", "oracle_outcome_bacc", "oracle_valid_bacc", "rm_bacc")}
    return out | {f"pass_{k}": out[k] >= least for k, (least, _) in GATES.items()}


def table(q: dict, m: int) -> str:
    """Markdown: each number, and each gate with its verdict."""
    rows = [("tasks × rollouts (labelled steps)", f"{q['tasks']} × {q['rollouts'] // max(q['tasks'], 1)} "
                                                 f"({q['labelled_steps']})"),
            ("P's base rate; its answers that are no valid action", f"{100 * q['base_rate']:.1f} %; "
                                                                    f"{100 * q['invalid']:.1f} %"),
            ("tasks in R's band / mixed", f"{100 * q['in_band']:.1f} % / {100 * q['mixed']:.1f} %"),
            (f"label judge: μ against the outcomes (Theorem 1 bound at m = {m})",
             f"{q['oracle_label_mu']:.2f} ({q['oracle_label_bound']:.3f})"),
            ("outcome judge: balanced Process Acc (Eq. 3's ceiling)", f"{100 * q['oracle_outcome_bacc']:.1f} %"),
            ("easy feature (no valid action is bad): balanced Process Acc, μ against the outcomes",
             f"{100 * q['oracle_valid_bacc']:.1f} %, {q['oracle_valid_mu']:.2f}"),
            ("untrained R: balanced Process Acc", f"{100 * q['rm_bacc']:.1f} %"),
            ("untrained R: μ against the labels, μ/(1 − u), unparseable u",
             f"{q['rm_mu']:.2f}, {q['rm_mu_parsed']:.2f}, {100 * q['rm_unparseable']:.1f} %"),
            ("untrained R: its unparseable answers' first box (share of all its answers)",
             ", ".join(f"`{box}` {100 * share:.1f} %" for box, share in q["rm_first_boxes"]) or "-")]
    lines = ["| quantity | value |", "|---|---|", *(f"| {a} | {b} |" for a, b in rows), "",
             "| gate | needs | has | passes |", "|---|---|---|---|"]
    lines += [f"| {what} | ≥ {least:g} | {q[k]:.3g} | {'yes' if q[f'pass_{k}'] else 'no'} |"
              for k, (least, what) in GATES.items()]
    return "\n".join(lines)


def labelled_validation(adapter) -> list:
    """The setting's validation tasks whose steps get exact labels (shared with scripts/rm_screen.py); [] for a
    setting with no validation split or no labels (agent settings say which tasks have labels)."""
    labelled = getattr(adapter, "labelled", lambda task: False)
    return [t for t in getattr(adapter, "sets", {}).get("validation") or [] if labelled(t)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    p.add_argument("--task", default="maze")
    p.add_argument("--tasks", type=int, default=0, help="validation tasks played, spread over the split (0: all)")
    p.add_argument("--json", default="", help="also write the numbers and the machine to this file")
    args, loop_flags = p.parse_known_args(argv)
    if args.tasks < 0:
        p.error("--tasks: must be >= 0")
    cfg = parse_args(["--task", args.task, "--validation", *loop_flags])
    adapter = tasks.get(cfg.task, cfg, env_mode=None)
    val = labelled_validation(adapter)
    if not val:
        sys.exit(f"error: --task {cfg.task}: the premise check needs a validation split with step labels "
                 "(maze, osworld)")
    if args.tasks:
        val = [val[k] for k in range(0, len(val), max(1, len(val) // args.tasks))][:args.tasks]
    models, engines = loop.build_models(cfg, True, cfg.model, cfg.rm_model or cfg.model)
    seed_everything(cfg.seed)
    groups = adapter.rollout(val, cfg.group_size, engines["policy"], cfg)
    adapter.judge(groups, engines["reward_model"], cfg)
    if not any(st.label is not None for g in groups for ro in g.rollouts for st in ro.steps):
        sys.exit(f"error: --task {cfg.task} has no step labels: the premise check needs exact step labels")
    q = premise(groups, cfg.m)
    print(table(q, cfg.m))
    if args.json:
        Path(args.json).write_text(json.dumps({"task": cfg.task, "flags": loop_flags, "m": cfg.m,
                                               "group_size": cfg.group_size, **q, "machine": machine()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
