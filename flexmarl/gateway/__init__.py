"""Training an existing OpenAI-client app: its episodes become the run's trajectories.

    api.py       the OpenAI chat/completions wire format (aiohttp) over a Backend
    backend.py   Gateway: episodes, seats and rewards on top of the orchestrator's ctx
    app.py       the app's process: started once the gateway is up, stopped at the end
"""
