"""Install a seccomp filter, then exec the sandboxed interpreter: the fallback's launcher.

    python -I -S -B _seccomp_exec.py FD INTERPRETER ARG...

FD holds the compiled BPF program (`confinement.seccomp_filter()`, built with `struct`). This
process loads _ctypes to call prctl, then execs INTERPRETER: the new image starts with the filter
in force and without ctypes, so nothing the sandboxed program can reach was made by ctypes.
Under bubblewrap this file is not used (bwrap takes the same bytes with `--seccomp FD`). Where
the kernel refuses seccomp, the interpreter starts without it; the audit hook and RLIMIT_NPROC
remain.
"""
import os
import sys


def main(argv: list[str]) -> None:
    fd, program = int(argv[0]), argv[1:]
    code = b""
    while chunk := os.read(fd, 1 << 16):
        code += chunk
    os.close(fd)
    if code:
        # _ctypes alone, not the ctypes package (3 ms more of every start on this path).
        import _ctypes
        import struct

        prctl = _ctypes.dlsym(_ctypes.dlopen(None), "prctl")
        no_new_privs, set_seccomp, mode_filter = 38, 22, 2
        # struct sock_fprog {unsigned short len; struct sock_filter *filter;}: the filter's
        # bytes start where CPython keeps a bytes object's data (its header, 32 bytes on a
        # 64-bit build: sys.getsizeof(b"") less the trailing NUL), kept alive by `code`.
        data = id(code) + sys.getsizeof(b"") - 1
        fprog = struct.pack("@HP", len(code) // 8, data)
        if _ctypes.call_function(prctl, (no_new_privs, 1, 0, 0, 0)) == 0:
            _ctypes.call_function(prctl, (set_seccomp, mode_filter, fprog, 0, 0))
    os.execv(program[0], program)


if __name__ == "__main__":
    main(sys.argv[1:])
