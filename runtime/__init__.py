"""FlexMARL's generic asyncio actor runtime: codec, transport, actors, supervision.

It knows nothing of reinforcement learning; `flexmarl` builds the MARL system on top of it.
Importing it has no side effects: uvloop and signal handlers are installed by entry points only.
"""
