"""A gateway team's held-out measurement: the app's own held-out episodes on saved weights.

    flexmarl eval RUN_DIR (a gateway_team with heldout=N, gateway.eval_app set)
      ─► the run's weights in this process's engines (flexmarl.launch.evaluation)
      ─► a Gateway over them, its team's held-out tasks the N slots ─► GatewayServer up
      ─► gateway.eval_app started (OPENAI_BASE_URL, OPENAI_API_KEY) ─► its episodes take the
         slots, one each ─► flexmarl.orchestrator.evaluate: greedy or sampled as eval.* says,
         each episode's rewards (POST /v1/episodes/ID/reward) per agent, training off
      ─► the app stopped (SIGTERM), the gateway down

A run cannot measure a gateway team itself (eval.before / eval.final need the team's own
workflow: the app's training episodes hold the endpoint), so `flexmarl eval RUN_DIR` is the
gateway team's held-out measurement, of the final weights or of a saved step.
"""
from __future__ import annotations

import contextlib
import dataclasses
import secrets
from typing import Any

from flexmarl.checks import ConfigError
from flexmarl.config.load import Config
from flexmarl.gateway.app import serve_gateway, unless_app_exits
from flexmarl.gateway.backend import Gateway
from flexmarl.orchestrator.evaluate import evaluate
from flexmarl.team import Team


def check_app_eval(team: Team, config: Config) -> None:
    """What a gateway team's evaluation needs, each missing piece named with its fix."""
    if not team.heldout:
        raise ConfigError(f"team {team.name} is trained through the gateway and has no held-out "
                          "episodes: give its team file gateway_team(..., heldout=N), N episodes "
                          "of the app's held-out problems")
    if not config.gateway.eval_app:
        raise ConfigError(f"team {team.name} is trained through the gateway: its held-out "
                          "episodes are its app's; set gateway.eval_app to a command that plays "
                          "them until stopped (e.g. --set gateway.eval_app='python app.py "
                          "--heldout'; docs/gateway.md)")


async def evaluate_app(team: Team, agents: dict[str, Any], generate: Any, tasks: list[Any],
                       config: Config) -> dict[str, Any]:
    """evaluate()'s result for the app's first len(`tasks`) held-out episodes on `generate`
    (the evaluated weights); the app's early exit is an error naming it."""
    check_app_eval(team, config)
    gateway = Gateway(agents, config.gateway, config.pipeline)
    # The app gets a token of its own (OPENAI_API_KEY); nothing else calls this gateway.
    settings = dataclasses.replace(config.gateway, app=config.gateway.eval_app, port=0,
                                   token=config.gateway.token or secrets.token_urlsafe(24))
    async with contextlib.AsyncExitStack() as stack:
        app = await serve_gateway(stack, gateway, settings, lambda url: None,
                                  stop_timeout_s=config.supervisor.stop_timeout_s)
        out: dict[str, Any] = {}

        async def measure() -> None:
            out.update(await evaluate(gateway.team(team), agents, generate, tasks, config.eval,
                                      seed=config.run.seed))
        try:
            await unless_app_exits(measure(), app)
        except RuntimeError as e:  # the app exited before its episodes were all played
            raise ConfigError(f"{e} (gateway.eval_app = {config.gateway.eval_app!r})") from None
    return out
