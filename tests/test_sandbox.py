"""tasks/sandbox.py: hostile programs end as failed or limited runs, quickly, and the loop goes on.

Every hostile test ends by checking that a normal program still runs (`_alive`).
bwrap-specific tests are skipped only where bubblewrap is not installed; where it
is installed but unusable they fail (mode="bwrap" raises). The identity tests need
root (CI runs as root): they check what a program gets when the trainer is root,
and run a second trainer as an unprivileged uid (TEST_UID) for the user's case.
"""
from __future__ import annotations

import errno
import functools
import json
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
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

IS_ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not IS_ROOT, reason="needs root: the sandbox of a root trainer (CI runs as root)")
TEST_UID = 4242         # an unprivileged uid that owns nothing, for a trainer that runs as a user
WHO = ["root", "user"]

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


@pytest.mark.parametrize("mode", MODES)
def test_no_network(mode):
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
        r = run_program(code, timeout=15, mode=mode)
        assert r.status == "error", r
        assert "connected" not in r.stdout and r.stdout.count("refused") == 3
        server.settimeout(0.5)
        with pytest.raises(socket.timeout):
            conn, _ = server.accept()
            conn.close()
    finally:
        server.close()
    _alive(mode)


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


@pytest.mark.parametrize("mode", MODES)
def test_run_many_counts_runs_and_timeouts(mode):
    sandbox.pop_stats()
    results = run_many([(ECHO, "a\n"), (LOOP, ""), ("raise SystemExit(3)", "")], timeout=1.0, workers=2, mode=mode)
    stats = sandbox.pop_stats()
    assert stats["runs"] == 3 and stats["timeouts"] == 1
    assert stats["timeout_seconds"] == results[1].seconds >= 1.0
    assert stats["slowest_ok_seconds"] == results[0].seconds > 0
    assert sandbox.pop_stats() == {"runs": 0, "timeouts": 0, "timeout_seconds": 0.0, "slowest_ok_seconds": 0.0,
                                   "reused": 0}


@pytest.mark.parametrize("mode", MODES)
def test_run_many_runs_identical_jobs_once(mode):
    """A job equal to an earlier one (same program, same input) is answered by that run's result, in its place."""
    sandbox.pop_stats()
    jobs = [(ECHO, "a\n"), (ECHO, "b\n"), (ECHO, "a\n"), ("raise SystemExit(3)", ""), (ECHO, "a\n")]
    results = run_many(jobs, timeout=2.0, workers=2, mode=mode)
    assert [r.stdout for r in results] == ["a\n", "b\n", "a\n", "", "a\n"]
    assert results[0] is results[2] is results[4] and results[3].returncode == 3
    stats = sandbox.pop_stats()
    assert stats["runs"] == 3 and stats["reused"] == 2


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
    monkeypatch.setitem(sandbox._probes, "bwrap", (False, "simulated probe failure"))
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


# ----------------------------------------------------------------------------- identity, other processes

# A trainer of its own: loads tasks/sandbox.py (standard library only), runs one program, then an echo,
# and prints what happened as JSON. Run as root or as TEST_UID, in a session of its own.
TRAINER = r"""
import importlib.util, json, sys, warnings
warnings.simplefilter("ignore")
spec = importlib.util.spec_from_file_location("sandbox_under_test", sys.argv[1])
sandbox = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = sandbox
spec.loader.exec_module(sandbox)
try:
    sandbox.mode(sys.argv[2])
except RuntimeError as e:
    print(json.dumps({"unusable": str(e)}))
    sys.exit()
r = sandbox.run_program(sys.argv[3], timeout=10, mode=sys.argv[2])
after = sandbox.run_program("print('still alive')", timeout=10, mode=sys.argv[2])
print(json.dumps({"status": r.status, "stdout": r.stdout, "stderr": r.stderr, "after": after.stdout}))
"""


