"""Device placement: which GPUs each rollout instance and each trainer rank owns, on which host.

    hosts: this machine's visible GPUs (devices.gpus), or what each flexmarl-node reports
    asks:  every rollout instance (its tensor_parallel_size GPUs, on one host) and every trainer
           slot (one GPU per rank; its ranks kept on one host when one has room)
        ─► place_devices ─► DevicePlacement: worker -> Seat(host, GPU indices on that host)
        ─► each worker process starts with CUDA_VISIBLE_DEVICES = its GPUs (runtime.supervisor
           maps them through the starting process's own CUDA_VISIBLE_DEVICES) and, on nodes,
           on its seat's node

Pure: no torch and no CUDA here (the run hands in the counts), so every shape is unit-tested on
a CPU machine. No two workers share a GPU unless `devices.colocate`: then workers share GPUs by
memory, each instance taking rollout.gpu_memory_utilization of each of its GPUs and each trainer
rank devices.trainer_memory_fraction, as long as a GPU's shares add up to at most 1 less
devices.reserve_fraction (CUDA contexts, NCCL's buffers and vLLM's weight-receive buffers sit
outside every share, and vLLM refuses to start unless the free memory covers its whole share);
an instance goes to its agent's trainer GPUs first (`near`: CUDA IPC weight sync needs that),
else to the GPUs with most room. Largest asks first, each on the host where it fits tightest (best
fit), so that big tensor-parallel instances and whole trainer slots are not starved by the many
small ones. Not enough GPUs is one PlacementError listing what was asked and what exists.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from flexmarl import _compat
from flexmarl.checks import ConfigError, require
from flexmarl.config.sections import _span

ROLES = ("rollout", "trainer")


class PlacementError(ConfigError):
    """The workers do not fit on the GPUs; the message lists what was asked and what exists."""


@dataclass(frozen=True)
class Host:
    """A machine's GPUs (their indices there) and the roles it hosts ("any": both)."""

    name: str
    gpus: tuple[int, ...]
    roles: tuple[str, ...] = ("any",)

    def serves(self, role: str) -> bool:
        return "any" in self.roles or role in self.roles


@dataclass(frozen=True)
class Ask:
    """One worker's GPUs: a rollout instance (`gpus` = its tensor-parallel size) or one rank of
    trainer slot `group` (one GPU)."""

    worker: str
    role: str
    gpus: int = 1
    group: str = ""
    label: str = ""
    """What it serves, for tables: the agent of an instance."""
    memory: float = 1.0
    """Share of each of its GPUs' memory (with colocate; otherwise it owns them whole)."""
    near: str = ""
    """With colocate: a trainer group whose GPUs it should share (its agent's slot)."""
    inside: str = ""
    """Time-shared (devices.placement): the trainer group whose GPUs it runs on, taking no room
    of its own there (the two take turns, the engine asleep while the group trains)."""

    def __post_init__(self) -> None:
        require(self.role in ROLES, "Ask.role", self.role, f"must be one of {ROLES}")
        require(self.gpus >= 1, f"GPUs of {self.worker}", self.gpus, "must be >= 1")
        require(0 < self.memory <= 1, f"memory share of {self.worker}", self.memory,
                "must be in (0, 1]")


@dataclass(frozen=True)
class Seat:
    worker: str
    role: str
    host: str
    devices: tuple[int, ...]
    label: str = ""
    memory: float = 1.0
    inside: str = ""


