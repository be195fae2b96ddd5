"""A one-step gateway run driven by an OpenAI-client app (tests/test_pretrained.py,
tests/test_mixed_families.py): the team's agents answer the app's chat requests through the
gateway, every stored row is recorded, and the run's result comes back with those rows."""
from __future__ import annotations

import asyncio
from pathlib import Path

from flexmarl.config.load import load_config
from flexmarl.launch.run import train
from flexmarl.observe.rundir import RunDir
from flexmarl.orchestrator.store import ExperienceStore


async def gateway_run(team, run_dir: Path, monkeypatch, messages: list[dict],
                      models: list[str], *, lr: float) -> tuple:
    """One step of 1 task x 2 trajectories: each episode of the app calls every one of
    `models` (the team's agents) with `messages` in turn and rewards the team with its
    trajectory number. (run result, every row the store took)."""
    import aiohttp
    from openai import AsyncOpenAI

    stored = []
    put = ExperienceStore.put

    async def recording_put(self, row, **kwargs):
        stored.append(row)
        return await put(self, row, **kwargs)

    monkeypatch.setattr(ExperienceStore, "put", recording_put)
    config = load_config(overrides=[
        f"run.dir={run_dir}", "run.steps=1", "rollout.backend=torch",
        "pipeline.tasks_per_step=1", "pipeline.trajectories_per_task=2",
        "pipeline.micro_batch_groups=1", f"trainer.lr={lr}", "observe.dashboard=false",
        "observe.tensorboard=false", "observe.report=false", "gateway.enabled=true"])
    url: asyncio.Future = asyncio.get_running_loop().create_future()
    made = RunDir.create(config)
    run = asyncio.create_task(train(team, config, run_dir=made, progress=False,
                                    on_gateway=url.set_result))
    base_url = await asyncio.wait_for(url, 600)
    token = (made.path / "gateway_token").read_text()  # generated for the run
    client = AsyncOpenAI(base_url=base_url + "v1", api_key=token)

    async def app() -> None:
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"}) as http:
            k = 0
            while not run.done():
                for j in range(2):
                    eid = f"t{k}/{j}"
                    for model in models:
                        await client.chat.completions.create(
                            model=model, messages=messages, max_tokens=8,
                            extra_headers={"X-Episode-Id": eid})
                    async with http.post(f"{base_url}v1/episodes/{eid}/reward",
                                         json={"team": float(j)}) as resp:
                        assert resp.status == 200, await resp.text()
                    async with http.post(f"{base_url}v1/episodes/{eid}/end") as resp:
                        assert resp.status == 200, await resp.text()
                k += 1

    driver = asyncio.create_task(app())
    result = await asyncio.wait_for(run, 900)
    driver.cancel()
    await asyncio.gather(driver, return_exceptions=True)
    return result, stored
