"""Regenerate the pictures of README and docs/watching.md from a real default-team run.

    .venv/bin/python docs/capture.py [--steps 12] [--shot-after 6]

Trains agents/math_duo.py (the default config otherwise), screenshots the live dashboard in
headless Chromium once `--shot-after` steps are done (docs/dashboard.png), and copies the run
report's timeline plot (docs/report_timeline.png). Needs chromium, chromedriver and selenium
(`make setup` installs them where it can).
"""
from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import shutil
import sys
from pathlib import Path

if importlib.util.find_spec("flexmarl") is None:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

DOCS = Path(__file__).resolve().parent


def screenshot(url: str, path: Path) -> None:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or ""
    for arg in ("--headless=new", "--no-sandbox", "--window-size=1400,1700"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    try:
        driver.get(url)
        driver.implicitly_wait(5)
        import time
        time.sleep(2.5)  # a few polls: the page has drawn the current state
        driver.save_screenshot(str(path))
    finally:
        driver.quit()


async def main(args: argparse.Namespace) -> None:
    import aiohttp

    from flexmarl.config.load import load_config
    from flexmarl.observe.rundir import RunDir
    from flexmarl.launch.run import train
    from flexmarl.team import load_team

    config = load_config(overrides=[f"run.steps={args.steps}", "run.name=docs",
                                    "team.path=agents/math_duo.py", "rollout.backend=vllm",
                                    "pipeline.tasks_per_step=16"])  # as the pictures were taken
    team = load_team(config.team.path)
    url: asyncio.Future = asyncio.get_running_loop().create_future()
    run_dir = RunDir.create(config)
    with run_dir:
        run = asyncio.create_task(train(team, config, run_dir=run_dir, progress=False,
                                        on_dashboard=url.set_result))
        base = await url
        async with aiohttp.ClientSession() as http:
            while True:
                async with http.get(base + "api/status") as r:
                    if (await r.json())["run"]["steps_done"] >= args.shot_after:
                        break
                await asyncio.sleep(0.5)
        await asyncio.to_thread(screenshot, base, DOCS / "dashboard.png")
        result = await run
    shutil.copy(result.report.parent / "timeline.png", DOCS / "report_timeline.png")
    print(f"wrote {DOCS / 'dashboard.png'} and {DOCS / 'report_timeline.png'} "
          f"(run dir {result.run_dir})")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--shot-after", type=int, default=6)
    asyncio.run(main(ap.parse_args()))