def _as_user() -> list[str]:
    """The command prefix that runs a command as TEST_UID (we are root), or skip."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("setpriv (util-linux) is not installed: cannot start a trainer as an unprivileged user")
    return [setpriv, f"--reuid={TEST_UID}", f"--regid={TEST_UID}", "--clear-groups", "--"]


@functools.lru_cache(maxsize=None)
def _user_python() -> str | None:
    """A Python interpreter that TEST_UID can run (ours may live under /root, mode 0700)."""
    for exe in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
        check = "import ctypes, json, os, sys; assert os.path.isfile(os.path.realpath(sys.executable))"
        if os.path.exists(exe) and subprocess.run([*_as_user(), exe, "-I", "-S", "-c", check],
                                                  capture_output=True, timeout=60).returncode == 0:
            return exe
    return None


def _trainer_cmd(who: str) -> tuple[list[str], str]:
    """(prefix, interpreter): how to start a trainer as `who`, "root" or "user"; or skip."""
    if who == "root" and not IS_ROOT:
        pytest.skip("needs root: a root trainer")
    if who == "root" or not IS_ROOT:
        return [], sys.executable
    prefix, exe = _as_user(), _user_python()
    if exe is None:
        pytest.skip(f"no Python interpreter that uid {TEST_UID} can run")
    return prefix, exe


def _trainer(who: str, mode: str, code: str, env: dict | None = None) -> dict:
    """Run `code` through run_program in a trainer process of its own (with `env` added to its environment);
    its report. The test fails if the trainer died."""
    prefix, exe = _trainer_cmd(who)
    p = subprocess.run([*prefix, exe, "-c", TRAINER, str(ROOT / "tasks" / "sandbox.py"), mode, code],
                       capture_output=True, text=True, timeout=120, cwd="/", start_new_session=True,
                       env={"PATH": os.environ.get("PATH", sandbox.SAFE_PATH), "HOME": "/", **(env or {})})
    assert p.returncode == 0 and p.stdout.strip(), f"the trainer died (exit {p.returncode}): {p.stderr[-3000:]}"
    result = json.loads(p.stdout.strip().splitlines()[-1])
    if "unusable" in result:
        assert who == "user", result["unusable"]
        pytest.skip(f"{mode} is unusable for an unprivileged user here: {result['unusable']}")
    return result


def _keep_run_dir_facts(monkeypatch, fact) -> list:
    """Record fact(run directory) for each run, just before the directory is removed (probe first)."""
    facts = []
    real = sandbox._remove_dir

    def remove(path):
        facts.append(fact(path))
        real(path)
    monkeypatch.setattr(sandbox, "_remove_dir", remove)
    return facts


@needs_root
@pytest.mark.parametrize("mode", MODES)
def test_program_runs_as_nobody_on_the_host(mode, monkeypatch):
    sandbox.mode(mode)                                          # the probe runs before the patch below
    facts = _keep_run_dir_facts(monkeypatch, lambda d: (os.lstat(d).st_uid,
                                                        os.lstat(os.path.join(d, "made_by_program")).st_uid))
    code = "import os\nopen('made_by_program', 'w').close()\nprint(os.getuid(), os.getgid(), os.getgroups())\n"
    r = run_program(code, timeout=10, mode=mode)
    assert r.ok, r
    assert r.stdout.split(maxsplit=2)[:2] == ["65534", "65534"] and r.stdout.rstrip().endswith("[]"), r.stdout
    # The host's view: the run directory, and what the program writes, belong to uid 65534 (not 0).
    assert facts == [(sandbox.SANDBOX_UID, sandbox.SANDBOX_UID)]


@needs_root
@pytest.mark.parametrize("mode", MODES)
def test_root_files_are_unreadable(mode, monkeypatch):
    secret = "s3cr3t-" + uuid.uuid4().hex
    files = [Path(d, f"rlanything-test-{uuid.uuid4().hex[:8]}") for d in ("/root", "/var/tmp") if os.path.isdir(d)]
    real_mkdtemp = sandbox.tempfile.mkdtemp

    def mkdtemp(*a, **kw):                          # and one in the run directory itself
        d = real_mkdtemp(*a, **kw)
        Path(d, "root_only").write_text(secret)
        os.chmod(Path(d, "root_only"), 0o600)
        return d

    sandbox.mode(mode)                                          # the probe runs before the patch below
    monkeypatch.setattr(sandbox.tempfile, "mkdtemp", mkdtemp)
    paths = ["/etc/shadow", "root_only", *map(str, files)]
    code = ("for p in %r:\n    try:\n        print('READ', p, open(p).read()[:60])\n"
            "    except OSError as e:\n        print('refused', p, e.errno)\n") % paths
    try:
        for f in files:
            f.write_text(secret)
            os.chmod(f, 0o600)
        r = run_program(code, timeout=10, mode=mode)
    finally:
        for f in files:
            f.unlink(missing_ok=True)
    assert r.ok, r
    assert "READ" not in r.stdout and secret not in r.stdout, r.stdout
    assert r.stdout.count("refused") == len(paths)
    monkeypatch.undo()
    _alive(mode)


@needs_root
@pytest.mark.parametrize("mode", MODES)
def test_root_unix_socket_is_unreachable(mode):
    if not os.path.isdir("/run"):
        pytest.skip("no /run on this machine")
    d = tempfile.mkdtemp(prefix="rlanything-test-", dir="/run")                     # root's, 0700
    path = os.path.join(d, "socket")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.bind(path)
        server.listen(5)
        server.settimeout(0.5)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:          # it works from outside
            client.connect(path)
            server.accept()[0].close()
        code = ("import socket\ns = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\ntry:\n"
                f"    s.connect({path!r})\n    print('connected')\nexcept OSError as e:\n    print('refused', e)\n")
        r = run_program(code, timeout=10, mode=mode)
        assert r.ok and r.stdout.startswith("refused"), r
        with pytest.raises(socket.timeout):
            server.accept()[0].close()
    finally:
        server.close()
        shutil.rmtree(d, ignore_errors=True)
    _alive(mode)


@pytest.mark.parametrize("mode", MODES)
def test_abstract_unix_socket_is_unreachable(mode):
    if mode == "rlimit" and sandbox._LANDLOCK_ABI < 6:
        pytest.skip("Landlock ABI < 6: rlimit mode cannot keep programs from abstract Unix sockets (documented)")
    name = "\0rlanything-test-" + uuid.uuid4().hex
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.bind(name)
        server.listen(5)
        server.settimeout(0.5)
        code = ("import socket\ns = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\ntry:\n"
                f"    s.connect({name!r})\n    print('connected')\nexcept OSError as e:\n    print('refused', e)\n")
        r = run_program(code, timeout=10, mode=mode)
        assert r.ok and r.stdout.startswith("refused"), r
        with pytest.raises(socket.timeout):
            server.accept()[0].close()
    finally:
        server.close()
    _alive(mode)


@needs_bwrap
def test_bwrap_shows_only_what_python_needs():
    code = "import json, os\nprint(json.dumps([sorted(os.listdir('/')), sorted(os.listdir('/etc'))]))\n"
    r = run_program(code, timeout=10, mode="bwrap")
    assert r.ok, r
    top, etc = json.loads(r.stdout)
    interpreter_tops = {d.split("/")[1] for d in sandbox._interpreter_dirs(sandbox._interpreter())}
    host_only = {"run", "var", "home", "srv", "mnt", "media", "opt", "boot", "sys", "root"} - interpreter_tops
    assert not host_only & set(top), top
    assert set(etc) <= set(sandbox._ETC_FILES) and "shadow" not in etc


@pytest.mark.parametrize("who", WHO)
@pytest.mark.parametrize("mode", MODES)
def test_trainer_survives_kill_attempts(mode, who):
    prefix, _ = _trainer_cmd(who)                               # (skips first, before the sleeper starts)
    sleeper = subprocess.Popen([*prefix, "sleep", "60"], start_new_session=True)     # a process of the trainer's uid
    names = ["parent", "parent's group", "pid 1", "sleep", "pidfd"]
    code = ("import os, signal\nppid = os.getppid()\n"
            "attempts = [lambda: os.kill(ppid, signal.SIGKILL),\n"
            "            lambda: os.killpg(os.getpgid(ppid), signal.SIGKILL),\n"
            "            lambda: os.kill(1, signal.SIGKILL),\n"
            f"            lambda: os.kill({sleeper.pid}, signal.SIGKILL),\n"
            "            lambda: signal.pidfd_send_signal(os.pidfd_open(ppid), signal.SIGKILL)]\n"
            f"for name, attempt in zip({names!r}, attempts):\n"
            "    try:\n        attempt()\n        print(name, 'SENT')\n"
            "    except OSError as e:\n        print(name, 'refused', e.errno)\n")
    try:
        result = _trainer(who, mode, code)
        assert sleeper.poll() is None, "the program killed another process of the trainer's uid"
    finally:
        sleeper.kill()
        sleeper.wait()
    assert result["status"] == "ok", result
    assert result["stdout"].splitlines() == [f"{n} refused {errno.EPERM}" for n in names]
    assert result["after"] == "still alive\n"
    _alive(mode)


@pytest.mark.parametrize("who", WHO)
def test_rlimit_trainer_environment_is_unreadable(who):
    if who == "user" and sandbox._LANDLOCK_ABI == 0:
        pytest.skip("no Landlock on this kernel: a user's rlimit-mode program can read its trainer's environment "
                    "(documented)")
    secret = "s3cr3t-" + uuid.uuid4().hex
    code = ("import os\nfor what in ('environ', 'mem'):\n    try:\n"
            "        print('READ', what, open(f'/proc/{os.getppid()}/{what}', 'rb').read(1 << 16))\n"
            "    except OSError as e:\n        print('refused', what, e.errno)\n")
    result = _trainer(who, "rlimit", code, env={"RLANYTHING_TEST_SECRET": secret})
    assert result["status"] == "ok", result
    assert result["stdout"].splitlines() == [f"refused environ {errno.EACCES}", f"refused mem {errno.EACCES}"]
    assert secret not in result["stdout"]


@pytest.mark.parametrize("who", WHO)
@pytest.mark.parametrize("mode", MODES)
def test_writes_stay_in_the_run_directory(mode, who):
    if mode == "rlimit" and sandbox._LANDLOCK_ABI == 0:
        pytest.skip("no Landlock on this kernel: rlimit mode cannot confine writes (documented)")
    _trainer_cmd(who)                                           # (skips first, before the home is made)
    tag = uuid.uuid4().hex[:8]
    home = None
    if who == "root":
        home = "/root"
    elif IS_ROOT:                                               # a home of TEST_UID's own
        home = tempfile.mkdtemp(prefix="rlanything-test-home-")
        os.chown(home, TEST_UID, TEST_UID)
    else:
        home = os.path.expanduser("~")
    bases = [f"{d}/rlanything-test-{tag}" for d in ("", "/tmp", "/var/tmp", home)]
    written = [b + suffix for b in bases for suffix in ("", ".d", ".l", ".m")]
    code = ("import os\nopen('moved', 'w').close()\n"
            f"for t in {bases!r}:\n"
            "    for what, f in [('file', lambda: open(t, 'w').write('pwned')), ('dir', lambda: os.mkdir(t + '.d')),\n"
            "                    ('link', lambda: os.symlink('main.py', t + '.l')),\n"
            "                    ('move', lambda: os.rename('moved', t + '.m'))]:\n"
            "        try:\n            f()\n            print('WROTE', what, t)\n"
            "        except OSError as e:\n            print('refused', what, t, e.errno)\n"
            "open('inside.txt', 'w').write('inside ok')\nprint(open('inside.txt').read())\n")
    try:
        result = _trainer(who, mode, code)
        left = [p for p in written if os.path.lexists(p)]
    finally:
        for p in written:
            if os.path.isdir(p) and not os.path.islink(p):
                shutil.rmtree(p, ignore_errors=True)
            elif os.path.lexists(p):
                os.unlink(p)
        if who == "user" and IS_ROOT:
            shutil.rmtree(home, ignore_errors=True)
    assert result["status"] == "ok", result
    assert result["stdout"].rstrip().endswith("inside ok")
    assert not left, f"the program wrote outside its run directory: {left}"
    if mode == "rlimit":
        assert "WROTE" not in result["stdout"] and result["stdout"].count("refused") == 4 * len(bases), result["stdout"]
    else:                                                       # only in the sandbox's own /tmp, discarded
        assert {line.split()[-1] for line in result["stdout"].splitlines() if line.startswith("WROTE")} <= {bases[1]}


@pytest.mark.parametrize("mode", MODES)
def test_stdlib_works_under_the_filter(mode):
    # The calls that would act on another process target a `sleep` of ours (in bwrap it is not even visible).
    code = r"""
