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
    actions = [
        g.add_argument("--family", default="sm80", help="kernel family (a file in search_spaces/): %(default)s"),
        g.add_argument("--dtype", default="fp16", help="fp16 or bf16 (default %(default)s)"),
        g.add_argument("--head-dim", type=int, default=128, help="head dimension (default %(default)s)"),
        g.add_argument("--causal", action="store_true", help="causal masking (bottom-right aligned)"),
    ]
    if shape:
        actions += [
            g.add_argument("--batch", type=int, default=8, help="batch size (default %(default)s)"),
            g.add_argument("--seqlen", type=int, default=2048, help="query sequence length (default %(default)s)"),
            g.add_argument("--seqlen-k", type=int, default=None, help="key/value sequence length (default: --seqlen)"),
            g.add_argument("--heads", type=int, default=16, help="query heads (default %(default)s)"),
            g.add_argument("--kv-heads", type=int, default=None,
                           help="key/value heads, dividing --heads (default: --heads)"),
        ]
    p.set_defaults(problem_flags=tuple((a.option_strings[0], a.dest, a.default) for a in actions))


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
def _gpus(text: str) -> list[int]:
    """``0``, ``0,2,3`` or ``all``."""
    if text == "all":
        from .worker import Worker, WorkerError

        with Worker(device=0) as worker:
            try:
                return list(range(worker.call("device_count", timeout_s=120)))
            except WorkerError as e:
                raise UsageError(f"no usable GPU: {str(e).splitlines()[-1]}") from None
    try:
        gpus = [int(g) for g in text.split(",")]
    except ValueError:
        raise UsageError(f"--gpus takes device indices like 0,1,3 or 'all', not {text!r}") from None
    if not gpus or len(set(gpus)) != len(gpus) or min(gpus) < 0:
        raise UsageError(f"--gpus must list distinct device indices, got {text!r}")
    return gpus


def _settings(args: argparse.Namespace, n_trials: int | None):
    from .jobs import MeasureSettings
    from .tune import TuneSettings

    if n_trials is not None and n_trials <= 0:
        raise UsageError("--trials must be positive")
    for flag, value, least in (("--compile-workers", args.compile_workers, 1), ("--rounds", args.rounds, 1),
                               ("--top-k", args.top_k, 0)):
        if value < least:
            raise UsageError(f"{flag} must be at least {least}, not {value}")
    for flag, value in (("--timeout", args.timeout), ("--trial-timeout", args.trial_timeout)):
        if value is not None and value <= 0:
            raise UsageError(f"{flag} must be a positive number of seconds, not {value:g}")
    return TuneSettings(n_trials=n_trials, timeout_s=args.timeout, compile_workers=args.compile_workers,
                        trial_timeout_s=args.trial_timeout, measure=MeasureSettings(seed=args.seed or 0))


def cmd_tune(args: argparse.Namespace) -> int:
    from .run import RunSpec, gpu_infos, prepare_study, run_on_gpus
    from .storage import mask_url

    if getattr(args, "suite", None):
        return _tune_suite(args)
    problem = _problem(args)
    spec = RunSpec(family=args.family, problem=problem, storage_url=args.storage, study_name=args.study or "",
                   sampler=args.sampler, seed=args.seed, settings=_settings(args, args.trials))
    _validate_early(spec)
    gpus = _gpus(args.gpus)
    infos = gpu_infos(gpus)
    spec = prepare_study(spec, infos[0])
    print(f"study {spec.study_name} in {mask_url(spec.storage_url)} on {len(gpus)} x {infos[0]['name']} "
          f"(sm_{infos[0]['arch']}, driver {infos[0].get('driver_version', infos[0]['driver'])})", file=sys.stderr)
    run_on_gpus(spec, gpus, infos)
    return _retime_and_print(spec, gpus[0], args.top_k, args.rounds)


def cmd_worker(args: argparse.Namespace) -> int:
    from .run import gpu_infos, run_on_gpus, spec_from_study

    spec = spec_from_study(args.storage, args.study, n_trials=args.trials, settings=_settings(args, args.trials))
    gpus = _gpus(args.gpus)
    run_on_gpus(spec, gpus, gpu_infos(gpus))
    if args.top_k > 0:
        return _retime_and_print(spec, gpus[0], args.top_k, args.rounds)
    return 0


