"""`flashtune check`: sweep a space without a GPU — static feasibility, then nvcc and ptxas for each config.

A space of up to ``EXHAUSTIVE_LIMIT`` grid points is checked point by point. A larger one (the
sm90 grid has about 22 million) is checked on ``DRAWS`` distinct random points, which also
estimate its feasible share. Unless told otherwise, ``AUTO_SAMPLES`` of the feasible configs are
compiled, the default among them (about a minute on two cores); ``samples=0`` (``--samples all``)
compiles every feasible config of a space small enough to enumerate (sm80: 552 at d128, about 17
minutes on two cores).
"""

from __future__ import annotations

import concurrent.futures as cf
import itertools
import multiprocessing as mp
import os
import random
import sys
from dataclasses import dataclass, field
from typing import TextIO

from ..devices import DeviceLimits
from ..errors import UsageError
from ..outcome import Status
from ..problem import Problem, ProblemError
from ..progress import Progress
from ..space import Config, Space, load_space
from ._nvcc import compile_outcome
from ._ptxas import Resources

__all__ = ["CheckReport", "CheckRow", "all_configs", "check_space", "static_candidates"]

EXHAUSTIVE_LIMIT = 200_000  # grid points checked one by one (a few seconds); above, random draws
DRAWS = 20_000  # distinct random points statically checked in a larger space
MAX_JOBS = max(64, 4 * (os.cpu_count() or 1))  # more compile processes than this only thrash the machine
AUTO_SAMPLES = 32  # configs compiled unless --samples says otherwise (about 2 s each on one core)


@dataclass
class CheckRow:
    config: Config
    status: Status  # ok, infeasible or compile_error
    reason: str = ""
    resources: Resources | None = None
    is_default: bool = False


@dataclass
class CheckReport:
    space: Space
    rows: list[CheckRow] = field(default_factory=list)

    @property
    def default(self) -> CheckRow:
        return next(r for r in self.rows if r.is_default)

    @property
    def compile_errors(self) -> list[CheckRow]:
        return [r for r in self.rows if r.status == Status.COMPILE_ERROR]

    @property
    def spilling(self) -> list[CheckRow]:
        return [r for r in self.rows if r.resources is not None and r.resources.spills]

    @property
    def ok(self) -> bool:
        """The default compiles without spills, and every statically feasible config compiles."""
        d = self.default
        return d.status == Status.OK and d.resources is not None and not d.resources.spills and not self.compile_errors


def all_configs(space: Space) -> list[Config]:
    names = [k.name for k in space.knobs]
    return [dict(zip(names, values)) for values in itertools.product(*(k.values for k in space.knobs))]


def static_candidates(space: Space, default: Config, rng: random.Random) -> tuple[list[Config], bool]:
    """The configs to check statically: the whole grid of a small space (True), or the default and
    ``DRAWS`` distinct random points of a larger one (False)."""
    if space.size() <= EXHAUSTIVE_LIMIT:
        return all_configs(space), True
    drawn = {tuple(default.values()): default}
    for _ in range(20 * DRAWS):
        if len(drawn) > DRAWS:
            break
        config = {k.name: rng.choice(k.values) for k in space.knobs}
        drawn.setdefault(tuple(config.values()), config)
    return list(drawn.values()), False


def check_space(
    family: str,
    problem: Problem,
    device: DeviceLimits,
    *,
    samples: int | None = None,
    jobs: int = 1,
    seed: int = 0,
    out: TextIO | None = None,
) -> CheckReport:
    """Check ``family`` for ``problem`` on ``device``'s arch; compile ``samples`` feasible configs, the
    default among them (None: ``AUTO_SAMPLES``; 0: every feasible config, refused for a space too large
    to enumerate)."""
    space = load_space(family)
    report = CheckReport(space)
    _validate_arguments(space, problem, device, samples, jobs)
    rng = random.Random(seed)
    default = space.defaults(problem=problem, device=device)
    candidates, exhaustive = static_candidates(space, default, rng)
    if samples == 0 and not exhaustive:
        raise UsageError(
            f"{space.name} has {space.size():,} grid points, too many to compile every feasible one; "
            f"pass --samples N to compile N of them (sampled from {DRAWS:,} random points)"
        )
    if samples is None:
        samples = AUTO_SAMPLES
    feasible = _static_check(report, candidates, problem, device, default)
    if samples > len(feasible):
        where = "" if exhaustive else f" of {len(candidates):,} random points"
        print(
            f"flashtune: warning: --samples {samples} is more than the {len(feasible)} statically feasible "
            f"configs{where}; compiling those {len(feasible)}",
            file=sys.stderr,
        )
    chosen = _compile_sample(feasible, default, samples, rng)
    if out:
        _announce(space, problem, device, candidates, exhaustive, feasible, chosen, jobs, out)
    _compile(report, chosen, problem, device, default, jobs, out)
    if out:
        _summary(report, out)
    return report


