"""loop.py with every engine scripted (tests/golden.py, indexed by prompt occurrence), for tests/test_dist.py:
run with torchrun for the multi-process loop, or plainly for the one-process reference."""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import golden  # noqa: E402
import loop  # noqa: E402
from plumbing import dist  # noqa: E402

if __name__ == "__main__":
    real = loop.make_engines

    def scripted(*a, **k):
        engines = real(*a, **k)
        print("[dist_loop] scripted over", ", ".join(f"{n} {type(e).__name__}" for n, e in engines.items()), flush=True)
        return {n: golden.Scripted(e, by_occurrence=True) for n, e in engines.items()}

    loop.make_engines = scripted
    dist.exit_process(loop.main(sys.argv[1:]))   # as loop.py exits
