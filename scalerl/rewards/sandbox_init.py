"""The sandbox's first process: sets up the jail, runs the untrusted program, reaps and reports.

Executed as a script (`python -I -S sandbox_init.py SPEC_DIR`) by `sandbox.Sandbox`, usually as
PID 1 of fresh PID/mount/network/IPC/UTS namespaces made by `unshare`. Stdlib only, imports no
scalerl code. Steps:

1. read `SPEC_DIR/spec.json` and the program files (before any mount hides them); join the
   run's cgroups (`cgroup.py`, made by the host) so that the program's whole tree is charged to
   them, exempt the init itself from the OOM killer and start watching the cgroup for OOM kills;
2. with a mount namespace: everything read-only (every mount re-bound `ro`), a fresh `/proc` of
   the new PID namespace (`hidepid=2`), a fresh read-only `/sys` of the new network namespace
   (no host interfaces, no cgroup hierarchies), a size-limited tmpfs on `/tmp` that becomes the scratch
   dir (owned by the program's uid, the only writable place), empty read-only tmpfs over the
   other world-writable dirs (`/var/tmp`, `/dev/shm`) and over `/run` (host service sockets),
   so host files there are hidden, then a private 16 MB `/dev/shm` on top (POSIX semaphores);
   without one: a scratch dir `SPEC_DIR/work` on the host;
3. fork the program: new process group, clean environment, supplementary groups dropped,
   uid/gid switched (when root), no-new-privileges, capability bounding set emptied, rlimits
   (CPU, address space, processes, file size, open files, core=0), OOM score back to 0, then exec;
4. wait, reaping every orphan, until the program exits, the wall-clock limit passes, the host
   writes to / closes the control pipe, or the tree's memory cgroup OOM-kills one of its
   processes (then the whole tree is stopped, not only the victim); then SIGKILL everything
   left (as PID 1: `kill(-1)`, which empties the namespace; otherwise the process group and,
   when the uid is dedicated, every process of that uid);
5. write one JSON status line to the status pipe and exit 0 (setup failure: status + exit 125).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import resource
import select
import signal
import sys
import time
from typing import Any

MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_NOATIME = 0x400
MS_NODIRATIME = 0x800
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000
MS_RELATIME = 0x200000
MS_STRICTATIME = 0x1000000
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4

# Per-mount options from /proc/self/mountinfo that a read-only bind remount must keep (a user
# namespace refuses to clear locked flags).
_MOUNT_OPTION_FLAGS = {
    "nosuid": MS_NOSUID,
    "nodev": MS_NODEV,
    "noexec": MS_NOEXEC,
    "noatime": MS_NOATIME,
    "nodiratime": MS_NODIRATIME,
    "relatime": MS_RELATIME,
    "strictatime": MS_STRICTATIME,
}
# World-writable dirs, and /run, where host services keep their Unix sockets (D-Bus, systemd,
# nscd): a socket file stays connectable through a read-only mount, so it must not be visible.
_HIDDEN_DIRS = ("/var/tmp", "/dev/shm", "/run")
_SCRATCH = "/tmp"
_SHM = "/dev/shm"
_SHM_BYTES = 16 * 1024 * 1024

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]


def _enc(value: str | None) -> bytes | None:
    return None if value is None else value.encode()


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    if _libc.mount(_enc(source), _enc(target), _enc(fstype), flags, _enc(data)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {fstype or source} on {target}: {os.strerror(err)}")


def prctl(option: int, arg2: int = 0, arg3: int = 0) -> None:
    if _libc.prctl(option, arg2, arg3, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl({option}, {arg2}): {os.strerror(err)}")


def _mount_points() -> list[tuple[str, int]]:
    """(mount point, flags to keep) for every mount visible here, parents before children."""
    points = []
    with open("/proc/self/mountinfo", encoding="utf-8") as fh:
        for line in fh:
            fields = line.split()
            point = fields[4].encode().decode("unicode_escape")  # mountinfo octal-escapes spaces
            keep = 0
            for option in fields[5].split(","):
                keep |= _MOUNT_OPTION_FLAGS.get(option, 0)
            points.append((point, keep))
    return points


def build_jail(spec: dict[str, Any], files: dict[str, bytes]) -> list[str]:
    """Make the filesystem read-only except a private scratch tmpfs; returns non-fatal problems."""
    problems = []
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing below may propagate back to the host
    for point, keep in _mount_points():
        try:
            mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | keep)
        except OSError as exc:
            if point == "/":
                raise
            problems.append(str(exc))
    uid, gid = spec["uid"], spec["gid"]
    trees = _plan_trees(spec["expose"], unprivileged=uid is not None)  # before anything is covered
    if spec["pid_namespace"]:
        try:
            mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=2")
        except OSError:
            mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
            problems.append("/proc mounted without hidepid")
        try:  # the host's sysfs lists the host's network interfaces; a fresh one shows the jail's
            mount("sysfs", "/sys", "sysfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
        except OSError as exc:
            problems.append(f"host /sys kept (host network interfaces visible): {exc}")
    owner = f",uid={uid},gid={gid}" if uid is not None else ""
    mount("tmpfs", _SCRATCH, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
          f"size={spec['scratch_bytes']},nr_inodes={spec['scratch_inodes']},mode=0700{owner}")
    sealed = [d for d in _HIDDEN_DIRS if os.path.isdir(d) and not os.path.islink(d)]
    sealed += sorted({anchor for _, anchor, _ in trees if not _covered(anchor)})
    for directory in sealed:  # root-owned, emptied; made read-only once the trees are in
        mount("tmpfs", directory, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=64k,mode=0755")
    for tree, _, fd in trees:
        os.makedirs(tree, mode=0o755, exist_ok=True)
        mount(f"/proc/self/fd/{fd}", tree, None, MS_BIND | MS_REC)
        mount(None, tree, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
        os.close(fd)
    for directory in sealed:
        mount(None, directory, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
    if _SHM in sealed:  # a private, small one on top: POSIX semaphores (multiprocessing locks) live here
        mount("tmpfs", _SHM, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
              f"size={_SHM_BYTES},nr_inodes=256,mode=0700{owner}")
    _write_files(_SCRATCH, files, uid, gid)
    return problems


def _under(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def _covered(path: str) -> bool:
    """Whether the jail replaces the dir holding `path` with a fresh tmpfs (/tmp, /var/tmp, ...)."""
    return any(_under(path, d) for d in (_SCRATCH, *_HIDDEN_DIRS))


def _hidden_ancestor(path: str) -> str | None:
    """The topmost directory above or at `path` that others may not traverse (e.g. /root)."""
    parts = path.strip("/").split("/")
    for depth in range(1, len(parts) + 1):
        candidate = "/" + "/".join(parts[:depth])
        if not os.stat(candidate).st_mode & 0o001:
            return candidate
    return None


def _plan_trees(paths: list[str], unprivileged: bool) -> list[tuple[str, str, int]]:
    """(tree, anchor, O_PATH fd) for each interpreter tree the jail would otherwise hide.

    A tree is hidden when it lives under a dir the jail covers with a tmpfs (a checkout and its
    venv under /tmp) or, for an unprivileged uid, under a private dir (a pyenv Python in /root).
    Each such tree is bind-mounted back, read-only, at its own path into an otherwise empty
    tmpfs, so the rest of the private dir (keys, credentials) stays invisible. The O_PATH fd
    keeps the tree reachable once its anchor is covered. A private dir is never exposed whole.
    """
    plan: list[tuple[str, str, int]] = []
    for tree in sorted({os.path.realpath(p) for p in paths if os.path.isdir(p)}):
        if any(_under(tree, done) for done, _, _ in plan):
            continue  # inside a tree already planned
        anchor = next((d for d in (_SCRATCH, *_HIDDEN_DIRS) if _under(tree, d)), None)
        if anchor is None and unprivileged:
            anchor = _hidden_ancestor(tree)
        if anchor is None or anchor == tree:
            continue
        plan.append((tree, anchor, os.open(tree, os.O_PATH | os.O_DIRECTORY)))
    return plan


def _write_files(directory: str, files: dict[str, bytes], uid: int | None, gid: int | None) -> None:
    for name, content in files.items():
        path = os.path.join(directory, name)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(content)
        if uid is not None:
            os.chown(path, uid, gid)


# Classic BPF for seccomp (linux/filter.h, linux/seccomp.h). seccomp_data: nr at 0, arch at 4,
# args[i] at 16 + 8 i (low word first on these little-endian arches).
_BPF_LD_ABS, _BPF_JEQ, _BPF_JGE, _BPF_JSET, _BPF_RET = 0x20, 0x15, 0x35, 0x45, 0x06
_RET_ALLOW, _RET_ERRNO = 0x7FFF0000, 0x00050000
_AF_INET, _AF_INET6 = 2, 10
# arch: (AUDIT_ARCH_* of linux/audit.h, x32 syscall bit or 0). Only these two have a table: on any
# other machine the sandbox does not start.
_SECCOMP_ARCH = {"x86_64": (0xC000003E, 0x40000000), "aarch64": (0xC00000B7, 0)}
# The calls checked by argument: socket, ioctl, clone, clone3 (asm/unistd_64.h; asm-generic/unistd.h)
_SPECIAL_NR = {"x86_64": {"socket": 41, "ioctl": 16, "clone": 56, "clone3": 435},
               "aarch64": {"socket": 198, "ioctl": 29, "clone": 220, "clone3": 435}}

# The x86_64 allow-list: what CPython, its stdlib (files, threads, subprocess, multiprocessing's
# fork start method, asyncio, sockets, signals, timers) and numpy use, found by `strace -f -c` of
# such programs and completed by family (every variant of a call the interpreter makes). Left out,
# so refused with EPERM: namespaces (unshare, setns), mounts and pivot_root, ptrace and
# process_vm_*, kcmp, pidfd_getfd, bpf, perf_event_open, userfaultfd, io_uring, keyrings (add_key,
# request_key, keyctl), fanotify, name_to_handle_at/open_by_handle_at, module and kexec loading,
# reboot, swap, quotas, acct, syslog, clock and host-name setting, sync/syncfs, personality,
# modify_ldt/iopl/ioperm, vmsplice, POSIX message queues, the uid/gid/capability setters, seccomp,
# and everything newer than this table. Three calls are checked by argument: socket (AF_INET and
# AF_INET6 only: a Unix socket file stays connectable through a read-only mount, and the network
# namespace does not cover it), clone (no CLONE_NEW* flag) and ioctl (terminal and fd-flag queries
# only). clone3 gets ENOSYS, so glibc falls back to clone, whose flags the filter can read.
_X86_64_ALLOWED: dict[str, int] = {  # name -> number (asm/unistd_64.h), by what the interpreter uses them for
    # files
    "read": 0, "write": 1, "readv": 19, "writev": 20, "pread64": 17, "pwrite64": 18, "preadv": 295,
    "pwritev": 296, "preadv2": 327, "pwritev2": 328, "open": 2, "openat": 257, "openat2": 437, "close": 3,
    "close_range": 436, "creat": 85, "lseek": 8, "fstat": 5, "stat": 4, "lstat": 6, "newfstatat": 262,
    "statx": 332, "statfs": 137, "fstatfs": 138, "access": 21, "faccessat": 269, "faccessat2": 439,
    "readlink": 89, "readlinkat": 267, "getdents": 78, "getdents64": 217, "fcntl": 72, "dup": 32,
    "dup2": 33, "dup3": 292, "pipe": 22, "pipe2": 293, "fsync": 74, "fdatasync": 75, "ftruncate": 77,
    "truncate": 76, "fallocate": 285, "rename": 82, "renameat": 264, "renameat2": 316, "unlink": 87,
    "unlinkat": 263, "mkdir": 83, "mkdirat": 258, "rmdir": 84, "link": 86, "linkat": 265, "symlink": 88,
    "symlinkat": 266, "chmod": 90, "fchmod": 91, "fchmodat": 268, "fchmodat2": 452, "chown": 92,
    "fchown": 93, "lchown": 94, "fchownat": 260, "utime": 132, "utimes": 235, "utimensat": 280,
    "futimesat": 261, "umask": 95, "getcwd": 79, "chdir": 80, "fchdir": 81, "flock": 73,
    "copy_file_range": 326, "sendfile": 40, "splice": 275, "tee": 276, "fadvise64": 221, "readahead": 187,
    "memfd_create": 319, "mknod": 133, "mknodat": 259, "getxattr": 191, "lgetxattr": 192, "fgetxattr": 193,
    "listxattr": 194, "llistxattr": 195, "flistxattr": 196, "setxattr": 188, "lsetxattr": 189,
    "fsetxattr": 190, "removexattr": 197, "lremovexattr": 198, "fremovexattr": 199,
    # waiting
    "select": 23, "pselect6": 270, "poll": 7, "ppoll": 271, "epoll_create": 213, "epoll_create1": 291,
    "epoll_ctl": 233, "epoll_wait": 232, "epoll_pwait": 281, "epoll_pwait2": 441, "eventfd": 284,
    "eventfd2": 290, "signalfd": 282, "signalfd4": 289, "timerfd_create": 283, "timerfd_settime": 286,
    "timerfd_gettime": 287, "inotify_init": 253, "inotify_init1": 294, "inotify_add_watch": 254,
    "inotify_rm_watch": 255,
    # memory
    "mmap": 9, "munmap": 11, "mprotect": 10, "mremap": 25, "madvise": 28, "brk": 12, "msync": 26,
    "mincore": 27, "mlock": 149, "mlock2": 325, "munlock": 150, "mlockall": 151, "munlockall": 152,
    "membarrier": 324, "get_mempolicy": 239, "mbind": 237,
    # processes
    "fork": 57, "vfork": 58, "execve": 59, "execveat": 322, "exit": 60, "exit_group": 231, "wait4": 61,
    "waitid": 247, "kill": 62, "tkill": 200, "tgkill": 234, "getpid": 39, "getppid": 110, "gettid": 186,
    "getuid": 102, "geteuid": 107, "getgid": 104, "getegid": 108, "getresuid": 118, "getresgid": 120,
    "getgroups": 115, "getpgid": 121, "getpgrp": 111, "getsid": 124, "setpgid": 109, "setsid": 112,
    "set_tid_address": 218, "set_robust_list": 273, "get_robust_list": 274, "futex": 202,
    "futex_waitv": 449, "rseq": 334, "arch_prctl": 158, "prctl": 157, "sched_yield": 24,
    "sched_getaffinity": 204, "sched_setaffinity": 203, "sched_getparam": 143, "sched_getscheduler": 145,
    "sched_get_priority_max": 146, "sched_get_priority_min": 147, "sched_rr_get_interval": 148,
    "sched_getattr": 315, "getpriority": 140, "setpriority": 141, "getrlimit": 97, "setrlimit": 160,
    "prlimit64": 302, "getrusage": 98, "times": 100, "sysinfo": 99, "uname": 63, "capget": 125,
    "pidfd_open": 434, "pidfd_send_signal": 424,
    # signals
    "rt_sigaction": 13, "rt_sigprocmask": 14, "rt_sigreturn": 15, "rt_sigpending": 127,
    "rt_sigtimedwait": 128, "rt_sigsuspend": 130, "rt_sigqueueinfo": 129, "rt_tgsigqueueinfo": 297,
    "sigaltstack": 131, "pause": 34, "alarm": 37, "setitimer": 38, "getitimer": 36, "restart_syscall": 219,
    # time
    "clock_gettime": 228, "clock_getres": 229, "clock_nanosleep": 230, "nanosleep": 35, "gettimeofday": 96,
    "time": 201, "timer_create": 222, "timer_settime": 223, "timer_gettime": 224, "timer_getoverrun": 225,
    "timer_delete": 226, "getrandom": 318, "getcpu": 309,
    # sockets
    "socketpair": 53, "connect": 42, "bind": 49, "listen": 50, "accept": 43, "accept4": 288, "sendto": 44,
    "recvfrom": 45, "sendmsg": 46, "recvmsg": 47, "sendmmsg": 307, "recvmmsg": 299, "shutdown": 48,
    "getsockname": 51, "getpeername": 52, "setsockopt": 54, "getsockopt": 55,
    # sysv_ipc
    "shmget": 29, "shmat": 30, "shmctl": 31, "shmdt": 67, "semget": 64, "semop": 65, "semctl": 66,
    "semtimedop": 220, "msgget": 68, "msgsnd": 69, "msgrcv": 70, "msgctl": 71,
}
# The x86_64 names with no syscall of their own in the generic table aarch64 uses (asm-generic/
# unistd.h has only the *at, *2/*4, p* and epoll_pwait variants, and clone for fork/vfork); glibc
# and CPython call the generic variants there, which are in the aarch64 table below.
_X86_64_ONLY = frozenset({
    "access", "alarm", "arch_prctl", "chmod", "chown", "creat", "dup2", "epoll_create", "epoll_wait",
    "eventfd", "fork", "futimesat", "getdents", "getpgrp", "inotify_init", "lchown", "link", "lstat",
    "mkdir", "mknod", "open", "pause", "pipe", "poll", "readlink", "rename", "rmdir", "select",
    "signalfd", "stat", "symlink", "time", "unlink", "utime", "utimes", "vfork",
})
# The aarch64 allow-list: the same calls as x86_64's, numbered by the generic table
# (include/uapi/asm-generic/unistd.h; `newfstatat` is its __NR3264_fstatat, `fstat` __NR3264_fstat).
_AARCH64_ALLOWED: dict[str, int] = {
    # files
    "read": 63, "write": 64, "readv": 65, "writev": 66, "pread64": 67, "pwrite64": 68, "preadv": 69,
    "pwritev": 70, "preadv2": 286, "pwritev2": 287, "openat": 56, "openat2": 437, "close": 57,
    "close_range": 436, "lseek": 62, "fstat": 80, "newfstatat": 79, "statx": 291, "statfs": 43,
    "fstatfs": 44, "faccessat": 48, "faccessat2": 439, "readlinkat": 78, "getdents64": 61, "fcntl": 25,
    "dup": 23, "dup3": 24, "pipe2": 59, "fsync": 82, "fdatasync": 83, "ftruncate": 46, "truncate": 45,
    "fallocate": 47, "renameat": 38, "renameat2": 276, "unlinkat": 35, "mkdirat": 34, "linkat": 37,
    "symlinkat": 36, "fchmod": 52, "fchmodat": 53, "fchmodat2": 452, "fchown": 55, "fchownat": 54,
    "utimensat": 88, "umask": 166, "getcwd": 17, "chdir": 49, "fchdir": 50, "flock": 32,
    "copy_file_range": 285, "sendfile": 71, "splice": 76, "tee": 77, "fadvise64": 223, "readahead": 213,
    "memfd_create": 279, "mknodat": 33, "getxattr": 8, "lgetxattr": 9, "fgetxattr": 10, "listxattr": 11,
    "llistxattr": 12, "flistxattr": 13, "setxattr": 5, "lsetxattr": 6, "fsetxattr": 7, "removexattr": 14,
    "lremovexattr": 15, "fremovexattr": 16,
    # waiting
    "pselect6": 72, "ppoll": 73, "epoll_create1": 20, "epoll_ctl": 21, "epoll_pwait": 22,
    "epoll_pwait2": 441, "eventfd2": 19, "signalfd4": 74, "timerfd_create": 85, "timerfd_settime": 86,
    "timerfd_gettime": 87, "inotify_init1": 26, "inotify_add_watch": 27, "inotify_rm_watch": 28,
    # memory
    "mmap": 222, "munmap": 215, "mprotect": 226, "mremap": 216, "madvise": 233, "brk": 214, "msync": 227,
    "mincore": 232, "mlock": 228, "mlock2": 284, "munlock": 229, "mlockall": 230, "munlockall": 231,
    "membarrier": 283, "get_mempolicy": 236, "mbind": 235,
    # processes
    "execve": 221, "execveat": 281, "exit": 93, "exit_group": 94, "wait4": 260, "waitid": 95, "kill": 129,
    "tkill": 130, "tgkill": 131, "getpid": 172, "getppid": 173, "gettid": 178, "getuid": 174,
    "geteuid": 175, "getgid": 176, "getegid": 177, "getresuid": 148, "getresgid": 150, "getgroups": 158,
    "getpgid": 155, "getsid": 156, "setpgid": 154, "setsid": 157, "set_tid_address": 96,
    "set_robust_list": 99, "get_robust_list": 100, "futex": 98, "futex_waitv": 449, "rseq": 293,
    "prctl": 167, "sched_yield": 124, "sched_getaffinity": 123, "sched_setaffinity": 122,
    "sched_getparam": 121, "sched_getscheduler": 120, "sched_get_priority_max": 125,
    "sched_get_priority_min": 126, "sched_rr_get_interval": 127, "sched_getattr": 275, "getpriority": 141,
    "setpriority": 140, "getrlimit": 163, "setrlimit": 164, "prlimit64": 261, "getrusage": 165,
    "times": 153, "sysinfo": 179, "uname": 160, "capget": 90, "pidfd_open": 434, "pidfd_send_signal": 424,
    # signals
    "rt_sigaction": 134, "rt_sigprocmask": 135, "rt_sigreturn": 139, "rt_sigpending": 136,
    "rt_sigtimedwait": 137, "rt_sigsuspend": 133, "rt_sigqueueinfo": 138, "rt_tgsigqueueinfo": 240,
    "sigaltstack": 132, "setitimer": 103, "getitimer": 102, "restart_syscall": 128,
    # time
    "clock_gettime": 113, "clock_getres": 114, "clock_nanosleep": 115, "nanosleep": 101,
    "gettimeofday": 169, "timer_create": 107, "timer_settime": 110, "timer_gettime": 108,
    "timer_getoverrun": 109, "timer_delete": 111, "getrandom": 278, "getcpu": 168,
    # sockets
    "socketpair": 199, "connect": 203, "bind": 200, "listen": 201, "accept": 202, "accept4": 242,
    "sendto": 206, "recvfrom": 207, "sendmsg": 211, "recvmsg": 212, "sendmmsg": 269, "recvmmsg": 243,
    "shutdown": 210, "getsockname": 204, "getpeername": 205, "setsockopt": 208, "getsockopt": 209,
    # sysv_ipc
    "shmget": 194, "shmat": 196, "shmctl": 195, "shmdt": 197, "semget": 190, "semop": 193, "semctl": 191,
    "semtimedop": 192, "msgget": 186, "msgsnd": 189, "msgrcv": 188, "msgctl": 187,
}
# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET | NEWTIME (linux/sched.h)
_CLONE_NEW_ANY = (0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
                  | 0x00000080)
# TCGETS, TIOCGWINSZ, TIOCGPGRP, FIONREAD, FIONBIO, FIONCLEX, FIOCLEX (asm-generic/ioctls.h): isatty,
# terminal size, non-blocking and close-on-exec flags, bytes readable.
_IOCTL_ALLOWED = (0x5401, 0x5413, 0x540F, 0x541B, 0x5421, 0x5450, 0x5451)


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte),
                ("k", ctypes.c_uint)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


Insn = tuple[int, int | str, int | str, int]  # (code, jt, jf, k); a str jump names a label


def assemble(lines: list[Insn | str]) -> list[tuple[int, int, int, int]]:
    """Resolve label jumps (a str item defines a label; jumps are forward, at most 255 apart)."""
    labels: dict[str, int] = {}
    insns: list[Insn] = []
    for item in lines:
        if isinstance(item, str):
            labels[item] = len(insns)
        else:
            insns.append(item)
    out = []
    for i, (code, jt, jf, k) in enumerate(insns):
        offsets = [labels[j] - i - 1 if isinstance(j, str) else j for j in (jt, jf)]
        if not all(0 <= o <= 255 for o in offsets):
            raise ValueError(f"seccomp program: jump out of range at {i}: {offsets}")
        out.append((code, offsets[0], offsets[1], k))
    return out


def _allow_list_program(machine: str) -> list[tuple[int, int, int, int]]:
    """The allow-list filter for `machine` (a key of `_SECCOMP_ARCH`)."""
    arch, x32 = _SECCOMP_ARCH[machine]
    special = _SPECIAL_NR[machine]
    deny, nosys = _RET_ERRNO | errno.EPERM, _RET_ERRNO | errno.ENOSYS
    ret = {name: (_BPF_RET, 0, 0, value) for name, value in (("allow", _RET_ALLOW), ("deny", deny),
                                                               ("nosys", nosys))}
    lines: list[Insn | str] = [(_BPF_LD_ABS, 0, 0, 4), (_BPF_JEQ, 1, 0, arch), ret["nosys"],  # a foreign arch
                               (_BPF_LD_ABS, 0, 0, 0)]
    if x32:  # x86_64's x32 ABI: the same numbers with a high bit, another table
        lines += [(_BPF_JGE, 0, 1, x32), ret["nosys"]]
    lines += [
        # socket: internet families only
        (_BPF_JEQ, 0, "ioctl", special["socket"]), (_BPF_LD_ABS, 0, 0, 16),
        (_BPF_JEQ, "socket_ok", 0, _AF_INET), (_BPF_JEQ, "socket_ok", 0, _AF_INET6), ret["deny"],
        "socket_ok", ret["allow"],
        "ioctl", (_BPF_JEQ, 0, "clone", special["ioctl"]), (_BPF_LD_ABS, 0, 0, 24),
        *[(_BPF_JEQ, "ioctl_ok", 0, cmd) for cmd in _IOCTL_ALLOWED], ret["deny"],
        "ioctl_ok", ret["allow"],
        # clone's flags are its first argument on both arches (x86_64 and the generic table)
        "clone", (_BPF_JEQ, 0, "clone3", special["clone"]), (_BPF_LD_ABS, 0, 0, 16),
        (_BPF_JSET, 0, 1, _CLONE_NEW_ANY), ret["deny"], ret["allow"],
        "clone3", (_BPF_JEQ, 0, 1, special["clone3"]), ret["nosys"],
    ]
    for nr in sorted(allowed_syscalls(machine).values()):
        lines += [(_BPF_JEQ, 0, 1, nr), ret["allow"]]
    lines.append(ret["deny"])
    return assemble(lines)


SECCOMP_MACHINES = tuple(_SECCOMP_ARCH)  # `platform.machine()` values the sandbox runs on


def allowed_syscalls(machine: str) -> dict[str, int]:
    """name -> number of every syscall the filter allows outright on `machine` (socket, ioctl and
    clone are checked by argument on top). Raises KeyError for an arch without a table."""
    return {"x86_64": _X86_64_ALLOWED, "aarch64": _AARCH64_ALLOWED}[machine]


def seccomp_program(machine: str) -> list[tuple[int, int, int, int]] | None:
    """The filter for `machine` (`platform.machine()`), or None for an arch without a table: the
    sandbox then refuses to run anything (`Sandbox` before starting, this init as a last guard).

    x86_64 and aarch64: an allow-list of what a Python interpreter needs (above); anything else is
    refused with EPERM, foreign-arch (and x32) syscalls with ENOSYS, so the table cannot be
    side-stepped. Pipes and `socketpair` (multiprocessing's fork start method, asyncio) work.
    """
    if machine not in _SECCOMP_ARCH:
        return None
    return _allow_list_program(machine)


def install_seccomp(program: list[tuple[int, int, int, int]]) -> None:
    """Load `program` for this process and every child (needs no-new-privileges first)."""
    filters = (_SockFilter * len(program))(*(_SockFilter(*ins) for ins in program))
    fprog = _SockFprog(len(program), filters)
    prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog))


class CgroupWatch:
    """The run's cgroups, joined; `fired()` tells whether the tree has had an OOM kill."""

    def __init__(self, spec: dict[str, Any] | None) -> None:
        self.joined = self.oom_exempt = False
        self.problems: list[str] = []
        self.read_fds: list[int] = []
        self.except_fds: list[int] = []
        self._fds: list[int] = []
        if not spec:
            return
        try:
            for path in spec["join"]:
                with open(path, "w", encoding="ascii") as fh:
                    fh.write("0")  # 0: the writing process; its children are born inside
            self.joined = True
        except OSError as exc:
            self.problems.append(f"cgroup join: {exc}")
            return
        watch = spec.get("oom")
        if watch:
            try:
                with open("/proc/self/oom_score_adj", "w", encoding="ascii") as fh:
                    fh.write("-1000")  # the OOM killer (and v2 oom.group) must pick the program, not us
                self.oom_exempt = True
            except OSError:
                pass  # not real root (user namespace): the init may then be a victim too
        try:
            if watch and watch["version"] == 1:
                efd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
                ofd = os.open(watch["oom_control"], os.O_RDONLY | os.O_CLOEXEC)
                self._fds += [efd, ofd]
                with open(watch["event_control"], "w", encoding="ascii") as fh:
                    fh.write(f"{efd} {ofd}")
                self.read_fds.append(efd)
            elif watch and watch["version"] == 2:
                fd = os.open(watch["events"], os.O_RDONLY | os.O_CLOEXEC)
                self._fds.append(fd)
                self.except_fds.append(fd)  # kernfs signals a changed file with POLLPRI
        except OSError as exc:
            self.problems.append(f"cgroup OOM watch: {exc}")

    def fired(self, readable: list[int], exceptional: list[int]) -> bool:
        hit = False
        for fd in self.read_fds:
            if fd in readable:
                with contextlib.suppress(BlockingIOError):
                    os.eventfd_read(fd)
                hit = True
        for fd in self.except_fds:
            if fd in exceptional:
                for line in os.pread(fd, 4096, 0).decode().splitlines():
                    key, _, value = line.partition(" ")
                    hit |= key in ("oom_kill", "oom_group_kill") and value.strip() not in ("", "0")
        return hit

    def close(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds = []


def _drop_privileges_and_exec(spec: dict[str, Any], scratch: str, err_fd: int, oom_exempt: bool,
                              seccomp: list[tuple[int, int, int, int]] | None) -> None:
    """In the forked child: never returns (exec or _exit)."""
    try:
        for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)  # Python ignores SIGPIPE/SIGXFSZ; exec keeps "ignored"
        signal.set_wakeup_fd(-1)
        os.setpgid(0, 0)
        if oom_exempt:  # undo the init's exemption: an unkillable program would wedge its cgroup
            with open("/proc/self/oom_score_adj", "w", encoding="ascii") as fh:
                fh.write("0")
        if os.geteuid() == 0:
            with open("/proc/sys/kernel/cap_last_cap") as fh:
                last_cap = int(fh.read())
            for cap in range(last_cap + 1):
                prctl(PR_CAPBSET_DROP, cap)  # an exec as (namespace) root then gains nothing
            prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
        if spec["uid"] is not None:
            os.setgroups([])
            os.setresgid(spec["gid"], spec["gid"], spec["gid"])
            os.setresuid(spec["uid"], spec["uid"], spec["uid"])
        prctl(PR_SET_NO_NEW_PRIVS, 1)  # setuid binaries (su, mount) cannot raise privileges
        if seccomp is not None:
            install_seccomp(seccomp)
        for name, value in spec["rlimits"].items():
            resource.setrlimit(getattr(resource, name), (value[0], value[1]))
        os.chdir(scratch)
        os.umask(0o077)
        env = dict(spec["env"])
        env["HOME"] = env["TMPDIR"] = scratch
        os.execve(spec["argv"][0], spec["argv"], env)
    except BaseException as exc:
        try:
            os.write(err_fd, f"{type(exc).__name__}: {exc}".encode()[:1000])
        finally:
            os._exit(127)


def _kill_uid(uid: int) -> None:
    """SIGKILL every process of `uid` (run as that uid: `kill(-1)` then reaches exactly those)."""
    try:
        pid = os.fork()
    except OSError:
        return  # the tree's pids cgroup is full: the host kills every member afterwards
    if pid == 0:
        try:
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            if os.getresuid() == (uid, uid, uid):  # never kill(-1) with any other identity
                os.kill(-1, signal.SIGKILL)
        except OSError:
            pass
        os._exit(0)
    os.waitpid(pid, 0)


def supervise(spec: dict[str, Any], scratch: str, cgroup: CgroupWatch,
              seccomp: list[tuple[int, int, int, int]] | None) -> dict[str, Any]:
    """Fork the program, wait for it under the limits, kill its leftovers; the status dict."""
    status_fd, control_fd = spec["status_fd"], spec["control_fd"]
    as_init = os.getpid() == 1
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so SIGCHLD wakes select()
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    for fd in (status_fd, control_fd, wake_r, wake_w):
        os.set_inheritable(fd, False)

    start = time.monotonic()
    child = os.fork()
    if child == 0:
        os.close(err_r)
        _drop_privileges_and_exec(spec, scratch, err_w, cgroup.oom_exempt, seccomp)
    os.close(err_w)
    exec_error = b""
    while chunk := os.read(err_r, 1000):
        exec_error += chunk
    os.close(err_r)

    deadline = start + spec["wall_s"]
    child_status: int | None = None
    rusage: Any = None
    timed_out = killed_by_host = memory_limited = False
    while child_status is None:
        while True:  # reap the program and, as PID 1, every orphan it left
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                pid = 0
            if pid == 0:
                break
            if pid == child:
                child_status, rusage = status, usage
        if child_status is not None:
            break
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            timed_out = True
            break
        ready, _, exceptional = select.select([control_fd, wake_r, *cgroup.read_fds], [],
                                              cgroup.except_fds, remaining)
        if wake_r in ready:
            os.read(wake_r, 4096)
        if control_fd in ready:
            killed_by_host = True  # output over its cap, or the host gave up / died
            break
        if cgroup.fired(ready, exceptional):
            memory_limited = True  # the tree hit its memory bound: stop all of it, not one victim
            break
    wall = time.monotonic() - start

    # Leftovers die whether the program finished or not: no process outlives a run.
    if as_init:
        with contextlib.suppress(ProcessLookupError):  # nothing else left in the namespace
            os.kill(-1, signal.SIGKILL)
    else:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child, signal.SIGKILL)
        if spec["uid"] is not None and spec["uid_dedicated"]:
            _kill_uid(spec["uid"])
    if child_status is None:
        _, child_status, rusage = os.wait4(child, 0)
    if as_init:
        while True:
            try:
                os.wait4(-1, 0)
            except ChildProcessError:
                break

    result: dict[str, Any] = {
        "ok": not exec_error,
        "wall_s": round(wall, 4),
        "cpu_s": round(rusage.ru_utime + rusage.ru_stime, 4) if rusage else None,
        "max_rss_kb": rusage.ru_maxrss if rusage else None,
        "timed_out": timed_out,
        "killed_by_host": killed_by_host,
        "memory_limited": memory_limited,
        "cgroup": cgroup.joined,
        "exit_code": os.WEXITSTATUS(child_status) if os.WIFEXITED(child_status) else None,
        "signal": os.WTERMSIG(child_status) if os.WIFSIGNALED(child_status) else None,
    }
    if exec_error:
        result["error"] = "program start failed: " + exec_error.decode(errors="replace")
    return result


