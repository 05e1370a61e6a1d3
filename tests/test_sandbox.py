"""tasks/sandbox.py: hostile programs end as failed or limited runs, quickly, and the loop goes on.

Every hostile test ends by checking that a normal program still runs (`_alive`).
bwrap-specific tests are skipped only where bubblewrap is not installed; where it
is installed but unusable they fail (mode="bwrap" raises).
"""
from __future__ import annotations

import logging
import os
import socket
import sys
import time
import tracemalloc
import uuid
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tasks import sandbox  # noqa: E402
from tasks.sandbox import outputs_match, run_many, run_program  # noqa: E402

needs_bwrap = pytest.mark.skipif(sandbox._bwrap_path() is None,
                                 reason="bubblewrap (bwrap) is not installed: bwrap-only tests skipped")
MODES = [pytest.param("bwrap", marks=needs_bwrap), "rlimit"]
# The one-time rlimit warning is tested on its own (test_rlimit_warning_once).
pytestmark = pytest.mark.filterwarnings("ignore:SANDBOX RUNNING IN RLIMIT MODE:RuntimeWarning")

ECHO = "import sys\nsys.stdout.write(sys.stdin.read())\n"
LOOP = "while True:\n    pass\n"
LIMIT = 20.0            # generous bound: proves the kill happened, not a benchmark


def _alive(mode: str) -> None:
    r = run_program(ECHO, "still alive\n", timeout=10, mode=mode)
    assert r.status == "ok", r
    assert r.stdout == "still alive\n"


@pytest.mark.parametrize("mode", MODES)
def test_echo(mode):
    r = run_program(ECHO, "3\n1 2 3\nünïcödé\n", timeout=10, mode=mode)
    assert r.status == "ok" and r.returncode == 0, r
    assert outputs_match(r.stdout, "3\n1 2 3\nünïcödé")
    assert r.stderr == ""


@pytest.mark.parametrize("mode", MODES)
def test_error_exit(mode):
    r = run_program("import sys\nprint('partial')\nraise ValueError('boom')", timeout=10, mode=mode)
    assert r.status == "error" and r.returncode == 1
    assert r.stdout == "partial\n" and "ValueError: boom" in r.stderr


@pytest.mark.parametrize("mode", MODES)
def test_infinite_loop_times_out(mode):
    r = run_program(LOOP, timeout=1.0, mode=mode)
    assert r.status == "timeout" and r.returncode is None, r
    assert r.seconds < LIMIT
    _alive(mode)


@pytest.mark.parametrize("mode", MODES)
def test_memory_hog(mode):
    code = "chunks = []\nfor _ in range(80):\n    chunks.append(b'x' * (50 << 20))  # 4 GB in all\nprint('allocated')\n"
    r = run_program(code, timeout=10, mem_mb=512, mode=mode)
    assert r.status != "ok", r
    assert "allocated" not in r.stdout
    assert r.seconds < LIMIT
    _alive(mode)


@pytest.mark.parametrize("mode", MODES)
def test_fork_bomb(mode):
    # First a bounded probe: 50 children that sleep. No fork may succeed, and only
    # then is the real bomb run.
    probe = ("import os, sys, time\nn = 0\nfor _ in range(50):\n    try:\n        pid = os.fork()\n"
             "    except OSError as e:\n        print('refused', e.errno)\n        break\n"
             "    if pid == 0:\n        time.sleep(0.5)\n        os._exit(0)\n    n += 1\nprint('forked', n)\n")
    r = run_program(probe, timeout=5, mode=mode)
    assert "forked 0" in r.stdout, f"forks are not refused, not running the fork bomb: {r}"

    bomb = "import os\nwhile True:\n    os.fork()\n"
    r = run_program(bomb, timeout=2, mode=mode)
    assert r.status != "ok", r
    assert r.seconds < LIMIT
    _alive(mode)


@pytest.mark.parametrize("mode", MODES)
def test_huge_print_hits_output_limit(mode):
    code = "import sys\nchunk = 'x' * (1 << 20)\nfor _ in range(100):\n    sys.stdout.write(chunk)\n"
    tracemalloc.start()
    try:
        r = run_program(code, timeout=10, max_output=1_000_000, mode=mode)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert r.status == "output_limit" and r.returncode is None, r.status
    assert len(r.stdout) <= 1_000_000
    assert peak < 20 << 20, f"the parent held {peak} bytes for a 100 MB print"
    assert r.seconds < LIMIT
    _alive(mode)


