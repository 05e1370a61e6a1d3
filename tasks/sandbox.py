"""The execution sandbox of the coding setting (paper §4, LiveBench / CodeContests).

Every program the policy writes, and every test the reward model writes, is run
here. These programs are hostile input: this module is the project's security
boundary for model-written code. docs/SECURITY.md has the threat model, mode by
mode, with the test that proves each line. `python -m tasks.sandbox` prints the
mode in use and the host uid programs run as (`report`).

Each run gets its own subprocess (its own session and process group), a fresh
temporary directory as its working directory (<tempdir>/rlanything-sandbox-<pid>-*,
removed afterwards, also after a timeout; `cleanup_stale` removes those that killed
trainers left behind), an environment with nothing inherited, and:

* identity: when the trainer runs as root, the program runs as uid and gid 65534
  (nobody) on the host, with no supplementary groups, and the run directory
  belongs to that uid: it has no rights on root's files, sockets or processes.
  Under any other user it keeps that user's uid (inside bwrap's user namespace
  it is called 65534);
* wall time (`timeout`): the whole process group, and with bubblewrap the whole
  sandbox, is killed with SIGKILL when it runs out;
* CPU time (RLIMIT_CPU, a little above the wall timeout), address space
  (RLIMIT_AS, `mem_mb`), file size (RLIMIT_FSIZE), open files, no core dumps;
* output: stdout and stderr are read as they come; past `max_output` bytes in
  all the program is killed (status "output_limit"). The parent keeps at most
  `max_output` bytes of stdout and a few KB of stderr, so a 100 MB print costs
  it nothing;
* system calls: a seccomp filter (x86_64 and aarch64 only; elsewhere see `mode`)
  refuses new processes (fork, vfork, clone of a process; threads are allowed,
  the address-space limit bounds them), so a fork bomb gets EPERM on its first
  fork, also as root, where RLIMIT_NPROC would not count; sockets other than
  AF_UNIX, and io_uring; any action on another process: signals (kill, tkill,
  tgkill, rt_(tg)sigqueueinfo, pidfd_send_signal, pidfd_open, F_SETOWN), ptrace,
  process_vm_readv/writev, pidfd_getfd, and changing another process's limits,
  priority, scheduling, CPU affinity or memory placement (on itself, pid 0, these
  are allowed); unshare, setns, and clearing the parent-death signal. The program
  cannot signal itself either: os.kill and signal.raise_signal get EPERM.

Two modes (`mode()`):

"bwrap"   bubblewrap isolation on top of the above. The sandbox's root is an
          empty read-only tmpfs with only what the interpreter needs bound in,
          read-only: /usr, the /bin, /sbin and /lib* links, a few files of /etc
          (`_ETC_FILES`, no secrets) and the interpreter's prefix. The host's
          /home, /root, /run (its sockets), /var, /opt, /srv, /mnt and /tmp are
          not there. Plus: a private size-capped /tmp with the run directory bound
          writable at /tmp/sandbox, fresh /proc and /dev, new pid (the program
          sees no process but its own), network, ipc, uts and cgroup namespaces,
          no capabilities, --die-with-parent, --new-session, --clearenv; bwrap
          itself is started with an empty environment. As root, bwrap sets the
          sandbox up without a user namespace (so it can bind an interpreter that
          uid 65534 could not reach on the host, e.g. under /root, mode 0700) and
          util-linux `setpriv` then makes the program uid 65534. As a user, bwrap
          uses an unprivileged user namespace, with nested ones disabled.
"rlimit"  the fallback where bwrap is missing or its probe fails (or where it is
          forced: `mode="rlimit"` or RLANYTHING_SANDBOX=rlimit): no namespaces. A
          launcher (`_LAUNCHER`, this interpreter again) sets the limits; as root,
          it drops to uid 65534, after hiding under a tmpfs, in a mount namespace
          of its own, any directory that would keep that uid from the interpreter
          (e.g. /root; that needs CAP_SYS_ADMIN, without it the probe fails); it
          has the program killed with the trainer (parent-death signal); where
          the kernel has Landlock (Linux >= 5.13), it confines writes to the run
          directory (and /dev/null), refuses TCP and device ioctls and ptrace-like
          access to other processes (/proc/<trainer>/environ), and with Landlock
          ABI >= 6 signals to and abstract Unix sockets of processes outside; then
          no_new_privs, the seccomp filter, and it execs the program. The program
          can still READ whatever its uid can (as root: world-readable files; as
          a user: that user's files too) and, without Landlock, write wherever its
          uid can. A loud warning is given once per process.

Each mode is probed once per process (a tiny program through the real command
line); "auto" uses bwrap when its probe passes, else rlimit, and raises when
neither works. The program runs as `python -I -S -X utf8 main.py` with this
process's interpreter: isolated mode, no site (the stdlib only), UTF-8 I/O.
"""
from __future__ import annotations

