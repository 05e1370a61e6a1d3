"""The execution sandbox of the coding setting (paper §4, LiveBench / CodeContests).

Every program the policy writes, and every test the reward model writes, is run
here. These programs are hostile input: this module is the project's security
boundary for model-written code.

Each run gets its own subprocess (its own session and process group), a fresh
temporary directory as its working directory (removed afterwards, also after a
timeout), an environment with nothing inherited, and these limits:

* wall time (`timeout`): the whole process group, and with bubblewrap the whole
  sandbox, is killed with SIGKILL when it runs out;
* CPU time (RLIMIT_CPU, a little above the wall timeout), address space
  (RLIMIT_AS, `mem_mb`), file size (RLIMIT_FSIZE), open files, no core dumps;
* output: stdout and stderr are read as they come; past `max_output` bytes in
  all the program is killed (status "output_limit"). The parent keeps at most
  `max_output` bytes of stdout and a few KB of stderr, so a 100 MB print costs
  it nothing;
* processes: a seccomp filter refuses fork/vfork/clone of new processes
  (threads are allowed; the address-space limit bounds them), so a fork bomb
  gets EPERM on its first fork. It also refuses non-Unix sockets and io_uring.
  This is what contains fork bombs when we run as root, where RLIMIT_NPROC is
  ignored. (x86_64 and aarch64 only; elsewhere see `mode`.)

Two modes (`mode()`):

"bwrap"   bubblewrap isolation on top of the above: read-only root, private
          size-capped /tmp with the run directory bound writable inside it, fresh
          /proc and /dev, all namespaces unshared (no network, own pid namespace,
          so the program sees no process but its own), sandbox uid 65534, no
          capabilities, no nested user namespaces, --die-with-parent,
          --new-session, --clearenv. The home directory (and /root) is hidden
          behind an empty tmpfs, with only the interpreter's directories bound
          back read-only. bwrap itself is started with an empty environment, so
          nothing can be read through /proc/<pid>/environ either.
"rlimit"  the fallback where bwrap is missing or its probe fails (or where it is
          forced: `mode="rlimit"` or RLANYTHING_SANDBOX=rlimit): limits and the
          seccomp filter only. The program can then READ the file system and
          write wherever the user can. A loud warning is given once per process.

The program runs as `python -I -S -X utf8 main.py` with this process's
interpreter: isolated mode, no site (the stdlib only), UTF-8 I/O.
"""
from __future__ import annotations

import ctypes
import errno
import logging
import math
import os
import platform
import pwd
import resource
import selectors
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

__all__ = ["RunResult", "run_program", "run_many", "outputs_match", "mode", "ENV_VAR"]

log = logging.getLogger(__name__)

ENV_VAR = "RLANYTHING_SANDBOX"          # "rlimit" forces the fallback, "bwrap" requires bwrap, "auto"
SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
STDERR_KEEP = 4096                      # stderr kept: this many bytes, half from the head, half from the tail
FILE_LIMIT = 64 << 20                   # RLIMIT_FSIZE, and the size of the sandbox's /tmp
SHM_LIMIT = 16 << 20                    # size of the sandbox's /dev/shm
NOFILE_LIMIT = 256
SANDBOX_ID = "65534"                    # uid/gid inside the sandbox (nobody)
INNER_DIR = "/tmp/sandbox"              # where the run directory appears inside bwrap
PROBE_TIMEOUT = 15.0


@dataclass
class RunResult:
    """What one program run did.

    status: "ok" (exit 0), "error" (nonzero exit), "timeout" (wall or CPU time),
    "output_limit" (more than max_output bytes written) or "killed" (a signal,
    e.g. SIGXFSZ; running out of memory is usually a MemoryError, i.e. "error").
    returncode: the exit code, minus the signal number if one ended it, None when
    we killed it ourselves (timeout, output_limit).
    """
    stdout: str
    stderr: str           # at most STDERR_KEEP bytes of it: head and tail
    returncode: int | None
    status: str
    seconds: float

    @property
    def ok(self) -> bool:
        return self.status == "ok"


# ----------------------------------------------------------------------------- seccomp

