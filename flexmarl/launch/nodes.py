"""Multi-node runs: the `cluster` config section and the `flexmarl-node` command.

    machine A: flexmarl run CONFIG --listen tcp://0.0.0.0:5555   (runtime.registry.NodeRegistry)
    machine B: flexmarl-node --connect tcp://A:5555 --role rollout (runtime.node.NodeAgent)
    machine C: flexmarl-node --connect tcp://A:5555 --role trainer

The run waits for `cluster.rollout_nodes` and `cluster.trainer_nodes` nodes, then starts every
rollout instance and trainer rank on them instead of as local processes; trainer ranks of one
slot on different nodes rendezvous through a TCPStore the run hosts (`cluster.store_port`). A
rollout node that joins later gets `cluster.instances_per_node` new instances. All TCP is
CURVE-encrypted with the key pair of `transport.curve_secret_key_file` (`--key-file` on a node);
a node without an allowed key is refused before any of its messages reaches the run.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys
from typing import Sequence


log = logging.getLogger(__name__)

WORKER_ENTRIES = ("flexmarl.rollout.worker:rollout_worker",
                  "flexmarl.training.worker:trainer_worker")
"""The only entry points a flexmarl-node starts (runtime.node checks every StartWorker)."""
DEFAULT_KEY_FILE = "~/.flexmarl/keys/node.key_secret"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="flexmarl-node", description=(
        "Host FlexMARL workers (rollout instances, trainer ranks) on this machine for a run "
        "started with `flexmarl run --listen tcp://ADDR:PORT`."))
    p.add_argument("--connect", required=True, metavar="tcp://HOST:PORT",
                   help="the run's --listen address")
    p.add_argument("--role", default="any", choices=("rollout", "trainer", "any"),
                   help="which workers this node hosts (default %(default)s)")
    p.add_argument("--name", default=socket.gethostname(),
                   help="unique node name (default: the host name)")
    p.add_argument("--advertise", default="", metavar="HOST",
                   help="address other machines reach this one at (default: the one this "
                        "machine uses to reach --connect)")
    p.add_argument("--key-file", default=DEFAULT_KEY_FILE,
                   help="CURVE secret key file from `flexmarl keygen` (default %(default)s; "
                        "'' for plaintext on loopback only)")
    p.add_argument("--cpus", default="", help='pin workers to these cores, e.g. "0-7"')
    p.add_argument("--devices", default="auto",
                   help='GPUs this node offers the run: "auto" (every visible one) or a count '
                        "(the first N visible); the run places workers on them")
    p.add_argument("--stay", action="store_true",
                   help="after a run ends, wait for the next one instead of exiting")
    p.add_argument("--join-timeout", type=float, default=600.0, metavar="SECONDS",
                   help="give up if the run does not accept this node within it")
    p.add_argument("--log-level", default="WARNING")
    return p


def node_main(argv: Sequence[str] | None = None) -> int:
    """`flexmarl-node`: join a run and host its workers; exit 0 when the run ends, 2 on bad
    arguments, 1 if the run never accepted the node."""
    args = _parser().parse_args(argv)
    level = args.log_level.upper()
    logging.basicConfig(level=level, format=f"%(asctime)s node {args.name} %(levelname)s "
                                            "%(name)s: %(message)s")
    os.environ["FLEXMARL_LOG"] = level  # its workers log at the same level

    from flexmarl.checks import parse_cpus
    from runtime.config import TransportConfig
    from runtime.node import NodeAgent, NodeJoinError, NodeOptions

    try:
        devices = _devices(args.devices)
        key = os.path.expanduser(args.key_file) if args.key_file else ""
        transport = TransportConfig(curve_secret_key_file=key)
        options = NodeOptions(name=args.name, registry=args.connect, roles=(args.role,),
                              advertise=args.advertise, allowed_entries=WORKER_ENTRIES,
                              cpus=parse_cpus(args.cpus, "--cpus"), devices=devices,
                              stay=args.stay, join_timeout_s=args.join_timeout,
                              transport=transport)
    except ValueError as e:
        print(f"flexmarl-node: {e}", file=sys.stderr)
        return 2

    async def serve() -> None:
        node = NodeAgent(options)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, node.stop)
        await node.run()

    import uvloop
    try:
        uvloop.run(serve())
    except BaseExceptionGroup as group:  # the actor's TaskGroup wraps what its loop raised
        error = group.exceptions[0]
        while isinstance(error, BaseExceptionGroup):
            error = error.exceptions[0]
        if not isinstance(error, (NodeJoinError, ValueError)):
            raise
        print(f"flexmarl-node: {error}", file=sys.stderr)
        return 1 if isinstance(error, NodeJoinError) else 2
    except ValueError as e:  # e.g. tcp:// beyond loopback without CURVE, at bind
        print(f"flexmarl-node: {e}", file=sys.stderr)
        return 2
    return 0


def _devices(text: str) -> int:
    """--devices: "auto" is every GPU this process sees (0 without CUDA)."""
    if text.strip() == "auto":
        import torch
        return torch.cuda.device_count()
    if not text.strip().isdigit():
        raise ValueError(f'--devices must be "auto" or a number of GPUs, got {text!r}')
    return int(text)


def main() -> None:
    raise SystemExit(node_main())


if __name__ == "__main__":
    main()
