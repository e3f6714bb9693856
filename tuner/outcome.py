"""What became of one config, in one vocabulary from the compile step through measuring to the stored trial.

:class:`Status` names every outcome a config can have (the strings are what a trial stores);
:class:`Outcome` is one step's result: a status, a reason for people when it is not ``ok``, and
the step's payload (the compiled kernel, the measurement job, the measurement), plus what the
trial will store (its value and attributes). Compile (:mod:`tuner.compile`), the GPU worker
(:mod:`tuner.gpu`), the tuning loop (:mod:`tuner.run`) and the stored study (:mod:`tuner.study`)
all speak it; it imports nothing of theirs.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

__all__ = ["COMPILE_FAILURES", "MEASURE_FAILURES", "STATUS_ATTR", "Outcome", "Status"]

#: the trial user attribute a status is stored under (``tuner.study.STATUS``)
STATUS_ATTR = "status"


class _HasUserAttrs(Protocol):
    @property
    def user_attrs(self) -> Mapping[str, Any]: ...


class Status(enum.StrEnum):
    """What became of a config (the strings are the stored values)."""

    OK = "ok"
    INFEASIBLE = "infeasible"  # refused by the space's static check: never compiled, not counted
    COMPILE_ERROR = "compile_error"
    COMPILE_TIMEOUT = "compile_timeout"
    WRONG_RESULT = "wrong_result"  # checked against the reference on the GPU and found wrong
    LAUNCH_ERROR = "launch_error"
    TIMEOUT = "timeout"  # the measurement took longer than the trial timeout
    CRASHED = "crashed"  # the GPU worker died measuring it
    INTERRUPTED = "interrupted"  # the tuner stopped before the trial finished (FAIL; its config enqueued again)
    ORPHANED = "orphaned"  # its tuner died while asking for its parameters (FAIL)

    @classmethod
    def of(cls, trial: _HasUserAttrs) -> Status | None:
        """A stored trial's status; None when it has none (still running, or not a flashtune trial) or an
        unknown one."""
        try:
            return cls(trial.user_attrs.get(STATUS_ATTR))
        except ValueError:
            return None

    @property
    def evaluated(self) -> bool:
        """Past the static check: the config was compiled (and measured), so it counts against the budget."""
        return self is not Status.INFEASIBLE


#: what a compile step may end in besides ok
COMPILE_FAILURES = frozenset({Status.COMPILE_ERROR, Status.COMPILE_TIMEOUT})
#: what a measurement may end in besides ok (the GPU worker's vocabulary)
MEASURE_FAILURES = frozenset({Status.WRONG_RESULT, Status.LAUNCH_ERROR, Status.TIMEOUT, Status.CRASHED})

PayloadT = TypeVar("PayloadT")


@dataclass(frozen=True, kw_only=True)
class Outcome(Generic[PayloadT]):
    """One step's result for one config. ``payload`` is what the step made (an ``ok`` compile: its
    kernel; an ``ok`` job: the measurement job; a measurement: its result); ``value`` (the TFLOPS of an
    ``ok`` measurement) and ``attrs`` (resources, compile and measurement figures) are what the trial
    stores beside its status and reason. A status given as its string is read as a :class:`Status`
    (an unknown one is refused)."""

    status: Status
    reason: str = ""
    payload: PayloadT | None = None
    value: float | None = None
    attrs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", Status(self.status))

    @property
    def ok(self) -> bool:
        return self.status is Status.OK

    def stored(self) -> dict[str, Any]:
        """The trial fields of this outcome, as ``tuner.study.finish`` and ``finished`` take them."""
        return {"status": self.status, "reason": self.reason, "attrs": dict(self.attrs), "value": self.value}
