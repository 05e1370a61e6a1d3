"""loop.py with every engine scripted (tests/golden.py, indexed by prompt occurrence), for tests/test_dist.py:
run with torchrun for the multi-process loop, or plainly for the one-process reference."""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import golden  # noqa: E402
import loop  # noqa: E402

if __name__ == "__main__":
    real = loop.make_engines
    loop.make_engines = lambda *a, **k: {n: golden.Scripted(e, by_occurrence=True) for n, e in real(*a, **k).items()}
    sys.exit(loop.main(sys.argv[1:]))
