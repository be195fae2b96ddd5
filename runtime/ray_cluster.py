"""Ray as the cluster engine: Ray places, starts and watches worker processes; ZeroMQ, msgpack
and CURVE still carry every message and tensor (as in AReaL, Miles and NeMo-RL).

    RayLauncher: a Supervisor (the same start_worker / kill / events / stop; Ready and heartbeats
    reach it over the same sockets), bound to tcp://DRIVER_IP:0
      start_worker(spec) ─► the placement group of spec.group (made when its first worker starts:
          spec.group_size bundles of bundle_of(spec), STRICT_PACK) ─► a WorkerHost actor in
          bundle spec.group_index ─► host.start(boot): `python -m runtime.worker BOOT` as the
          actor's child, bound to tcp://NODE_IP:0, CUDA_VISIBLE_DEVICES = the GPUs Ray gave the
          actor, the run's CURVE key written to a private file on that node
    keys: beyond loopback (or with transport.curve_secret_key_file set) the run makes a CURVE
      key pair of its own, per run, for the driver and every worker; the user's key file is
      never read for sending. Its secret goes to a host actor (an argument of host.start) only
      when Ray's token authentication is on, in this process and on the host's node
      (RAY_AUTH_MODE=token): otherwise RayTokenAuthOff. On a Ray of this machine alone (its
      address is loopback) nothing is sent: the workers read the pair's file here.
      host.wait() returns when the child exits (its code and last stderr lines) and fails when
          the actor or its node dies ─► WorkerDied ("exited", or "actor_died" with Ray's reason),
          as soon as a local process exit would be seen
      signals go through the host; SIGKILL also ray.kill()s it; a group's placement group is
          removed once none of its workers is left (a replacement gets a new one: the dead
          worker's resources go back to Ray first)
    leaving serving(): every worker stopped, every actor killed, every placement group removed,
    and Ray left (ray.shutdown). A SIGKILLed driver leaves nothing either: the actors and
    placement groups belong to its Ray job, which Ray ends with the driver; the workers are
    the actors' children and die with them (PR_SET_PDEATHSIG, runtime.worker).

Knows nothing of RL: what a worker needs (GPUs, a group, a role) comes in its WorkerSpec.
"""
from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import logging
import math
import os
import shutil
import signal
import tempfile
import time
import uuid
from dataclasses import dataclass
from typing import Any

from runtime.config import SupervisorConfig, TransportConfig
from runtime.errors import RuntimeErrorBase, WorkerStartError
from runtime.keys import write_keys
from runtime.supervisor import Supervisor, WorkerHandle, WorkerSpec

log = logging.getLogger(__name__)

ROLE_RESOURCE = "flexmarl_{role}"
"""The custom resource of a node that hosts only one role: `ray start --resources
'{"flexmarl_rollout": 100}'` (flexmarl-node --role rollout, in Ray's words). When some node of
the cluster has it, every worker of that role asks for a sliver of it, so it lands only there."""
ROLE_SLIVER = 0.001
NAMESPACE = "flexmarl"
PREFIX = "flexmarl."
"""Every actor and placement group of a run is named flexmarl.RUN_ID.WORKER_OR_GROUP."""
RAY_MISSING = ("cluster.launcher = \"ray\" needs Ray: `pip install 'flexmarl[ray]'` (or `pip "
               "install ray`), or use launcher \"local\" (this machine) or \"nodes\" "
               "(flexmarl-node processes)")


AUTH_MODE_ENV = "RAY_AUTH_MODE"
TOKEN_AUTH_OFF = (
    "{where} runs without Ray's token authentication, so the run will not hand its CURVE "
    "secret key to workers through Ray (without it, anyone who reaches the cluster can call into "
    "it). Turn it on for every node and for the run: `export RAY_AUTH_MODE=token` and one token "
    "everywhere (`ray get-auth-token --generate` writes ~/.ray/auth_token; or set "
    "RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH), before `ray start` and `flexmarl run` (KubeRay: "
    "docs/deploy/kuberay.yaml). Or, on a network you trust entirely, "
    "transport.plaintext_tcp_beyond_loopback = true without transport.curve_secret_key_file: no "
    "CURVE, no key to send")


