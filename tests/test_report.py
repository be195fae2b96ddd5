"""The run report (flexmarl.observe.report, `flexmarl report`) and the metric loggers (flexmarl.observe.loggers).

tests/data/metrics_small.jsonl is four records of the cluster simulator, written once with

    from flexmarl.sim.cluster import simulate
    records = simulate("small", "flexmarl", steps=4).records
    open("tests/data/metrics_small.jsonl", "wb").write(
        b"".join(orjson.dumps(r) + b"\\n" for r in records))
"""
from __future__ import annotations

import base64
import logging
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from flexmarl.checks import ConfigError
from flexmarl.observe.loggers import MetricLoggers, scalars
from flexmarl.observe.report import PLOTS, REPORT_FILE, ReportError, write_report
from flexmarl.observe.rundir import METRICS_FILE, read_metrics

FIXTURE = Path(__file__).parent / "data" / "metrics_small.jsonl"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _records() -> list[dict]:
    return read_metrics(FIXTURE)


def _write(run_dir: Path, records: list[dict]) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / METRICS_FILE).write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    return run_dir


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    d = tmp_path / "run"
    d.mkdir()
    shutil.copy(FIXTURE, d / METRICS_FILE)
    return d


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == PNG_MAGIC, "not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def _embedded_pngs(page: str) -> list[bytes]:
    return [base64.b64decode(m) for m in
            re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)]


# ----------------------------------------------------------------------------- fixture


def test_fixture_is_small_and_complete():
    assert FIXTURE.stat().st_size < 100_000
    records = _records()
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    for key in ("mode", "step_s", "rollout_s", "team_reward", "t_rollout_start",
                "t_rollout_end", "moves", "swaps", "trainer_slots_busy_s", "agents"):
        assert all(key in r for r in records), key
    agents = records[-1]["agents"]
    assert len(agents) >= 2
    for a in agents.values():
        for key in ("reward", "samples", "tokens", "version", "staleness", "train_s", "sync_s",
                    "step_s", "rollout_busy_s", "t_first_call", "t_done", "train_metrics"):
            assert key in a, key
    assert any(r["moves"] for r in records) and any(r["swaps"] for r in records)


# ----------------------------------------------------------------------------- report


def test_report_from_simulator_records(run_dir: Path):
    pyplot_before = "matplotlib.pyplot" in sys.modules
    path = write_report(run_dir)
    assert path == run_dir / "report" / REPORT_FILE and path.is_file()
    page = path.read_text(encoding="utf-8")
    embedded = _embedded_pngs(page)
    assert len(embedded) == len(PLOTS) == 5
    for (name, _), data in zip(PLOTS, embedded):
        on_disk = (path.parent / name).read_bytes()
        assert on_disk == data, name
        width, height = _png_size(on_disk)
        assert 600 <= width <= 2000 and 250 <= height <= 1500, (name, width, height)
    # Self-contained: nothing fetched from elsewhere.
    assert not re.search(r'(src|href)="(?!data:)', page)
    assert "<link" not in page and "<script" not in page
    records = _records()
    summary = page.split('<h2 id="reward">')[0]
    for name in records[-1]["agents"]:
        assert f"<td>{name}</td>" in summary
    assert "<th>steps</th><td>4</td>" in summary
    assert f"<th>mode</th><td>{records[0]['mode']}</td>" in summary
    first, last = (f"{records[i]['team_reward']:.4g}" for i in (0, -1))
    assert f"<th>first team reward</th><td>{first}</td>" in summary
    assert f"<th>last team reward</th><td>{last}</td>" in summary
    if not pyplot_before:  # drawn without pyplot's global state
        assert "matplotlib.pyplot" not in sys.modules


def test_report_pngs_decode(run_dir: Path):
    from matplotlib.image import imread

    path = write_report(run_dir, out_dir=run_dir / "elsewhere")
    assert path == run_dir / "elsewhere" / REPORT_FILE
    for name, _ in PLOTS:
        pixels = imread(path.parent / name)
        assert pixels.ndim == 3 and pixels.shape[0] > 200 and pixels.shape[1] > 500
        assert pixels.std() > 0.01, f"{name} is blank"


