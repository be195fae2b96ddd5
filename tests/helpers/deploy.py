"""The deployment examples' checks that tests/test_deploy_docs.py (SLURM, Kubernetes) and
tests/test_deploy_ray.py (SLURM and KubeRay on Ray) share: reading a command's options, and
running a batch script with stub `scontrol`, `srun`, `flexmarl` and `flexmarl-node` commands on
PATH that record their arguments (run_sbatch)."""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

BASH = shutil.which("bash")
needs_bash = pytest.mark.skipif(BASH is None, reason="bash is not installed")


def option(tokens: list[str], name: str) -> str | None:
    """The value of `name VALUE` or `name=VALUE` in tokens (the last one), else None."""
    found = None
    for i, tok in enumerate(tokens):
        if tok == name and i + 1 < len(tokens):
            found = tokens[i + 1]
        elif tok.startswith(name + "="):
            found = tok[len(name) + 1:]
    return found


def settings(tokens: list[str]) -> dict[str, str]:
    """The `--set section.key=value` overrides in tokens."""
    out = {}
    for i, tok in enumerate(tokens[:-1]):
        if tok == "--set":
            key, _, value = tokens[i + 1].partition("=")
            out[key] = value
    return out


STUB = """#!/usr/bin/env bash
f=$(mktemp "$STUB_LOG/call.XXXXXX")
printf '%q ' "$(basename "$0")" "$@" > "$f"
"""
SCONTROL = STUB + 'for h in $STUB_HOSTS; do echo "$h"; done\n'


def run_sbatch(script: str, tmp: Path, hosts: list[str], trainer_nodes: int,
               key_exists: bool = False, stubs: dict[str, str] | None = None,
               env: dict[str, str] | None = None) -> tuple[int, list[list[str]], Path, str]:
    """Run the batch script with stubs (`stubs`: command -> script, beside srun, flexmarl,
    flexmarl-node and scontrol; `env`: more variables); (exit status, recorded calls, key dir,
    stderr)."""
    bin_dir, log, home, venv = tmp / "bin", tmp / "log", tmp / "home", tmp / "venv" / "bin"
    for d in (bin_dir, log, home, venv):
        d.mkdir(parents=True)
    (venv / "activate").write_text("")
    for name, text in {"srun": STUB, "flexmarl": STUB, "flexmarl-node": STUB,
                       "scontrol": SCONTROL, **(stubs or {})}.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    keys = home / "shared-keys"
    if key_exists:
        keys.mkdir()
        (keys / "node.key_secret").write_text("stub")
    path = tmp / "job.sbatch"
    path.write_text(script)
    variables = {"PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
                 "HOME": str(home), "STUB_LOG": str(log), "STUB_HOSTS": " ".join(hosts),
                 "SLURM_JOB_NODELIST": "stub[0-9]", "SLURM_SUBMIT_DIR": str(tmp),
                 "SLURM_CPUS_ON_NODE": "8", "FLEXMARL_VENV": str(venv.parent),
                 "FLEXMARL_KEYS": str(keys), "FLEXMARL_PORT": "6001",
                 "TRAINER_NODES": str(trainer_nodes), **(env or {})}
    proc = subprocess.run([BASH, str(path), "my.toml"], env=variables, cwd=tmp,
                          capture_output=True, text=True, timeout=60)
    calls = [shlex.split(f.read_text()) for f in sorted(log.iterdir())]
    return proc.returncode, calls, keys, proc.stderr