@dataclass
class DevicePlacement:
    """Where every GPU worker runs; changes as workers are replaced or nodes join."""

    hosts: list[Host]
    seats: dict[str, Seat] = field(default_factory=dict)
    colocate: bool = False
    reserve: float = 0.0
    """With colocate: the share of each GPU no worker's share may take (devices.reserve_fraction)."""

    def env(self, worker: str) -> dict[str, str]:
        """The worker's process environment: its GPUs (none if it has no seat: a CPU worker)."""
        seat = self.seats.get(worker)
        return {"CUDA_VISIBLE_DEVICES": ",".join(map(str, seat.devices))} if seat else {}

    def host(self, worker: str) -> str:
        seat = self.seats.get(worker)
        return seat.host if seat else ""

    def used(self, host: str, gpu: int) -> float:
        """The share of a GPU's memory its workers hold (1 per worker without colocate)."""
        return sum(s.memory if self.colocate else 1.0 for s in self.seats.values()
                   if s.host == host and gpu in s.devices and not s.inside)

    def free(self, host: Host, ask: Ask) -> list[int]:
        """GPUs of `host` that `ask` fits on, best first: its `near` group's GPUs, then those
        with most room (with colocate), then in order."""
        if not host.serves(ask.role):
            return []
        if ask.inside:  # exactly its trainer group's GPUs on this host, however full
            return sorted({d for s in self.seats.values() if s.host == host.name
                           and s.worker.startswith(ask.inside + "-") for d in s.devices})
        need = ask.memory if self.colocate else 1.0
        room = 1.0 - (self.reserve if self.colocate else 0.0)
        fits = [d for d in host.gpus if self.used(host.name, d) + need <= room + 1e-9]
        near = {d for s in self.seats.values() if ask.near and s.host == host.name
                and s.worker.startswith(ask.near + "-") for d in s.devices}
        return sorted(fits, key=lambda d: (d not in near, self.used(host.name, d), d))

    def replace(self, old: str, new: str) -> None:
        """A replacement process takes the dead worker's seat (its GPUs are free again)."""
        seat = self.seats.pop(old, None)
        if seat is not None:
            self.seats[new] = Seat(new, seat.role, seat.host, seat.devices, seat.label,
                                   seat.memory, seat.inside)

    def take(self, ask: Ask, host: str | None = None) -> Seat | None:
        """Seat one more worker (on `host` if given); None if no host has room for it."""
        hosts = [h for h in self.hosts if host is None or h.name == host]
        fits = [(_shared(h), len(free), i, h) for i, h in enumerate(hosts)
                if len(free := self.free(h, ask)) >= ask.gpus]
        if not fits:
            return None
        best = min(fits)[3]
        return self._seat(ask, best, self.free(best, ask)[:ask.gpus])

    def paired(self, group_of: dict[str, str]) -> bool:
        """Every instance can take CUDA IPC weight sync from its agent's trainer group
        (`group_of`: agent -> group): see `unpaired`."""
        return not self.unpaired(group_of)

    def unpaired(self, group_of: dict[str, str]) -> list[str]:
        """The instances with a GPU that hosts no rank of their agent's trainer group. vLLM's
        IPC engine has each tensor-parallel worker look up its own GPU in the handles, and a
        trainer rank hands out handles of its own GPU only: every GPU of the instance needs a
        rank there ("IPC handle not found for GPU UUID" otherwise)."""
        out = []
        for s in self.seats.values():
            if s.role != "rollout":
                continue
            group = group_of.get(s.label)
            ranks = {d for r in self.seats.values() if group and r.role == "trainer"
                     and r.host == s.host and r.worker.startswith(group + "-") for d in r.devices}
            if not set(s.devices) <= ranks:
                out.append(s.worker)
        return out

    def add_host(self, host: Host) -> None:
        self.hosts = [h for h in self.hosts if h.name != host.name] + [host]

    def drop_host(self, name: str) -> None:
        """A node was lost: its GPUs and its workers' seats go (replacements sit elsewhere)."""
        self.hosts = [h for h in self.hosts if h.name != name]
        self.seats = {w: s for w, s in self.seats.items() if s.host != name}

    def _seat(self, ask: Ask, host: Host, devices: list[int]) -> Seat:
        seat = Seat(ask.worker, ask.role, host.name, tuple(sorted(devices)),
                    ask.label or ask.group, ask.memory if self.colocate else 1.0, ask.inside)
        self.seats[ask.worker] = seat
        return seat

    def rows(self) -> list[dict]:
        """One row per GPU worker (the dashboard's and --dry-run's placement table)."""
        return [{"worker": s.worker, "role": s.role, "serves": s.label, "host": s.host,
                 "gpus": list(s.devices), "memory": s.memory} for s in self.seats.values()]

    def table(self) -> str:
        share = (lambda s: f"  ({s.memory:.0%} of each)") if self.colocate else (lambda s: "")
        lines = [f"{'worker':<18}{'role':<9}{'serves':<14}{'host':<14}gpus"]
        lines += [f"{s.worker:<18}{s.role:<9}{s.label:<14}{s.host:<14}{_span(s.devices)}"
                  f"{share(s)}" + (f"  (time-shared with {s.inside})" if s.inside else "")
                  for s in self.seats.values()]
        idle = [f"{h.name}: {_span(d)}" for h in self.hosts
                if (d := [g for g in h.gpus if not any(
                    s.host == h.name and g in s.devices for s in self.seats.values())])]
        if idle:
            lines.append("unused: " + "; ".join(idle))
        return "\n".join(lines)


def place_devices(hosts: list[Host], asks: list[Ask], *, colocate: bool = False,
                 reserve: float = 0.0) -> DevicePlacement:
    """Every ask seated on its own GPUs (see the module docstring), or one PlacementError.
    `reserve` (devices.reserve_fraction): with colocate, the share of each GPU kept free."""
    placed = DevicePlacement(list(hosts), colocate=colocate, reserve=reserve)
    units: list[list[Ask]] = []
    groups: dict[str, list[Ask]] = {}
    for ask in asks:
        if ask.role == "trainer" and ask.group:
            if ask.group not in groups:
                groups[ask.group] = []
                units.append(groups[ask.group])
            groups[ask.group].append(ask)
        else:
            units.append([ask])
    # Largest first; at equal size trainer slots first (with colocate, instances then go to
    # their agent's trainer GPUs: `near`).
    order = sorted(range(len(units)), key=lambda i: (-sum(a.gpus for a in units[i]),
                                                     units[i][0].role != "trainer", i))
    for i in order:
        unit = units[i]
        if not _place(placed, unit):
            raise PlacementError(_shortage(hosts, asks, unit, colocate, reserve))
    # Seats listed in the asks' order (tables read like the config).
    placed.seats = {a.worker: placed.seats[a.worker] for a in asks}
    return placed