class RayTokenAuthOff(RuntimeErrorBase):
    """The run's CURVE secret would have to travel through a Ray cluster without token auth."""


def token_auth_on() -> bool:
    """Whether Ray's token authentication is on in this process. Ray (2.52 and later) has no
    public call for it (ray._raylet.get_authentication_mode is private); its documented switch
    is the environment variable RAY_AUTH_MODE, which Ray reads ignoring case, and which ray.init
    sets to "token" itself when it turns token auth on (a new local cluster; `address="auto"`
    with a token in ~/.ray/auth_token). In a Ray worker (a host actor) it is the node's."""
    return os.environ.get(AUTH_MODE_ENV, "").lower() == "token"  # " token" is off to Ray too


def require_token_auth(on: bool, where: str) -> None:
    """RayTokenAuthOff naming `where` and how to turn token auth on, unless `on`."""
    if not on:
        raise RayTokenAuthOff(TOKEN_AUTH_OFF.format(where=where))


def ray_module() -> Any:
    """`import ray`, or an ImportError that names the extra."""
    try:
        import ray
    except ImportError:
        raise ImportError(RAY_MISSING) from None
    return ray


def bundle_of(spec: WorkerSpec, cpus: float, roles: frozenset[str] = frozenset()
              ) -> dict[str, float]:
    """The Ray resources of one worker: `cpus` CPUs, its GPUs (one bundle holds a whole
    tensor-parallel instance: it is one process and its TP workers are its children), and a
    sliver of its role's resource when the cluster has nodes marked for roles (`roles`)."""
    bundle = {"CPU": float(cpus)}
    if spec.gpus:
        bundle["GPU"] = float(spec.gpus)
    if spec.role in roles:
        bundle[ROLE_RESOURCE.format(role=spec.role)] = ROLE_SLIVER
    return bundle


@dataclass(frozen=True)
class GroupPlan:
    """One placement group: the workers of `group`, one bundle each, on one node."""

    name: str
    bundles: tuple[dict[str, float], ...]
    strategy: str = "STRICT_PACK"


def placement_groups(specs: list[WorkerSpec], cpus: float,
                     roles: frozenset[str] = frozenset()) -> list[GroupPlan]:
    """The placement groups a set of workers makes (`flexmarl run --dry-run` prints them):
    STRICT_PACK keeps a trainer slot's ranks on one node; the groups themselves are placed
    apart or together as Ray finds room (rollout instances are groups of one each)."""
    out: dict[str, list[dict[str, float] | None]] = {}
    for spec in specs:
        group = spec.group or spec.name
        out.setdefault(group, [None] * spec.group_size)[spec.group_index] = bundle_of(
            spec, cpus, roles)
    return [GroupPlan(g, tuple(b for b in bs if b is not None)) for g, bs in out.items()]


def role_resources(cluster_resources: dict[str, float]) -> frozenset[str]:
    """The roles some node of the cluster is marked for (ROLE_RESOURCE)."""
    return frozenset(r for r in ("rollout", "trainer")
                     if cluster_resources.get(ROLE_RESOURCE.format(role=r), 0) > 0)


def node_address(ray: Any) -> str:
    """The address Ray knows this process's node by (`ray start --node-ip-address`; on a
    one-machine Ray of our own, loopback), which its other nodes reach it at."""
    me = ray.get_runtime_context().get_node_id()
    for node in ray.nodes():
        if node["NodeID"] == me:
            return node["NodeManagerAddress"]
    return ray.util.get_node_ip_address()


