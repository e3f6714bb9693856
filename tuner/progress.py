"""Logging and progress for the ``flashtune`` commands: one logger, one progress display.

- :data:`log` is the ``flashtune`` logger every package logs to. :func:`configure_logging` gives it the
  command line's handler (``-v``/``-q``): one line per record on standard error, ``flashtune: warning:
  ...`` for a warning, ``flashtune: ...`` for information (what a run is doing), ``flashtune: debug:
  ...`` with ``-v`` (each trial, each replayed run), Optuna's own log too with ``-vv``; ``-q`` leaves
  warnings and errors, ``-qq`` errors only. A library caller configures logging as it likes.
- :class:`Progress` counts work toward a total (trials, runs, compiles, shapes) with the time elapsed and
  an estimate of the time left: a tqdm bar redrawn in place when its stream is a terminal, else a plain
  line every few seconds (``every_s``) and one at the end, so a pipe or a log file sees the run move.
  It shows nothing when the logger is quieter than INFO (``-q``).
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

__all__ = ["LOGGER_NAME", "Progress", "configure_logging", "log"]

LOGGER_NAME = "flashtune"
log = logging.getLogger(LOGGER_NAME)
#: seconds between the plain lines of a progress display that is not on a terminal
PLAIN_EVERY_S = 5.0


class _OneLine(logging.Formatter):
    """``flashtune: warning: message`` (the house format of a warning), ``flashtune: message`` for info."""

    def format(self, record: logging.LogRecord) -> str:
        text = " ".join(record.getMessage().split("\n"))
        level = "" if record.levelno == logging.INFO else f"{record.levelname.lower()}: "
        return f"{LOGGER_NAME}: {level}{text}"


def configure_logging(verbosity: int, stream: TextIO | None = None) -> None:
    """The command line's logging: ``verbosity`` is the count of ``-v`` less the count of ``-q``."""
    level = {-2: logging.ERROR, -1: logging.WARNING, 0: logging.INFO}.get(max(-2, verbosity), logging.DEBUG)
    for handler in [h for h in log.handlers if getattr(h, "_flashtune_cli", False)]:
        log.removeHandler(handler)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler._flashtune_cli = True  # type: ignore[attr-defined]
    handler.setFormatter(_OneLine())
    log.addHandler(handler)
    log.setLevel(level)
    log.propagate = False
    try:
        import optuna
    except ImportError:
        return
    optuna.logging.set_verbosity(logging.INFO if verbosity >= 2 else logging.WARNING)


def _interval(seconds: float) -> str:
    from tqdm import tqdm

    return tqdm.format_interval(max(0.0, seconds))


class Progress:
    """``done`` of ``total`` ``unit``\\ s of ``desc``, with the figures a caller adds (best TFLOPS, ...)."""

    def __init__(
        self,
        total: int | None,
        *,
        desc: str,
        unit: str,
        stream: TextIO | None = None,
        every_s: float = PLAIN_EVERY_S,
        terminal: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
        show: bool = True,
    ) -> None:
        self.total, self.desc, self.unit = total, desc, unit
        self.stream = stream or sys.stderr
        self.every_s, self.clock = every_s, clock
        # shown unless the logger was set quieter than INFO (-q); a library caller's unset logger shows it
        self.enabled = show and (log.level == logging.NOTSET or log.isEnabledFor(logging.INFO))
        tty = terminal if terminal is not None else bool(getattr(self.stream, "isatty", lambda: False)())
        self.start = clock()
        self.done = 0
        self.postfix = ""
        self._last_line = self.start
        self._bar = None
        if self.enabled and tty:
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=desc, unit=unit, file=self.stream, dynamic_ncols=True, leave=True)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def set(self, done: int, *figures: str) -> None:
        """Now ``done`` units are done; ``figures`` replace what the line shows beside the count."""
        self.done = done
        self.postfix = "  ".join(figures)
        if self._bar is not None:
            self._bar.n = done
            self._bar.set_postfix_str(self.postfix, refresh=False)
            self._bar.refresh()
        elif self.enabled and self.clock() - self._last_line >= self.every_s:
            self._plain()

    def update(self, n: int = 1, *figures: str) -> None:
        self.set(self.done + n, *figures)

    def write(self, line: str, file: TextIO | None = None) -> None:
        """Print ``line`` (to ``file``, default the progress stream) without breaking a bar on a terminal."""
        if self._bar is not None:
            self._bar.write(line, file=file or self.stream)
        else:
            print(line, file=file or self.stream, flush=True)

    def line(self) -> str:
        """The plain line: count, postfix, time elapsed and, from the rate so far, the time left."""
        elapsed = self.clock() - self.start
        total = f"/{self.total}" if self.total else ""
        text = f"{self.desc}: {self.done}{total} {self.unit}s"
        if self.postfix:
            text += f"  {self.postfix}"
        text += f"  {_interval(elapsed)} elapsed"
        if self.total and 0 < self.done < self.total:
            text += f", ~{_interval(elapsed / self.done * (self.total - self.done))} left"
        return text

    def _plain(self) -> None:
        self._last_line = self.clock()
        print(f"{LOGGER_NAME}: {self.line()}", file=self.stream, flush=True)

    def close(self) -> None:
        """The last line (or the bar's last redraw); nothing more is shown."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elif self.enabled and self.done:
            self._plain()
        self.enabled = False
