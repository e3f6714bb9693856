"""`flashtune bench --suite`: every study of a suite against its peers in one run, as the table that
BENCHMARKS.md records (and, with ``--ablate``, what each tuned knob is worth).

For each problem of the suite: the winner of its study on this GPU model is compiled, checked and
timed by the GPU worker, and PyTorch SDPA (FLASH_ATTENTION, CUDNN_ATTENTION, EFFICIENT_ATTENTION) by the
same worker. That is one round; ``rounds`` interleaved rounds (default :data:`ROUNDS`), each starting one
place further along that list (so that no kernel always follows the same one), give each kernel's median, so
that a drift of the GPU's clock or temperature during the run falls on ours and the peers alike, not on
whichever ran last (a single sequential pass moved ratios by 5-8% on some shapes between runs). An 8192³ cuBLAS
GEMM is timed once after the rounds, and the card idles after it (``tuner.gpu`` does): right after that GEMM
attention kernels ran 12-26% slower on an H200, and with the GEMM inside the rounds ours, first in each, always
followed it. With ``ablate`` the winner is
also timed with each knob that differs from the family's default put back to the default, one
knob at a time: winner / ablated is what that knob's tuned value is worth on that shape. The
problem's default config (the space's defaults with its rules for this problem and device) is
timed beside every winner that differs from it, so the table shows what a user gets untuned too.
"""

from __future__ import annotations

import concurrent.futures as cf
import datetime as dt
import functools
import multiprocessing as mp
import statistics
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import optuna

from .._version import __version__
from ..compile import CompileOutcome, compile_outcome
from ..devices import DeviceLimits
from ..gpu import GEMM_PEER, PEER_NAMES, MeasureSettings, measure_job_for
from ..problem import Problem
from ..progress import Progress
from ..run import Worker
from ..space import Space, load_space
from ..study import (
    ChosenConfig,
    StudyError,
    StudyMeta,
    Suite,
    SuiteStudy,
    choose,
    mask_url,
    open_storage,
    suite_studies,
)

__all__ = ["ROUNDS", "BenchRow", "bench_suite", "markdown_table"]

PEERS = {"cudnn": "sdpa_cudnn_attention", "fa2": "sdpa_flash_attention", "gemm": GEMM_PEER}
ROUNDS = 3  # interleaved rounds of (winner, default, peers) per problem: each figure is its median


@dataclass
class BenchRow:
    problem: Problem
    study: str | None = None
    config: dict[str, int] = field(default_factory=dict)
    tflops: float | None = None
    note: str = ""  # why there is no figure, or the check's error
    peers: dict[str, float | None] = field(default_factory=dict)  # peer name -> TFLOPS
    ablations: dict[str, float | None] = field(default_factory=dict)  # knob put back to its default -> TFLOPS
    default_tflops: float | None = None  # the problem's default config (the winner's figure where they are one)
    rounds: int = 0  # interleaved rounds each figure is the median of (0: not timed)

    def ratio(self, peer: str) -> float | None:
        other = self.peers.get(PEERS.get(peer, peer))
        return self.tflops / other if self.tflops and other else None

    def default_ratio(self, peer: str) -> float | None:
        other = self.peers.get(PEERS.get(peer, peer))
        return self.default_tflops / other if self.default_tflops and other else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "problem": self.problem.to_dict(),
            "study": self.study,
            "config": self.config,
            "tflops": self.tflops,
            "note": self.note,
            "peers": self.peers,
            "ablations": self.ablations,
            "default_tflops": self.default_tflops,
            "rounds": self.rounds,
        }


def _study_for(
    storage: optuna.storages.BaseStorage, names: tuple[str, ...], gpu: str
) -> tuple[str | None, ChosenConfig | None, str]:
    """Of the studies tuning one problem, the one measured on this GPU model with the fastest valid winner:
    (its name, its winner checked as ``export`` checks it, why there is none)."""
    best: tuple[str | None, ChosenConfig | None, str] = (None, None, "")
    for name in names:
        study = optuna.load_study(study_name=name, storage=storage)
        try:
            if StudyMeta.read(study).gpu_name != gpu:
                continue
            chosen = choose(study)
        except StudyError as e:
            if best[1] is None:
                best = (name, None, f"the study's winner cannot be used ({e})")
            continue
        if best[1] is None or (chosen.tflops or 0.0) > (best[1].tflops or 0.0):
            best = (name, chosen, "")
    return best


def _time(
    worker: Worker,
    space: Space,
    config: dict[str, int],
    problem: Problem,
    device: DeviceLimits,
    settings: MeasureSettings,
    tag: str,
    compiler: Callable[..., CompileOutcome],
) -> tuple[float | None, str]:
    reason = space.check(config, problem, device)
    if reason:
        return None, f"infeasible: {reason}"
    outcome = compiler(str(space.path), config, problem, device)
    if outcome.payload is None:
        return None, f"{outcome.status}: {outcome.reason[:200]}"
    result = worker.measure(measure_job_for(space, config, problem, device, outcome.payload, settings, tag=tag))
    if not result.ok:
        return None, f"{result.status}: {result.detail[:200]}"
    return result.tflops, ""


