"""Picklable messages between the tuner and its GPU worker process."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from ..outcome import Status  # a measurement's: ok, or one of tuner.outcome.MEASURE_FAILURES
from ..problem import Problem

if TYPE_CHECKING:
    from ..compile import CompiledKernel
    from ..devices import DeviceLimits
    from ..space import Config, Space

__all__ = [
    "GEMM_COOLDOWN_S",
    "GEMM_PEER",
    "PEER_NAMES",
    "TOLERANCES",
    "MeasureJob",
    "MeasureResult",
    "MeasureSettings",
    "Status",
    "measure_job_for",
]

#: dtype -> (max relative L2 error of O, max abs error of LSE) against a float32 reference. A correct
#: kernel's errors, simulated with the rounding of its inputs, P and O: O about 3e-4 (fp16) and 2.3e-3
#: (bf16), LSE below 2e-5 (1.03e-4 with poly_exp's polynomial); one key dropped from a row of 8192
#: gives LSE 1.1e-3 (its O error, 8.6e-3 in bf16, hides among the rounding). Not yet measured on a GPU.
TOLERANCES = {"fp16": (2e-3, 1e-3), "bf16": (1e-2, 1e-3)}


#: the peers the GPU worker times beside a kernel (``GpuHandler.run_peers``), by row name, in the order it times
#: them: PyTorch SDPA's backends, then a large cuBLAS GEMM
GEMM_PEER = "cublas_gemm_8192"
PEER_NAMES = ("sdpa_flash_attention", "sdpa_cudnn_attention", "sdpa_efficient_attention", GEMM_PEER)
#: idle seconds after the GEMM's timing: the GEMM draws the card to its power limit and its clocks take a while
#: to come back. H200, 2026-12-04: right after a 100 ms burst of this GEMM, ours and cuDNN ran at 0.74-0.77x
#: their speed after 150 ms idle on short d64 causal shapes, 0.83-0.88x at d128 N8192 (BENCHMARKS.md, session 19)
GEMM_COOLDOWN_S = 0.3


@dataclass(frozen=True, kw_only=True)
class MeasureSettings:
    """How the GPU worker checks and times one kernel (:class:`tuner.gpu.CupyHandler`).

    Timing is adaptive (``tuner.gpu._stopping``): launches are queued in batches, each between
    two events with an L2 flush before it, and timing stops once the median latency is known to
    ``rel_ci`` (95% confidence, half-width over the median), after ``max_reps`` timed launches,
    or once the timed batches have taken ``target_ms`` of wall time, whichever comes first, but
    never before ``min_reps`` launches.
    """

    warmup_ms: float = 5.0  # launches before timing, about this much kernel time (at least 1, at most 50)
    min_reps: int = 10  # timed launches at least, whatever the time cap says
    max_reps: int = 500  # timed launches at most
    target_ms: float = 100.0  # time cap (ms of wall time) of the timed batches
    rel_ci: float = 0.01  # stop when the median is known to this (half-width of its 95% interval / median)
    flush_l2: bool = True  # overwrite a buffer of twice the device's L2 before every launch
    check: bool = True
    timing: bool = True
    seed: int = 0
    input_scale: float = 1.0  # standard deviation of Q, K, V: larger widens the score range (rescale stress)
    # new inputs and a new reference for this job instead of the worker's cached ones for the problem
    # (re-timing a winner: it must compute the right function on inputs it was not tuned on)
    fresh_inputs: bool = False


@dataclass(frozen=True, kw_only=True)
class MeasureJob:
    """Run one compiled kernel: check it, then time it."""

    cubin_path: str
    entry: str
    abi: str
    grid: tuple[int, int, int]
    threads: int
    smem_bytes: int
    problem: Problem
    config: dict[str, int]
    abi_params: dict[str, int] = field(default_factory=dict)  # the space's [launch.abi] values
    settings: MeasureSettings = field(default_factory=MeasureSettings)
    tag: str = ""


@dataclass(frozen=True, kw_only=True)
class MeasureResult:
    status: Status
    detail: str = ""
    latency_ms: float | None = None  # median of the timed launches
    spread: float | None = None  # interquartile range over the median
    reps: int = 0  # timed launches in the median
    tflops: float | None = None
    rel_error: float | None = None
    lse_error: float | None = None
    rel_ci: float | None = None  # half-width of the median's 95% confidence interval over the median
    kernel_ms: float | None = None  # GPU time of this job's kernel launches (check, warm-up, timed), event-timed
    job_ms: float | None = None  # the worker's wall time for the job
    phases_ms: dict[str, float] = field(default_factory=dict)  # job_ms by phase: load, inputs, check, timing

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def measure_job_for(
    space: Space,
    config: Config,
    problem: Problem,
    device: DeviceLimits,
    kernel: CompiledKernel,
    settings: MeasureSettings,
    tag: str = "",
) -> MeasureJob:
    """The job that checks and times ``kernel`` (``config`` built for ``problem``) on ``device``."""
    geometry = space.launch(config, problem, device)
    return MeasureJob(
        cubin_path=kernel.cubin_path,
        entry=kernel.entry,
        abi=space.family.abi,
        grid=geometry.grid,
        threads=geometry.threads,
        smem_bytes=geometry.smem_bytes,
        problem=problem,
        config=dict(config),
        abi_params=dict(geometry.abi),
        settings=settings,
        tag=tag,
    )