def _place(placed: DevicePlacement, unit: list[Ask]) -> bool:
    """Seat one instance, or one trainer slot's ranks: on one host if any has room for all of
    them (the tightest), else a slot's ranks spread over the hosts with most room."""
    first, need = unit[0], sum(a.gpus for a in unit)
    # Hosts of this role only before "any" hosts (the other role may need those), then the
    # tightest fit. A slot's ranks take distinct GPUs (one per rank): NCCL needs that.
    room = [(_shared(h), len(placed.free(h, first)), i, h) for i, h in enumerate(placed.hosts)]
    fits = [r for r in room if r[1] >= need]
    if fits:
        host = min(fits)[3]
        free = placed.free(host, first)
        for ask in unit:
            placed._seat(ask, host, free[:ask.gpus])
            free = free[ask.gpus:]
        return True
    if len(unit) == 1 or sum(r[1] for r in room) < need:
        return False  # an instance's tensor-parallel GPUs must share a host
    taken: set[tuple[str, int]] = set()
    for ask in unit:  # one GPU per rank (NCCL joins ranks across hosts), most room first
        options = [(r[0], -len(free), r[2], r[3], free) for r in room
                   if (free := [d for d in placed.free(r[3], ask) if (r[3].name, d) not in taken])]
        if not options:
            return False
        _, _, _, host, free = min(options, key=lambda o: o[:3])
        placed._seat(ask, host, free[:1])
        taken.add((host.name, free[0]))
    return True


def _shared(host: Host) -> bool:
    return len(host.roles) > 1 or "any" in host.roles


def _shortage(hosts: list[Host], asks: list[Ask], failed: list[Ask], colocate: bool,
              reserve: float = 0.0) -> str:
    """What was asked, what exists, and why `failed` did not fit."""
    def asked(role: str) -> str:
        mine = [a for a in asks if a.role == role]
        if role == "rollout":
            sizes = sorted({a.gpus for a in mine})
            return (f"{len(mine)} rollout instance{'s' * (len(mine) != 1)} x "
                    f"tensor_parallel_size {'/'.join(map(str, sizes))} = "
                    f"{sum(a.gpus for a in mine)}")
        slots = {a.group for a in mine}
        return (f"{len(slots)} trainer slot{'s' * (len(slots) != 1)} with {len(mine)} "
                f"rank{'s' * (len(mine) != 1)} = {len(mine)}")
    parts = [asked(r) for r in ROLES if any(a.role == r for a in asks)]
    total = {r: sum(a.gpus * (a.memory if colocate else 1) for a in asks if a.role == r)
             for r in ROLES}
    need = math.ceil(sum(total.values()) / (1 - reserve if colocate else 1.0) - 1e-9)
    exist = "; ".join(f"{h.name} ({'/'.join(h.roles)}): {len(h.gpus)} "
                      f"({_span(h.gpus) or 'none'})" for h in hosts) or "no host"
    have = sum(len(h.gpus) for h in hosts)
    what = failed[0]
    shares = ", at their memory shares (devices.colocate)" if colocate else ""
    why = f"the run asks for {need} GPUs ({'; '.join(parts)}{shares}) and {have} exist ({exist})"
    if need <= have:  # enough in all, but not where this one needs them
        why += (f"; {what.group or what.worker} ({sum(a.gpus for a in failed)} GPUs"
                f"{' on one host' if len(failed) == 1 else ''}) finds no host of role "
                f"{what.role} with room left")
    if have == 0:
        return (f"no GPU here: {why}. Train on CPU (trainer.device = \"cpu\"), or run on a "
                "machine with GPUs and a CUDA build of torch (make TORCH=torch "
                "EXTRAS=dev,gpu,pretrained setup; nodes: flexmarl-node --devices)")
    fixes = ("fewer rollout.instances_per_agent, a smaller rollout.tensor_parallel_size or "
             "fewer trainer ranks (trainer_pool.ranks_per_agent, slots)")
    fixes += (", or smaller memory shares (rollout.gpu_memory_utilization, "
              "devices.trainer_memory_fraction: the shares on one GPU may add up to "
              f"{1 - reserve:g}, devices.reserve_fraction = {reserve:g} being kept for CUDA "
              "contexts and communication buffers)" if colocate else
              ", or devices.colocate = true (workers share GPUs by memory)")
    return f"not enough GPUs: {why}. Fit them with {fixes}"


__getattr__ = _compat.renamed_getattr(__name__, globals())  # the old names, until REMOVED_IN