def test_report_escapes_names(tmp_path: Path):
    records = _records()
    evil = '<script>alert("x")</script> & $a_{b}$'
    for r in records:
        r["agents"][evil] = r["agents"].pop(next(iter(r["agents"])))
        for mv in r["moves"]:
            mv["src"] = evil
    page = write_report(_write(tmp_path / "run", records)).read_text(encoding="utf-8")
    assert "<script>" not in page
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; $a_{b}$" in page


def test_report_with_frozen_agent_missing_fields_and_nulls(tmp_path: Path):
    records = _records()
    frozen_keep = ("instances", "latency", "reward", "samples", "tokens", "trainable",
                   "version", "rollout_busy_s")
    for i, r in enumerate(records):
        agents = r["agents"]
        name = list(agents)[-1]
        agents[name] = {k: v for k, v in agents[name].items() if k in frozen_keep}
        agents[name].update(trainable=False, version=0, reward=None)
        first = agents[list(agents)[0]]
        first["loss"] = first["staleness"] = None
        if i % 2:
            first["reward"] = None
            r["team_reward"] = None
            for key in ("t_rollout_start", "t_rollout_end", "moves", "swaps",
                        "trainer_slots_busy_s", "instance_tokens"):
                r.pop(key)
    # An older run's records: a few keys only.
    records += [{"step": 4, "agents": {"legacy": {"reward": 0.5}}},
                {"step": 5, "team_reward": 0.25, "step_s": None}]
    path = write_report(_write(tmp_path / "run", records))
    page = path.read_text(encoding="utf-8")
    assert len(_embedded_pngs(page)) == 5
    assert "no (frozen)" in page
    assert "<td>legacy</td>" in page


def test_report_with_nothing_but_steps(tmp_path: Path):
    path = write_report(_write(tmp_path / "run", [{"step": 0}, {"step": 1, "agents": {}}]))
    page = path.read_text(encoding="utf-8")
    assert len(_embedded_pngs(page)) == 5
    assert "<th>first team reward</th><td>–</td>" in page


def test_report_errors_name_the_path(tmp_path: Path):
    missing = tmp_path / "missing"
    with pytest.raises(ReportError, match=re.escape(str(missing))):
        write_report(missing)
    with pytest.raises(ReportError, match=re.escape(str(tmp_path / METRICS_FILE))):
        write_report(tmp_path)
    (tmp_path / METRICS_FILE).write_bytes(b"\n")
    with pytest.raises(ValueError, match="no records"):
        write_report(tmp_path)
    (tmp_path / METRICS_FILE).write_bytes(b'{"step": 0}\nnot json\n{"step": 1}\n')
    with pytest.raises(ReportError, match="line 2"):
        write_report(tmp_path)


# ----------------------------------------------------------------------------- CLI


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from flexmarl.launch.cli import main; main()",
                           "report", *args], capture_output=True, text=True, timeout=120)


def test_cli_report(run_dir: Path):
    done = _cli(str(run_dir))
    assert done.returncode == 0, done.stderr
    path = Path(done.stdout.strip())
    assert path == run_dir / "report" / REPORT_FILE and path.is_file()