def _validate_arguments(space: Space, problem: Problem, device: DeviceLimits, samples: int | None, jobs: int) -> None:
    unsupported = space.supports(problem)
    if unsupported:
        raise ProblemError(unsupported)
    wrong_arch = space.runs_on(device.arch)
    if wrong_arch:
        raise UsageError(f"{wrong_arch}: pass --arch {space.family.min_arch}")
    if samples is not None and samples < 0:
        raise UsageError(f"--samples must be 'all' (every feasible config) or a positive number, not {samples}")
    if not 1 <= jobs <= MAX_JOBS:
        raise UsageError(f"--jobs must be from 1 to {MAX_JOBS} (compile processes on this machine), not {jobs}")


def _static_check(
    report: CheckReport, candidates: list[Config], problem: Problem, device: DeviceLimits, default: Config
) -> list[Config]:
    """Record the statically infeasible candidates in ``report``; return the feasible ones."""
    feasible: list[Config] = []
    for config in candidates:
        reason = report.space.check(config, problem, device)
        if reason:
            report.rows.append(CheckRow(config, Status.INFEASIBLE, reason, is_default=config == default))
        else:
            feasible.append(config)
    return feasible


def _compile_sample(feasible: list[Config], default: Config, samples: int, rng: random.Random) -> list[Config]:
    """The feasible configs to compile: all of them, or ``samples`` of them with the default among them."""
    if samples and len(feasible) > samples:
        others = [c for c in feasible if c != default]
        return rng.sample(others, samples - (default in feasible)) + ([default] if default in feasible else [])
    return feasible


def _announce(
    space: Space,
    problem: Problem,
    device: DeviceLimits,
    candidates: list[Config],
    exhaustive: bool,
    feasible: list[Config],
    chosen: list[Config],
    jobs: int,
    out: TextIO,
) -> None:
    share = (
        f"{len(feasible)} statically feasible"
        if exhaustive
        else f"{len(feasible)} of {len(candidates):,} random points statically feasible "
        f"(~{len(feasible) / len(candidates):.1%} of the grid)"
    )
    every = "every feasible one" if len(chosen) == len(feasible) else "a sample; --samples all for every one"
    print(
        f"{space.name} on sm_{space.arch_string(device.arch)} for {problem.dtype} d{problem.head_dim} "
        f"{'causal' if problem.causal else 'non-causal'}: {space.size():,} configs, {share}, "
        f"compiling {len(chosen)} ({every}) with {jobs} processes",
        file=out,
        flush=True,
    )


def _compile(
    report: CheckReport,
    chosen: list[Config],
    problem: Problem,
    device: DeviceLimits,
    default: Config,
    jobs: int,
    out: TextIO | None,
) -> None:
    """Compile ``chosen`` with nvcc and ptxas in ``jobs`` processes, a row in ``report`` for each as it ends."""
    space = report.space
    workers = max(1, min(jobs, len(chosen)))
    with (
        cf.ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) as pool,
        Progress(len(chosen), desc="check", unit="compile", show=out is not None) as shown,
    ):
        futures = {pool.submit(compile_outcome, str(space.path), c, problem, device): c for c in chosen}
        for i, future in enumerate(cf.as_completed(futures), 1):
            config = futures[future]
            outcome = future.result()
            row = CheckRow(
                config,
                outcome.status,
                outcome.reason,
                outcome.payload.resources if outcome.payload else None,
                is_default=config == default,
            )
            report.rows.append(row)
            if out:
                shown.write(f"[{i}/{len(chosen)}] {_line(row)}", out)
                shown.update(1, f"{len(report.compile_errors)} compile errors")


def _line(row: CheckRow) -> str:
    knobs = " ".join(f"{k}={v}" for k, v in row.config.items())
    if row.resources is None:
        return f"{row.status:<13} {knobs}  {row.reason[:160]}"
    r = row.resources
    spill = f" SPILLS {r.spill_store_bytes}/{r.spill_load_bytes} B" if r.spills else ""
    return f"{'ok':<13} {knobs}  regs {r.registers} stack {r.stack_bytes} B{spill}" + (
        "  (default)" if row.is_default else ""
    )


def _summary(report: CheckReport, out: TextIO) -> None:
    d = report.default
    print(f"default config: {_line(d)}", file=out)
    print(
        f"{sum(r.status == Status.OK for r in report.rows)} compiled, {len(report.compile_errors)} compile errors, "
        f"{len(report.spilling)} spilling, {sum(r.status == Status.INFEASIBLE for r in report.rows)} statically infeasible",
        file=out,
    )
    for row in report.compile_errors[:5]:
        print(f"  compile error: {_line(row)}", file=out)
    print(
        "check "
        + (
            "passed"
            if report.ok
            else "FAILED: the default must compile without spills and every "
            "statically feasible config must compile (tighten the space's constraints)"
        ),
        file=out,
    )