import ctypes
import errno
import json
import logging
import math
import os
import platform
import resource
import selectors
import shutil
import signal
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

__all__ = ["RunResult", "run_program", "run_many", "outputs_match", "mode", "report", "cleanup_stale", "ENV_VAR"]

log = logging.getLogger(__name__)

ENV_VAR = "RLANYTHING_SANDBOX"          # "rlimit" forces the fallback, "bwrap" requires bwrap, "auto"
SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
STDERR_KEEP = 4096                      # stderr kept: this many bytes, half from the head, half from the tail
FILE_LIMIT = 64 << 20                   # RLIMIT_FSIZE, and the size of the sandbox's /tmp
SHM_LIMIT = 16 << 20                    # size of the sandbox's /dev/shm
NOFILE_LIMIT = 256
SANDBOX_UID = SANDBOX_GID = 65534       # nobody: the program's host uid when we are root; its uid inside bwrap
INNER_DIR = "/tmp/sandbox"              # where the run directory appears inside bwrap
RUN_PREFIX = "rlanything-sandbox-"      # run directories: <tempdir>/rlanything-sandbox-<creator pid>-<random>
PROBE_TIMEOUT = 15.0
# What bwrap binds from the host besides /usr and the interpreter's prefix.
_ROOT_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
_ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "passwd", "group", "nsswitch.conf",
              "hosts", "mime.types", "os-release")


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

# System call numbers: (x86_64, aarch64); None where the call does not exist.
_NR = {
    "fork": (57, None), "vfork": (58, None), "clone": (56, 220), "clone3": (435, 435), "socket": (41, 198),
    "io_uring_setup": (425, 425), "io_uring_enter": (426, 426), "io_uring_register": (427, 427),
    "kill": (62, 129), "tkill": (200, 130), "tgkill": (234, 131), "rt_sigqueueinfo": (129, 138),
    "rt_tgsigqueueinfo": (297, 240), "pidfd_open": (434, 434), "pidfd_send_signal": (424, 424),
    "pidfd_getfd": (438, 438), "ptrace": (101, 117), "process_vm_readv": (310, 270),
    "process_vm_writev": (311, 271), "unshare": (272, 97), "setns": (308, 268), "ioprio_set": (251, 30),
    "migrate_pages": (256, 238), "move_pages": (279, 239), "prlimit64": (302, 261),
    "sched_setparam": (142, 118), "sched_setscheduler": (144, 119), "sched_setaffinity": (203, 122),
    "sched_setattr": (314, 274), "setpriority": (141, 140), "fcntl": (72, 25), "prctl": (157, 167),
}
_EPERM_CALLS = ("fork", "vfork", "kill", "tkill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo", "pidfd_open",
                "pidfd_send_signal", "pidfd_getfd", "ptrace", "process_vm_readv", "process_vm_writev", "unshare",
                "setns", "ioprio_set", "migrate_pages", "move_pages")
_ENOSYS_CALLS = ("clone3", "io_uring_setup", "io_uring_enter", "io_uring_register")   # clone3: libc falls back to clone
_LD, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06    # BPF_LD|W|ABS, BPF_JMP|{JEQ,JGE,JSET}|K, BPF_RET|K
# Calls allowed for some arguments only: tests (argument, jump, constant, if true, if false), where a
# target is "allow", "eperm" or None (the next test). Arguments are compared on their low 32 bits:
# all of these are ints or flags.
_SELF = ((0, _JEQ, 0, "allow", "eperm"),)                      # pid 0: the calling process
_ARG_RULES = {
    "clone": ((0, _JSET, 0x00010000, "allow", "eperm"),),      # CLONE_THREAD: a thread
    "socket": ((0, _JEQ, 1, "allow", "eperm"),),               # AF_UNIX
    "prlimit64": _SELF, "sched_setparam": _SELF, "sched_setscheduler": _SELF, "sched_setaffinity": _SELF,
    "sched_setattr": _SELF,
    "setpriority": ((0, _JEQ, 0, None, "eperm"), (1, _JEQ, 0, "allow", "eperm")),   # PRIO_PROCESS, who = 0
    "fcntl": ((1, _JEQ, 8, "eperm", None), (1, _JEQ, 15, "eperm", "allow")),        # F_SETOWN(_EX): SIGIO
    "prctl": ((0, _JEQ, 1, "eperm", "allow"),),                # PR_SET_PDEATHSIG
}


