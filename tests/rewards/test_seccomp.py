"""The seccomp filter, decision by decision: a classic-BPF interpreter runs the program the sandbox's
init loads (`sandbox_init.seccomp_program`) on syscall records. The real kernel's verdicts on the
same calls are the hostile corpus's `outside_allow_list` program (tests/rewards/test_sandbox_corpus.py)."""

from __future__ import annotations

import errno
import struct

import pytest

from scalerl.rewards import sandbox_init as init

X86_64, AARCH64, I386 = 0xC000003E, 0xC00000B7, 0x40000003
ALLOW, EPERM, ENOSYS = 0x7FFF0000, 0x00050000 | errno.EPERM, 0x00050000 | errno.ENOSYS
CLONE_NEW = {"NS": 0x00020000, "CGROUP": 0x02000000, "UTS": 0x04000000, "IPC": 0x08000000,
             "USER": 0x10000000, "PID": 0x20000000, "NET": 0x40000000, "TIME": 0x00000080}


def verdict(program: list[tuple[int, int, int, int]], nr: int, *args: int, arch: int = X86_64) -> int:
    """Run `program` on a `struct seccomp_data` (nr, arch, instruction pointer, args[6]) like the kernel."""
    data = struct.pack("<iIQ6Q", nr, arch, 0, *(list(args) + [0] * (6 - len(args))))
    pc, acc = 0, 0
    for _ in range(len(program)):  # jumps only go forward: at most one pass
        code, jt, jf, k = program[pc]
        if code == 0x20:  # BPF_LD | BPF_W | BPF_ABS
            acc, pc = struct.unpack_from("<I", data, k)[0], pc + 1
        elif code in (0x15, 0x35, 0x45):  # JEQ, JGE, JSET (BPF_K)
            taken = acc == k if code == 0x15 else acc >= k if code == 0x35 else bool(acc & k)
            pc += 1 + (jt if taken else jf)
        elif code == 0x06:  # BPF_RET | BPF_K
            return k
        else:
            raise AssertionError(f"unexpected instruction {code:#x}")
    raise AssertionError("fell off the program")


@pytest.fixture(scope="module")
def x86() -> list[tuple[int, int, int, int]]:
    program = init.seccomp_program("x86_64")
    assert program is not None and len(program) < 4096  # the kernel's BPF_MAXINSNS
    return program


def test_every_allowed_syscall_is_allowed(x86: list[tuple[int, int, int, int]]) -> None:
    table = init._X86_64_ALLOWED
    assert len(table) >= 200 and len(set(table.values())) == len(table)
    denied = {name: nr for name, nr in init._X86_64_ALLOWED.items() if verdict(x86, nr) != ALLOW}
    assert denied == {}


@pytest.mark.parametrize("name, nr", [
    ("ptrace", 101), ("process_vm_readv", 310), ("process_vm_writev", 311), ("kcmp", 312), ("unshare", 272),
    ("setns", 308), ("mount", 165), ("umount2", 166), ("pivot_root", 155), ("chroot", 161), ("bpf", 321),
    ("perf_event_open", 298), ("userfaultfd", 323), ("io_uring_setup", 425), ("io_uring_enter", 426),
    ("io_uring_register", 427), ("add_key", 248), ("request_key", 249), ("keyctl", 250),
    ("fanotify_init", 300), ("name_to_handle_at", 303), ("open_by_handle_at", 304), ("init_module", 175),
    ("finit_module", 313), ("kexec_load", 246), ("reboot", 169), ("swapon", 167), ("acct", 163),
    ("syslog", 103), ("settimeofday", 164), ("sethostname", 170), ("sync", 162), ("syncfs", 306),
    ("personality", 135), ("modify_ldt", 154), ("iopl", 172), ("vmsplice", 278), ("mq_open", 240),
    ("setuid", 105), ("setresuid", 117), ("capset", 126), ("seccomp", 317), ("pidfd_getfd", 438),
    ("fsopen", 430), ("move_mount", 429), ("open_tree", 428), ("a syscall newer than the table", 470),
])
def test_calls_outside_the_allow_list_are_refused(x86: list[tuple[int, int, int, int]], name: str,
                                                  nr: int) -> None:
    assert name not in init._X86_64_ALLOWED
    assert verdict(x86, nr) == EPERM


def test_socket_families(x86: list[tuple[int, int, int, int]]) -> None:
    assert verdict(x86, 41, 2, 1) == ALLOW and verdict(x86, 41, 10, 2) == ALLOW  # AF_INET, AF_INET6
    for family in (1, 16, 17, 38, 40):  # AF_UNIX, AF_NETLINK, AF_PACKET, AF_ALG, AF_VSOCK
        assert verdict(x86, 41, family, 1) == EPERM, family
    assert verdict(x86, 41, 1 | 2 << 32, 1) == EPERM  # the kernel reads the low 32 bits, so does the filter
    assert verdict(x86, 53, 1, 1) == ALLOW  # socketpair(AF_UNIX): multiprocessing's fork start method


def test_clone_without_namespace_flags_only(x86: list[tuple[int, int, int, int]]) -> None:
    sigchld, thread = 17, 0x00010000 | 0x00000100 | 0x00000800 | 0x00000400 | 0x00080000  # fork, pthread
    assert verdict(x86, 56, sigchld) == ALLOW and verdict(x86, 56, thread) == ALLOW
    for name, flag in CLONE_NEW.items():
        assert verdict(x86, 56, flag | sigchld) == EPERM, name
    assert verdict(x86, 435) == ENOSYS  # clone3 hides its flags in memory: glibc falls back to clone


