"""Per-step metric records, also as TensorBoard event files and Weights & Biases runs.

    loggers = MetricLoggers(run_dir, tensorboard=True, wandb=False, config=config_dict)
    loggers.log(record)     # each metrics.jsonl record, as it is written
    loggers.close()

Each record is flattened into scalars (`scalars(record)`: `team/reward`, `agent/NAME/loss`, ...)
logged at step `record["step"]`. TensorBoard writes `RUN_DIR/tensorboard` through
`torch.utils.tensorboard.SummaryWriter`; W&B writes `RUN_DIR/wandb` (offline by default: no
network, `wandb sync` later). A logger that fails while the run is going (a full disk, a network
error) must not end the training: it logs one warning and is switched off.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Protocol

from flexmarl.checks import ConfigError

log = logging.getLogger(__name__)

TENSORBOARD_DIR = "tensorboard"

_TEAM_KEYS = (("team_reward", "reward"), ("step_s", "step_s"), ("rollout_s", "rollout_s"))
_AGENT_KEYS = ("reward", "staleness", "loss", "train_s", "sync_s", "version", "tokens")


def _scalar(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The numbers of one metrics record by tag; None and non-numeric values are left out."""
    out: dict[str, float] = {}
    for key, tag in _TEAM_KEYS:
        v = _scalar(record.get(key))
        if v is not None:
            out[f"team/{tag}"] = v
    agents = record.get("agents")
    for name, agent in (agents.items() if isinstance(agents, dict) else ()):
        if not isinstance(agent, dict):
            continue
        for key in _AGENT_KEYS:
            v = _scalar(agent.get(key))
            if v is not None:
                out[f"agent/{name}/{key}"] = v
        metrics = agent.get("train_metrics")
        for key, value in (metrics.items() if isinstance(metrics, dict) else ()):
            v = _scalar(value)
            if v is not None:
                out[f"agent/{name}/train_metrics/{key}"] = v
    return out | eval_scalars(record.get("eval"))


def eval_scalars(result: Any) -> dict[str, float]:
    """A held-out evaluation's numbers by tag (eval/team_reward, eval/<agent>/reward, ...)."""
    if not isinstance(result, dict):
        return {}
    out = {f"eval/{key}": v for key in ("team_reward", "best_team", "failed")
           if (v := _scalar(result.get(key))) is not None}
    for name, agent in (result.get("agents") or {}).items():
        if isinstance(agent, dict) and (v := _scalar(agent.get("reward"))) is not None:
            out[f"eval/{name}/reward"] = v
    return out


class _Sink(Protocol):
    name: str

    def log(self, values: dict[str, float], step: int) -> None: ...

    def close(self) -> None: ...


class _TensorBoard:
    name = "tensorboard"

    def __init__(self, log_dir: Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:  # torch says which module is missing
            raise ConfigError(f"observe.tensorboard needs the tensorboard package ({e}); "
                              "pip install tensorboard, or set observe.tensorboard = false"
                              ) from None
        self.writer = SummaryWriter(log_dir=str(log_dir))

    def log(self, values: dict[str, float], step: int) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, global_step=step)
        self.writer.flush()  # a live TensorBoard sees each step as it ends

    def close(self) -> None:
        self.writer.close()


class _WandB:
    name = "wandb"

    def __init__(self, run_dir: Path, *, project: str, mode: str, run_name: str,
                 config: dict | None) -> None:
        try:
            import wandb
        except ImportError:
            raise ConfigError("observe.wandb = true needs the wandb package: pip install wandb, "
                              "or set observe.wandb = false") from None
        self.run = wandb.init(project=project, name=run_name or None, dir=str(run_dir),
                              mode=mode, config=config)

    def log(self, values: dict[str, float], step: int) -> None:
        self.run.log(values, step=step)

    def close(self) -> None:
        self.run.finish()


class MetricLoggers:
    """TensorBoard and/or W&B for the per-step records of one run.

    A missing package raises ConfigError (the message says what to install or switch off).
    Any other failure, starting a logger or later, logs one warning and switches that logger
    off: metrics.jsonl still has everything.
    """

    def __init__(self, run_dir: str | Path, *, tensorboard: bool = True, wandb: bool = False,
                 wandb_project: str = "flexmarl", wandb_mode: str = "offline",
                 run_name: str = "", config: dict | None = None) -> None:
        run_dir = Path(run_dir)
        self.sinks: list[_Sink] = []
        if tensorboard:
            self._start("tensorboard", lambda: _TensorBoard(run_dir / TENSORBOARD_DIR))
        if wandb:
            self._start("wandb", lambda: _WandB(run_dir, project=wandb_project,
                                                mode=wandb_mode, run_name=run_name,
                                                config=config))

    def _start(self, name: str, make: Any) -> None:
        try:
            self.sinks.append(make())
        except ConfigError:
            self.close()  # the ones already started
            raise
        except Exception as e:
            log.warning("%s logger could not start (%s: %s); running without it "
                        "(metrics.jsonl has every record)", name, type(e).__name__, e,
                        exc_info=log.isEnabledFor(logging.DEBUG))

    @property
    def enabled(self) -> list[str]:
        """Names of the loggers still on."""
        return [s.name for s in self.sinks]

    def log(self, record: dict[str, Any]) -> None:
        """Log one metrics record's scalars at its step; never raises."""
        if not self.sinks:
            return
        step = record.get("step")
        if isinstance(step, bool) or not isinstance(step, int):
            log.warning("metric record without an integer step (%r): not logged to %s", step,
                        ", ".join(self.enabled))
            return
        values = scalars(record)
        for sink in list(self.sinks):
            try:
                sink.log(values, step)
            except Exception as e:
                self._disable(sink, e)

    def close(self) -> None:
        """Flush and close every logger; never raises."""
        sinks, self.sinks = self.sinks, []
        for sink in sinks:
            try:
                sink.close()
            except Exception as e:
                log.warning("%s logger failed to close (%s: %s)", sink.name,
                            type(e).__name__, e)

    def _disable(self, sink: _Sink, error: Exception) -> None:
        log.warning("%s logger failed (%s: %s); switched off for the rest of the run "
                    "(metrics.jsonl has every record)", sink.name, type(error).__name__, error,
                    exc_info=log.isEnabledFor(logging.DEBUG))
        self.sinks.remove(sink)
        try:
            sink.close()
        except Exception:
            pass

    def __enter__(self) -> MetricLoggers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