def _seccomp_filter() -> bytes | None:
    """The classic-BPF seccomp program (struct sock_filter[]) for this machine, or None.

    Allows everything but the calls the module docstring lists: EPERM for them,
    ENOSYS for clone3 and io_uring (which can open sockets without socket()).
    Foreign ABIs (x32, i386 on x86_64) kill the process.
    """
    if sys.byteorder != "little":
        return None
    machine = platform.machine().lower()
    if machine in ("x86_64", "amd64"):
        arch, column, x32 = 0xC000003E, 0, True
    elif machine in ("aarch64", "arm64"):
        arch, column, x32 = 0xC00000B7, 1, False
    else:
        return None
    nr = {name: nrs[column] for name, nrs in _NR.items() if nrs[column] is not None}
    ALLOW, KILL, ERRNO = 0x7FFF0000, 0x80000000, 0x00050000

    prog: list[tuple] = [(_LD, 0, 0, 4),                            # (code, jt, jf, k); A = arch
                         (_JEQ, 0, "kill", arch),
                         (_LD, 0, 0, 0)]                            # A = syscall number
    if x32:
        prog.append((_JGE, "kill", 0, 0x40000000))
    prog += [(_JEQ, "eperm", 0, nr[n]) for n in _EPERM_CALLS if n in nr]
    prog += [(_JEQ, "enosys", 0, nr[n]) for n in _ENOSYS_CALLS if n in nr]
    rules = list(dict.fromkeys(_ARG_RULES.values()))                # calls with equal rules share the code
    prog += [(_JEQ, f"rule{rules.index(rule)}", 0, nr[n]) for n, rule in _ARG_RULES.items()]
    prog.append((_RET, 0, 0, ALLOW))
    labels = {}
    for i, rule in enumerate(rules):                                # (BPF jumps only forward)
        labels[f"rule{i}"] = len(prog)
        for arg, jump, k, jt, jf in rule:
            prog += [(_LD, 0, 0, 16 + 8 * arg),                     # A = low 32 bits of args[arg]
                     (jump, jt or 0, jf or 0, k)]
    for label, action in (("allow", ALLOW), ("eperm", ERRNO | errno.EPERM), ("enosys", ERRNO | errno.ENOSYS),
                          ("kill", KILL)):
        labels[label] = len(prog)
        prog.append((_RET, 0, 0, action))

    out = b""
    for i, (code, jt, jf, k) in enumerate(prog):
        jt = labels[jt] - i - 1 if isinstance(jt, str) else jt
        jf = labels[jf] - i - 1 if isinstance(jf, str) else jf
        assert 0 <= jt < 256 and 0 <= jf < 256
        out += struct.pack("=HBBI", code, jt, jf, k)
    return out


_FILTER = _seccomp_filter()


