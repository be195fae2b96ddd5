"""FlexMARL: asynchronous multi-agent LLM reinforcement learning, one policy model per agent.

The MARL system (team API, orchestrator, experience store, pipeline policies, engines) is built
on the generic actor runtime in `runtime`. This package grows issue by issue; see README.md for
what exists today.
"""

__version__ = "0.1.0"
