"""The rollout backends by name: `make_engine(config)` builds the one `rollout.backend` names.

Apart from engine.py (the interface) so that each backend imports the interface and nothing
imports both ways; vLLM is imported only when asked for (a heavy import).
"""
from __future__ import annotations

from flexmarl.rollout.engine import EngineConfig, RolloutEngine


def make_engine(config: EngineConfig) -> RolloutEngine:
    if config.backend == "vllm":
        from flexmarl.rollout.vllm_engine import VllmEngine  # heavy import, only when asked
        return VllmEngine(config)
    from flexmarl.rollout.torch_engine import TorchEngine
    return TorchEngine(config)