def _landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 where there is none (Linux < 5.13, or disabled)."""
    try:
        syscall = ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):
        return 0
    syscall.restype = ctypes.c_long
    # landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)
    return max(0, syscall(ctypes.c_long(444), None, ctypes.c_size_t(0), ctypes.c_uint32(1)))


_LANDLOCK_ABI = _landlock_abi()

# The rlimit mode's launcher: `<interpreter> -I -S -c _LAUNCHER <json>`, started in the run directory.
# It applies everything the program gets in that mode, then execs it. Nothing runs in the trainer
# between fork and exec, so Popen can vfork.
_LAUNCHER = r'''
import ctypes, json, os, resource, signal, struct, sys

c = json.loads(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]


def check(ret, what):
    if ret < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"sandbox launcher: {what}: {os.strerror(e)}")
    return ret


def syscall(nr, *args):
    return libc.syscall(ctypes.c_long(nr), *args)


if c["rebind"]:
    # In a mount namespace of our own: a read-only tmpfs over each directory uid 65534 may not cross
    # (e.g. /root, 0700), with the interpreter's directories bound back into it, read-only.
    MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 32, 4096, 16384, 1 << 18
    check(libc.unshare(0x00020000), "unshare(CLONE_NEWNS)")

    def mount(src, dst, fstype, flags, data=None):
        check(libc.mount(src, os.fsencode(dst), fstype, flags, data), f"mount {dst}")

    mount(None, "/", None, MS_REC | MS_PRIVATE)
    fds = [os.open(d, os.O_PATH | os.O_DIRECTORY) for d in c["rebind"]]       # (in the new namespace)
    for d in c["hide"]:
        mount(b"tmpfs", d, b"tmpfs", MS_NOSUID | MS_NODEV, b"mode=0755,size=1m")
    for d, fd in zip(c["rebind"], fds):
        os.makedirs(d, exist_ok=True)
        mount(f"/proc/self/fd/{fd}".encode(), d, None, MS_BIND | MS_REC)
        mount(None, d, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
        os.close(fd)
    for d in c["hide"]:
        mount(None, d, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
if c["uid"] is not None:
    os.setgroups([])
    os.setresgid(c["gid"], c["gid"], c["gid"])
    os.setresuid(c["uid"], c["uid"], c["uid"])
for res, soft, hard in c["limits"]:                 # after the uid change: RLIMIT_NPROC counts the new uid
    resource.setrlimit(res, (soft, hard))
# Killed when the trainer's thread that started us ends (the filter keeps the program from undoing it).
check(libc.prctl(1, signal.SIGKILL, 0, 0, 0), "PR_SET_PDEATHSIG")
if os.getppid() != c["ppid"]:
    sys.exit("sandbox launcher: the trainer is gone")
check(libc.prctl(38, 1, 0, 0, 0), "PR_SET_NO_NEW_PRIVS")
abi = c["landlock"]
if abi >= 1:
    # Handled (so refused unless a rule allows them): every write right this ABI knows (write_file,
    # remove_dir/file, make_char/dir/reg/sock/fifo/block/sym; refer; truncate; ioctl_dev), TCP bind and
    # connect, and the abstract Unix socket and signal scopes. Reading and executing stay allowed.
    fs = 0x1FF2 | (0x2000 if abi >= 2 else 0) | (0x4000 if abi >= 3 else 0) | (0x8000 if abi >= 5 else 0)
    attr = struct.pack("=QQQ", fs, 3 if abi >= 4 else 0, 3 if abi >= 6 else 0)
    ruleset = check(syscall(444, attr, ctypes.c_size_t(len(attr)), ctypes.c_uint32(0)), "landlock_create_ruleset")
    for path, allowed in ((".", fs), ("/dev/null", fs & 0xC002)):     # on /dev/null: write_file, truncate, ioctl_dev
        fd = os.open(path, os.O_PATH)
        rule = struct.pack("=Qi", allowed, fd)                          # struct landlock_path_beneath_attr
        check(syscall(445, ctypes.c_long(ruleset), ctypes.c_long(1), rule, ctypes.c_uint32(0)),   # PATH_BENEATH
              f"landlock_add_rule {path}")
        os.close(fd)
    check(syscall(446, ctypes.c_long(ruleset), ctypes.c_uint32(0)), "landlock_restrict_self")
    os.close(ruleset)
if c["filter"]:
    prog = ctypes.create_string_buffer(bytes.fromhex(c["filter"]))
    fprog = ctypes.create_string_buffer(struct.pack("=HxxxxxxQ", len(c["filter"]) // 16, ctypes.addressof(prog)))
    check(libc.prctl(22, 2, ctypes.addressof(fprog), 0, 0), "PR_SET_SECCOMP")     # SECCOMP_MODE_FILTER
os.execv(c["argv"][0], c["argv"])
'''


# ----------------------------------------------------------------------------- mode

_lock = threading.Lock()
_probes: dict[str, tuple[bool, str]] = {}       # mode -> (usable, reason when not), probed once
_bwrap_opts: set[str] = set()
_warned = False


def _tool(name: str) -> str | None:
    return shutil.which(name, path=SAFE_PATH)


def _bwrap_path() -> str | None:
    return _tool("bwrap")


def _probe(mode_: str) -> tuple[bool, str]:
    """Run a tiny program through `mode_`'s real command line."""
    global _bwrap_opts
    needed = []
    if mode_ == "bwrap":
        needed = ["bwrap", "prlimit"] + (["setpriv"] if os.geteuid() == 0 else [])
    missing = [t for t in needed if _tool(t) is None]
    if missing:
        names = {"bwrap": "bwrap (bubblewrap)", "prlimit": "prlimit (util-linux)", "setpriv": "setpriv (util-linux)"}
        return False, " and ".join(names[t] for t in missing) + " not installed"
    try:
        if mode_ == "bwrap":
            helptext = subprocess.run([_tool("bwrap"), "--help"], capture_output=True, text=True, env={},
                                      timeout=PROBE_TIMEOUT).stdout
            _bwrap_opts = {w for w in helptext.split() if w.startswith("--")}
        r = _run('import sys\nprint("sandbox-ok", sys.base_prefix)', "", timeout=PROBE_TIMEOUT, mem_mb=512,
                 max_output=10_000, mode_=mode_)
    except (OSError, subprocess.SubprocessError) as e:
        return False, f"the {mode_} probe failed: {e!r}"
    prefix = os.path.realpath(sys.base_prefix)
    if r.status == "ok" and r.stdout.strip() == f"sandbox-ok {prefix}":
        return True, ""
    if r.status == "ok" and r.stdout.startswith("sandbox-ok"):         # it found another stdlib than its own
        return False, f"the {mode_} probe failed: the sandboxed interpreter cannot read its prefix {prefix}"
    hint = ""
    if os.geteuid() == 0:
        needs = ("bwrap needs" if mode_ == "bwrap" else
                 "if it is behind a directory that uid cannot cross, the launcher needs")
        hint = (f" (as root, programs run as uid {SANDBOX_UID}: {_interpreter()} and its prefix must be readable "
                f"by it; {needs} CAP_SYS_ADMIN)")
    return False, f"the {mode_} probe failed ({r.status}, rc={r.returncode}): {r.stderr.strip()[-300:]}{hint}"


