"""What the tuning loop calls to compile a config and to measure it: two small contracts.

A :class:`Compile` runs in a compile process (so it is a picklable, module-level function) and
never raises: a failure is an :class:`~tuner.outcome.Outcome`. A :class:`Measure` is one GPU: the
loop calls :meth:`Measure.prepare` once, while the first configs compile, then :meth:`Measure.measure`
for each compiled config. :class:`MeasureFunction` turns a plain function into a Measure with
nothing to prepare.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ..compile import CompileOutcome
from ..devices import DeviceLimits
from ..gpu import MeasureJob, MeasureResult, MeasureSettings
from ..problem import Problem
from ..space import Config

__all__ = ["Compile", "Measure", "MeasureFunction"]


class Compile(Protocol):
    """Build ``config`` of the space in file ``space_path`` for ``problem`` on ``device`` (the space is named
    by its file: a compile process loads it once); an outcome, never an exception."""

    def __call__(self, space_path: str, config: Config, problem: Problem, device: DeviceLimits) -> CompileOutcome: ...


@runtime_checkable
class Measure(Protocol):
    """One GPU as the tuning loop measures on it."""

    def prepare(self, problem: Problem, settings: MeasureSettings) -> None:
        """Get ready for ``problem``'s jobs (inputs, reference, warm-up); a failure here shows again, and is
        dealt with, in the first job."""

    def measure(self, job: MeasureJob) -> MeasureResult:
        """Check and time one compiled config."""


@dataclass(frozen=True)
class MeasureFunction:
    """A function of a job as a :class:`Measure` with nothing to prepare (a replay's oracle, a test's stand-in)."""

    function: Callable[[MeasureJob], MeasureResult]

    def prepare(self, problem: Problem, settings: MeasureSettings) -> None:
        pass

    def measure(self, job: MeasureJob) -> MeasureResult:
        return self.function(job)