def test_cli_report_out(run_dir: Path, tmp_path: Path):
    out = tmp_path / "out"
    done = _cli(str(run_dir), "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()) == out / REPORT_FILE
    assert len(_embedded_pngs((out / REPORT_FILE).read_text(encoding="utf-8"))) == 5


def test_cli_report_missing_run_dir(tmp_path: Path):
    done = _cli(str(tmp_path / "nope"))
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "does not exist" in lines[0] and "nope" in lines[0]

    done = _cli(str(tmp_path))  # a directory without metrics.jsonl
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and METRICS_FILE in lines[0]


# ----------------------------------------------------------------------------- loggers


def test_scalars_flatten_and_skip():
    record = {"step": 3, "team_reward": 0.5, "step_s": 2, "rollout_s": None, "mode": "sync",
              "agents": {"a": {"reward": None, "staleness": 0.5, "loss": 1.25, "train_s": 1,
                               "sync_s": 0.25, "version": 4, "tokens": 100, "trainable": True,
                               "skipped_update": False,
                               "train_metrics": {"grad_norm": 2.0, "note": "x", "nan": None}},
                         "frozen": {"reward": 0.75, "version": 0, "tokens": 10}}}
    assert scalars(record) == {
        "team/reward": 0.5, "team/step_s": 2.0,
        "agent/a/staleness": 0.5, "agent/a/loss": 1.25, "agent/a/train_s": 1.0,
        "agent/a/sync_s": 0.25, "agent/a/version": 4.0, "agent/a/tokens": 100.0,
        "agent/a/train_metrics/grad_norm": 2.0,
        "agent/frozen/reward": 0.75, "agent/frozen/version": 0.0, "agent/frozen/tokens": 10.0}
    assert scalars({"step": 0}) == {}


def test_tensorboard_event_file(tmp_path: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    records = _records()
    with MetricLoggers(tmp_path, tensorboard=True, wandb=False) as loggers:
        assert loggers.enabled == ["tensorboard"]
        for r in records:
            loggers.log(r)
    events = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert len(events) == 1
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    got = [(e.step, e.value) for e in acc.Scalars("team/reward")]
    assert got == [(r["step"], pytest.approx(r["team_reward"])) for r in records]
    name = next(iter(records[0]["agents"]))
    for key in ("reward", "staleness", "loss", "train_s", "sync_s", "version", "tokens",
                "train_metrics/grad_norm"):
        assert f"agent/{name}/{key}" in tags
    assert [e.value for e in acc.Scalars(f"agent/{name}/version")] == [
        r["agents"][name]["version"] for r in records]


def test_wandb_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    try:
        loggers = MetricLoggers(tmp_path, tensorboard=False, wandb=True, wandb_mode="offline",
                                run_name="test-run", config={"pipeline": {"mode": "sync"}})
        assert loggers.enabled == ["wandb"]
        for r in _records():
            loggers.log(r)
        assert loggers.enabled == ["wandb"]  # nothing failed
        loggers.close()
    finally:
        wandb.teardown()
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    assert list(runs[0].glob("run-*.wandb"))


def test_wandb_missing_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    with pytest.raises(ConfigError, match="pip install wandb.*observe.wandb = false"):
        MetricLoggers(tmp_path, tensorboard=False, wandb=True)


class _Boom:
    name = "boom"

    def __init__(self) -> None:
        self.calls = 0
        self.closed = False

    def log(self, values: dict, step: int) -> None:
        self.calls += 1
        raise OSError("disk full")

    def close(self) -> None:
        self.closed = True


def test_failing_logger_is_switched_off(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                        monkeypatch: pytest.MonkeyPatch):
    records = _records()
    loggers = MetricLoggers(tmp_path, tensorboard=True)
    boom = _Boom()
    loggers.sinks.append(boom)
    with caplog.at_level(logging.WARNING, logger="flexmarl.observe.loggers"):
        for r in records:
            loggers.log(r)  # does not raise
    assert boom.calls == 1 and boom.closed
    assert loggers.enabled == ["tensorboard"]  # the other logger carries on
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "boom" in warnings[0].getMessage()
    assert "disk full" in warnings[0].getMessage()

    # The real TensorBoard writer failing mid-run: switched off the same way.
    def gone(*args: object, **kwargs: object) -> None:
        raise RuntimeError("writer gone")

    monkeypatch.setattr(loggers.sinks[0].writer, "add_scalar", gone)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="flexmarl.observe.loggers"):
        loggers.log(records[0])
        loggers.log(records[1])
    assert loggers.enabled == []
    assert len([r for r in caplog.records if "writer gone" in r.getMessage()]) == 1
    loggers.close()
    loggers.close()  # twice is fine