def _seccomp_filter() -> bytes | None:
    """A classic-BPF seccomp program (struct sock_filter[]) for this machine, or None.

    Allows everything except: new processes (fork, vfork, clone without
    CLONE_THREAD -> EPERM; clone3 -> ENOSYS so libc falls back to clone), sockets
    other than AF_UNIX (EPERM) and io_uring (ENOSYS, it can open sockets without
    socket()). Foreign ABIs (x32, i386 on x86_64) kill the process.
    """
    if sys.byteorder != "little":
        return None
    machine = platform.machine().lower()
    if machine in ("x86_64", "amd64"):
        arch, x32 = 0xC000003E, True
        eperm_nrs, clone_nr, socket_nr = [57, 58], 56, 41          # fork, vfork; clone; socket
    elif machine in ("aarch64", "arm64"):
        arch, x32 = 0xC00000B7, False
        eperm_nrs, clone_nr, socket_nr = [], 220, 198
    else:
        return None
    enosys_nrs = [435, 425, 426, 427]                               # clone3, io_uring_{setup,enter,register}

    LD_ABS, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06
    ALLOW, KILL = 0x7FFF0000, 0x80000000
    ERRNO = 0x00050000
    CLONE_THREAD, AF_UNIX = 0x00010000, 1

    prog: list[tuple] = []                                          # (code, jt, jf, k); jt/jf: label or 0

    def jump(code, k, jt, jf=0):
        prog.append((code, jt, jf, k))

    prog.append((LD_ABS, 0, 0, 4))                                  # A = arch
    jump(JEQ, arch, 0, "kill")
    prog.append((LD_ABS, 0, 0, 0))                                  # A = syscall nr
    if x32:
        jump(JGE, 0x40000000, "kill")
    for nr in eperm_nrs:
        jump(JEQ, nr, "eperm")
    for nr in enosys_nrs:
        jump(JEQ, nr, "enosys")
    jump(JEQ, socket_nr, "socket")
    jump(JEQ, clone_nr, "clone")
    labels = {}
    prog.append((RET, 0, 0, ALLOW))
    labels["clone"] = len(prog)                                     # (BPF jumps only forward)
    prog.append((LD_ABS, 0, 0, 16))                                 # A = low 32 bits of args[0] (flags)
    jump(JSET, CLONE_THREAD, 0, "eperm")
    prog.append((RET, 0, 0, ALLOW))                                 # a thread
    labels["socket"] = len(prog)
    prog.append((LD_ABS, 0, 0, 16))                                 # A = domain
    jump(JEQ, AF_UNIX, 0, "eperm")
    prog.append((RET, 0, 0, ALLOW))
    labels["eperm"] = len(prog)
    prog.append((RET, 0, 0, ERRNO | errno.EPERM))
    labels["enosys"] = len(prog)
    prog.append((RET, 0, 0, ERRNO | errno.ENOSYS))
    labels["kill"] = len(prog)
    prog.append((RET, 0, 0, KILL))

    out = b""
    for i, (code, jt, jf, k) in enumerate(prog):
        jt = labels[jt] - i - 1 if isinstance(jt, str) else jt
        jf = labels[jf] - i - 1 if isinstance(jf, str) else jf
        assert 0 <= jt < 256 and 0 <= jf < 256
        out += struct.pack("=HBBI", code, jt, jf, k)
    return out


_FILTER = _seccomp_filter()


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