class WorkerHost:
    """The Ray actor that hosts one worker process (an async actor: its event loop thread
    lives as long as the actor, so the child's PR_SET_PDEATHSIG parent never goes early)."""

    def __init__(self) -> None:
        self.proc = None
        self.tail = None
        self.key_file = ""

    async def token_auth(self) -> bool:
        """Whether Ray checks tokens on this node (asked before the run's secret is sent)."""
        return token_auth_on()

    async def start(self, boot: dict, env: dict[str, str], key_text: str) -> dict:
        import json
        import subprocess
        import sys
        import tempfile

        import ray

        from runtime.supervisor import StderrTail

        node_ip = node_address(ray)
        boot = {**boot, "bind": f"tcp://{node_ip}:0", "supervisor_pid": os.getpid(),
                "transport": dict(boot["transport"])}
        if key_text:  # the run's key pair, private to this node's worker
            fd, self.key_file = tempfile.mkstemp(prefix="flexmarl-key-", suffix=".key_secret")
            with os.fdopen(fd, "w") as f:
                f.write(key_text)
            boot["transport"]["curve_secret_key_file"] = self.key_file
        child_env = {**os.environ, **env}
        gpus = [str(g) for g in ray.get_gpu_ids()]
        if gpus:
            child_env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
        read_end, write_end = os.pipe()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "runtime.worker", json.dumps(boot)], env=child_env,
                stdout=write_end, stderr=write_end, start_new_session=True)
        finally:
            os.close(write_end)
        self.tail = StderrTail(read_end)  # copied to this actor's log (`ray logs`), tail kept
        return {"pid": self.proc.pid, "node_ip": node_ip, "gpus": gpus,
                "node_id": ray.get_runtime_context().get_node_id()}

    async def wait(self) -> dict:
        code = await asyncio.to_thread(self.proc.wait)
        if self.key_file:  # the secret stays on the node no longer than its worker
            os.unlink(self.key_file)
        return {"returncode": code, "tail": list(await self.tail.settled())}

    async def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass

    async def tail_lines(self) -> list[str]:
        return list(self.tail.tail()) if self.tail is not None else []


class RayProcess:
    """A worker process on a Ray node, as the Supervisor sees a local one: pid, returncode,
    wait(); `reason` says how it ended ("exited", or "actor_died: ..." when Ray lost its host
    actor or the actor's node)."""

    def __init__(self, host: Any) -> None:
        self.host = host
        self.waiting: Any = None
        """host.wait()'s ObjectRef, asked for once the process has started."""
        self.pid = 0
        self.returncode: int | None = None
        self.reason = "exited"
        self.lines: tuple[str, ...] = ()
        self.node_ip = ""

    async def wait(self) -> int | None:
        ray = ray_module()
        try:
            out = await self.waiting
            self.returncode, self.lines = out["returncode"], tuple(out["tail"])
        except ray.exceptions.RayActorError as exc:
            self.reason = "actor_died"
            self.lines = (f"Ray: {str(exc).strip().splitlines()[0][:300]}",) if str(exc) else ()
        except ray.exceptions.RayError as exc:  # e.g. the driver is leaving Ray
            self.reason = "actor_died"
            self.lines = (f"Ray: {type(exc).__name__}",)
        return self.returncode


class RayTail:
    """The StderrTail of a Ray worker: its last lines, as its host sent them when it ended."""

    def __init__(self, proc: RayProcess) -> None:
        self.proc = proc

    def tail(self) -> tuple[str, ...]:
        return self.proc.lines

    async def settled(self, timeout_s: float = 1.0) -> tuple[str, ...]:
        return self.proc.lines