def _usable(mode_: str) -> tuple[bool, str]:
    with _lock:
        if mode_ not in _probes:
            _probes[mode_] = _probe(mode_)
        return _probes[mode_]


def _warn_rlimit(reason: str) -> None:
    global _warned
    with _lock:
        if _warned:
            return
        _warned = True
    who = (f"they run as uid {SANDBOX_UID} (nobody) and can READ every world-readable file"
           if os.geteuid() == 0 else
           "they run as YOUR uid and can READ every file you can (keys, tokens, other runs' code) and connect "
           "to your Unix sockets")
    seccomp = ("a seccomp filter refuses new processes, network sockets and acting on other processes"
               if _FILTER is not None else
               "NO seccomp filter on this machine (not x86_64/aarch64): new processes are refused only by "
               "RLIMIT_NPROC, the network is reachable and processes of the same uid can be signalled")
    landlock = (f"Landlock (ABI {_LANDLOCK_ABI}) confines their writes to the run directory" if _LANDLOCK_ABI else
                "NO LANDLOCK on this kernel (Linux < 5.13, or disabled): they can WRITE wherever "
                f"{'uid %d' % SANDBOX_UID if os.geteuid() == 0 else 'you'} can")
    msg = (f"SANDBOX RUNNING IN RLIMIT MODE ({reason}): model-written programs run WITHOUT bubblewrap isolation: "
           f"{who}; {seccomp}; {landlock}. Install bubblewrap for real isolation (docs/SECURITY.md; check with "
           f"`python -m tasks.sandbox`).")
    warnings.warn(msg, RuntimeWarning, stacklevel=2)
    log.warning(msg)


def mode(requested: str | None = None) -> str:
    """The sandbox mode in use: "bwrap" or "rlimit".

    `requested` (or else the RLANYTHING_SANDBOX environment variable): "auto"
    (default: bwrap when it is installed and its one-time probe runs a program,
    otherwise rlimit with a loud one-time warning), "rlimit" (force the fallback,
    e.g. for tests) or "bwrap" (raise RuntimeError when bwrap is unusable).
    Raises RuntimeError when the mode it would use fails its probe.
    """
    req = (requested if requested is not None else os.environ.get(ENV_VAR, "")).strip().lower() or "auto"
    if req not in ("auto", "bwrap", "rlimit"):
        raise ValueError(f"sandbox mode must be auto, bwrap or rlimit, not {req!r}")
    if req == "rlimit":
        reason = f"forced by {'argument' if requested is not None else ENV_VAR}=rlimit"
    else:
        usable, reason = _usable("bwrap")
        if usable:
            return "bwrap"
        if req == "bwrap":
            raise RuntimeError(f"sandbox mode bwrap requested but unusable: {reason}")
    usable, why = _usable("rlimit")
    if not usable:
        raise RuntimeError(f"no usable sandbox: rlimit mode ({reason}) is unusable too: {why}")
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


def _interpreter_dirs(exe: str) -> list[str]:
    """The interpreter's prefix and base prefixes, outside /usr (which both modes have), outermost only."""
    dirs = {os.path.realpath(p) for p in (sys.base_prefix, sys.base_exec_prefix, os.path.dirname(os.path.dirname(exe)))
            if not _under(os.path.realpath(p), "/usr")}
    return sorted(d for d in dirs if not any(o != d and _under(d, o) for o in dirs))


