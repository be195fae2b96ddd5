"""The live dashboard in a real headless Chromium (Selenium): it renders the status JSON without
console errors, draws one timeline row per agent, and follows the run as /api/status changes.

The StatusServer runs on its own asyncio loop in a background thread, so the test body can make
blocking WebDriver calls. `make setup` installs chromium + chromedriver where it can (root with
apt-get); elsewhere these tests skip.
"""
from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import shutil
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

import pytest

from flexmarl.observe.server import StatusServer

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
try:
    import selenium  # noqa: F401
    HAVE_SELENIUM = True
except ImportError:
    HAVE_SELENIUM = False

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(60),
    pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER),
                       reason="chromium/chromedriver not installed (make setup installs them as root "
                              "with apt-get: apt-get install chromium chromium-driver)"),
    pytest.mark.skipif(not HAVE_SELENIUM, reason="selenium not installed (pip install -e '.[dev]')"),
]

SAMPLE = json.loads((Path(__file__).parent / "data" / "status_sample.json").read_text())
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@contextlib.contextmanager
def serve(status: Callable[[], dict]) -> Iterator[StatusServer]:
    """A StatusServer on a private event loop in a daemon thread; yields once it listens."""
    loop = asyncio.new_event_loop()
    server = StatusServer(status, lambda: b"")
    ready = threading.Event()
    failure: list[BaseException] = []

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(server.start())
        except BaseException as exc:  # surfaced in the test thread below
            failure.append(exc)
            ready.set()
            return
        ready.set()
        loop.run_forever()
        loop.run_until_complete(server.close())

    thread = threading.Thread(target=run, name="dashboard-server", daemon=True)
    thread.start()
    assert ready.wait(10), "StatusServer did not start"
    if failure:
        raise failure[0]
    try:
        yield server
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


@pytest.fixture(scope="module")
def driver():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1400,1900", "--no-first-run", "--disable-extensions"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    drv = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    drv.set_page_load_timeout(15)
    yield drv
    drv.quit()


def updates(drv) -> int:
    """How many status responses the page has rendered (dashboard.js counts them on <body>)."""
    return int(drv.execute_script("return document.body.dataset.updates || '0'"))


def wait_renders(drv, n: int, timeout: float = 10) -> None:
    """Wait until the page rendered `n` status responses; on timeout show the browser console,
    where a failed render logs its exception."""
    try:
        wait_for(lambda: updates(drv) >= n, timeout, f"{n} render(s)")
    except AssertionError as exc:
        errors = [e["message"] for e in severe(drv)][:3]
        raise AssertionError(f"{exc}; browser console errors: {errors}") from None


def severe(drv) -> list[dict]:
    return [e for e in drv.get_log("browser") if e.get("level") == "SEVERE"]


