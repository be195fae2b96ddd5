"""Install a seccomp filter, then exec the sandboxed interpreter: the fallback's launcher.

    python -I -S -B _seccomp_exec.py FD INTERPRETER ARG...

FD holds the compiled BPF program (`confinement.seccomp_filter()`, built with `struct`). This
process loads ctypes to call prctl, then execs INTERPRETER: the new image starts with the filter
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
        import ctypes

        class Program(ctypes.Structure):
            _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]

        libc = ctypes.CDLL(None, use_errno=True)
        no_new_privs, set_seccomp, mode_filter = 38, 22, 2
        if libc.prctl(no_new_privs, 1, 0, 0, 0) == 0:
            libc.prctl(set_seccomp, mode_filter, ctypes.byref(Program(len(code) // 8, code)),
                       0, 0)
    os.execv(program[0], program)


if __name__ == "__main__":
    main(sys.argv[1:])
