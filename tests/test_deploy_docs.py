"""The multi-node deployment examples hang together: docs/deploy/slurm.sbatch, docs/deploy/k8s.yaml
and docs/multinode.md. Fast: no network, no cluster, no SLURM.

Each check is a function returning a list of problems, so that the same function is run on the
shipped files (no problems) and on broken copies (a wrong port, a wrong role, ...: problems), which
shows the checks can fail. The SLURM script is also executed with stub `scontrol`, `srun`,
`flexmarl` and `flexmarl-node` commands on PATH that record their arguments.
"""
from __future__ import annotations

import copy
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.helpers.deploy import BASH, needs_bash, option, run_sbatch, settings

ROOT = Path(__file__).resolve().parent.parent
SBATCH = ROOT / "docs" / "deploy" / "slurm.sbatch"
K8S = ROOT / "docs" / "deploy" / "k8s.yaml"
GUIDE = ROOT / "docs" / "multinode.md"
ROLES = {"rollout", "trainer", "any"}


def tcp(address: str | None) -> tuple[str, str] | None:
    """("host", "port") of tcp://host:port, else None."""
    m = re.fullmatch(r"tcp://(.+):([^:/]+)", address or "")
    return (m.group(1), m.group(2)) if m else None


# ---------------------------------------------------------------- SLURM

def logical_lines(script: str) -> list[str]:
    """The script's commands: continuation lines joined, comment lines dropped."""
    lines, current = [], ""
    for raw in script.splitlines():
        if not current and raw.lstrip().startswith("#"):
            continue
        if raw.endswith("\\"):
            current += raw[:-1] + " "
            continue
        lines.append(current + raw)
        current = ""
    return [line for line in lines if line.strip()]


def sbatch_problems(script: str) -> list[str]:
    problems = []
    if not re.search(r"^set -euo pipefail$", script, re.M):
        problems.append("no `set -euo pipefail`")
    if not re.search(r"^#SBATCH --nodes=\d+", script, re.M):
        problems.append("no #SBATCH --nodes")
    lines = logical_lines(script)
    if not any("scontrol show hostnames" in line and "SLURM_JOB_NODELIST" in line
               for line in lines):
        problems.append("hosts do not come from `scontrol show hostnames $SLURM_JOB_NODELIST`")
    listen = [re.search(r"--listen\s+\"?tcp://0\.0\.0\.0:(\S+?)\"?(\s|$)", line)
              for line in lines if re.search(r"\bflexmarl run\b", line)]
    if len(listen) != 1 or listen[0] is None:
        problems.append("not exactly one `flexmarl run --listen tcp://0.0.0.0:PORT`")
    nodes = [line for line in lines if "flexmarl-node" in line]
    if not nodes:
        problems.append("no flexmarl-node command")
    for line in nodes:
        connect = re.search(r"--connect\s+\"?tcp://[^:\s]+:(\S+?)\"?(\s|$)", line)
        if connect is None or "--role" not in line:
            problems.append(f"flexmarl-node without --connect tcp://HOST:PORT and --role: {line}")
        elif listen and listen[0] and connect.group(1) != listen[0].group(1):
            problems.append(f"connects to port {connect.group(1)}, listens on "
                            f"{listen[0].group(1)}")
        if "srun" not in line:
            problems.append(f"flexmarl-node not started through srun: {line}")
    return problems