# Built in the parent, so the child (preexec_fn, rlimit mode) only makes two calls.
if _FILTER is not None:
    _FILTER_BUF = ctypes.create_string_buffer(_FILTER, len(_FILTER))
    _FPROG = _SockFprog(len(_FILTER) // 8, ctypes.addressof(_FILTER_BUF))
    try:
        _prctl = ctypes.CDLL(None, use_errno=True).prctl
        _prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
        _prctl.restype = ctypes.c_int
    except (OSError, AttributeError):
        _prctl = None
else:
    _prctl = None


def _install_seccomp() -> None:
    """In the child: no new privileges, then the filter. Raises if either fails."""
    PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
    if _prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    if _prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(_FPROG), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")


# ----------------------------------------------------------------------------- mode

_lock = threading.Lock()
_bwrap_state: tuple[bool, str] | None = None    # (usable, reason when not), probed once
_bwrap_opts: set[str] = set()
_warned = False


def _bwrap_path() -> str | None:
    return shutil.which("bwrap", path=SAFE_PATH)


def _bwrap_usable() -> tuple[bool, str]:
    """Probe bwrap once: run a tiny program through the real sandbox command line."""
    global _bwrap_state, _bwrap_opts
    with _lock:
        if _bwrap_state is None:
            path = _bwrap_path()
            if path is None:
                _bwrap_state = (False, "bwrap (bubblewrap) is not installed")
            else:
                try:
                    helptext = subprocess.run([path, "--help"], capture_output=True, text=True,
                                              env={}, timeout=PROBE_TIMEOUT).stdout
                    _bwrap_opts = {w for w in helptext.split() if w.startswith("--")}
                    r = _run('print("sandbox-ok")', "", timeout=PROBE_TIMEOUT, mem_mb=512,
                             max_output=10_000, mode_="bwrap")
                    if r.status == "ok" and r.stdout.strip() == "sandbox-ok":
                        _bwrap_state = (True, "")
                    else:
                        _bwrap_state = (False, f"the bwrap probe failed ({r.status}, rc={r.returncode}): "
                                               f"{r.stderr.strip()[:300]}")
                except (OSError, subprocess.SubprocessError) as e:
                    _bwrap_state = (False, f"the bwrap probe failed: {e!r}")
        return _bwrap_state


def _warn_rlimit(reason: str) -> None:
    global _warned
    with _lock:
        if _warned:
            return
        _warned = True
    seccomp = ("a seccomp filter blocks new processes and network sockets"
               if _FILTER is not None and _prctl is not None else
               "NO seccomp filter on this machine: fork bombs are only bounded by RLIMIT_NPROC "
               "(ignored for root) and the wall timeout, and the network is reachable")
    msg = (f"SANDBOX RUNNING IN RLIMIT MODE ({reason}): model-written programs run WITHOUT "
           f"bubblewrap isolation, with resource limits only; {seccomp}. They can READ the whole "
           f"file system (secrets included, e.g. /proc/<pid>/environ of your processes) and write "
           f"wherever this user can. Install bubblewrap for real isolation.")
    warnings.warn(msg, RuntimeWarning, stacklevel=2)
    log.warning(msg)


def mode(requested: str | None = None) -> str:
    """The sandbox mode in use: "bwrap" or "rlimit".

    `requested` (or else the RLANYTHING_SANDBOX environment variable): "auto"
    (default: bwrap when it is installed and its one-time probe runs a program,
    otherwise rlimit with a loud one-time warning), "rlimit" (force the fallback,
    e.g. for tests) or "bwrap" (raise RuntimeError when bwrap is unusable).
    """
    req = (requested if requested is not None else os.environ.get(ENV_VAR, "")).strip().lower() or "auto"
    if req not in ("auto", "bwrap", "rlimit"):
        raise ValueError(f"sandbox mode must be auto, bwrap or rlimit, not {req!r}")
    if req == "rlimit":
        _warn_rlimit(f"forced by {'argument' if requested is not None else ENV_VAR}=rlimit")
        return "rlimit"
    usable, reason = _bwrap_usable()
    if usable:
        return "bwrap"
    if req == "bwrap":
        raise RuntimeError(f"sandbox mode bwrap requested but unusable: {reason}")
    _warn_rlimit(reason)
    return "rlimit"


# ----------------------------------------------------------------------------- running

def _interpreter() -> str:
    exe = os.path.realpath(sys.executable or "")
    if not sys.executable or not os.path.isfile(exe):
        raise RuntimeError("sys.executable is unknown: cannot start the sandboxed interpreter")
    return exe


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _hidden_dirs(exe: str) -> tuple[list[str], list[str]]:
    """Home directories to hide inside bwrap, and interpreter directories to bind back."""
    keep = {os.path.realpath(p) for p in (sys.base_prefix, sys.base_exec_prefix)}
    keep.add(os.path.dirname(os.path.dirname(exe)))                 # the interpreter's prefix (or venv)
    homes = {os.path.expanduser("~")} | ({"/root"} if os.geteuid() == 0 else set())
    try:
        homes.add(pwd.getpwuid(os.geteuid()).pw_dir)
    except KeyError:
        pass
    hide = []
    for h in sorted({os.path.realpath(h) for h in homes if h}):
        if h != "/" and os.path.isdir(h) and not any(_under(h, k) for k in keep):
            hide.append(h)
    rebind = sorted(k for k in keep if any(_under(k, h) for h in hide))
    rebind = [k for k in rebind if not any(k != o and _under(k, o) for o in rebind)]
    return hide, rebind


def _bwrap_argv(rundir: str, exe: str, seccomp_fd: int | None) -> list[str]:
    opt = _bwrap_opts
    sized = lambda n: ["--size", str(n)] if "--size" in opt else []          # noqa: E731
    argv = [_bwrap_path() or "bwrap",
            "--unshare-all", "--unshare-user", "--uid", SANDBOX_ID, "--gid", SANDBOX_ID,
            "--die-with-parent", "--new-session", "--cap-drop", "ALL",
            "--ro-bind", "/", "/"]
    if "--disable-userns" in opt:
        argv += ["--disable-userns"]
    hide, rebind = _hidden_dirs(exe)
    for h in hide:
        argv += ["--tmpfs", h]
    for k in rebind:
        argv += ["--ro-bind", k, k]
    for h in hide:
        argv += ["--remount-ro", h]
    argv += ["--proc", "/proc", "--dev", "/dev", *sized(SHM_LIMIT), "--tmpfs", "/dev/shm",
             "--remount-ro", "/dev", *sized(FILE_LIMIT), "--tmpfs", "/tmp"]
    parent = os.path.dirname(os.path.realpath(rundir))
    if parent != "/tmp" and not _under(exe, parent) and parent not in ("/", *hide):
        argv += ["--tmpfs", parent, "--remount-ro", parent]          # other runs' directories
    argv += ["--bind", rundir, INNER_DIR, "--chdir", INNER_DIR,
             "--clearenv", "--setenv", "PATH", SAFE_PATH, "--setenv", "LANG", "C.UTF-8",
             "--setenv", "HOME", INNER_DIR]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    return argv + ["--", exe, "-I", "-S", "-X", "utf8", "main.py"]


def _limits(timeout: float, mem_mb: int, rlimit_mode: bool) -> list[tuple[int, int, int]]:
    cpu = int(math.ceil(timeout)) + 1
    wanted = [(resource.RLIMIT_CPU, cpu, cpu + 1),
              (resource.RLIMIT_AS, mem_mb << 20, mem_mb << 20),
              (resource.RLIMIT_FSIZE, FILE_LIMIT, FILE_LIMIT),
              (resource.RLIMIT_NOFILE, NOFILE_LIMIT, NOFILE_LIMIT),
              (resource.RLIMIT_CORE, 0, 0)]
    if rlimit_mode and (_FILTER is None or _prctl is None) and hasattr(resource, "RLIMIT_NPROC"):
        # No seccomp: refuse forks by RLIMIT_NPROC (it counts all this user's processes,
        # so 0 means none; root ignores it). Not in bwrap mode: bwrap must fork.
        wanted.append((resource.RLIMIT_NPROC, 0, 0))
    out = []
    for res, soft, hard in wanted:                                  # never above the current hard limit
        cur_hard = resource.getrlimit(res)[1]
        if cur_hard != resource.RLIM_INFINITY:
            soft, hard = min(soft, cur_hard), min(hard, cur_hard)
        out.append((res, soft, hard))
    return out


_PRLIMIT_NAMES = {resource.RLIMIT_CPU: "cpu", resource.RLIMIT_AS: "as", resource.RLIMIT_FSIZE: "fsize",
                  resource.RLIMIT_NOFILE: "nofile", resource.RLIMIT_CORE: "core", resource.RLIMIT_NPROC: "nproc"}


def _child_setup(limits: list[tuple[int, int, int]], seccomp: bool) -> None:
    """preexec_fn: runs in the child between fork and exec."""
    for res, soft, hard in limits:
        resource.setrlimit(res, (soft, hard))
    if seccomp:
        _install_seccomp()


def _kill(proc: subprocess.Popen) -> None:
    """SIGKILL the process group (with bwrap: bwrap, whose death takes the pid namespace down)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.kill()
    except ProcessLookupError:
        pass
    proc.wait()


def _communicate(proc: subprocess.Popen, data: bytes, deadline: float, max_output: int):
    """Feed stdin, read stdout/stderr as they come. Returns (stdout, stderr, reason or None)."""
    out, err_head, err_tail = bytearray(), bytearray(), bytearray()
    half = STDERR_KEEP // 2
    total = err_total = 0
    reason = None
    sel = selectors.DefaultSelector()
    fds = {}
    for f in (proc.stdout, proc.stderr):
        os.set_blocking(f.fileno(), False)
        sel.register(f.fileno(), selectors.EVENT_READ)
        fds[f.fileno()] = f
    stdin_fd, pos = proc.stdin.fileno(), 0
    if data:
        os.set_blocking(stdin_fd, False)
        sel.register(stdin_fd, selectors.EVENT_WRITE)
    else:
        proc.stdin.close()
    try:
        while sel.get_map() and reason is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                reason = "timeout"
                break
            for key, _ in sel.select(remaining):
                fd = key.fd
                if fd == stdin_fd:
                    try:
                        pos += os.write(fd, data[pos:pos + 65536])
                    except BlockingIOError:
                        continue
                    except (BrokenPipeError, OSError):
                        pos = len(data)
                    if pos >= len(data):
                        sel.unregister(fd)
                        proc.stdin.close()
                    continue
                try:
                    chunk = os.read(fd, 65536)
                except BlockingIOError:
                    continue
                if not chunk:
                    sel.unregister(fd)
                    continue
                total += len(chunk)
                if fd == proc.stdout.fileno():
                    out += chunk[:max(0, max_output - len(out))]
                else:
                    err_total += len(chunk)
                    err_head += chunk[:max(0, half - len(err_head))]
                    err_tail = (err_tail + chunk)[-half:]
                if total > max_output:
                    reason = "output_limit"
                    break
    finally:
        sel.close()
    if err_total <= half:                          # err_head is all of it
        err = err_head
    elif err_total <= 2 * half:                    # head and tail overlap: no gap
        err = err_head + err_tail[len(err_tail) - (err_total - half):]
    else:
        err = err_head + f"\n...[{err_total - 2 * half} bytes of stderr cut]...\n".encode() + err_tail
    return bytes(out), bytes(err), reason


def _remove_dir(path: str) -> None:
    """rm -rf that also copes with the program's chmods and a just-killed writer."""
    def fix(func, p, _exc):
        for q in (os.path.dirname(p), p):
            try:
                os.chmod(q, 0o700)
            except OSError:
                pass
        try:
            func(p)
        except OSError:
            pass
    for attempt in range(6):
        shutil.rmtree(path, onerror=fix)
        if not os.path.lexists(path):
            return
        time.sleep(0.05 * (attempt + 1))
    log.warning("sandbox: could not remove %s", path)


def _run(code: str, stdin: str, *, timeout: float, mem_mb: int, max_output: int, mode_: str) -> RunResult:
    exe = _interpreter()
    rundir = tempfile.mkdtemp(prefix="rlanything-sandbox-")
    try:
        with open(os.path.join(rundir, "main.py"), "w", encoding="utf-8") as f:
            f.write(code)
        seccomp_fd, pass_fds = None, ()
        if mode_ == "bwrap":
            if _FILTER is not None:
                seccomp_fd, w = os.pipe()
                os.write(w, _FILTER)
                os.close(w)
                pass_fds = (seccomp_fd,)
            argv, env, cwd = _bwrap_argv(rundir, exe, seccomp_fd), {}, "/"
            seccomp_here = False
            prlimit = shutil.which("prlimit", path=SAFE_PATH)
        else:
            argv = [exe, "-I", "-S", "-X", "utf8", "main.py"]
            env, cwd = {"PATH": SAFE_PATH, "LANG": "C.UTF-8", "HOME": rundir}, rundir
            seccomp_here, prlimit = _FILTER is not None and _prctl is not None, None
        limits = _limits(timeout, mem_mb, mode_ == "rlimit")
        preexec = lambda: _child_setup(limits, seccomp_here)  # noqa: E731
        if prlimit:  # rlimits set by util-linux's prlimit, which then execs bwrap: no Python code runs
            # between fork and exec, so Popen can vfork. A preexec_fn forces a full fork(), which copies
            # the page tables of this (large: models, vLLM) process: ~120 ms per run instead of ~15 ms.
            argv = [prlimit, *(f"--{_PRLIMIT_NAMES[r]}={s}:{h}" for r, s, h in limits), "--", *argv]
            preexec = None
        start = time.monotonic()
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, cwd=cwd, env=env, close_fds=True,
                                    pass_fds=pass_fds, start_new_session=True, preexec_fn=preexec)
        finally:
            if seccomp_fd is not None:
                os.close(seccomp_fd)
        try:
            out, err, reason = _communicate(proc, stdin.encode("utf-8", "replace"),
                                            start + timeout, max_output)
            if reason is None:
                try:
                    proc.wait(timeout=max(0.0, start + timeout - time.monotonic()))
                except subprocess.TimeoutExpired:
                    reason = "timeout"                 # closed its pipes but kept running
        finally:
            if proc.returncode is None:
                _kill(proc)
            for f in (proc.stdin, proc.stdout, proc.stderr):
                try:
                    f.close()
                except OSError:
                    pass
        seconds = time.monotonic() - start
        rc: int | None = proc.returncode
        if reason is not None:
            status, rc = reason, None
        else:
            sig = -rc if rc < 0 else (rc - 128 if mode_ == "bwrap" and 128 < rc < 128 + 65 else 0)
            # (bwrap reports a child killed by signal N as exit 128+N)
            if sig:
                status, rc = ("timeout" if sig == signal.SIGXCPU else "killed"), -sig
            else:
                status = "ok" if rc == 0 else "error"
        return RunResult(out.decode("utf-8", "replace"), err.decode("utf-8", "replace"), rc, status, seconds)
    finally:
        _remove_dir(rundir)