import fcntl, json, os, resource, signal, tempfile, threading, time
from concurrent.futures import ThreadPoolExecutor
out = []
with ThreadPoolExecutor(4) as pool:
    out.append(sum(pool.map(lambda x: x * x, range(100))))
t = threading.Thread(target=time.sleep, args=(0.05,))
t.start()
t.join()
try:
    raise KeyError("k")
except KeyError:
    out.append("caught")
resource.setrlimit(resource.RLIMIT_NOFILE, (128, 128))
os.sched_setaffinity(0, os.sched_getaffinity(0))
os.nice(1)
with open(os.devnull, "w") as f:
    f.write("x")
with tempfile.TemporaryFile() as f:
    f.write(b"x")
signal.signal(signal.SIGALRM, lambda *a: out.append("alarm"))
signal.setitimer(signal.ITIMER_REAL, 0.01)
time.sleep(0.2)
other = SLEEPER
for name, f in [("raise_signal", lambda: signal.raise_signal(signal.SIGUSR1)),
                ("kill self", lambda: os.kill(os.getpid(), 0)),
                ("F_SETOWN", lambda: fcntl.fcntl(1, fcntl.F_SETOWN, other)),
                ("prlimit other", lambda: resource.prlimit(other, resource.RLIMIT_NOFILE, (1, 1))),
                ("setpriority other", lambda: os.setpriority(os.PRIO_PROCESS, other, 19)),
                ("setpriority group", lambda: os.setpriority(os.PRIO_PGRP, 0, 19)),
                ("affinity other", lambda: os.sched_setaffinity(other, {0}))]:
    try:
        f()
        out.append(name + " ALLOWED")
    except OSError as e:
        out.append(f"{name} refused {e.errno}")