def _default(space: Space, row: BenchRow, device: DeviceLimits) -> dict[str, int]:
    """The config a user gets untuned for ``row``'s problem on this device."""
    return space.defaults(problem=row.problem, device=device)


def _ablations(space: Space, row: BenchRow, device: DeviceLimits) -> dict[str, dict[str, int]]:
    """The winner with each tuned knob put back to its default (the problem's on this device), by knob."""
    defaults = space.defaults(problem=row.problem, device=device)
    return {name: {**row.config, name: default} for name, default in defaults.items() if row.config[name] != default}


def _warm(
    compiler: Callable[..., CompileOutcome],
    space_path: str,
    job: tuple[dict[str, int], Problem],
    *,
    device: DeviceLimits,
) -> None:
    compiler(space_path, job[0], job[1], device)


def bench_suite(
    worker: Worker,
    info: dict[str, Any],
    suite: Suite,
    storage_url: str,
    *,
    ablate: bool = False,
    settings: MeasureSettings | None = None,
    log: TextIO | None = None,
    compiler: Callable[..., CompileOutcome] = compile_outcome,
    compile_workers: int = 1,
    rounds: int = ROUNDS,
) -> list[BenchRow]:
    """One row per problem of ``suite``, in the suite's order (problems without a study on this GPU
    model get a note instead of figures); each figure the median of ``rounds`` interleaved rounds."""
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, not {rounds}")
    settings = settings or MeasureSettings()
    space = load_space(suite.family)
    device = DeviceLimits.from_info(info)
    storage = open_storage(storage_url, create=False)
    entries = suite_studies(storage, suite)
    rows = _chosen_rows(storage, entries, info)
    if compile_workers > 1:
        _compile_up_front(space, rows, device, ablate, compiler, compile_workers)
    with Progress(len(rows), desc="bench", unit="shape", show=log is not None) as shown:
        for i, row in enumerate(rows, 1):
            _measure_row(worker, space, row, device, settings, ablate, compiler, rounds)
            if log is not None:
                shown.write(_row_line(row, i, len(entries)), log)
                shown.update(1)
    return rows


def _chosen_rows(
    storage: optuna.storages.BaseStorage, entries: list[SuiteStudy], info: dict[str, Any]
) -> list[BenchRow]:
    """A row per suite entry with the config its study chose on this GPU model, or a note saying why none."""
    rows = []
    for entry in entries:
        row = BenchRow(problem=entry.problem)
        rows.append(row)
        row.study, chosen, why = _study_for(storage, entry.studies, str(info["name"]))
        if row.study is None:
            row.note = f"no study of this problem measured on {info['name']}: run `flashtune tune --suite`"
        elif chosen is None:
            row.note = why
        else:
            row.config = dict(chosen.config)
    return rows


def _compile_up_front(
    space: Space,
    rows: list[BenchRow],
    device: DeviceLimits,
    ablate: bool,
    compiler: Callable[..., CompileOutcome],
    compile_workers: int,
) -> None:
    """Every kernel the run times, compiled up front in parallel (the cubin cache keeps them)."""
    jobs = [
        (variant, row.problem)
        for row in rows
        if row.config
        for variant in [
            row.config,
            _default(space, row, device),
            *(_ablations(space, row, device) if ablate else {}).values(),
        ]
        if space.check(variant, row.problem, device) is None
    ]
    with cf.ProcessPoolExecutor(max_workers=compile_workers, mp_context=mp.get_context("spawn")) as pool:
        list(pool.map(functools.partial(_warm, compiler, str(space.path), device=device), jobs))