def _validate_early(spec) -> None:
    """Check what needs no GPU before starting one, so bad input fails fast and touches nothing."""
    from .search import make_sampler
    from .space import load_space
    from .storage import open_storage

    space = load_space(spec.family)
    unsupported = space.supports(spec.problem)
    if unsupported:
        raise UsageError(unsupported)
    make_sampler(spec.sampler, space, spec.seed)
    open_storage(spec.storage_url)


def _retime_and_print(spec, gpu: int, top_k: int, rounds: int) -> int:
    from .run import retime_winner

    return _print_best(retime_winner(spec, gpu, top_k=top_k, rounds=rounds), as_json=False)


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

    from .storage import mask_url, open_storage

    storage = open_storage(args.storage, create=False)
    try:
        study = optuna.load_study(study_name=args.study, storage=storage)
    except KeyError:
        raise UsageError(f"no study named {args.study!r} in {mask_url(args.storage)}; `flashtune studies` lists them"
                         ) from None
    return _print_best(study, as_json=args.json)


def cmd_studies(args: argparse.Namespace) -> int:
    from .storage import mask_url, open_storage
    from .study import describe

    rows = describe(open_storage(args.storage, create=False))
    if not rows:
        raise UsageError(f"no flashtune studies in {mask_url(args.storage)}; `flashtune tune` creates one")
    print(f"{'study':<64} {'trials':>6} {'ok':>4} {'best TFLOPS':>11} {'retimed':>8}  gpu")
    for r in rows:
        best = f"{r.best_tflops:.1f}" if r.best_tflops is not None else "-"
        won = f"{r.winner_tflops:.1f}" if r.winner_tflops is not None else "-"
        print(f"{r.name:<64} {r.trials:>6} {r.complete:>4} {best:>11} {won:>8}  {r.gpu}")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from .check import check_space
    from .space import load_space

    arch = args.arch if args.arch is not None else load_space(args.family).family.min_arch
    device = limits_for_arch(arch)
    problem = Problem(batch=1, seqlen_q=1, heads_q=1, head_dim=args.head_dim, dtype=args.dtype, causal=args.causal)
    report = check_space(args.family, problem, device, samples=args.samples, jobs=args.jobs, seed=args.seed,
                         out=sys.stdout)
    return 0 if report.ok else 1


def _explicit_problem_flags(args: argparse.Namespace) -> list[str]:
    """The problem flags (``_add_problem``) given on the command line: those that differ from their defaults."""
    return [flag for flag, dest, default in args.problem_flags if getattr(args, dest) != default]


def cmd_bench(args: argparse.Namespace) -> int:
    from .bench import run_bench, study_for_bench
    from .space import load_space

    if args.suite:
        return _bench_suite(args)
    if args.ablate or args.output:
        raise UsageError("--ablate and --output go with --suite")
    if args.study:
        if args.config:
            raise UsageError("--study times the study's winner; drop --config (or --study, to time a config)")
        explicit = _explicit_problem_flags(args)
        if explicit:
            raise UsageError(f"--study times the study's own problem and family; drop {' '.join(explicit)}")
        family, problem, config = study_for_bench(args.study, args.storage)
        print(f"study {args.study}: its winner on its own problem", file=sys.stderr)
    else:
        family, problem = args.family, _problem(args)
        config = load_space(family).validate(_parse_config(args.config), partial=True, head_dim=problem.head_dim)
    worker, info = _start_worker(args.gpu)
    with worker:
        run_bench(worker, info, family, problem, config=config, out=sys.stdout)
    return 0


def _bench_suite(args: argparse.Namespace) -> int:
    """``bench --suite FILE``: each study's winner against the peers, as a Markdown table (and JSON)."""
    from .bench_suite import bench_suite, markdown_table
    from .export import check_output_path, write_text
    from .suite import load_suite, suite_storage

    if args.study or args.config:
        raise UsageError("with --suite every problem's config comes from its study; drop --study/--config")
    if args.output:
        out = check_output_path(args.output)  # before the GPU run, not after it
        if out.suffix == ".json":
            raise UsageError(f"-o {out}: the table is Markdown (the JSON goes beside it); give a .md name")
    suite = load_suite(args.suite)
    storage_url = suite_storage(suite, args.storage)
    worker, info = _start_worker(args.gpu)
    with worker:
        rows = bench_suite(worker, info, suite, storage_url, ablate=args.ablate, log=sys.stderr)
    table = markdown_table(rows, info, suite, storage_url)
    if args.output:
        write_text(table, out)
        write_text(json.dumps({"gpu": info, "rows": [r.to_dict() for r in rows]}, indent=1), out.with_suffix(".json"))
        print(f"wrote {out} and {out.with_suffix('.json')}", file=sys.stderr)
    else:
        print(table, end="")
    return 0 if any(r.tflops for r in rows) else 1


