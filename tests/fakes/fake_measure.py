"""A GPU stand-in for tune() (a :class:`tuner.run.Measure`) and retime_top() (called as a function): a
deterministic synthetic TFLOPS model of the toy space; :class:`KnownSpeedupMeasure` for re-timing, with
configs a known factor from the default and seeded noise.

Configs with ``flag == 1 and block_m == 32`` compute a wrong result.
"""

from __future__ import annotations

import dataclasses
import random
import time
from dataclasses import dataclass, field

from tuner.gpu import MeasureJob, MeasureResult, MeasureSettings
from tuner.problem import Problem
from tuner.space import config_key


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


@dataclass
class KnownSpeedupMeasure(FakeMeasure):
    """A re-timing stand-in whose configs differ from ``default`` by a known factor, plus noise: a config
    takes the default's model latency divided by its true speedup (``speedups``, by config key; any other
    config ``others``), times ``1 + N(0, rel_noise)`` drawn from ``noise_seed``, times a drift common to
    every config that grows by ``drift`` each call (a GPU warming up, clocks falling)."""

    default: dict[str, int] = field(default_factory=dict)
    speedups: dict[str, float] = field(default_factory=dict)
    others: float = 0.9
    rel_noise: float = 0.0
    noise_seed: int = 0
    drift: float = 0.0

    def __post_init__(self) -> None:
        self._rng = random.Random(self.noise_seed)

    def true_speedup(self, config: dict[str, int]) -> float:
        if config == self.default:
            return 1.0
        return self.speedups.get(config_key(config), self.others)

    def __call__(self, job: MeasureJob) -> MeasureResult:
        result = super().__call__(job)
        if not result.ok:
            return result
        default_ms = job.problem.flops / (model_tflops(self.default) * 1e12) * 1e3
        noise = 1 + self._rng.gauss(0.0, self.rel_noise) if self.rel_noise else 1.0
        latency_ms = default_ms / self.true_speedup(job.config) * noise * (1 + self.drift * len(self.calls))
        return dataclasses.replace(result, latency_ms=latency_ms, tflops=job.problem.flops / (latency_ms * 1e-3) / 1e12)