@pytest.mark.parametrize("mode", MODES)
def test_stderr_flood_is_truncated(mode):
    r = run_program("import sys\nsys.stderr.write('e' * 500_000)\nsys.stderr.write('END')\n", timeout=10,
                    mode=mode)
    assert r.status == "ok"
    assert len(r.stderr) < 2 * sandbox.STDERR_KEEP and r.stderr.endswith("END")


@pytest.mark.parametrize("mode", MODES)
def test_temp_dir_removed_even_on_timeout(mode, monkeypatch):
    made = []
    real_mkdtemp = sandbox.tempfile.mkdtemp

    def mkdtemp(*a, **kw):
        made.append(real_mkdtemp(*a, **kw))
        return made[-1]

    monkeypatch.setattr(sandbox.tempfile, "mkdtemp", mkdtemp)
    code = ("import os\nopen('data.txt', 'w').write('x' * 1000)\nos.mkdir('locked')\n"
            "open('locked/f', 'w').write('y')\nos.chmod('locked', 0)\nprint('written', flush=True)\n" + LOOP)
    r = run_program(code, timeout=1.0, mode=mode)
    assert r.status == "timeout" and "written" in r.stdout, r
    assert len(made) == 1 and not os.path.exists(made[0])
    # And the next run does not see the files of the last one.
    r = run_program("import os\nprint(sorted(os.listdir('.')))", timeout=10, mode=mode)
    assert r.status == "ok" and r.stdout.strip() == "['main.py']"
    assert len(made) == 2 and not os.path.exists(made[1])


@needs_bwrap
def test_write_outside_temp_dir():
    tag = uuid.uuid4().hex[:8]
    targets = [ROOT / f"should_not_exist_{tag}", Path(f"/etc/should_not_exist_{tag}")]
    code = ("import sys\nok = 0\nfor p in sys.argv[1:] or %r:\n    try:\n        open(p, 'w').write('pwned')\n"
            "        print('wrote', p)\n    except OSError as e:\n        print('refused', p, e)\n    else:\n"
            "        ok += 1\nsys.exit(0 if ok == 2 else 1)\n") % [str(t) for t in targets]
    try:
        r = run_program(code, timeout=10, mode="bwrap")
        assert r.status == "error", r
        assert "wrote" not in r.stdout and r.stdout.count("refused") == 2
        for t in targets:
            assert not t.exists(), t
    finally:
        for t in targets:
            if t.exists():
                t.unlink()
    _alive("bwrap")


@needs_bwrap
def test_no_network():
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", 0))
    server.listen(5)
    server.settimeout(2.0)
    port = server.getsockname()[1]
    try:
        # The server works from outside the sandbox ...
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            conn, _ = server.accept()
            conn.close()
        # ... and gets nothing from inside it.
        code = ("import socket, sys\nok = False\n"
                f"for addr in [('127.0.0.1', {port}), ('1.1.1.1', 80), ('8.8.8.8', 53)]:\n"
                "    try:\n        socket.create_connection(addr, timeout=2).close()\n"
                "        print('connected', addr)\n        ok = True\n"
                "    except OSError as e:\n        print('refused', addr, e)\n"
                "sys.exit(0 if ok else 1)\n")
        r = run_program(code, timeout=15, mode="bwrap")
        assert r.status == "error", r
        assert "connected" not in r.stdout and r.stdout.count("refused") == 3
        server.settimeout(0.5)
        with pytest.raises(socket.timeout):
            conn, _ = server.accept()
            conn.close()
    finally:
        server.close()
    _alive("bwrap")


@needs_bwrap
def test_secret_environment_not_visible(monkeypatch):
    secret = "s3cr3t-" + uuid.uuid4().hex
    monkeypatch.setenv("RLANYTHING_TEST_SECRET", secret)
    code = ("import glob, os\nprint(dict(os.environ))\nn = 0\n"
            "for p in glob.glob('/proc/*/environ') + ['/proc/%d/environ' % os.getppid()]:\n"
            "    try:\n        print(p, open(p, 'rb').read())\n        n += 1\n"
            "    except OSError as e:\n        print(p, e)\nprint('readable', n)\n")
    r = run_program(code, timeout=10, mode="bwrap")
    assert r.status == "ok", r
    assert "readable 0" not in r.stdout          # it did read something: the check is not vacuous
    assert secret not in r.stdout and secret not in r.stderr
    assert "RLANYTHING_TEST_SECRET" not in r.stdout


def test_rlimit_environment_is_clean(monkeypatch):
    secret = "s3cr3t-" + uuid.uuid4().hex
    monkeypatch.setenv("RLANYTHING_TEST_SECRET", secret)
    r = run_program("import os\nprint(sorted(os.environ))", timeout=10, mode="rlimit")
    assert r.status == "ok" and secret not in r.stdout and "RLANYTHING_TEST_SECRET" not in r.stdout


