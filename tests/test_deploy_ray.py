"""The Ray deployment examples hang together: docs/deploy/slurm_ray.sbatch and
docs/deploy/kuberay.yaml (cluster.launcher = "ray"). Fast: no network, no cluster, no SLURM.

As in tests/test_deploy_docs.py, each check is a function returning a list of problems, run on
the shipped file (none) and on a broken copy (some), which shows the check can fail. The SLURM
script runs with stub `scontrol`, `srun`, `ray`, `python` and `flexmarl` commands that record
their arguments.
"""
from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.helpers import deploy
from tests.helpers.deploy import BASH, STUB, needs_bash, option, settings

ROOT = Path(__file__).resolve().parent.parent
SBATCH = ROOT / "docs" / "deploy" / "slurm_ray.sbatch"
RAYJOB = ROOT / "docs" / "deploy" / "kuberay.yaml"
# `python -c ...` in the script asks Ray how many nodes are up: the stub says all of them.
PYTHON = STUB + 'set -- $STUB_HOSTS; echo $#\n'


def run_sbatch(script: str, tmp: Path, hosts: list[str], trainer_nodes: int
               ) -> tuple[int, list[list[str]], str]:
    rc, calls, _, err = deploy.run_sbatch(
        script, tmp, hosts, trainer_nodes, stubs={"ray": STUB, "python": PYTHON},
        env={"FLEXMARL_RAY_PORT": "6400"})
    return rc, calls, err


def sbatch_problems(script: str, tmp: Path) -> list[str]:
    """Problems seen when the script runs on 5 hosts with 2 trainer nodes."""
    hosts = ["n0", "n1", "n2", "n3", "n4"]
    rc, calls, err = run_sbatch(script, tmp, hosts, trainer_nodes=2)
    if rc != 0:
        return [f"exit status {rc}: {err}"]
    problems = []
    heads = [c for c in calls if c[:3] == ["ray", "start", "--head"]]
    if len(heads) != 1 or option(heads[0], "--port") != "6400":
        problems.append(f"expected one `ray start --head --port=6400` on n0: {heads}")
    runs = [c for c in calls if c[:2] == ["flexmarl", "run"]]
    if len(runs) != 1:
        return problems + [f"expected one `flexmarl run`: {runs}"]
    got = settings(runs[0])
    if "my.toml" not in runs[0] or got.get("cluster.launcher") != "ray" \
            or got.get("cluster.ray_address") != "auto":
        problems.append(f"flexmarl run is not the config on Ray: {runs[0]}")
    roles = {}
    for c in (c for c in calls if c[0] == "srun"):
        node = option(c, "--nodelist")
        start = c[c.index("ray"):] if "ray" in c else []
        if start[:2] != ["ray", "start"] or option(start, "--address") != "n0:6400":
            problems.append(f"srun on {node} does not join the head at n0:6400: {c}")
            continue
        resources = json.loads(option(start, "--resources") or "{}")
        roles[node] = [r.removeprefix("flexmarl_") for r in resources]
    want = {"n1": ["rollout"], "n2": ["rollout"], "n3": ["trainer"], "n4": ["trainer"]}
    if roles != want:
        problems.append(f"Ray workers marked {roles}, expected {want}")
    return problems


@needs_bash
def test_the_slurm_ray_script_starts_ray_by_role_and_runs_on_it(tmp_path):
    assert subprocess.run([BASH, "-n", str(SBATCH)]).returncode == 0
    assert sbatch_problems(SBATCH.read_text(), tmp_path / "shipped") == []
    broken = SBATCH.read_text().replace("flexmarl_$role", "flexmarl_rollout")
    assert any("expected" in p for p in sbatch_problems(broken, tmp_path / "broken"))