class RayLauncher(Supervisor):
    """See the module docstring. `address`: "" starts a Ray of this machine's own,
    "auto" joins the one `ray start` made here, else a head's address (or ray://). `cpus`: the
    CPUs each worker's bundle asks for. `place_timeout_s`: how long a placement group may wait
    for room before the start fails, saying what it asked and what the cluster has free."""

    remote = True
    """Workers may run on other machines (trainer ranks meet at a TCPStore, not a file)."""
    shares_gpus = False
    """Ray hands each worker GPUs of its own; it cannot seat a second worker on a GPU it
    picked for another (devices.colocate, time-shared GPU placements)."""

    def __init__(self, *, address: str = "", cpus: float = 1.0, place_timeout_s: float = 600.0,
                 config: SupervisorConfig = SupervisorConfig(),
                 transport: TransportConfig = TransportConfig(),
                 name: str = "supervisor") -> None:
        ray = ray_module()
        self.ray = ray
        started_here = not ray.is_initialized()
        context = None
        if started_here:
            # Worker output stays in Ray's logs (`ray logs`); a death still brings its tail.
            kwargs: dict[str, Any] = dict(namespace=NAMESPACE, log_to_driver=False,
                                          configure_logging=False)
            if address:
                context = ray.init(address=address, **kwargs)
            else:  # a one-machine Ray of this run's own
                context = ray.init(include_dashboard=False, **kwargs)
        self._owns_ray = started_here
        self.driver_ip = node_address(ray)
        self.dashboard_url = _dashboard_url(context)
        self._key_dir = ""
        self._key_text = ""
        """The run key pair's file text, sent to host actors; empty: none is sent."""
        try:
            transport = self._run_keys(transport)
        except BaseException:
            if self._owns_ray:  # refused before anything ran on it
                ray.shutdown()
            raise
        super().__init__(config=config, transport=transport, name=name,
                         address=f"tcp://{self.driver_ip}:0")
        self.cpus = cpus
        self.place_timeout_s = place_timeout_s
        resources = ray.cluster_resources()
        self.roles = role_resources(resources)
        log.warning("workers on Ray (%s): %d node(s), %s%s; their output goes to Ray's logs",
                    address or "a Ray of this run's own", len(self.alive()),
                    ", ".join(f"{k} {v:g}" for k, v in sorted(resources.items())
                              if k in ("CPU", "GPU") or k.startswith("flexmarl_")),
                    f"; Ray dashboard {self.dashboard_url}" if self.dashboard_url else "")
        self.run_id = uuid.uuid4().hex[:8]
        self._groups: dict[str, Any] = {}
        """group -> its placement group (created by its first worker's start)."""
        self._members: dict[str, set[str]] = {}
        """group -> names of its workers still alive (the group is removed when none is)."""
        self._placing: dict[str, asyncio.Lock] = {}

    def _run_keys(self, transport: TransportConfig) -> TransportConfig:
        """The run's transport on Ray. CURVE is on when the user asked for it (a key file) or
        when workers may sit beyond loopback (unless plaintext is allowed there). Then the run
        makes a key pair of its own, shared by the driver and every worker (one pair, as
        runtime.curve expects of a cluster), and sets the user's key file, server key and
        allow-list aside: a long-term key never leaves this machine through Ray, and a leaked
        run key is worthless once the run ends. On a Ray whose address here is loopback no
        other machine can be a node (none could reach it), so the workers read the pair's file
        (mode 0600) here and nothing is sent; beyond it the secret's text goes to each host
        actor, only with Ray's token authentication on (checked here, and on each host's node
        before sending: _start_host)."""
        beyond = not ipaddress.ip_address(self.driver_ip).is_loopback
        if not transport.curve_secret_key_file and (transport.plaintext_tcp_beyond_loopback
                                                    or not beyond):
            return transport  # no CURVE: nothing to make or send
        if beyond:
            require_token_auth(token_auth_on(), "This process (the run's Ray driver)")
        if transport.curve_secret_key_file:
            log.warning("on Ray the run uses a CURVE key pair of its own: transport."
                        "curve_secret_key_file (%s), curve_server_key and curve_allowed are not "
                        "used, and the file is not sent", transport.curve_secret_key_file)
        self._key_dir = tempfile.mkdtemp(prefix="flexmarl-ray-keys-")
        _, secret, _ = write_keys(self._key_dir, "run")
        if beyond:
            self._key_text = secret.read_text()
        return dataclasses.replace(transport, curve_secret_key_file=str(secret),
                                   curve_server_key="", curve_allowed=())

    # ------------------------------------------------------------------ start

    def _bind(self, spec: WorkerSpec) -> str:
        return "tcp://*:0"  # the host actor binds on its node's address

    def alive(self) -> list[Any]:
        """The cluster's live nodes (ray.nodes() rows)."""
        return [n for n in self.ray.nodes() if n.get("Alive")]

    def hosts(self) -> list[tuple[str, int, tuple[str, ...]]]:
        """(node address, GPUs, roles) of each live node: what the GPU planner places on."""
        out = []
        for node in self.alive():
            res = node.get("Resources", {})
            roles = tuple(r for r in ("rollout", "trainer")
                          if res.get(ROLE_RESOURCE.format(role=r), 0) > 0) or ("any",)
            out.append((node["NodeManagerAddress"], int(res.get("GPU", 0)), roles))
        return out

    async def _spawn(self, spec: WorkerSpec, boot: dict[str, Any]) -> WorkerHandle:
        ray = self.ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        group = spec.group or spec.name
        pg = await self._placement_group(spec, group)
        bundle = bundle_of(spec, self.cpus, self.roles)
        options: dict[str, Any] = dict(
            num_cpus=bundle["CPU"], num_gpus=bundle.get("GPU", 0),
            resources={k: v for k, v in bundle.items() if k not in ("CPU", "GPU")},
            name=f"{PREFIX}{self.run_id}.{spec.name}", namespace=NAMESPACE, max_restarts=0,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                pg, placement_group_bundle_index=spec.group_index))
        host = ray.remote(WorkerHost).options(**options).remote()
        proc = RayProcess(host)
        handle = WorkerHandle(spec, proc, RayTail(proc))
        self.workers[spec.name] = handle  # before it can say Ready
        self._members.setdefault(group, set()).add(spec.name)
        args = {k: v.replace("{registry_host}", self.driver_ip) if isinstance(v, str) else v
                for k, v in boot["args"].items()}
        env = dict(spec.env)
        env.pop("CUDA_VISIBLE_DEVICES", None)  # Ray's GPU ids, set by the host
        env.setdefault("OMP_NUM_THREADS", str(max(1, math.floor(bundle["CPU"]))))
        try:
            started = await asyncio.wait_for(
                self._start_host(host, spec.name, {**boot, "args": args}, env),
                self.place_timeout_s)
        except BaseException as exc:
            self.workers.pop(spec.name, None)
            self._release(handle)
            if isinstance(exc, (asyncio.TimeoutError, ray.exceptions.RayError)):
                raise WorkerStartError(f"Ray could not start {spec.name}'s host actor: "
                                       f"{exc}") from None
            raise
        proc.pid, proc.node_ip = started["pid"], started["node_ip"]
        # Asked only now: the host's methods run concurrently (an async actor), and wait()
        # needs the process start() made.
        proc.waiting = host.wait.remote()
        log.info("worker %s on Ray node %s id %s (pid %d, GPUs %s)", spec.name,
                 started["node_ip"], started["node_id"], proc.pid,
                 ",".join(started["gpus"]) or "none")
        return handle

    async def _start_host(self, host: Any, name: str, boot: dict[str, Any],
                          env: dict[str, str]) -> dict:
        """host.start, with the run key's text when workers are beyond this machine: only once
        the host's own node says Ray checks tokens there (the driver's setting alone does not
        show that the cluster does)."""
        key_text = ""
        if self._key_text:
            require_token_auth(await host.token_auth.remote(), f"The Ray node of {name}")
            key_text = self._key_text
        return await host.start.remote(boot, env, key_text)

    async def _placement_group(self, spec: WorkerSpec, group: str) -> Any:
        """The group's placement group, made (and waited for) by its first worker."""
        lock = self._placing.setdefault(group, asyncio.Lock())
        async with lock:
            if group in self._groups:
                return self._groups[group]
            from ray.util.placement_group import placement_group

            bundles = [bundle_of(spec, self.cpus, self.roles)] * spec.group_size
            pg = placement_group(bundles, strategy="STRICT_PACK",
                                 name=f"{PREFIX}{self.run_id}.{group}")
            try:
                await asyncio.wait_for(pg.ready(), self.place_timeout_s)
            except asyncio.TimeoutError:
                self.ray.util.remove_placement_group(pg)
                free = self.ray.available_resources()
                raise WorkerStartError(
                    f"Ray found no room for {group} within {self.place_timeout_s:g} s: it asks "
                    f"{len(bundles)} x {bundles[0]} on one node; free now: "
                    + ", ".join(f"{k} {v:g}" for k, v in sorted(free.items())
                                if not k.startswith(("node:", "memory", "object_store")))
                    + ". Lower cluster.ray_worker_cpus, add nodes, or raise "
                    "cluster.join_timeout_s if the cluster is scaling up") from None
            self._groups[group] = pg
            return pg

    def _release(self, handle: WorkerHandle) -> None:
        """The worker is gone: its actor goes, and its group's placement group with the last
        of its members (the resources return to Ray for a replacement)."""
        spec = handle.spec
        try:
            self.ray.kill(handle.proc.host, no_restart=True)
        except Exception:  # already dead
            pass
        group = spec.group or spec.name
        members = self._members.get(group, set())
        members.discard(spec.name)
        if not members and group in self._groups:
            self._members.pop(group, None)
            self.ray.util.remove_placement_group(self._groups.pop(group))

    async def _proc_wait(self, handle: WorkerHandle) -> None:
        await super()._proc_wait(handle)
        self._release(handle)

    def _running(self, handle: WorkerHandle) -> bool:
        return handle.alive

    # ------------------------------------------------------------------ stop

    def _signal(self, handle: WorkerHandle, sig: int) -> None:
        host = handle.proc.host
        host.signal.remote(sig)
        if sig == signal.SIGKILL:  # the host goes too, once it has passed the signal on
            asyncio.get_running_loop().call_later(1.0, self._kill_actor, host)

    def _kill_actor(self, host: Any) -> None:
        try:
            self.ray.kill(host, no_restart=True)
        except Exception:
            pass

    async def on_drain(self) -> None:
        await super().on_drain()
        for handle in list(self.workers.values()):
            self._release(handle)
        for pg in self._groups.values():
            self.ray.util.remove_placement_group(pg)
        self._groups.clear()

    async def on_stop(self) -> None:
        await super().on_stop()
        if self._owns_ray:
            self.ray.shutdown()
        if self._key_dir:
            shutil.rmtree(self._key_dir, ignore_errors=True)


def _dashboard_url(context: Any) -> str:
    """Ray's dashboard (http://HOST:PORT) from ray.init's context, when the cluster runs one
    (`pip install 'ray[default]'`); "" when it runs none."""
    url = getattr(context, "dashboard_url", "") or ""
    return f"http://{url}" if url and not url.startswith("http") else url


def leftovers(ray: Any, timeout_s: float = 0.0, prefix: str = PREFIX) -> list[str]:
    """Names of FlexMARL's live actors and placement groups on the cluster (`prefix`: of one
    run, PREFIX + its run id), waiting up to `timeout_s` for them to go (Ray ends a dead
    driver's job within seconds). Empty: nothing left."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = [n["name"] for n in ray.util.list_named_actors(all_namespaces=True)
                if n["name"].startswith(prefix)]
        left += [pg["name"] for pg in ray.util.placement_group_table().values()
                 if pg["name"].startswith(prefix) and pg["state"] != "REMOVED"]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)
