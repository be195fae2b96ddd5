"""Core pinning: which of this machine's cores each role's processes get, and how the trainer
processes share them with the run (their niceness, one at a time or together).

    cores_choosable      where devices.cores applies (trainers on this CPU, both roles "auto")
    role_cpus            rollout.cpus and trainer_pool.cpus resolved ("auto": half each, or
                         every core for both with devices.cores = "shared")
    instance_core        the one core of a rollout instance under "shared"
    trainers_on_local_cpu where trainer_pool.nice and .serial "auto" apply
    trainer_nice         trainer_pool.nice resolved
    serial_trainers      trainer_pool.serial resolved

Pure: reads the sections and the cores this process may use, starts nothing.
"""
from __future__ import annotations

from flexmarl import checks
from flexmarl.config.training import TrainerPoolConfig


SHARED_TRAINER_ENV = {"OMP_WAIT_POLICY": "PASSIVE"}
"""A trainer's OpenMP threads under devices.cores = "shared": they sleep at once when a parallel
region ends instead of spinning, so the rollout instances on the same cores get them back."""


def cores_choosable(rollout_cpus: str, trainer_cpus: str, trainer_device: str,
                    remote: bool) -> bool:
    """Whether devices.cores decides anything: trainers on this machine's CPU (not on nodes),
    rollout.cpus and trainer_pool.cpus both "auto", and at least two cores here."""
    return (trainer_device == "cpu" and not remote and rollout_cpus.strip() == "auto"
            and trainer_cpus.strip() == "auto" and len(checks.available_cpus() or []) >= 2)


def role_cpus(rollout_cpus: str, trainer_cpus: str, trainer_device: str, shared: bool = False
              ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The cores of rollout processes and of trainer processes; () means not pinned.

    `shared` (devices.cores = "shared", where cores_choosable): every core for both roles;
    each rollout instance then runs on one of them (instance_core), the trainers on all.

    "auto" (the default of both) splits this process's cores between the roles when trainers
    run on CPU: rollout gets the first half, training the second (one core each on a 2-core
    machine), each process's thread pool sized to its role's cores. Without it every torch
    process starts one thread per core and they fight over all of them: a training step of the
    default experiment measured about 4x slower unpinned on 2 cores (bench/README.md). With
    trainers on GPU, or a single core, "auto" pins nothing.
    """
    rollout = checks.parse_cpus(rollout_cpus, "rollout.cpus")
    train = checks.parse_cpus(trainer_cpus, "trainer_pool.cpus")
    auto_r, auto_t = rollout_cpus.strip() == "auto", trainer_cpus.strip() == "auto"
    cores = checks.available_cpus() or []
    if not (auto_r or auto_t) or trainer_device != "cpu" or len(cores) < 2:
        return rollout, train
    if shared and auto_r and auto_t:
        return tuple(cores), tuple(cores)
    half = len(cores) // 2
    if auto_r and auto_t:
        return tuple(cores[:half]), tuple(cores[half:])
    # One role explicit: the auto one gets the cores the other leaves (its half if unpinned).
    if auto_r:
        return (tuple(c for c in cores if c not in train) if train else tuple(cores[:half])), train
    return rollout, (tuple(c for c in cores if c not in rollout) if rollout else
                     tuple(cores[half:]))


def instance_core(cores: tuple[int, ...], taken: list[int]) -> int:
    """The core of a new single-threaded rollout instance under devices.cores = "shared": the
    first of `cores` with the fewest of `taken` (the cores of the agent's instances already
    placed), so an agent's instances spread over every core before any core gets a second."""
    return min(cores, key=lambda c: (taken.count(c), cores.index(c)))


def trainers_on_local_cpu(trainer_device: str, remote: bool) -> bool:
    """Trainer processes on this machine's CPU cores (trainer.device, not cluster.remote),
    beside the run process (which is not pinned and routes every rollout call): where
    trainer_pool.nice and .serial "auto" apply."""
    return trainer_device == "cpu" and not remote


def trainer_nice(trainer_pool: TrainerPoolConfig, on_local_cpu: bool) -> int:
    """trainer_pool.nice resolved: "auto" is 10 where trainers_on_local_cpu (measured in
    bench/README.md, `pipeline.py`), else 0."""
    nice = trainer_pool.nice
    if nice == "auto":
        return 10 if on_local_cpu else 0
    return int(nice)


def serial_trainers(trainer_pool: TrainerPoolConfig, on_local_cpu: bool) -> bool:
    """trainer_pool.serial resolved: "auto" is on where trainers_on_local_cpu
    (flexmarl.orchestrator.lane says why one at a time is faster there)."""
    serial = trainer_pool.serial
    return on_local_cpu if serial == "auto" else bool(serial)