def run_program(code: str, stdin: str = "", *, timeout: float = 5.0, mem_mb: int = 512,
                max_output: int = 1_000_000, mode: str | None = None) -> RunResult:
    """Run one Python program (source `code`, fed `stdin`) in the sandbox.

    `timeout` in wall seconds, `mem_mb` the address-space limit, `max_output` bytes
    of stdout+stderr before the program is killed. `mode`: see `mode()`
    (default: RLANYTHING_SANDBOX, else auto).
    """
    return _run(code, stdin, timeout=timeout, mem_mb=mem_mb, max_output=max_output,
                mode_=_resolve(mode))


def _resolve(requested: str | None) -> str:
    return mode(requested)


def run_many(jobs: list[tuple[str, str]], *, timeout: float = 5.0, mem_mb: int = 512,
             max_output: int = 1_000_000, workers: int | None = None,
             mode: str | None = None) -> list[RunResult]:
    """Run (code, stdin) jobs in parallel, `workers` at a time (default: the CPU count).

    Results come back in job order. Each job is a `run_program` call.
    """
    if not jobs:
        return []
    m = _resolve(mode)
    workers = max(1, min(workers or os.cpu_count() or 1, len(jobs)))

    def one(job: tuple[str, str]) -> RunResult:
        code, stdin = job
        return _run(code, stdin, timeout=timeout, mem_mb=mem_mb, max_output=max_output, mode_=m)

    if workers == 1:
        return [one(j) for j in jobs]
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sandbox") as pool:
        return list(pool.map(one, jobs))


def _lines(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    start, end = 0, len(lines)
    while start < end and not lines[start]:
        start += 1
    while end > start and not lines[end - 1]:
        end -= 1
    return lines[start:end]


def outputs_match(actual: str, expected: str) -> bool:
    """Whether a program's output is the expected one, the usual judge's way.

    Lines are compared after rstrip() (trailing spaces, \\r); blank lines at the
    start and end of the whole output are ignored.
    """
    return _lines(actual) == _lines(expected)
