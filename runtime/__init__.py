"""FlexMARL's generic asyncio actor runtime: codec, transport, actors, supervision.

It knows nothing of reinforcement learning; `flexmarl` builds the MARL system on top of it.
Importing it has no side effects: uvloop and signal handlers are installed by entry points only.

    protocol.py     every message kind on the wire and its typed dataclass
    codec.py        messages into frames and back: msgpack body, zero-copy tensor/array frames
    transport.py    one API over local://, inproc://, ipc:// and tcp://; the ZeroMQ socket factory
    curve.py        CURVE on tcp://: plaintext on loopback only, the ZAP handler's allow-lists
    keys.py         CURVE key pairs for encrypted, authenticated tcp:// (`flexmarl keygen`)
    actor.py        Actor base: a mailbox, handlers by message type, named `*_loop` tasks
    supervisor.py   start worker processes, watch them, report deaths, stop them in order
    worker.py       a worker process's entry point: `python -m runtime.worker BOOT_JSON`
    zygote.py       a fork server: workers forked from one process that imported their modules
                    once (SupervisorConfig.preload)
    heartbeat.py    heartbeats sent from a thread, silence judged without the observer's stalls
    lifecycle.py    Lifecycle: one pool's workers, their deaths and replacements
    node.py         a node: hosts workers on this machine for a registry on another one
    registry.py     the registry: nodes on other machines join it, it places workers on them
    ray_cluster.py  RayLauncher: Ray places, starts and watches the worker processes
    config.py       one keyword-only, validated config dataclass per component
    errors.py       every exception type the runtime raises, in one place
    demo.py         a tour of the runtime: `python -m runtime.demo`
"""
