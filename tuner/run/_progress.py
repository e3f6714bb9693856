"""A one-line progress display for `flashtune tune` (stderr; redraws in place on a terminal)."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

__all__ = ["Progress"]


class Progress:
    """Callable fed by :func:`tuner.tune.tune` with ``{"evaluated", "target", "best_tflops", "compiling", ...}``."""

    def __init__(self, stream: TextIO | None = None, *, every_s: float = 10.0, prefix: str = "") -> None:
        self.stream = stream or sys.stderr
        self.prefix = prefix
        self.tty = self.stream.isatty() and not prefix  # several processes: plain lines, not redraws
        self.every_s = every_s
        self.start = time.monotonic()
        self._last = 0.0

    def __call__(self, state: dict[str, Any]) -> None:
        now = time.monotonic()
        final = state.get("event") == "done"
        if not (self.tty or final or now - self._last >= self.every_s):
            return
        self._last = now
        target = state.get("target")
        done = state.get("evaluated", 0)
        bar = ""
        if target:
            filled = int(20 * min(done, target) / target)
            bar = "[" + "#" * filled + "." * (20 - filled) + "] "
        best = state.get("best_tflops")
        line = self.prefix + (
            f"{bar}{done}/{target or '∞'} trials  best {best:.1f} TFLOPS"
            if best is not None
            else f"{bar}{done}/{target or '∞'} trials  best -"
        )
        line += (
            f"  compiling {state.get('compiling', 0)}  infeasible {state.get('infeasible', 0)}"
            f"  failed {state.get('failed', 0)}"
        )
        if "configs_per_s" in state:
            line += f"  {state['configs_per_s']:.2f} configs/s  GPU busy {100 * state.get('gpu_busy', 0.0):.0f}%"
        line += f"  {now - self.start:.0f}s"
        if self.tty:
            self.stream.write("\r\x1b[2K" + line + ("\n" if final else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()
