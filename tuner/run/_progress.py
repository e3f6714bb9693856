"""The progress of `flashtune tune`: the tuning loop's state as a :class:`tuner.progress.Progress` (a tqdm
bar on a terminal, a plain line every few seconds elsewhere, each with the time left to the trial target)."""

from __future__ import annotations

from typing import Any, TextIO

from ..progress import PLAIN_EVERY_S, log
from ..progress import Progress as _Display

__all__ = ["Progress"]


class Progress:
    """Callable fed by :func:`tuner.run.tune` with ``{"evaluated", "target", "best_tflops", "compiling", ...}``;
    ``prefix`` (a suite's GPU process): plain lines, each starting with it, never a redrawn bar."""

    def __init__(self, stream: TextIO | None = None, *, every_s: float = PLAIN_EVERY_S, prefix: str = "") -> None:
        self.stream, self.every_s, self.prefix = stream, every_s, prefix
        self._display: _Display | None = None

    def __call__(self, state: dict[str, Any]) -> None:
        if self._display is None:
            self._display = _Display(
                state.get("target"),
                desc=f"{self.prefix}tune".strip(),
                unit="trial",
                stream=self.stream,
                every_s=self.every_s,
                terminal=False if self.prefix else None,
            )
        best = state.get("best_tflops")
        figures = [
            f"best {best:.1f} TFLOPS" if best is not None else "best -",
            f"compiling {state.get('compiling', 0)}",
            f"infeasible {state.get('infeasible', 0)}",
            f"failed {state.get('failed', 0)}",
        ]
        if "configs_per_s" in state:
            figures += [f"{state['configs_per_s']:.2f} configs/s", f"GPU busy {100 * state.get('gpu_busy', 0.0):.0f}%"]
        self._display.set(state.get("evaluated", 0), *figures)
        if state.get("event") == "done":
            self._display.close()
            self._display = None
            log.debug("tuning loop done: %s", ", ".join(figures))