def _closed_on_the_way(dirs: list[str]) -> tuple[list[str], list[str]]:
    """(closed, behind): the outermost directories that others may not cross (no o+x) on the way to
    `dirs`, and the dirs behind them."""
    closed, behind = set(), []
    for d in dirs:
        parts = d.strip("/").split("/")
        for i in range(1, len(parts)):
            ancestor = "/" + "/".join(parts[:i])
            if not os.stat(ancestor).st_mode & stat.S_IXOTH:
                closed.add(ancestor)
                behind.append(d)
                break
    return sorted(closed), behind


def _bwrap_argv(rundir: str, exe: str, seccomp_fd: int | None, as_root: bool) -> list[str]:
    opt = _bwrap_opts
    sized = lambda n: ["--size", str(n)] if "--size" in opt else []          # noqa: E731
    argv = [_tool("bwrap") or "bwrap", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    if as_root:
        # No user namespace: bwrap binds what root can read. It keeps three capabilities, to enter the
        # run directory (SANDBOX_UID's, mode 0700) and for the setpriv below, which drops the program to
        # SANDBOX_UID: that clears them all.
        argv += ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
                 "--cap-add", "CAP_DAC_READ_SEARCH", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        argv += ["--unshare-all", "--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_GID)]
        if "--disable-userns" in opt:
            argv += ["--disable-userns"]
    # A private /tmp first: the binds below may go into it (an interpreter under /tmp).
    argv += [*(["--perms", "1777"] if "--perms" in opt else []), *sized(FILE_LIMIT), "--tmpfs", "/tmp"]
    binds = [("--ro-bind", "/usr")]
    for name in _ROOT_LINKS:
        path = "/" + name
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            binds.append(("--ro-bind", path))
    binds += [("--ro-bind-try", f"/etc/{name}") for name in _ETC_FILES]
    binds += [("--ro-bind", d) for d in _interpreter_dirs(exe)]
    # The directories on the way to the mount points, made 0755: bwrap makes them 0700, and as root
    # they are root's, so that uid 65534 could not cross them.
    parents = set()
    for _, path in binds:
        d = os.path.dirname(path)
        while d != "/":
            parents.add(d)
            d = os.path.dirname(d)
    for d in sorted(parents, key=lambda d: d.count("/")):
        argv += [*(["--perms", "0755"] if "--perms" in opt else []), "--dir", d]
    for how, path in binds:
        argv += [how, path, path]
    argv += ["--proc", "/proc", "--dev", "/dev", *sized(SHM_LIMIT), "--tmpfs", "/dev/shm", "--remount-ro", "/dev",
             "--bind", rundir, INNER_DIR, "--remount-ro", "/", "--chdir", INNER_DIR,
             "--clearenv", "--setenv", "PATH", SAFE_PATH, "--setenv", "LANG", "C.UTF-8", "--setenv", "HOME", INNER_DIR]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    argv += ["--"]
    if as_root:
        argv += [_tool("setpriv") or "setpriv", f"--reuid={SANDBOX_UID}", f"--regid={SANDBOX_GID}", "--clear-groups",
                 "--inh-caps=-all", "--"]
    return argv + [exe, "-I", "-S", "-X", "utf8", "main.py"]


def _launcher_argv(exe: str, limits: list[tuple[int, int, int]], as_root: bool) -> list[str]:
    closed, behind = _closed_on_the_way(_interpreter_dirs(exe)) if as_root else ([], [])
    config = {"uid": SANDBOX_UID if as_root else None, "gid": SANDBOX_GID, "hide": closed, "rebind": behind,
              "limits": limits, "ppid": os.getpid(), "landlock": _LANDLOCK_ABI, "filter": (_FILTER or b"").hex(),
              "argv": [exe, "-I", "-S", "-X", "utf8", "main.py"]}
    return [exe, "-I", "-S", "-c", _LAUNCHER, json.dumps(config)]


def _limits(timeout: float, mem_mb: int, rlimit_mode: bool) -> list[tuple[int, int, int]]:
    cpu = int(math.ceil(timeout)) + 1
    wanted = [(resource.RLIMIT_CPU, cpu, cpu + 1),
              (resource.RLIMIT_AS, mem_mb << 20, mem_mb << 20),
              (resource.RLIMIT_FSIZE, FILE_LIMIT, FILE_LIMIT),
              (resource.RLIMIT_NOFILE, NOFILE_LIMIT, NOFILE_LIMIT),
              (resource.RLIMIT_CORE, 0, 0)]
    if rlimit_mode and _FILTER is None and hasattr(resource, "RLIMIT_NPROC"):
        # No seccomp: refuse forks by RLIMIT_NPROC (it counts all the program's uid's processes, so 0
        # means none; as root the program is SANDBOX_UID, which it binds). Not in bwrap mode: bwrap forks.
        wanted.append((resource.RLIMIT_NPROC, 0, 0))
    out = []
    for res, soft, hard in wanted:                                  # never above the current hard limit
        cur_hard = resource.getrlimit(res)[1]
        if cur_hard != resource.RLIM_INFINITY:
            soft, hard = min(soft, cur_hard), min(hard, cur_hard)
        out.append((res, soft, hard))
    return out


_PRLIMIT_NAMES = {resource.RLIMIT_CPU: "cpu", resource.RLIMIT_AS: "as", resource.RLIMIT_FSIZE: "fsize",
                  resource.RLIMIT_NOFILE: "nofile", resource.RLIMIT_CORE: "core"}


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


def _chmod_dir(path: str) -> None:
    """chmod 0700 `path` if it is a directory, never through a symlink."""
    try:
        fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.chmod(f"/proc/self/fd/{fd}", 0o700)
    except OSError:
        pass
    finally:
        os.close(fd)


def _remove_dir(path: str) -> None:
    """rm -rf that also copes with the program's chmods and a just-killed writer."""
    for attempt in range(6):
        if os.geteuid() != 0:               # (root needs no permission) reopen what the program closed (chmod 0)
            _chmod_dir(path)
            for top, dirs, _ in os.walk(path):
                for d in dirs:
                    _chmod_dir(os.path.join(top, d))
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.lexists(path):
            return
        time.sleep(0.05 * (attempt + 1))
    log.warning("sandbox: could not remove %s", path)


def _run(code: str, stdin: str, *, timeout: float, mem_mb: int, max_output: int, mode_: str,
         inspect: Callable[[str], None] | None = None) -> RunResult:
    """One run. `inspect`, if given, is called with the run directory once the program has ended."""
    exe = _interpreter()
    as_root = os.geteuid() == 0
    rundir = tempfile.mkdtemp(prefix=f"{RUN_PREFIX}{os.getpid()}-")
    try:
        main = os.path.join(rundir, "main.py")
        with open(main, "w", encoding="utf-8") as f:
            f.write(code)
        if as_root:
            for p in (rundir, main):
                os.chown(p, SANDBOX_UID, SANDBOX_GID)
        limits = _limits(timeout, mem_mb, mode_ == "rlimit")
        seccomp_fd, pass_fds = None, ()
        if mode_ == "bwrap":
            if _FILTER is not None:
                seccomp_fd, w = os.pipe()
                os.write(w, _FILTER)
                os.close(w)
                pass_fds = (seccomp_fd,)
            # util-linux's prlimit sets the limits and execs bwrap.
            argv = [_tool("prlimit") or "prlimit", *(f"--{_PRLIMIT_NAMES[r]}={s}:{h}" for r, s, h in limits), "--",
                    *_bwrap_argv(rundir, exe, seccomp_fd, as_root)]
            env, cwd = {}, "/"
        else:
            argv = _launcher_argv(exe, limits, as_root)
            env = {"PATH": SAFE_PATH, "LANG": "C.UTF-8", "HOME": rundir, "TMPDIR": rundir}
            cwd = rundir
        start = time.monotonic()
        # No preexec_fn in either mode: one would force a full fork(), which copies the page tables
        # of this (large: models, vLLM) process, instead of a vfork().
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, cwd=cwd, env=env, close_fds=True,
                                    pass_fds=pass_fds, start_new_session=True)
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
        if inspect is not None:
            inspect(rundir)
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


# What the runs of this process cost since the last `pop_stats`: how many, how many ran out of time and the
# wall seconds those took, the slowest run that passed (exit 0): how close a good program comes to the timeout,
# and the jobs answered by an identical job's run instead of a run of their own (`run_many`).
_NONE = {"runs": 0, "timeouts": 0, "timeout_seconds": 0.0, "slowest_ok_seconds": 0.0, "reused": 0}
_STATS = dict(_NONE)


def pop_stats() -> dict:
    """The counts of `run_many`'s runs since the last call (logged by the loop as sandbox/*), then reset."""
    stats = dict(_STATS)
    _STATS.update(_NONE)
    return stats


def _count(results: list[RunResult]) -> list[RunResult]:
    for r in results:
        _STATS["runs"] += 1
        if r.status == "timeout":
            _STATS["timeouts"] += 1
            _STATS["timeout_seconds"] += r.seconds
        elif r.ok:
            _STATS["slowest_ok_seconds"] = max(_STATS["slowest_ok_seconds"], r.seconds)
    return results


def run_many(jobs: list[tuple[str, str]], *, timeout: float = 5.0, mem_mb: int = 512,
             max_output: int = 1_000_000, workers: int | None = None,
             mode: str | None = None) -> list[RunResult]:
    """Run (code, stdin) jobs in parallel, `workers` at a time (default: the CPU count).

    Results come back in job order. Identical jobs run once and share that run's result: a program's verdict on
    an input is taken as a function of the two (G samples of a policy often write the same program, and every
    program of a task runs on the same tests). Each distinct job is a `run_program` call; `pop_stats` counts
    them, and the jobs that reused one.
    """
    if not jobs:
        return []
    m = _resolve(mode)
    distinct = list(dict.fromkeys(jobs))   # first occurrences, in order
    workers = max(1, min(workers or os.cpu_count() or 1, len(distinct)))

    def one(job: tuple[str, str]) -> RunResult:
        code, stdin = job
        return _run(code, stdin, timeout=timeout, mem_mb=mem_mb, max_output=max_output, mode_=m)

    if workers == 1:
        ran = [one(j) for j in distinct]
    else:
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sandbox") as pool:
            ran = list(pool.map(one, distinct))
    _STATS["reused"] += len(jobs) - len(distinct)
    result = dict(zip(distinct, _count(ran)))
    return [result[j] for j in jobs]


# ----------------------------------------------------------------------------- report, leftovers

_REPORT_CODE = ("open('owner', 'w').close()\n"
                "print([line.split()[1] for line in open('/proc/self/status') if line.startswith('Seccomp:')][0])\n")


def report(requested: str | None = None) -> str:
    """One line on the sandbox in use, measured by running a program in it, e.g.
    "sandbox: bwrap, program uid 65534 (host), seccomp on, landlock n/a".

    The uid is the host owner of a file the program creates (inside bwrap, a
    program sees its user namespace's uid, not the host's). `requested`: as for `mode()`.
    """
    m = mode(requested)
    owner: list[int] = []

    def inspect(rundir: str) -> None:
        try:
            owner.append(os.lstat(os.path.join(rundir, "owner")).st_uid)
        except OSError:
            pass

    r = _run(_REPORT_CODE, "", timeout=PROBE_TIMEOUT, mem_mb=512, max_output=10_000, mode_=m, inspect=inspect)
    if not (r.ok and owner):
        raise RuntimeError(f"the {m} sandbox did not run the report program: {r}")
    seccomp = "seccomp on" if r.stdout.strip() == "2" else "seccomp OFF"
    if m == "bwrap":
        landlock = "landlock n/a"
    elif _LANDLOCK_ABI:
        landlock = f"landlock ABI {_LANDLOCK_ABI} (writes confined to the run directory)"
    else:
        landlock = "NO landlock (writes not confined)"
    return f"sandbox: {m}, program uid {owner[0]} (host), {seccomp}, {landlock}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:                 # someone else's
        pass
    return True


def cleanup_stale(max_age_s: float = 24 * 3600.0) -> int:
    """Remove the run directories that killed runs left behind; returns how many were removed.

    A run directory (<tempdir>/rlanything-sandbox-<creator pid>-*) is stale when its
    creator is no longer running, or when it is older than `max_age_s` (no run lasts
    that long: this also covers a reused pid, and directories without a pid). Only
    directories of this uid, and as root of SANDBOX_UID, are touched.
    """
    owners = {os.geteuid()} | ({SANDBOX_UID} if os.geteuid() == 0 else set())
    now, removed = time.time(), 0
    try:
        entries = list(os.scandir(tempfile.gettempdir()))
    except OSError:
        return 0
    for entry in entries:
        if not entry.name.startswith(RUN_PREFIX):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid not in owners:
            continue
        creator = entry.name[len(RUN_PREFIX):].split("-", 1)[0]
        if now - st.st_mtime < max_age_s and not (creator.isdecimal() and not _pid_alive(int(creator))):
            continue
        _remove_dir(entry.path)
        removed += not os.path.lexists(entry.path)
    return removed


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


if __name__ == "__main__":
    print(report(sys.argv[1] if len(sys.argv) > 1 else None))