def _tune_suite(args: argparse.Namespace) -> int:
    """``tune --suite FILE``: every problem of the suite through the same path as one ``tune``; finished
    studies (trial target reached, winner re-timed) are skipped, so rerunning the command resumes."""
    from .run import RunSpec, gpu_infos, tune_suite
    from .suite import load_suite, suite_storage

    if args.study:
        raise UsageError("--study names one study; with --suite every problem gets its default study name")
    suite = load_suite(args.suite)
    base = RunSpec(family=suite.family, problem=suite.problems[0], storage_url=suite_storage(suite, args.storage),
                   sampler=args.sampler, seed=args.seed, settings=_settings(args, args.trials))
    _validate_early(base)
    gpus = _gpus(args.gpus)
    codes: list[int] = []
    tune_suite(suite, base, gpus, gpu_infos(gpus), top_k=args.top_k, rounds=args.rounds,
               on_done=lambda study: codes.append(_print_best(study, as_json=False)))
    return max(codes, default=0)


def cmd_replay(args: argparse.Namespace) -> int:
    import optuna

    from .replay import format_table, load_oracle, replay, summarize
    from .storage import open_storage

    samplers = [s.strip() for s in args.samplers.split(",") if s.strip()]
    if args.seeds < 1 or args.budget < 1 or args.window < 1 or args.jobs < 1:
        raise UsageError("--seeds, --budget, --window and --jobs must be at least 1")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    oracle = load_oracle(open_storage(args.storage, create=False), args.study, args.space)
    done = [0]
    total = len(samplers) * args.seeds

    def progress(run) -> None:
        done[0] += 1
        if sys.stderr.isatty():
            print(f"\rreplayed {done[0]}/{total} runs", end="" if done[0] < total else "\n", file=sys.stderr, flush=True)

    runs = replay(oracle, samplers, range(args.seeds), args.budget, window=args.window, jobs=args.jobs,
                  progress=progress)
    rows = summarize(oracle, runs)
    if args.json:
        print(json.dumps({"study": args.study, "best_tflops": oracle.best, "budget": args.budget,
                          "window": args.window, "rows": rows}, indent=1, default=str))
    else:
        print(format_table(oracle, rows, args.budget), end="")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from .dispatch import export_dispatch
    from .export import check_output_path, export_study, write_text

    if args.output:
        check_output_path(args.output)
    if args.dispatch:
        if not args.study and not args.suite:
            raise UsageError("--dispatch needs --study PATTERN (a glob over study names) and/or --suite FILE")
        text = export_dispatch(args.storage, pattern=args.study, suite_path=args.suite)
    elif args.suite or not args.study:
        raise UsageError("export one study with --study NAME, or several with --dispatch (--study PATTERN, --suite FILE)")
    else:
        text = export_study(args.storage, args.study)
    if args.output:
        print(f"wrote {write_text(text, args.output)}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from .export import check_output_path, write_text
    from .report import build_report

    if args.output:
        check_output_path(args.output)
    text, stem = build_report(args.storage, study=args.study, suite_path=args.suite)
    path = write_text(text, args.output or f"{stem}.html")
    print(f"wrote {path} ({len(text) // 1024} KiB): open it in a browser, no server needed", file=sys.stderr)
    return 0


# -- parser --------------------------------------------------------------------------------------
def _add_run_options(p: argparse.ArgumentParser, *, top_k: int = 5) -> None:
    p.add_argument("--gpus", default="0", help="CUDA devices: 0, 0,1,3 or all; one measuring process each (default 0)")
    p.add_argument("--compile-workers", type=int, default=default_compile_workers(),
                   help="CPU processes compiling ahead, shared by the GPUs (default %(default)s)")
    p.add_argument("--trial-timeout", type=float, default=120.0, help="seconds before a trial counts as hung")
    p.add_argument("--top-k", type=int, default=top_k, help="configs re-timed at the end (0: none; default %(default)s)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved re-timing rounds (default %(default)s)")


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
    p.add_argument("--sampler", default="pattern", choices=sorted(SAMPLERS), help="search algorithm (default %(default)s)")
    p.add_argument("--seed", type=int, default=None, help="sampler and input seed")
    _add_run_options(p)
    p.add_argument("--suite", help="tune every problem of a suite file (studies/*.toml) instead; reruns resume")
    p.set_defaults(func=cmd_tune)

    p = sub.add_parser("worker", help="join an existing study from this host (several hosts: a shared PostgreSQL URL)")
    p.add_argument("--study", required=True, help="the study to join")
    _add_storage(p)
    p.add_argument("--trials", type=int, default=None, help="override the study's trial target")
    p.add_argument("--timeout", type=float, default=None, help="stop this run after so many seconds")
    p.add_argument("--seed", type=int, default=None, help="input seed")
    _add_run_options(p, top_k=0)
    p.set_defaults(func=cmd_worker)

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
    p.add_argument("--arch", type=int, default=None, choices=KNOWN_ARCHS,
                   help="compute capability x10 (default: the family's oldest, 80 for sm80, 90 for sm90)")
    p.add_argument("--samples", type=int, default=None,
                   help="compile N feasible configs, the default among them (0: every feasible config; default: "
                        "every one of a space small enough to enumerate, else 32)")
    p.add_argument("--jobs", type=int, default=default_compile_workers(), help="parallel compiles")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("bench", help="time one config against PyTorch SDPA backends in one run")
    _add_problem(p)
    _add_storage(p)
    p.add_argument("--config", help="knob values, e.g. block_m=128,block_n=64 (others: defaults)")
    p.add_argument("--study", help="take the config from this study's winner instead")
    p.add_argument("--suite", help="every problem of a suite file: its study's winner against the peers, as a table")
    p.add_argument("--ablate", action="store_true",
                   help="with --suite: also time each winner with each tuned knob put back to its default")
    p.add_argument("-o", "--output", help="with --suite: Markdown file to write (and a .json beside it)")
    p.add_argument("--gpu", type=int, default=0)
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("replay", help="replay tuning runs against a stored exhaustive study (no GPU): "
                                      "evaluations each sampler needs to come near the best")
    p.add_argument("--study", required=True, help="a study that holds every feasible config (a --sampler grid sweep)")
    _add_storage(p)
    p.add_argument("--space", help="the space file the study was measured with, if not search_spaces/<family>.toml")
    p.add_argument("--samplers", default="tpe,random,grid", help="comma-separated, of: " + ", ".join(SAMPLERS)
                   + " (default %(default)s; grid replays a random order of the feasible configs)")
    p.add_argument("--seeds", type=int, default=20, help="runs per sampler (default %(default)s)")
    p.add_argument("--budget", type=int, default=100, help="evaluations per run (default %(default)s)")
    p.add_argument("--window", type=int, default=1,
                   help="configs in flight at once, as with compile-ahead (default %(default)s: each result is "
                        "known before the next proposal)")
    p.add_argument("--jobs", type=int, default=default_compile_workers(), help="parallel runs (default %(default)s)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_replay)

    p = sub.add_parser("export", help="write a study's best config as a C/C++ header, or a dispatch header over studies")
    p.add_argument("--study", help="the study; with --dispatch a glob over study names (e.g. 'sm80-*')")
    p.add_argument("--dispatch", action="store_true", help="one C++17 header that selects a config per shape")
    p.add_argument("--suite", help="with --dispatch: the studies of this suite file (studies/*.toml)")
    _add_storage(p)
    p.add_argument("-o", "--output", help="header file to write (default: standard output)")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("report", help="write a self-contained HTML report of a study (and of a suite)")
    p.add_argument("--study", help="the study to report on")
    p.add_argument("--suite", help="add a page comparing the winning configs across the shapes of this suite")
    _add_storage(p)
    p.add_argument("-o", "--output", help="HTML file to write (default: <study or suite>.html)")
    p.set_defaults(func=cmd_report)
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