def _measure_row(
    worker: Worker,
    space: Space,
    row: BenchRow,
    device: DeviceLimits,
    settings: MeasureSettings,
    ablate: bool,
    compiler: Callable[..., CompileOutcome],
    rounds: int = 1,
) -> None:
    """Time ``row``'s config, the problem's default and the SDPA peers in ``rounds`` interleaved rounds, round r
    starting r places along (ours, the default, the peers), keeping each one's median (a config that fails keeps
    its first error and no figure); then the GEMM once, and the ablations once."""
    if not (row.config or row.study):
        return
    default = _default(space, row, device) if row.config else None
    ours: list[float] = []
    defaults: list[float] = []
    peers: dict[str, list[float | None]] = {}

    def time_ours() -> None:
        if row.config and not row.note:
            tflops, row.note = _time(worker, space, row.config, row.problem, device, settings, "bench-suite", compiler)
            if tflops is not None:
                ours.append(tflops)

    def time_default() -> None:
        if row.config and not row.note and default != row.config:
            tflops, _ = _time(worker, space, default, row.problem, device, settings, "default", compiler)
            if tflops is not None:
                defaults.append(tflops)

    def time_peer(names: tuple[str, ...]) -> Callable[[], None]:
        def run() -> None:
            for peer in worker.peers(row.problem, settings, names, timeout_s=900):
                peers.setdefault(peer["name"], []).append(peer.get("tflops"))

        return run

    order = [time_ours, time_default, *(time_peer((name,)) for name in PEER_NAMES if name != GEMM_PEER)]
    for r in range(rounds):
        for step in order[r % len(order) :] + order[: r % len(order)]:
            step()
    time_peer((GEMM_PEER,))()
    row.tflops = statistics.median(ours) if ours and not row.note else None
    if row.config:
        row.default_tflops = row.tflops if default == row.config else statistics.median(defaults) if defaults else None
    row.peers = {name: _median(values) for name, values in peers.items()}
    row.rounds = rounds
    if ablate and row.tflops:
        for name, variant in _ablations(space, row, device).items():
            row.ablations[name], _ = _time(
                worker, space, variant, row.problem, device, settings, f"ablate-{name}", compiler
            )


def _median(values: list[float | None]) -> float | None:
    """The median of the figures a peer gave (a round where it did not run gives None), None if it never ran."""
    ran = [v for v in values if v]
    return statistics.median(ran) if ran else None


def _row_line(row: BenchRow, i: int, total: int) -> str:
    ours = f"{row.tflops:.1f} TFLOPS" if row.tflops else row.note
    cudnn = row.ratio("cudnn")
    default = row.default_ratio("cudnn")
    return (
        f"bench [{i}/{total}] {row.problem.slug()}: {ours}"
        + (f", {cudnn:.3f}x cuDNN" if cudnn else "")
        + (f" (default {row.default_tflops:.1f}, {default:.3f}x)" if default else "")
    )


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=Path(__file__).parent,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _num(x: float | None, fmt: str = ".1f") -> str:
    return format(x, fmt) if x else "—"


def _heads(p: Problem) -> str:
    """Query heads, with the KV heads after a colon where they are fewer (GQA)."""
    return f"{p.heads_q}:{p.heads_kv}" if p.heads_kv != p.heads_q else str(p.heads_q)


def markdown_table(rows: list[BenchRow], info: dict[str, Any], suite: Suite, storage_url: str) -> str:
    """The table BENCHMARKS.md records, with the date, GPU, driver, clock, version and commit above it."""
    commit = _git_commit()
    rounds = max((r.rounds for r in rows), default=0)
    lines = [
        f"`flashtune bench --suite {suite.path.name}` — {dt.date.today().isoformat()}, {info['name']} "
        f"(sm_{info['arch']}, driver {info.get('driver_version', info.get('driver', '?'))}, SM clock "
        f"{info.get('sm_clock_mhz', '?')} MHz), flashtune {__version__}"
        + (f" at {commit}" if commit else "")
        + f", studies in {mask_url(storage_url)}"
        + (f"; each figure the median of {rounds} interleaved rounds." if rounds > 1 else "."),
        "",
        "| dtype | D | heads | causal | N | batch | flashtune | cuDNN | FA2 | vs cuDNN | vs FA2 | vs GEMM "
        "| default | default vs cuDNN | note |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        p = r.problem
        lines.append(
            f"| {p.dtype} | {p.head_dim} | {_heads(p)} | {'yes' if p.causal else 'no'} | {p.seqlen_q} | "
            f"{p.batch} | {_num(r.tflops)} | {_num(r.peers.get(PEERS['cudnn']))} | "
            f"{_num(r.peers.get(PEERS['fa2']))} | {_num(r.ratio('cudnn'), '.3f')} | "
            f"{_num(r.ratio('fa2'), '.3f')} | {_num(r.ratio('gemm'), '.3f')} | {_num(r.default_tflops)} | "
            f"{_num(r.default_ratio('cudnn'), '.3f')} | {r.note} |"
        )
    gemm = [r.peers.get(PEERS["gemm"]) for r in rows if r.peers.get(PEERS["gemm"])]
    if gemm:
        lines += ["", f"cuBLAS GEMM 8192³ {min(gemm):.0f}–{max(gemm):.0f} TFLOPS over the run."]
    ablated = [r for r in rows if r.ablations]
    if ablated:
        knobs = sorted({k for r in ablated for k in r.ablations})
        lines += [
            "",
            "Ablations: winner TFLOPS / TFLOPS with the knob put back to its default "
            "(> 1: the tuned value pays; — : same as the default or infeasible).",
            "",
            "| problem | " + " | ".join(knobs) + " |",
            "|---|" + "---|" * len(knobs),
        ]
        for r in ablated:
            cells = [_num(r.tflops / r.ablations[k], ".3f") if r.ablations.get(k) else "—" for k in knobs]
            lines.append(f"| {r.problem.slug()} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