print(json.dumps(out))
"""
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        r = run_program(code.replace("SLEEPER", str(sleeper.pid)), timeout=10, mode=mode)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert r.ok, r
    refused = ["raise_signal", "kill self", "F_SETOWN", "prlimit other", "setpriority other", "setpriority group",
               "affinity other"]
    assert json.loads(r.stdout) == [328350, "caught", "alarm", *(f"{n} refused {errno.EPERM}" for n in refused)]
    r = run_program("import os\nos.abort()", timeout=10, mode=mode)     # abort() cannot raise SIGABRT: it still ends
    assert r.status == "killed", r
    _alive(mode)


# ----------------------------------------------------------------------------- report, leftovers

@pytest.mark.parametrize("mode", MODES)
def test_mode_report(mode):
    line = sandbox.report(mode)
    m = re.fullmatch(r"sandbox: (\w+), program uid (\d+) \(host\), seccomp on, (.+)", line)
    assert m and m[1] == mode, line
    assert int(m[2]) == (sandbox.SANDBOX_UID if IS_ROOT else os.geteuid()), line
    if mode == "bwrap":
        assert m[3] == "landlock n/a"
    else:
        assert m[3].startswith(f"landlock ABI {sandbox._LANDLOCK_ABI} " if sandbox._LANDLOCK_ABI else "NO landlock")


def test_mode_report_command():
    env = {k: v for k, v in os.environ.items() if k != sandbox.ENV_VAR}
    p = subprocess.run([sys.executable, "-m", "tasks.sandbox"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    expected = "rlimit" if sandbox._bwrap_path() is None else "bwrap"
    assert re.fullmatch(rf"sandbox: {expected}, program uid \d+ \(host\), seccomp on, .+", p.stdout.strip()), p.stdout


def test_cleanup_stale(monkeypatch, tmp_path):
    made = []
    real_mkdtemp = sandbox.tempfile.mkdtemp

    def mkdtemp(*a, **kw):
        made.append(real_mkdtemp(*a, **kw))
        return made[-1]

    monkeypatch.setattr(sandbox.tempfile, "mkdtemp", mkdtemp)
    assert run_program("print(1)", timeout=10, mode="rlimit").ok
    assert os.path.basename(made[0]).startswith(f"rlanything-sandbox-{os.getpid()}-")
    monkeypatch.undo()

    monkeypatch.setattr(sandbox.tempfile, "tempdir", str(tmp_path))
    gone = subprocess.Popen(["true"])
    gone.wait()
    day_ago = time.time() - 86400

    def make(name, age=None, uid=None):
        d = tmp_path / name
        (d / "locked").mkdir(parents=True)
        (d / "locked" / "f").write_text("x")
        os.chmod(d / "locked", 0)
        if uid is not None:
            os.chown(d, uid, uid)
        if age is not None:
            os.utime(d, (age, age))
        return d

    stale = [make(f"rlanything-sandbox-{gone.pid}-dead"),                       # its creator is gone
             make(f"rlanything-sandbox-{os.getpid()}-old", age=day_ago),        # too old, creator or not
             make("rlanything-sandbox-oldformat", age=day_ago)]
    kept = [make(f"rlanything-sandbox-{os.getpid()}-inuse"),                    # a run of ours, now
            make("rlanything-sandbox-nopid"),                                   # creator unknown, recent
            make("unrelated", age=day_ago)]
    if IS_ROOT:
        kept.append(make(f"rlanything-sandbox-{gone.pid}-someone", uid=TEST_UID))   # another user's
    assert sandbox.cleanup_stale(max_age_s=3600) == len(stale)
    assert sorted(tmp_path.iterdir()) == sorted(kept)
    for d in kept:
        os.chmod(d / "locked", 0o700)


def test_outputs_match():
    assert outputs_match("1 2 \n3\n\n\n", "1 2\n3")
    assert outputs_match("\n\nyes\r\n", "yes")
    assert outputs_match("", "\n\n")
    assert not outputs_match("1 2\n3", "1 2 3")
    assert not outputs_match("a\n\nb", "a\nb")          # inner blank lines count
    assert not outputs_match(" a", "a")                 # leading spaces count
