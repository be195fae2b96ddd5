"""Confine this process by the kernel, then exec the sandboxed interpreter: the fallback's launcher.

    python -I -S -B -c SOURCE FD WRITABLE READABLE INTERPRETER ARG...

Run where bubblewrap cannot (the unsafe fallback), with its source as -c (no compiled copy on
disk). In order, each where the kernel allows it:
1. capabilities dropped (the bounding set, then every set): a program started by root holds no
   CAP_SYS_PTRACE, CAP_DAC_OVERRIDE, CAP_LINUX_IMMUTABLE... after the exec;
2. no_new_privs;
3. Landlock (kernel 5.13+): files readable only beneath READABLE (":"-separated: the system's
   libraries, the interpreter's prefix, /dev's basic nodes), writable only beneath WRITABLE
   (the program's directory, /dev/null); no
   /proc, no home directory; no TCP (ABI 4+); signals and abstract unix sockets only within
   the sandbox (ABI 6+). Enforced by the kernel for root too, and inherited by the exec;
4. the seccomp filter read from FD (`confinement.seccomp_filter()`, built with `struct`).
Then exec INTERPRETER: the new image starts confined and without ctypes, so nothing the
sandboxed program can reach was made by ctypes. What the kernel refuses is skipped; the audit
hook and the rlimits remain (`confinement.Isolation.landlock` says what was in force).
"""
import os
import sys

_FS_BITS_BY_ABI = {1: 13, 2: 14, 3: 15, 4: 15, 5: 16}
_READ = 1 | 4 | 8  # execute, read_file, read_dir


def main(argv: list[str]) -> None:
    fd, writable, readable, program = int(argv[0]), argv[1], argv[2], argv[3:]
    code = b""
    while chunk := os.read(fd, 1 << 16):
        code += chunk
    os.close(fd)
    # _ctypes alone, not the ctypes package (3 ms more of every start on this path).
    import _ctypes
    import struct

    libc = _ctypes.dlopen(None)
    prctl = _ctypes.dlsym(libc, "prctl")
    syscall = _ctypes.dlsym(libc, "syscall")
    call = _ctypes.call_function
    _drop_capabilities(call, prctl, syscall, struct)
    if call(prctl, (38, 1, 0, 0, 0)) != 0:  # PR_SET_NO_NEW_PRIVS
        os.execv(program[0], program)
    _landlock(call, syscall, struct, [p for p in writable.split(":") if p],
              [p for p in readable.split(":") if p])
    if code:
        # struct sock_fprog {unsigned short len; struct sock_filter *filter;}: the filter's
        # bytes start where CPython keeps a bytes object's data (its header, 32 bytes on a
        # 64-bit build: sys.getsizeof(b"") less the trailing NUL), kept alive by `code`.
        data = id(code) + sys.getsizeof(b"") - 1
        fprog = struct.pack("@HP", len(code) // 8, data)
        call(prctl, (22, 2, fprog, 0, 0))  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
    os.execv(program[0], program)


def _number(name: str) -> int:
    machine = os.uname().machine
    return {"x86_64": {"capset": 126, "create": 444, "add": 445, "restrict": 446},
            "aarch64": {"capset": 91, "create": 444, "add": 445, "restrict": 446}
            }.get(machine, {}).get(name, -1)


def _drop_capabilities(call, prctl, syscall, struct) -> None:
    for cap in range(64):  # PR_CAPBSET_DROP until the kernel knows no more (or refuses)
        if call(prctl, (24, cap, 0, 0, 0)) != 0:
            break
    if _number("capset") >= 0:  # effective, permitted, inheritable: none (header v3)
        header = struct.pack("@Ii", 0x20080522, 0)
        call(syscall, (_number("capset"), header, bytes(24)))


def _landlock(call, syscall, struct, writable: list[str], readable: list[str]) -> None:
    create = _number("create")
    if create < 0:
        return
    abi = call(syscall, (create, 0, 0, 1))  # LANDLOCK_CREATE_RULESET_VERSION
    if abi < 1:
        return
    fs = (1 << _FS_BITS_BY_ABI.get(abi, 16)) - 1
    net = 3 if abi >= 4 else 0  # bind and connect TCP: no rule allows any
    scoped = 3 if abi >= 6 else 0  # abstract unix sockets, signals
    attr = struct.pack("@QQQ", fs, net, scoped)[:8 if abi < 4 else 16 if abi < 6 else 24]
    ruleset = call(syscall, (create, attr, len(attr), 0))
    if ruleset < 0:
        return
    # What a rule on a file (not a directory) may grant: execute, write, read, truncate, ioctl.
    file_rights = 1 | 2 | 4 | (1 << 14 if abi >= 3 else 0) | (1 << 15 if abi >= 5 else 0)
    for path, access in [(p, _READ) for p in readable] + [(p, fs) for p in writable]:
        try:
            where = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            continue  # a path this machine does not have
        if not os.path.isdir(path):
            access &= file_rights
        rule = struct.pack("<Qi", access & fs, where)  # struct landlock_path_beneath_attr
        call(syscall, (_number("add"), ruleset, 1, rule, 0))
        os.close(where)
    call(syscall, (_number("restrict"), ruleset, 0))
    os.close(ruleset)


if __name__ == "__main__":
    main(sys.argv[1:])