def sbatch_run_problems(script: str, tmp: Path) -> list[str]:
    """Problems seen when the script runs on 5 hosts with 2 trainer nodes and no key yet."""
    hosts = ["n0", "n1", "n2", "n3", "n4"]
    rc, calls, keys, err = run_sbatch(script, tmp, hosts, trainer_nodes=2)
    if rc != 0:
        return [f"exit status {rc}: {err}"]
    problems = []
    secret = str(keys / "node.key_secret")
    keygen = [c for c in calls if c[:2] == ["flexmarl", "keygen"]]
    if len(keygen) != 1 or option(keygen[0], "--dir") != str(keys) \
            or option(keygen[0], "--name") != "node":
        problems.append(f"expected one `flexmarl keygen --dir {keys} --name node`: {keygen}")
    runs = [c for c in calls if c[:2] == ["flexmarl", "run"]]
    if len(runs) != 1:
        return problems + [f"expected one `flexmarl run`: {runs}"]
    run = runs[0]
    if "my.toml" not in run:
        problems.append(f"the CONFIG argument is not passed on: {run}")
    if option(run, "--listen") != "tcp://0.0.0.0:6001":
        problems.append(f"listens on {option(run, '--listen')}, not FLEXMARL_PORT 6001")
    want = {"cluster.rollout_nodes": "2", "cluster.trainer_nodes": "2",
            "transport.curve_secret_key_file": secret}
    got = settings(run)
    if any(got.get(k) != v for k, v in want.items()):
        problems.append(f"flexmarl run sets {got}, expected {want}")
    sruns = [c for c in calls if c[0] == "srun"]
    started = sorted(option(c, "--nodelist") or option(c, "-w") or "?" for c in sruns)
    if started != hosts[1:]:
        problems.append(f"flexmarl-node started on {started}, expected {hosts[1:]}")
    roles = []
    for c in sruns:
        node = c[c.index("flexmarl-node"):] if "flexmarl-node" in c else []
        if not node:
            problems.append(f"srun without flexmarl-node: {c}")
            continue
        roles.append(option(node, "--role"))
        if option(node, "--connect") != "tcp://n0:6001":
            problems.append(f"node connects to {option(node, '--connect')}, not tcp://n0:6001")
        if option(node, "--key-file") not in (None, secret):
            problems.append(f"node key {option(node, '--key-file')} is not the run's {secret}")
    if sorted(map(str, roles)) != ["rollout", "rollout", "trainer", "trainer"]:
        problems.append(f"roles {roles}, expected 2 rollout and 2 trainer")
    if any(c[0] == "flexmarl-node" for c in calls):
        problems.append("flexmarl-node run on the orchestrator's node, not through srun")
    return problems