def main(spec_dir: str) -> int:
    with open(os.path.join(spec_dir, "spec.json"), encoding="utf-8") as fh:
        spec = json.load(fh)
    status_fd = spec["status_fd"]
    cgroup = CgroupWatch(spec.get("cgroup"))  # first: /sys is read-only once the jail is built
    try:
        files = {}
        for name in spec["files"]:
            with open(os.path.join(spec_dir, "files", name), "rb") as fh:
                files[name] = fh.read()
        problems = list(cgroup.problems)
        if spec["mount_namespace"]:
            problems += build_jail(spec, files)
            scratch = _SCRATCH
        else:
            scratch = os.path.join(spec_dir, "work")
            os.mkdir(scratch, 0o700)
            if spec["uid"] is not None:
                os.chown(scratch, spec["uid"], spec["gid"])
            _write_files(scratch, files, spec["uid"], spec["gid"])
    except Exception as exc:
        os.write(status_fd, (json.dumps({"ok": False, "error": f"sandbox setup: {exc}"}) + "\n").encode())
        return 125
    seccomp = seccomp_program(os.uname().machine)
    if seccomp is None:  # the host refuses first (`Sandbox`); this guard keeps a direct start closed too
        error = f"sandbox setup: no seccomp allow-list for architecture {os.uname().machine!r}"
        os.write(status_fd, (json.dumps({"ok": False, "error": error}) + "\n").encode())
        return 125
    result = supervise(spec, scratch, cgroup, seccomp)
    cgroup.close()
    if problems:
        result["setup_warnings"] = problems
    os.write(status_fd, (json.dumps(result) + "\n").encode())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
