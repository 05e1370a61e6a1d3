"""A short loop run whose every completion is scripted, so its metrics depend on the code's logic only:
the layout test replays it and compares against the metrics recorded before a refactor.

`python tests/golden.py` rewrites the recorded files (do it only for a change meant to alter behaviour).
Each run is the full method for 2 iterations on the tiny model, with real training (Eq. 5 on the tiny
model's weights) and E's ladder moves: maze (multi-turn, R judges steps, eval included) and livebench
(coding, R writes tests, the sandbox runs them)."""
import json
import random
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import loop  # noqa: E402
from records import Completion  # noqa: E402
from tasks import maze as mz  # noqa: E402
from tasks.livebench import given_lines, load_builtin  # noqa: E402

DATA = ROOT / "tests" / "data"
ARGS = {
    "maze": ["--task", "maze", "--model", "tiny", "--engine", "hf", "--iterations", "2", "--tasks-per-iter", "3",
             "--group-size", "4", "--m", "2", "--max-turns", "4", "--eval-tasks", "3", "--eval-samples", "2",
             "--eval-every", "2", "--lr", "1e-3", "--rm-lr", "1e-3", "--no-dither"],
    "livebench": ["--task", "livebench", "--model", "tiny", "--engine", "hf", "--iterations", "2",
                  "--tasks-per-iter", "3", "--group-size", "4", "--m", "2", "--eval-every", "-1",
                  "--sandbox-timeout", "3", "--lr", "1e-3", "--rm-lr", "1e-3", "--no-dither", "--target-kl", "0"],
}
# wall-clock and memory: not part of the behaviour
VOLATILE = ("time/", "sys/", "sandbox/timeout_seconds", "sandbox/slowest_ok_seconds")
# --no-dither: the same weights on every machine (with bf16, --dither would move them at the start of a run);
# --target-kl 0: every scripted update kept whole, as recorded


def continuation(solution: str, prompt: str) -> str:
    """A correct program's text after `prompt`: under code completion the prompt ends with the given lines
    and P continues them; otherwise the whole solution."""
    given = given_lines(solution)
    return solution[len(given):] if given and prompt.endswith(given) else solution


class Scripted:
    """Stands in for every engine: the text of each completion is a function of (prompt, its index in the call) only,
    the token ids are the tokenizer's. Maze: P's even samples move on a shortest path, odd ones take
    move 1; R's verdicts alternate with the prompt. Coding: P's even samples are the reference
    solution, odd ones a wrong program; R's tests are correct for even samples."""

    def __init__(self, inner, by_occurrence: bool = False):
        # by_occurrence: index P's completion by how often its prompt came before in the call, and R's by its
        # sample index alone, instead of by the place in the call; then a rank that plays a share of the
        # tasks answers as one process does (two tasks with the same maze may sit on different ranks)
        self.inner, self.tokenizer, self.by_occurrence = inner, inner.tokenizer, by_occurrence
        self.model = inner.model
        rows = load_builtin()
        self.solutions = {r["prompt"]: r["solution"] for r in rows}
        self.tests = {r["prompt"]: (r["tests"][0]["input"], r["tests"][0]["output"]) for r in rows}

    def sync(self):
        self.inner.sync()

    def text(self, prompt: str, j: int, r: int = 0) -> str:
        """j: the completion's index; r: its sample index for this prompt (0..n-1)."""
        if "You walk through a grid maze" in prompt:
            if j % 2:
                return "1}"
            grid = prompt.split("'G' goal):\n")[1].split("\nThe goal is at")[0].splitlines()
            dist = mz.distances(grid)
            moves = re.findall(r"(\d+)\. \w+ → row (\d+), column (\d+)", prompt)
            return min(moves, key=lambda m: dist.get((int(m[1]), int(m[2])), 10**9))[0] + "}"
        if "grid maze" in prompt:   # R judging a step
            return "1}" if (len(prompt) + (r if self.by_occurrence else j)) % 3 else "-1}"
        key = next((k for k in self.solutions if k in prompt), None)
        if "unit test" in prompt and key is not None:
            stdin, out = self.tests[key]
            return f"{stdin}```\nOutput:\n```\n{out if j % 2 == 0 else 'wrong'}\n```"
        if key is not None:
            return (continuation(self.solutions[key], prompt) if j % 2 == 0 else "print(0)") + "\n```"
        return "no}"

    def generate(self, prompts, n=1, **kw):
        out, seen = [], {}
        for i, p in enumerate(prompts):   # i: the episode's place in a batched turn
            if self.by_occurrence:
                i = seen[p] = seen.get(p, -1) + 1
            prompt_ids = self.tokenizer(p, add_special_tokens=False)["input_ids"]
            out.append([Completion(t, prompt_ids, self.tokenizer(t, add_special_tokens=False)["input_ids"], "stop")
                        for t in (self.text(p, i + j, j) for j in range(n))])
        return out


def run(task: str, runs_dir: Path) -> list[dict]:
    """The scripted run's metrics.jsonl rows, without the volatile keys."""
    real = loop.make_engines
    loop.make_engines = lambda *a, **k: {name: Scripted(e) for name, e in real(*a, **k).items()}
    try:
        random.seed(0)
        cfg = loop.parse_args([*ARGS[task], "--runs-dir", str(runs_dir), "--name", f"golden-{task}"])
        path = loop.train(cfg)
    finally:
        loop.make_engines = real
    rows = [json.loads(x) for x in (path / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in rows]


if __name__ == "__main__":
    import tempfile
    DATA.mkdir(exist_ok=True)
    for task in ARGS:
        with tempfile.TemporaryDirectory() as d:
            rows = run(task, Path(d))
        (DATA / f"golden-{task}.jsonl").write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
        print(f"{task}: {len(rows)} rows recorded")
