"""The ``flashtune`` command line."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from . import __version__
from .devices import KNOWN_ARCHS, DeviceLimits, limits_for_arch
from .errors import FlashtuneError, UsageError
from .problem import Problem
from .tune import default_compile_workers

__all__ = ["main"]


# -- shared options ----------------------------------------------------------------------------
def _add_problem(p: argparse.ArgumentParser, *, shape: bool = True) -> None:
    g = p.add_argument_group("problem")
    g.add_argument("--family", default="sm80", help="kernel family (a file in search_spaces/): %(default)s")
    g.add_argument("--dtype", default="fp16", help="fp16 or bf16 (default %(default)s)")
    g.add_argument("--head-dim", type=int, default=128, help="head dimension (default %(default)s)")
    g.add_argument("--causal", action="store_true", help="causal masking (bottom-right aligned)")
    if shape:
        g.add_argument("--batch", type=int, default=8, help="batch size (default %(default)s)")
        g.add_argument("--seqlen", type=int, default=2048, help="query sequence length (default %(default)s)")
        g.add_argument("--seqlen-k", type=int, default=None, help="key/value sequence length (default: --seqlen)")
        g.add_argument("--heads", type=int, default=16, help="query heads (default %(default)s)")
        g.add_argument("--kv-heads", type=int, default=None, help="key/value heads, dividing --heads (default: --heads)")


def _problem(args: argparse.Namespace) -> Problem:
    return Problem(batch=args.batch, seqlen_q=args.seqlen, seqlen_k=args.seqlen_k, heads_q=args.heads,
                   heads_kv=args.kv_heads, head_dim=args.head_dim, dtype=args.dtype, causal=args.causal)


def _add_storage(p: argparse.ArgumentParser) -> None:
    from .storage import DEFAULT_STORAGE

    p.add_argument("--storage", default=DEFAULT_STORAGE, help="SQLAlchemy URL of the study database (default %(default)s)")


def _parse_config(text: str | None) -> dict[str, int]:
    """``block_m=128,block_n=64`` -> dict; values must be integers."""
    if not text:
        return {}
    out: dict[str, int] = {}
    for item in text.split(","):
        name, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"--config expects name=value pairs separated by commas, got {item!r}")
        try:
            out[name.strip()] = int(value)
        except ValueError:
            raise UsageError(f"--config value for {name.strip()} must be an integer, got {value!r}") from None
    return out


def _start_worker(device: int):
    """A GPU worker and what it reports about its device; a clear error when there is no GPU."""
    from .worker import Worker, WorkerError

    worker = Worker(device=device)
    try:
        info = worker.call("device_info", timeout_s=120)
    except WorkerError as e:
        worker.close()
        raise UsageError(f"no usable GPU {device}: {str(e).splitlines()[-1]}. "
                         "(`flashtune check` compiles and checks a space without a GPU)") from None
    return worker, info


# -- commands ----------------------------------------------------------------------------------
def cmd_tune(args: argparse.Namespace) -> int:
    from . import study as st
    from .jobs import MeasureSettings
    from .progress import Progress
    from .retime import retime_top
    from .search import make_sampler
    from .space import load_space
    from .storage import mask_url, open_storage
    from .tune import TuneSettings, tune

    space = load_space(args.family)
    problem = _problem(args)
    unsupported = space.supports(problem)
    if unsupported:
        raise UsageError(unsupported)
    if args.trials is not None and args.trials <= 0:
        raise UsageError("--trials must be positive")
    storage = open_storage(args.storage)
    sampler = make_sampler(args.sampler, space, args.seed)
    worker, info = _start_worker(args.gpu)
    with worker:
        device = DeviceLimits.from_info(info)
        if device.arch < space.family.min_arch:
            raise UsageError(f"family {space.name} needs sm_{space.family.min_arch}+, GPU {info['name']} is sm_{device.arch}")
        name = args.study or st.default_study_name(space, device.arch, str(info["name"]), problem)
        study = st.open_study(storage=storage, name=name, space=space, problem=problem, gpu=info, sampler=sampler)
        print(f"study {name} in {mask_url(args.storage)} on {info['name']} (sm_{device.arch}, driver {info['driver']})",
              file=sys.stderr)
        settings = TuneSettings(n_trials=args.trials, timeout_s=args.timeout, compile_workers=args.compile_workers,
                                trial_timeout_s=args.trial_timeout, measure=MeasureSettings(seed=args.seed or 0))
        measure = lambda job: worker.measure(job, timeout_s=settings.trial_timeout_s)  # noqa: E731
        summary = tune(study, space, problem, device, measure, settings, progress=Progress())
        print(f"stopped: {summary.stopped_because}; {summary.infeasible} statically infeasible, "
              f"{summary.failed} failed, {summary.duplicates} duplicate proposals", file=sys.stderr)
        if args.top_k > 0:
            print(f"re-timing the top {args.top_k} configs and the default, {args.rounds} rounds ...", file=sys.stderr)
            retime_top(study, space, problem, device, measure, top_k=args.top_k, rounds=args.rounds,
                       settings=settings.measure)
    return _print_best(study, as_json=False)


def _print_best(study, *, as_json: bool) -> int:
    from . import study as st

    best = st.winner(study)
    if best is None:
        print(f"study {study.study_name} has no successful trial yet", file=sys.stderr)
        return 1
    if as_json:
        print(json.dumps({"study": study.study_name, **best}, indent=2))
        return 0
    speedup = best.get("speedup_over_default")
    print(f"best of {study.study_name} ({best['source']}): {best['tflops']:.1f} TFLOPS"
          + (f", {speedup:.2f}x the default config" if speedup else "") + f", trial {best['trial']}")
    for name, value in best["config"].items():
        print(f"  {name} = {value}")
    return 0


def cmd_best(args: argparse.Namespace) -> int:
    import optuna

    from .storage import open_storage

    storage = open_storage(args.storage)
    try:
        study = optuna.load_study(study_name=args.study, storage=storage)
    except KeyError:
        raise UsageError(f"no study named {args.study!r} in {args.storage}; `flashtune studies` lists them") from None
    return _print_best(study, as_json=args.json)


def cmd_studies(args: argparse.Namespace) -> int:
    from .study import describe
    from .storage import open_storage

    rows = describe(open_storage(args.storage))
    if not rows:
        print("no flashtune studies in this storage", file=sys.stderr)
        return 0
    print(f"{'study':<64} {'trials':>6} {'ok':>4} {'best TFLOPS':>11} {'retimed':>8}  gpu")
    for r in rows:
        best = f"{r.best_tflops:.1f}" if r.best_tflops is not None else "-"
        won = f"{r.winner_tflops:.1f}" if r.winner_tflops is not None else "-"
        print(f"{r.name:<64} {r.trials:>6} {r.complete:>4} {best:>11} {won:>8}  {r.gpu}")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from .check import check_space

    device = limits_for_arch(args.arch)
    problem = Problem(batch=1, seqlen_q=1, heads_q=1, head_dim=args.head_dim, dtype=args.dtype, causal=args.causal)
    report = check_space(args.family, problem, device, samples=args.samples, jobs=args.jobs, seed=args.seed,
                         out=sys.stdout)
    return 0 if report.ok else 1


def cmd_bench(args: argparse.Namespace) -> int:
    from .bench import run_bench

    problem = _problem(args)
    worker, info = _start_worker(args.gpu)
    with worker:
        run_bench(worker, info, args.family, problem, config=_parse_config(args.config), study=args.study,
                  storage_url=args.storage, out=sys.stdout)
    return 0


# -- parser --------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    from .search import SAMPLERS

    parser = argparse.ArgumentParser(prog="flashtune", description="Autotune FlashAttention forward kernels.")
    parser.add_argument("--version", action="version", version=f"flashtune {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("tune", help="run (or resume) a tuning study on a GPU")
    _add_problem(p)
    _add_storage(p)
    p.add_argument("--study", help="study name (default: derived from family, GPU and problem)")
    p.add_argument("--trials", type=int, default=50, help="evaluated trials the study should hold (default %(default)s)")
    p.add_argument("--timeout", type=float, default=None, help="stop this run after so many seconds")
    p.add_argument("--sampler", default="tpe", choices=sorted(SAMPLERS), help="search algorithm (default %(default)s)")
    p.add_argument("--seed", type=int, default=None, help="sampler and input seed")
    p.add_argument("--gpu", type=int, default=0, help="CUDA device index (default %(default)s)")
    p.add_argument("--compile-workers", type=int, default=default_compile_workers(),
                   help="CPU processes compiling ahead (default %(default)s)")
    p.add_argument("--trial-timeout", type=float, default=120.0, help="seconds before a trial counts as hung")
    p.add_argument("--top-k", type=int, default=5, help="configs re-timed at the end (0: none; default %(default)s)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved re-timing rounds (default %(default)s)")
    p.set_defaults(func=cmd_tune)

    p = sub.add_parser("best", help="print the best config of a study")
    p.add_argument("--study", required=True)
    _add_storage(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_best)

    p = sub.add_parser("studies", help="list the studies in a storage with their best TFLOPS")
    _add_storage(p)
    p.set_defaults(func=cmd_studies)

    p = sub.add_parser("check", help="compile a space without a GPU: static feasibility and ptxas resources")
    _add_problem(p, shape=False)
    p.add_argument("--arch", type=int, default=80, choices=KNOWN_ARCHS, help="compute capability x10 (default 80)")
    p.add_argument("--samples", type=int, default=0, help="compile N sampled configs (0: every feasible config)")
    p.add_argument("--jobs", type=int, default=default_compile_workers(), help="parallel compiles")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("bench", help="time one config against PyTorch SDPA backends in one run")
    _add_problem(p)
    _add_storage(p)
    p.add_argument("--config", help="knob values, e.g. block_m=128,block_n=64 (others: defaults)")
    p.add_argument("--study", help="take the config from this study's winner instead")
    p.add_argument("--gpu", type=int, default=0)
    p.set_defaults(func=cmd_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except FlashtuneError as e:
        print(f"flashtune {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"flashtune {args.command}: interrupted; finished trials are stored", file=sys.stderr)
        return 130
