"""The CLI's logging: the console's share of the log, the run's log file, and where warnings go.

    configure_logging(level)   the console: FlexMARL's records at `level` as phase lines
                               ("flexmarl: warning: ..."), other libraries' with -v or from
                               ERROR; warnings.warn routed (show_warning); the workers' level
    log_to_file(path, level)   the run's log file: every record with its time, level, logger
    show_warnings()            before any config is read: FlexMARL's own warnings as one line
"""
from __future__ import annotations

import logging
import os
import warnings
from typing import Any

log = logging.getLogger("flexmarl")


LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
"""The run's log file: every record with its time, level and logger."""


class ConsoleFormatter(logging.Formatter):
    """A record on the console reads as the phase lines do: "flexmarl: warning: ..." (the
    time and the logger are in the run's log file); INFO and DEBUG records (run.log_level)
    without a level, another library's (with -v) with its logger's name."""

    def format(self, record: logging.LogRecord) -> str:
        from flexmarl.console import PREFIX, ConsoleHandler

        level = "" if record.levelno < logging.WARNING else f"{record.levelname.lower()}: "
        own = record.name.split(".")[0] in ConsoleHandler.OWN
        return f"{PREFIX}{level}{'' if own else record.name + ': '}{super().format(record)}"


def configure_logging(level: str, *, verbose: bool = False) -> None:
    """The console's share of the log: this project's records at `level`, other libraries'
    (and Python warnings) only with `verbose` or from ERROR on (flexmarl.console.
    ConsoleHandler); `log_to_file` adds the run's log file once the run directory exists."""
    from flexmarl.console import ConsoleHandler

    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, ConsoleHandler)]:  # main() again
        root.removeHandler(old)
    console = ConsoleHandler(level, verbose=verbose)
    console.setFormatter(ConsoleFormatter("%(message)s"))
    root.addHandler(console)
    root.setLevel(level)
    # warnings.warn: FlexMARL's own as one console line, others' (FutureWarnings of torch and
    # transformers, ...) records of the "py.warnings" logger: in the log file, on the console
    # only with -v.
    show_warnings()
    # Worker processes read their level from here at bootstrap (runtime.worker).
    os.environ["FLEXMARL_LOG"] = level
    # Worker processes inherit these. Without -v the workers' output goes to the run's log
    # file, so vLLM's engine logs may say what they say there; with -v (on the console) vLLM
    # warns at every engine start and weight reload about things that do not apply on CPU
    # (Triton, tcmalloc, rotary embeddings having no weights): shown from INFO on.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "INFO" if not verbose else
                          level if level in ("DEBUG", "INFO") else
                          "ERROR" if level == "WARNING" else level)
    if level != "DEBUG":  # per-load bars are noise in a log file and on a console alike
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    route_transformers_logs(quiet_bars=level != "DEBUG")


def show_warnings() -> None:
    """warnings.warn from here on goes through show_warning; a console for it until
    configure_logging makes the run's (a command that reads no config never does)."""
    from flexmarl.console import ConsoleHandler

    warnings.showwarning = show_warning
    root = logging.getLogger()
    if not any(isinstance(h, ConsoleHandler) for h in root.handlers):
        console = ConsoleHandler(logging.WARNING)
        console.setFormatter(ConsoleFormatter("%(message)s"))
        root.addHandler(console)


def show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                  file: Any = None, line: str | None = None) -> None:
    """One warning: FlexMARL's own (its code's, or a deprecation that names FlexMARL: a
    renamed config key, a moved module) a record of the "flexmarl" logger, so on the console
    as "flexmarl: warning: ..." without a source path; any other one a record of "py.warnings"
    with its source, as logging.captureWarnings makes them (the log file; the console with -v
    or from ERROR on)."""
    own = (filename.startswith(os.path.dirname(os.path.dirname(__file__)) + os.sep)
           or (issubclass(category, FutureWarning) and "FlexMARL" in str(message)))
    if own:
        log.warning("%s", message)
    else:
        text = warnings.formatwarning(message, category, filename, lineno, line)
        logging.getLogger("py.warnings").warning("%s", text.rstrip())


def route_transformers_logs(*, quiet_bars: bool) -> None:
    """transformers writes its warnings with a handler of its own, past the root logger: send
    them through it (so to the log file, and to the console only with -v); its per-load bars
    read HF_HUB_DISABLE_PROGRESS_BARS at import, which happened already here."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        return
    hf_logging.disable_default_handler()
    hf_logging.enable_propagation()
    if quiet_bars:
        hf_logging.disable_progress_bar()


def log_to_file(path: Any, level: str) -> None:
    """Every record from `level` (and from INFO, when `level` is quieter) to the run's log
    file, which the workers' output is appended to as well (runtime.supervisor.StderrTail)."""
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "run_log", False)]:  # main() again
        root.removeHandler(old)
        old.close()
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.run_log = True  # type: ignore[attr-defined]
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    file_level = min(logging.getLevelName(level), logging.INFO)
    handler.setLevel(file_level)
    root.addHandler(handler)
    root.setLevel(file_level)
