"""A GPU stand-in for tune() (a :class:`tuner.run.Measure`) and retime_top() (called as a function): a
deterministic synthetic TFLOPS model of the toy space.

Configs with ``flag == 1 and block_m == 32`` compute a wrong result.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from tuner.gpu import MeasureJob, MeasureResult, MeasureSettings
from tuner.problem import Problem


def wrong(config: dict[str, int]) -> bool:
    return config.get("flag") == 1 and config.get("block_m") == 32


def model_tflops(config: dict[str, int]) -> float:
    """Peaks at block_m=128, block_n=64, stages=2, flag=1 (a unique best)."""
    return (
        100.0
        + config["block_m"] / 8
        - abs(config["block_n"] - 64) / 8
        - 5 * abs(config["stages"] - 2)
        + 3 * config["flag"]
    )


@dataclass
class FakeMeasure:
    interrupt_at: int | None = None  # raise KeyboardInterrupt on this call (1-based)
    calls: list[MeasureJob] = field(default_factory=list)
    noise: float = 0.0  # relative, alternating sign per call, to exercise re-timing medians
    delay_s: float = 0.0  # each call takes this long, as a GPU would

    def prepare(self, problem: Problem, settings: MeasureSettings) -> None:
        pass  # a subclass records it

    def measure(self, job: MeasureJob) -> MeasureResult:
        return self(job)

    def __call__(self, job: MeasureJob) -> MeasureResult:
        if self.delay_s:
            time.sleep(self.delay_s)
        self.calls.append(job)
        if self.interrupt_at is not None and len(self.calls) == self.interrupt_at:
            raise KeyboardInterrupt
        config = job.config
        if job.settings.check and wrong(config):
            return MeasureResult(status="wrong_result", detail="max relative error 0.5 > 0.004 (fake)", rel_error=0.5)
        tflops = model_tflops(config) * (1 + (self.noise if len(self.calls) % 2 else -self.noise))
        latency_ms = job.problem.flops / (tflops * 1e12) * 1e3
        return MeasureResult(
            status="ok",
            latency_ms=latency_ms,
            tflops=tflops,
            reps=10,
            spread=0.01,
            rel_error=1e-4 if job.settings.check else None,
        )