@needs_bash
def test_sbatch_is_valid_bash():
    proc = subprocess.run([BASH, "-n", str(SBATCH)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_sbatch_commands_are_consistent():
    script = SBATCH.read_text()
    assert sbatch_problems(script) == []
    assert len(script.splitlines()) <= 60


@needs_bash
def test_sbatch_launches_orchestrator_and_nodes(tmp_path):
    assert sbatch_run_problems(SBATCH.read_text(), tmp_path) == []


@needs_bash
def test_sbatch_reuses_an_existing_key_and_refuses_too_few_nodes(tmp_path):
    rc, calls, _, _ = run_sbatch(SBATCH.read_text(), tmp_path / "a", ["n0", "n1", "n2"], 1,
                                 key_exists=True)
    assert rc == 0 and not [c for c in calls if c[:2] == ["flexmarl", "keygen"]]
    rc, calls, _, err = run_sbatch(SBATCH.read_text(), tmp_path / "b", ["n0", "n1", "n2"], 2)
    assert rc != 0 and not [c for c in calls if c[0] in ("srun", "flexmarl-node")] \
        and not [c for c in calls if c[:2] == ["flexmarl", "run"]], (rc, calls, err)


SBATCH_BREAKAGES = {
    "connect port": ('"tcp://$ORCH:$PORT"', '"tcp://$ORCH:5556"'),
    "no role": ('--role "$role"', ""),
    "no strict mode": ("set -euo pipefail", "set -eu"),
    "roles off by one": ("(( i < ROLLOUT_NODES ))", "(( i <= ROLLOUT_NODES ))"),
    "node on the orchestrator's host": ('("${HOSTS[@]:1}")', '("${HOSTS[@]}")'),
    "node counts not passed": ('cluster.trainer_nodes="$TRAINER_NODES"',
                               'cluster.trainer_nodes=1'),
}


@needs_bash
@pytest.mark.parametrize("breakage", SBATCH_BREAKAGES)
def test_sbatch_checks_catch_breakage(breakage, tmp_path):
    old, new = SBATCH_BREAKAGES[breakage]
    script = SBATCH.read_text()
    assert old in script
    broken = script.replace(old, new)
    assert sbatch_problems(broken) or sbatch_run_problems(broken, tmp_path)


# ---------------------------------------------------------------- Kubernetes

def load_k8s() -> list[dict]:
    yaml = pytest.importorskip("yaml")
    return [doc for doc in yaml.safe_load_all(K8S.read_text()) if doc is not None]


def pod_templates(doc: dict) -> list[dict]:
    """(labels, pod spec) of a workload document, as {"labels", "spec"}."""
    if doc.get("kind") == "Pod":
        return [{"labels": doc["metadata"].get("labels", {}), "spec": doc.get("spec", {})}]
    template = (doc.get("spec") or {}).get("template")
    if doc.get("kind") in ("Deployment", "Job", "StatefulSet", "DaemonSet") and template:
        return [{"labels": template.get("metadata", {}).get("labels", {}),
                 "spec": template.get("spec", {})}]
    return []


def tokens(container: dict) -> list[str]:
    """The container's command line: command + args, shell strings split."""
    out = []
    for part in list(container.get("command") or []) + list(container.get("args") or []):
        out += shlex.split(str(part))
    return out


def k8s_problems(docs: list[dict]) -> list[str]:
    problems = []
    for i, doc in enumerate(docs):
        if not (isinstance(doc, dict) and doc.get("apiVersion") and doc.get("kind")
                and (doc.get("metadata") or {}).get("name")):
            problems.append(f"document {i} lacks apiVersion, kind or metadata.name")
    docs = [d for d in docs if isinstance(d, dict) and d.get("kind")]
    kinds = {d["kind"] for d in docs}
    for need in ("Secret", "Service", "Deployment"):
        if need not in kinds:
            problems.append(f"no {need}")
    if not kinds & {"Job", "Pod"}:
        problems.append("no Job or Pod for the orchestrator")
    services = [d for d in docs if d["kind"] == "Service"]
    secrets = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Secret"}
    if problems:
        return problems

    orchestrators, nodes = [], []   # (doc, pod, container, tokens)
    for doc in docs:
        for pod in pod_templates(doc):
            for c in pod["spec"].get("containers", []):
                t = tokens(c)
                if "flexmarl-node" in t:
                    nodes.append((doc, pod, c, t[t.index("flexmarl-node") + 1:]))
                elif "flexmarl" in t and "run" in t:
                    orchestrators.append((doc, pod, c, t[t.index("run") + 1:]))
    if len(orchestrators) != 1 or orchestrators[0][0]["kind"] not in ("Job", "Pod"):
        return problems + [f"expected one `flexmarl run` in a Job or Pod, got "
                           f"{[o[0]['metadata']['name'] for o in orchestrators]}"]
    if not nodes:
        return problems + ["no container runs flexmarl-node"]
    _, orch_pod, orch_c, orch_args = orchestrators[0]

    # The Service selects the orchestrator's pod, and only it, and forwards to its --listen port.
    def selects(service: dict, pod: dict) -> bool:
        selector = service["spec"].get("selector") or {}
        return bool(selector) and all(pod["labels"].get(k) == v for k, v in selector.items())

    mine = [s for s in services if selects(s, orch_pod)]
    if len(mine) != 1:
        return problems + [f"{len(mine)} Services select the orchestrator's pod, expected 1"]
    service = mine[0]
    for _, pod, _, _ in nodes:
        if selects(service, pod):
            problems.append("the orchestrator's Service also selects node pods")
    named = {p.get("name"): str(p.get("containerPort")) for p in orch_c.get("ports", [])}

    def target(port: dict) -> str:
        t = port.get("targetPort", port.get("port"))
        return named.get(t, "?") if isinstance(t, str) and not t.isdigit() else str(t)

    forwards = {target(p): str(p.get("port")) for p in service["spec"].get("ports", [])}
    listen = tcp(option(orch_args, "--listen"))
    if listen is None or listen[0] != "0.0.0.0":
        return problems + [f"orchestrator --listen {option(orch_args, '--listen')!r} is not "
                           "tcp://0.0.0.0:PORT"]
    if listen[1] not in forwards:
        return problems + [f"orchestrator listens on {listen[1]}; the Service forwards to "
                           f"{sorted(forwards)}"]
    want_connect = (service["metadata"]["name"], forwards[listen[1]])
    orch_set = settings(orch_args)
    store = orch_set.get("cluster.store_port")
    if store not in forwards:
        problems.append(f"cluster.store_port {store} is not forwarded by the Service "
                        f"({sorted(forwards)}); trainer nodes must reach the TCPStore")

    # Every node connects to the Service with a valid role, advertising its pod IP.
    replicas = {"rollout": 0, "trainer": 0, "any": 0}
    for doc, _, c, args in nodes:
        where = f"{doc['kind']}/{doc['metadata']['name']}"
        if tcp(option(args, "--connect")) != want_connect:
            problems.append(f"{where}: --connect {option(args, '--connect')}, expected "
                            f"tcp://{want_connect[0]}:{want_connect[1]}")
        role = option(args, "--role")
        if role not in ROLES:
            problems.append(f"{where}: --role {role!r} not in {sorted(ROLES)}")
        else:
            replicas[role] += doc["spec"].get("replicas", 1) if doc["kind"] == "Deployment" \
                else 1
        if doc["kind"] == "Deployment" and "--stay" not in args:
            problems.append(f"{where}: a Deployment's node needs --stay")
        advertise = option(args, "--advertise") or ""
        var = re.fullmatch(r"\$\((\w+)\)", advertise)
        env = {e["name"]: e for e in c.get("env", [])}
        field = (((env.get(var.group(1)) if var else None) or {}).get("valueFrom") or {}) \
            .get("fieldRef", {}).get("fieldPath")
        if field != "status.podIP":
            problems.append(f"{where}: --advertise {advertise!r} is not $(VAR) with VAR from "
                            "the downward API's status.podIP")
    for role in ("rollout", "trainer"):
        need = int(orch_set.get(f"cluster.{role}_nodes", "0"))
        if replicas[role] + replicas["any"] < need:
            problems.append(f"cluster.{role}_nodes={need} but only {replicas[role]} {role} "
                            f"and {replicas['any']} any nodes")

    # Keys: every process's key file lies in a volume of the Secret, under a key it holds.
    def key_problem(where: str, pod: dict, c: dict, path: str | None) -> str | None:
        volumes = {v["name"]: v for v in pod["spec"].get("volumes", [])}
        for m in c.get("volumeMounts", []):
            secret = volumes.get(m["name"], {}).get("secret", {}).get("secretName")
            directory = m["mountPath"].rstrip("/") + "/"
            if path and secret in secrets and path.startswith(directory):
                data = {**(secrets[secret].get("data") or {}),
                        **(secrets[secret].get("stringData") or {})}
                if path[len(directory):] in data:
                    return None
        return f"{where}: key file {path!r} is not in a mounted Secret"

    checks = [("orchestrator", orch_pod, orch_c, orch_set.get("transport.curve_secret_key_file"))]
    checks += [(d["metadata"]["name"], p, c, option(a, "--key-file")) for d, p, c, a in nodes]
    problems += [p for p in (key_problem(*check) for check in checks) if p]

    # Shared storage: one claim at one path in every pod, and FLEXMARL_CACHE on it.
    mounts = set()
    for where, pod, c, _ in checks:
        volumes = {v["name"]: v for v in pod["spec"].get("volumes", [])}
        claims = [(volumes[m["name"]]["persistentVolumeClaim"]["claimName"], m["mountPath"])
                  for m in c.get("volumeMounts", [])
                  if "persistentVolumeClaim" in volumes.get(m["name"], {})]
        cache = {e["name"]: e.get("value") for e in c.get("env", [])}.get("FLEXMARL_CACHE")
        if len(claims) != 1:
            problems.append(f"{where}: mounts {len(claims)} persistent volume claims, expected 1")
            continue
        mounts.add((*claims[0], cache))
        if not (cache or "").startswith(claims[0][1].rstrip("/") + "/"):
            problems.append(f"{where}: FLEXMARL_CACHE {cache!r} is not on the shared volume")
    if len(mounts) > 1:
        problems.append(f"pods mount the shared volume or cache differently: {sorted(mounts)}")
    return problems


def test_k8s_manifest_is_consistent():
    assert k8s_problems(load_k8s()) == []
    assert len(K8S.read_text().splitlines()) <= 150


def _node(docs: list[dict], role: str) -> dict:
    for doc in docs:
        for pod in pod_templates(doc):
            for c in pod["spec"]["containers"]:
                if "flexmarl-node" in tokens(c) and option(tokens(c), "--role") == role:
                    return c
    raise AssertionError(f"no {role} node")


def _orch(docs: list[dict]) -> dict:
    return next(c for d in docs for p in pod_templates(d) for c in p["spec"]["containers"]
                if "run" in tokens(c) and "flexmarl" in tokens(c))


def _replace(container: dict, old: str, new: str) -> None:
    assert any(old in str(part) for part in container["command"]), (old, container["command"])
    container["command"] = [str(part).replace(old, new) for part in container["command"]]


def _break_service_port(docs):
    service = next(d for d in docs if d["kind"] == "Service")
    service["spec"]["ports"][0]["port"] += 1


def _break_target_port(docs):
    service = next(d for d in docs if d["kind"] == "Service")
    service["spec"]["ports"][0]["targetPort"] = 1234


K8S_BREAKAGES = {
    "connect port": lambda docs: _replace(_node(docs, "rollout"), ":5555", ":5556"),
    "connect host": lambda docs: _replace(_node(docs, "trainer"), "flexmarl-orchestrator",
                                          "orchestrator"),
    "listen port": lambda docs: _replace(_orch(docs), "0.0.0.0:5555", "0.0.0.0:6000"),
    "service port": _break_service_port,
    "target port": _break_target_port,
    "store port": lambda docs: _replace(_orch(docs), "store_port=29500", "store_port=0"),
    "role": lambda docs: _replace(_node(docs, "rollout"), "rollout", "roll-out"),
    "too few replicas": lambda docs: next(d for d in docs if d["kind"] == "Deployment")
    ["spec"].update(replicas=0),
    "key path": lambda docs: _replace(_node(docs, "trainer"), "node.key_secret", "node.key2"),
    "cache path": lambda docs: _node(docs, "rollout")["env"].append(
        {"name": "FLEXMARL_CACHE", "value": "/root/.cache/flexmarl"}),
    "no secret": lambda docs: docs.remove(next(d for d in docs if d["kind"] == "Secret")),
    "no name": lambda docs: docs[-1]["metadata"].pop("name"),
}


@pytest.mark.parametrize("breakage", K8S_BREAKAGES)
def test_k8s_checks_catch_breakage(breakage):
    docs = copy.deepcopy(load_k8s())
    K8S_BREAKAGES[breakage](docs)
    assert k8s_problems(docs)


# ---------------------------------------------------------------- the guide

def test_guide_points_at_examples_and_its_commands_agree():
    text = GUIDE.read_text()
    assert "docs/deploy/slurm.sbatch" in text and "docs/deploy/k8s.yaml" in text
    blocks = re.findall(r"```[^\n]*\n(.*?)```", text, re.S)
    listens = {p for b in blocks for p in re.findall(r"--listen tcp://0\.0\.0\.0:(\d+)", b)}
    nodes = [line for b in blocks for line in logical_lines(b) if "flexmarl-node" in line]
    assert nodes and listens
    for line in nodes:
        assert "--role" in line, line
        connect = re.search(r"--connect tcp://[^:\s]+:(\d+)", line)
        assert connect and connect.group(1) in listens, line