def wait_for(predicate: Callable[[], object], timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


class LiveStatus:
    """The sample, advanced by the wall clock: one more step done each second, and the open
    rollout interval (and the timeline's `now`) grows with it."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def __call__(self) -> dict:
        dt = time.monotonic() - self.t0
        d = copy.deepcopy(SAMPLE)
        run = d["run"]
        run["steps_done"] = min(run["steps"], run["steps_done"] + int(dt))
        run["elapsed_s"] += dt
        d["timeline"]["now"] += dt
        return d


def test_dashboard_renders_sample_and_updates_live(driver, tmp_path):
    from selenium.webdriver.common.by import By

    driver.get_log("browser")  # drop anything left from an earlier test
    with serve(LiveStatus()) as server:
        driver.get(server.url)
        wait_renders(driver, 1)

        rows = driver.find_elements(By.CSS_SELECTOR, ".timeline-row")
        assert sorted(r.get_attribute("data-agent") for r in rows) == sorted(SAMPLE["agents"])
        assert len(rows) == len(SAMPLE["agents"])
        bars = driver.find_elements(By.CSS_SELECTOR, ".timeline-row rect.bar")
        assert len(bars) >= len(SAMPLE["timeline"]["intervals"]) - 1, "timeline bars missing"
        assert driver.find_element(By.ID, "team").text == SAMPLE["run"]["team"]
        assert len(driver.find_elements(By.CSS_SELECTOR, "#agents tbody tr")) == len(SAMPLE["agents"])
        assert len(driver.find_elements(By.CSS_SELECTOR, "#instances tbody tr")) == len(SAMPLE["instances"])
        assert len(driver.find_elements(By.CSS_SELECTOR, "#slots tbody tr")) == len(SAMPLE["slots"])
        assert len(driver.find_elements(By.CSS_SELECTOR, "#curves svg path.series")) >= 3
        assert len(driver.find_elements(By.CSS_SELECTOR, "#events li")) == len(SAMPLE["events"])

        # Live update: the server's steps_done grows every second; the header must follow.
        first = driver.find_element(By.ID, "steps").text
        assert first.endswith(f"/ {SAMPLE['run']['steps']}"), first
        later = wait_for(lambda: (t := driver.find_element(By.ID, "steps").text) != first and t,
                         6, f"the steps text to change from {first!r}")
        assert int(later.split("/")[0]) > int(first.split("/")[0])
        assert not driver.find_element(By.ID, "conn").is_displayed()

        shot = tmp_path / "dashboard.png"
        assert driver.save_screenshot(str(shot))
        data = shot.read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 20_000, f"screenshot too small: {len(data)} B"
        assert not severe(driver)

    # The server is gone: the page keeps the last data and says it is disconnected.
    wait_for(lambda: driver.find_element(By.ID, "conn").is_displayed(), 5, "the disconnected note")
    assert driver.find_elements(By.CSS_SELECTOR, ".timeline-row")


EMPTY = {
    "run": {"team": "empty_team", "mode": "sync", "state": "starting", "steps": 0, "steps_done": 0,
            "rollout_step": None, "started_at": None, "elapsed_s": 0.0, "run_dir": None},
    "agents": {}, "instances": {}, "slots": {}, "history": [],
    "timeline": {"now": 0.0, "intervals": []}, "events": [],
}


def _nulls() -> dict:
    """The sample with every nullable field null, an interval of an unknown agent and one of
    an unknown kind, and history entries lacking an agent."""
    d = copy.deepcopy(SAMPLE)
    for a in d["agents"].values():
        a.update(slot=None, reward=None, staleness=None, train_s=None)
    for s in d["slots"].values():
        s.update(agent=None, resident=None)
    for st in d["history"]:
        st["team_reward"] = None
        for a in st["agents"].values():
            a.update(reward=None, staleness=None)
    d["history"][0]["agents"].pop("checker")
    d["timeline"]["intervals"] += [["ghost", "rollout", 1.0, None], ["solver", "mystery", 2.0, 2.5]]
    d["events"].append({"t": None, "kind": "other", "text": "<b>not html</b>"})
    return d


@pytest.mark.parametrize("status", [EMPTY, _nulls()], ids=["empty", "nulls"])
def test_dashboard_survives_edge_cases(driver, status):
    from selenium.webdriver.common.by import By

    driver.get_log("browser")
    with serve(lambda: status) as server:
        driver.get(server.url)
        wait_renders(driver, 2)  # the second: polling survived the first render
        assert not severe(driver)
        rows = driver.find_elements(By.CSS_SELECTOR, ".timeline-row")
        assert [r.get_attribute("data-agent") for r in rows] == list(status["agents"])
        assert driver.find_element(By.ID, "team").text == status["run"]["team"]
        # Text from the data is shown as text, never parsed as markup.
        assert not driver.find_elements(By.CSS_SELECTOR, "#events b")


def test_dashboard_says_when_a_run_has_stalled(driver):
    from selenium.webdriver.common.by import By

    moving = copy.deepcopy(SAMPLE)
    stalled = copy.deepcopy(SAMPLE)
    stalled["run"]["stalled"] = {"for_s": 312.0,
                                 "waiting_for": "3 requests of solver in flight (rollout-0: 3)"}
    for status, shown in ((moving, False), (stalled, True)):
        driver.get_log("browser")
        with serve(lambda: status) as server:
            driver.get(server.url)
            wait_renders(driver, 1)
            banner = driver.find_element(By.ID, "stall")
            assert banner.is_displayed() == shown and not severe(driver)
            if shown:
                assert banner.text.startswith("No progress for 5:12: ")
                assert "waiting for 3 requests of solver in flight (rollout-0: 3)" in banner.text


async def test_dashboard_of_a_real_run(driver, tiny_model_dir, tmp_path):
    """The page against the server of a real training run (two agents, torch backend): it
    renders repeatedly with one timeline row per agent and no console error while the run
    goes."""
    from selenium.webdriver.common.by import By

    from flexmarl.config.load import load_config
    from flexmarl.observe.rundir import RunDir
    from flexmarl.launch.run import train

    from tests.helpers.teams import duo

    config = load_config(overrides=[
        f"run.dir={tmp_path / 'run'}", "run.steps=40", "rollout.backend=torch",
        "pipeline.tasks_per_step=3", "pipeline.trajectories_per_task=2",
        "observe.tensorboard=false", "observe.report=false"])
    url: asyncio.Future = asyncio.get_running_loop().create_future()
    run = asyncio.create_task(train(duo(tiny_model_dir), config, run_dir=RunDir.create(config),
                                    progress=False, on_dashboard=url.set_result))
    try:
        base = await asyncio.wait_for(asyncio.shield(url), 30)
        # Drop what earlier tests' pages logged (their servers are gone), then load ours.
        await asyncio.to_thread(driver.get, "about:blank")
        await asyncio.to_thread(driver.get_log, "browser")
        await asyncio.to_thread(driver.get, base)
        await asyncio.to_thread(wait_renders, driver, 3)
        rows = await asyncio.to_thread(lambda: sorted(
            e.get_attribute("data-agent")
            for e in driver.find_elements(By.CSS_SELECTOR, ".timeline-row")))
        assert rows == ["checker", "solver"]
        assert not run.done(), "the run ended before the page was checked; raise run.steps"
        assert await asyncio.to_thread(severe, driver) == []
        await asyncio.to_thread(driver.save_screenshot, str(tmp_path / "live.png"))
    finally:
        await run
    assert (tmp_path / "live.png").read_bytes()[:8] == PNG_MAGIC
