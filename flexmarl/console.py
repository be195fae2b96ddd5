"""The console of `flexmarl run`: one line per phase, and one live line for a long phase.

    phase("converting x.gguf ...")          -> "flexmarl: converting x.gguf ..."
    with Bar("warm start 'medium'", total=300, unit="steps") as bar:
        bar.update(done)                    a terminal: one line redrawn in place ("\\r"), at
                                            most every REDRAW_S
                                            not a terminal (a log file, CI): a start line, a
                                            line every PLAIN_EVERY_S, an end line
    await ticking(bar)                      redraws a bar whose line shows the time waited
    ConsoleHandler                          log records on the console between live lines

Lines go to stderr unless told otherwise (the CLI puts the run's place, its addresses and its
closing summary on stdout). Nothing here starts a thread: a bar moves only when its owner
updates it (or `ticking` does, on the event loop).
"""
from __future__ import annotations

import asyncio
import logging
import sys
import time
from typing import IO, Callable

PREFIX = "flexmarl: "
REDRAW_S = 0.2
"""Shortest interval between two redraws of a live line: a fast loop must not flood a slow
terminal (an ssh session) with redraws."""
PLAIN_EVERY_S = 60.0
"""Without a terminal, a long phase still writes a line this often: a log that shows nothing
for ten minutes looks like a hang."""
BAR_WIDTH = 24


def phase(text: str, *, file: IO[str] | None = None) -> None:
    """One line for a phase of the run (a model build, a conversion, the workers starting):
    shown whatever the log level, so a long preparation does not look like a hang."""
    if file is None and _live:  # above the live line on the terminal, not through it
        write(PREFIX + text)
        return
    print(PREFIX + text, file=file or sys.stderr, flush=True)


def duration(seconds: float) -> str:
    """"42 s", "2 min 12 s", "1 h 3 min": a time a person reads at a glance."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"


class Bar:
    """A live line for one long phase: `update(done, note)` as it goes, `close(note)` at its
    end (or leave the `with` block). `total=None`: no bar, the count (if any) and the time.

    `tty=None` asks `file` (default stderr) whether it is a terminal. `clock` is injectable so
    tests need no sleeps."""

    def __init__(self, label: str, total: int | None = None, *, unit: str = "",
                 file: IO[str] | None = None, tty: bool | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.label, self.total, self.unit = label, total, unit
        self.done: int | None = None
        self.note = ""
        self._file = file or sys.stderr
        self._tty = _isatty(self._file) if tty is None else tty
        self._clock = clock
        self.started = clock()
        self._drawn = -float("inf")  # when the line was last written
        self._width = 0  # of the live line now on a terminal, to blank what is left of it
        self.closed = False
        if self._tty:
            _live.append(self)
        else:
            phase(f"{label} ...", file=self._file)
            self._drawn = self.started

    def elapsed_s(self) -> float:
        return self._clock() - self.started

    def text(self) -> str:
        """The line as it reads now, without the prefix."""
        parts = [self.label]
        if self.total and self.done is not None:
            filled = min(BAR_WIDTH, BAR_WIDTH * self.done // self.total)
            parts.append(f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] "
                         f"{self.done}/{self.total}{' ' + self.unit if self.unit else ''}")
        elif self.done is not None:
            parts.append(f"{self.done}{' ' + self.unit if self.unit else ''}")
        parts.append(f"({duration(self.elapsed_s())})")
        if self.note:
            parts.append(self.note)
        return "  ".join(parts)

    def update(self, done: int | None = None, note: str | None = None, *,
               total: int | None = None) -> None:
        """The phase has reached `done` (of `total`, if given now); `note` replaces the
        line's note. Redraws when it is time to (REDRAW_S, PLAIN_EVERY_S)."""
        if total is not None:
            self.total = total
        if done is not None:
            self.done = done
        if note is not None:
            self.note = note
        if self.closed:
            return
        now = self._clock()
        if self._tty and now - self._drawn >= REDRAW_S:
            self._draw(self.text())
            self._drawn = now
        elif not self._tty and now - self._drawn >= PLAIN_EVERY_S:
            phase(self.text(), file=self._file)
            self._drawn = now

    def close(self, note: str | None = None, *, line: str | None = None) -> None:
        """The end line: "LABEL: done in 42 s  NOTE", or `line` with "{elapsed}" filled (the
        live line, redrawn a last time and ended, on a terminal)."""
        if self.closed:
            return
        self.closed = True
        if line is not None:
            self._end(line.format(elapsed=duration(self.elapsed_s())))
            return
        if note is not None:
            self.note = note
        if self.total and self.done is not None:
            counted = f" ({self.done}/{self.total}{' ' + self.unit if self.unit else ''})"
        elif self.done is not None:
            counted = f" ({self.done}{' ' + self.unit if self.unit else ''})"
        else:
            counted = ""
        line = (f"{self.label}: done{counted} in {duration(self.elapsed_s())}"
                + (f"  {self.note}" if self.note else ""))
        self._end(line)

    def fail(self, why: str = "stopped") -> None:
        """End the line without claiming the phase is done."""
        if self.closed:
            return
        self.closed = True
        self._end(f"{self.label}: {why} after {duration(self.elapsed_s())}")

    def _end(self, line: str) -> None:
        if self._tty:
            self._draw(line)
            self._file.write("\n")
            self._file.flush()
            if self in _live:
                _live.remove(self)
        else:
            phase(line, file=self._file)

    def _draw(self, text: str) -> None:
        line = PREFIX + text
        pad = " " * max(0, self._width - len(line))  # blank the rest of a longer old line
        self._file.write("\r" + line + pad)
        self._file.flush()
        self._width = len(line)

    def __enter__(self) -> Bar:
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.fail()


_live: list[Bar] = []
"""Bars drawn on a terminal and not yet ended: a line written meanwhile goes above them."""


def write(text: str) -> None:
    """A line on the console (stderr) that leaves a live line intact: above our live bar
    (cleared, written, redrawn) or above tqdm's bars (tqdm.write)."""
    if _live:
        bar = _live[-1]
        bar._file.write("\r" + text.ljust(bar._width) + "\n")
        bar._width = 0
        bar._drawn = -float("inf")
        bar.update()
        return
    from tqdm import tqdm  # it writes plainly when no bar of its own is up
    tqdm.write(text, file=sys.stderr)


class ConsoleHandler(logging.Handler):
    """Log records on the console through `write`. Without `verbose`, only this project's own
    records (loggers `flexmarl.*`, `runtime.*`) and other libraries' errors: third-party
    warnings (Triton, FutureWarnings, transformers) belong in the run's log file."""

    OWN = ("flexmarl", "runtime", "__main__")

    def __init__(self, level: int | str = logging.WARNING, *, verbose: bool = False) -> None:
        super().__init__(level)
        self.verbose = verbose

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < self.level:
            return False
        if self.verbose or record.levelno >= logging.ERROR:
            return super().filter(record)
        return record.name.split(".")[0] in self.OWN and super().filter(record)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            write(self.format(record))
        except Exception:  # a handler never raises into the code that logged
            self.handleError(record)


async def ticking(bar: Bar, every_s: float = 1.0) -> None:
    """Redraw `bar` every `every_s` until cancelled: its line shows the time waited even while
    nothing it counts has moved."""
    while not bar.closed:
        bar.update()
        await asyncio.sleep(every_s)


def _isatty(file: IO[str]) -> bool:
    try:
        return file.isatty()
    except (AttributeError, ValueError):  # a closed or file-like stream without a terminal
        return False