def rayjob_problems(docs: list[dict]) -> list[str]:
    [job] = [d for d in docs if d and d.get("kind") == "RayJob"]
    problems = []
    entry = shlex.split(job["spec"]["entrypoint"])
    got = settings(entry)
    if entry[:2] != ["flexmarl", "run"] or got.get("cluster.launcher") != "ray" \
            or got.get("cluster.ray_address") != "auto":
        problems.append(f"the entrypoint is not `flexmarl run` on this Ray cluster: {entry}")
    if not job["spec"].get("shutdownAfterJobFinishes"):
        problems.append("the Ray cluster outlives the run (shutdownAfterJobFinishes)")
    marked = set()
    for group in job["spec"]["rayClusterSpec"]["workerGroupSpecs"]:
        # KubeRay's quoting: a JSON object inside a quoted string.
        raw = group.get("rayStartParams", {}).get("resources", '"{}"')
        marked |= set(json.loads(json.loads(raw)))
    if marked != {"flexmarl_rollout", "flexmarl_trainer"}:
        problems.append(f"worker groups marked {sorted(marked)}, expected one per role")
    return problems + token_auth_problems(job)


def token_auth_problems(job: dict) -> list[str]:
    """Ray's token authentication on in every Ray container (the run sends its CURVE key to
    workers only then) and in the submitter (the dashboard asks for the token): RAY_AUTH_MODE
    = token and RAY_AUTH_TOKEN from one Kubernetes Secret, never written in the file."""
    cluster = job["spec"]["rayClusterSpec"]
    pods = {"head": cluster["headGroupSpec"]["template"],
            "submitter": job["spec"].get("submitterPodTemplate") or {"spec": {"containers": []}}}
    pods |= {g["groupName"]: g["template"] for g in cluster["workerGroupSpecs"]}
    problems, secrets = [], set()
    for where, pod in pods.items():
        containers = pod["spec"]["containers"]
        if not containers:
            problems.append(f"{where}: no container (the submitter needs the token too)")
        for c in containers:
            env = {e["name"]: e for e in c.get("env", [])}
            if env.get("RAY_AUTH_MODE", {}).get("value") != "token":
                problems.append(f"{where}/{c['name']}: RAY_AUTH_MODE is not token")
            ref = env.get("RAY_AUTH_TOKEN", {}).get("valueFrom", {}).get("secretKeyRef")
            if not ref:
                problems.append(f"{where}/{c['name']}: RAY_AUTH_TOKEN not from a Secret")
            else:
                secrets.add((ref["name"], ref["key"]))
    if len(secrets) > 1:
        problems.append(f"more than one token Secret: {sorted(secrets)}")
    return problems


def test_the_rayjob_runs_flexmarl_on_its_cluster_with_a_group_per_role():
    docs = list(yaml.safe_load_all(RAYJOB.read_text()))
    assert rayjob_problems(docs) == []
    broken = RAYJOB.read_text().replace("cluster.launcher=ray", "cluster.launcher=local")
    assert rayjob_problems(list(yaml.safe_load_all(broken)))


def test_the_rayjob_turns_on_ray_token_auth_everywhere():
    text = RAYJOB.read_text()
    assert "kubectl create secret generic flexmarl-ray-token" in text  # how the Secret is made
    # The last container (the trainer group's) without the mode; the first with another token.
    head, _, tail = text.rpartition("- {name: RAY_AUTH_MODE, value: token}")
    other_secret = text.replace("name: flexmarl-ray-token, key", "name: other, key", 1)
    for broken, want in ((head + tail, "trainer/ray-worker: RAY_AUTH_MODE is not token"),
                         (other_secret, "more than one token Secret")):
        job = next(d for d in yaml.safe_load_all(broken) if d and d.get("kind") == "RayJob")
        assert any(want in p for p in token_auth_problems(job)), (want, token_auth_problems(job))


@pytest.mark.parametrize("path", [SBATCH, RAYJOB])
def test_the_guide_links_the_ray_examples(path):
    assert f"(deploy/{path.name})" in (ROOT / "docs" / "multinode.md").read_text()
