"""Training an existing OpenAI-client app: its episodes become the run's trajectories.

    api.py       the OpenAI chat/completions wire format (aiohttp) over a Backend
    backend.py   Gateway: episodes, seats and rewards on top of the orchestrator's ctx
    app.py       the app's process: started once the gateway is up, stopped at the end
    heldout.py   `flexmarl eval RUN_DIR` of a gateway team: gateway.eval_app's held-out episodes

A team file imports `gateway_team` from here (`from flexmarl.gateway import gateway_team`, as
it did when the gateway was one module).
"""
from flexmarl.config.sections import GatewayConfig
from flexmarl.gateway.api import ApiError
from flexmarl.gateway.backend import EpisodeExpired, Gateway, Slot, gateway_team

__all__ = ["ApiError", "EpisodeExpired", "Gateway", "GatewayConfig", "Slot", "gateway_team"]