def test_ioctl_queries_only(x86: list[tuple[int, int, int, int]]) -> None:
    for cmd in (0x5401, 0x5413, 0x541B, 0x5421, 0x5451):  # TCGETS, TIOCGWINSZ, FIONREAD, FIONBIO, FIOCLEX
        assert verdict(x86, 16, 0, cmd) == ALLOW, hex(cmd)
    for cmd in (0x5412, 0x5402, 0x540E):  # TIOCSTI (type into a terminal), TCSETS, TIOCSCTTY
        assert verdict(x86, 16, 0, cmd) == EPERM, hex(cmd)


def test_the_table_cannot_be_side_stepped(x86: list[tuple[int, int, int, int]]) -> None:
    assert verdict(x86, 0x40000000 | 101) == ENOSYS  # the x32 ABI
    assert verdict(x86, 26, arch=I386) == ENOSYS  # int 0x80: i386 ptrace has another number
    assert verdict(x86, 0, arch=AARCH64) == ENOSYS


@pytest.fixture(scope="module")
def arm() -> list[tuple[int, int, int, int]]:
    program = init.seccomp_program("aarch64")
    assert program is not None and len(program) < 4096
    return program


def test_every_allowed_name_resolves_on_both_arches_or_is_x86_64_only() -> None:
    x86_names, arm_names = set(init._X86_64_ALLOWED), set(init._AARCH64_ALLOWED)
    assert arm_names | init._X86_64_ONLY == x86_names  # the same policy, by name
    assert not arm_names & init._X86_64_ONLY
    assert len(set(init._AARCH64_ALLOWED.values())) == len(init._AARCH64_ALLOWED)  # no two names, one number
    # the generic table has no legacy calls: every x86_64-only name has its *at / 2 / p variant there
    variants = {"open": "openat", "stat": "newfstatat", "lstat": "newfstatat", "access": "faccessat",
                "pipe": "pipe2", "dup2": "dup3", "poll": "ppoll", "select": "pselect6", "fork": None,
                "epoll_wait": "epoll_pwait", "unlink": "unlinkat", "rename": "renameat", "mkdir": "mkdirat"}
    for legacy, modern in variants.items():
        assert legacy in init._X86_64_ONLY and (modern is None or modern in arm_names), legacy


@pytest.mark.parametrize("name, x86_nr, arm_nr", [  # asm/unistd_64.h, asm-generic/unistd.h
    ("read", 0, 63), ("write", 1, 64), ("openat", 257, 56), ("close", 3, 57), ("exit_group", 231, 94),
    ("mmap", 9, 222), ("execve", 59, 221), ("futex", 202, 98), ("rt_sigreturn", 15, 139),
    ("newfstatat", 262, 79), ("getrandom", 318, 278), ("wait4", 61, 260), ("socketpair", 53, 199),
])
def test_well_known_numbers(name: str, x86_nr: int, arm_nr: int) -> None:
    assert init.allowed_syscalls("x86_64")[name] == x86_nr
    assert init.allowed_syscalls("aarch64")[name] == arm_nr


def test_aarch64_allow_list(arm: list[tuple[int, int, int, int]]) -> None:
    assert {n: nr for n, nr in init._AARCH64_ALLOWED.items() if verdict(arm, nr, arch=AARCH64) != ALLOW} == {}
    for name, nr in (("ptrace", 117), ("unshare", 97), ("setns", 268), ("mount", 40), ("bpf", 280),
                     ("io_uring_setup", 425), ("keyctl", 219), ("setuid", 146), ("seccomp", 277),
                     ("perf_event_open", 241), ("process_vm_readv", 270), ("a syscall newer", 470)):
        assert verdict(arm, nr, arch=AARCH64) == EPERM, name
    assert verdict(arm, 198, 1, 1, arch=AARCH64) == EPERM  # socket(AF_UNIX)
    assert verdict(arm, 198, 2, 1, arch=AARCH64) == ALLOW  # socket(AF_INET)
    assert verdict(arm, 29, 0, 0x5401, arch=AARCH64) == ALLOW  # ioctl(TCGETS)
    assert verdict(arm, 29, 0, 0x5412, arch=AARCH64) == EPERM  # ioctl(TIOCSTI)
    assert verdict(arm, 220, 17, arch=AARCH64) == ALLOW  # clone(SIGCHLD): fork
    assert verdict(arm, 220, 17 | CLONE_NEW["USER"], arch=AARCH64) == EPERM
    assert verdict(arm, 435, arch=AARCH64) == ENOSYS  # clone3
    assert verdict(arm, 63, arch=X86_64) == ENOSYS  # a foreign arch's table
    assert verdict(arm, 0x40000000 | 63, arch=AARCH64) == EPERM  # no x32 bit there: just an unknown number


def test_other_architectures_have_no_filter() -> None:
    assert init.seccomp_program("riscv64") is None
    assert init.SECCOMP_MACHINES == ("x86_64", "aarch64")


def test_labels_resolve_and_bad_jumps_are_refused() -> None:
    assert init.assemble([(0x15, "a", 0, 1), (0x06, 0, 0, 0), "a", (0x06, 0, 0, 1)]) == [
        (0x15, 1, 0, 1), (0x06, 0, 0, 0), (0x06, 0, 0, 1)]
    with pytest.raises(ValueError, match="jump out of range"):
        init.assemble([(0x15, "far", 0, 1), *[(0x06, 0, 0, 0)] * 300, "far", (0x06, 0, 0, 1)])