@needs_bwrap
def test_timeout_kills_the_whole_sandbox(monkeypatch):
    # Without the seccomp filter, forks succeed: 20 children exec `sleep 60 <marker>`.
    # After the timeout none may be left (pid namespace torn down with bwrap).
    monkeypatch.setattr(sandbox, "_FILTER", None)
    marker = ("0.%d" % uuid.uuid4().int)[:20]       # `sleep 60 0.123...` sleeps 60.123 s
    code = ("import os, time\nfor i in range(20):\n    if os.fork() == 0:\n"
            f"        os.execv('/bin/sleep', ['sleep', '60', '{marker}'])\n"
            "print('forked 20', flush=True)\ntime.sleep(60)\n")
    r = run_program(code, timeout=1.5, mode="bwrap")
    assert r.status == "timeout" and "forked 20" in r.stdout, r
    deadline, left = time.monotonic() + 10, None
    while time.monotonic() < deadline:
        left = []
        for pid in os.listdir("/proc"):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if marker.encode() in f.read():
                        left.append(pid)
            except OSError:
                pass
        if not left:
            break
        time.sleep(0.1)
    assert not left, f"sandbox processes survived the timeout: {left}"
    monkeypatch.undo()
    _alive("bwrap")


@pytest.mark.parametrize("mode", MODES)
def test_run_many_keeps_order(mode):
    jobs = [(ECHO, "a\n"),
            (LOOP, ""),
            (ECHO, "b\n"),
            ("raise SystemExit(3)", ""),
            ("print('x' * 2_000_000)", ""),
            ("import os\nwhile True:\n    os.fork()\n", ""),
            (ECHO, "c\n")]
    results = run_many(jobs, timeout=1.5, workers=2, mode=mode)
    assert [r.status for r in results] == ["ok", "timeout", "ok", "error", "output_limit", "error", "ok"]
    assert [r.stdout for r in results[::2] if r.status == "ok"] == ["a\n", "b\n", "c\n"]
    assert results[3].returncode == 3
    assert run_many([], mode=mode) == []


def test_mode_detection_and_forcing(monkeypatch):
    monkeypatch.setenv(sandbox.ENV_VAR, "rlimit")
    assert sandbox.mode() == "rlimit"
    r = run_program("import os\nprint(os.getcwd())", timeout=10)
    assert r.status == "ok" and r.stdout.strip() != sandbox.INNER_DIR
    monkeypatch.setenv(sandbox.ENV_VAR, "nonsense")
    with pytest.raises(ValueError):
        sandbox.mode()
    monkeypatch.delenv(sandbox.ENV_VAR)
    expected = "rlimit" if sandbox._bwrap_path() is None else "bwrap"
    assert sandbox.mode() == expected
    assert sandbox.mode("rlimit") == "rlimit"


def test_rlimit_warning_once(monkeypatch, caplog):
    monkeypatch.setattr(sandbox, "_warned", False)
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.WARNING, "tasks.sandbox"):
        warnings.simplefilter("always")
        for _ in range(2):
            assert run_program(ECHO, "x", timeout=10, mode="rlimit").status == "ok"
        assert sandbox.mode("rlimit") == "rlimit"
    ours = [w for w in caught if "RLIMIT MODE" in str(w.message)]
    assert len(ours) == 1 and issubclass(ours[0].category, RuntimeWarning)
    assert sum("RLIMIT MODE" in rec.getMessage() for rec in caplog.records) == 1


def test_unusable_bwrap_falls_back_with_warning(monkeypatch):
    monkeypatch.setattr(sandbox, "_bwrap_state", (False, "simulated probe failure"))
    monkeypatch.setattr(sandbox, "_warned", False)
    monkeypatch.delenv(sandbox.ENV_VAR, raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert sandbox.mode() == "rlimit"
        r = run_program(ECHO, "fallback", timeout=10)
    assert r.status == "ok" and r.stdout == "fallback"
    assert [str(w.message) for w in caught if "simulated probe failure" in str(w.message)]
    with pytest.raises(RuntimeError, match="simulated probe failure"):
        sandbox.mode("bwrap")


def test_outputs_match():
    assert outputs_match("1 2 \n3\n\n\n", "1 2\n3")
    assert outputs_match("\n\nyes\r\n", "yes")
    assert outputs_match("", "\n\n")
    assert not outputs_match("1 2\n3", "1 2 3")
    assert not outputs_match("a\n\nb", "a\nb")          # inner blank lines count
    assert not outputs_match(" a", "a")                 # leading spaces count
