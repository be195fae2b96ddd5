"""Two agents of an existing OpenAI-client app, trained through FlexMARL's gateway.

The app (agents/openai_duo_app.py) knows nothing of FlexMARL: it calls the OpenAI chat API with
`model="solver"` and `model="checker"`, names each episode in the X-Episode-Id header, and
posts a reward when an episode is over. This file only names the agents and their models; the
run's tasks and workflow are the app's episodes. The file carries the gateway's settings
(`config`: the gateway on, the app to start, the app's held-out mode), so one command trains
the app and one measures it on 100 held-out problems:

    flexmarl run --team agents/openai_duo.py
    flexmarl eval RUN_DIR                     # gateway.eval_app's episodes on the final weights

FLEXMARL_EXAMPLE_MODEL picks another model for both agents (the tests use a tiny one).
"""
from __future__ import annotations

import os

from flexmarl import AgentSpec, SamplingParams
from flexmarl.gateway import gateway_team

MODEL = os.environ.get("FLEXMARL_EXAMPLE_MODEL", "")
# As the default team (agents/math_duo.py): built-in models, warm-started part of the way.
SOLVER = dict(model=MODEL or "small", warm_start_steps=None if MODEL else 250)
CHECKER = dict(model=MODEL or "medium", warm_start_steps=None if MODEL else 300)

APP = "python agents/openai_duo_app.py"
config = {"run": {"name": "openai_duo"},
          "gateway": {"enabled": True, "app": APP, "eval_app": APP + " --heldout"}}
"""The recommended run (flexmarl.team.load_team reads a team file's `config`)."""

team = gateway_team("openai_duo", [
    AgentSpec(name="solver", lr=1e-5, sampling=SamplingParams(max_tokens=8), **SOLVER),
    AgentSpec(name="checker", lr=1e-5, sampling=SamplingParams(max_tokens=8), **CHECKER),
], heldout=100)
