"""The ``flashtune`` command line."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
from collections.abc import Sequence

from .._version import __version__
from ..devices import KNOWN_ARCHS, gpu_unavailable, limits_for_arch, missing_driver
from ..errors import FlashtuneError, UsageError
from ..problem import DTYPES, Problem
from ..text import printable
from ..run import default_compile_workers

__all__ = ["main"]

MAX_STUDY_NAME = 512  # Optuna's limit on a study name (a longer one is no study anywhere)
MAX_SEED = 2**32 - 1  # numpy's and Optuna's samplers take seeds below 2**32


class _Parser(argparse.ArgumentParser):
    """argparse with its errors as one line (``flashtune tune: error: ...; see --help``), not usage + error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {printable(message, 500)}; see `{self.prog} --help`\n")


# -- option types: each refuses a bad value with one line naming the option ----------------------
def _study_name(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("a study name must not be empty (leave --study out for the default name)")
    if len(text) > MAX_STUDY_NAME:
        raise argparse.ArgumentTypeError(f"a study name has at most {MAX_STUDY_NAME} characters, this one "
                                         f"{len(text)}")
    return text


def _storage_url(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("the storage URL is empty (leave --storage out for the default)")
    return text


def _output(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("the output file name is empty; give a file name (or leave -o out)")
    return text


def _samples(text: str) -> int:
    """``all`` (0: every feasible config) or a positive number of configs."""
    if text.strip().lower() == "all":
        return 0
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'all' or a number of configs, not {printable(text, 40)!r}"
                                         ) from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected 'all' or a positive number of configs, not {value}")
    return value


def _gpu_index(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a device index (0, 1, ...), not {printable(text, 40)!r}"
                                         ) from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a device index (0, 1, ...), not {value}")
    return value


def _check_seed(seed: int | None) -> None:
    if seed is not None and not 0 <= seed <= MAX_SEED:
        raise UsageError(f"--seed must be from 0 to {MAX_SEED}, not {seed}")


def _check_printable_name(name: str) -> None:
    """A study name this command would create: printable (it reaches terminals, file names and headers)."""
    if not name.isprintable():
        raise UsageError(f"study name {printable(name, 120)!r} holds control characters; choose a printable name")


# -- shared options ----------------------------------------------------------------------------
def _family_help() -> str:
    from ..space import available_families

    families = ", ".join(available_families()) or "none installed"
    return f"kernel family: {families} (search_spaces/<family>.toml, or a space file's path; default %(default)s)"


def _add_problem(p: argparse.ArgumentParser, *, shape: bool = True) -> None:
    g = p.add_argument_group("problem")
    actions = [
        g.add_argument("--family", default="sm80", help=_family_help()),
        g.add_argument("--dtype", default="fp16", help=f"{' or '.join(DTYPES)} (default %(default)s)"),
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
    from ..study import DEFAULT_STORAGE

    p.add_argument("--storage", default=DEFAULT_STORAGE, type=_storage_url,
                   help="SQLAlchemy URL of the study database (default %(default)s)")


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
    from ..run import Worker, WorkerError

    worker = Worker(device=device)
    try:
        info = worker.call("device_info", timeout_s=120)
    except WorkerError as e:
        worker.close()
        raise gpu_unavailable(device, str(e)) from None
    return worker, info


def _gpu_infos(gpus: list[int]):
    """What each GPU reports (:func:`tuner.run.gpu_infos`), with the one no-GPU message when there is no driver."""
    from ..run import gpu_infos

    with _no_gpu_message(gpus):
        return gpu_infos(gpus)


@contextlib.contextmanager
def _open_gpus(gpus: list[int]):
    """A started worker per GPU and what each reports (:func:`tuner.run.open_gpus`), with the one no-GPU message."""
    from ..run import open_gpus

    with _no_gpu_message(gpus), open_gpus(gpus) as opened:
        yield opened


@contextlib.contextmanager
def _no_gpu_message(gpus: list[int]):
    try:
        yield
    except UsageError as e:
        if "no usable GPU" in str(e) and missing_driver():  # CUDA blames "driver version insufficient"
            raise gpu_unavailable(gpus[0] if len(gpus) == 1 else None, str(e)) from None
        raise


# -- commands ----------------------------------------------------------------------------------
def _gpus(text: str) -> list[int]:
    """``0``, ``0,2,3`` or ``all``."""
    if text == "all":
        from ..run import Worker, WorkerError

        with Worker(device=0) as worker:
            try:
                return list(range(worker.call("device_count", timeout_s=120)))
            except WorkerError as e:
                raise gpu_unavailable(None, str(e)) from None
    try:
        gpus = [int(g) for g in text.split(",")]
    except ValueError:
        raise UsageError(f"--gpus takes device indices like 0,1,3 or 'all', not {printable(text, 60)!r}") from None
    if not gpus or len(set(gpus)) != len(gpus) or min(gpus) < 0:
        raise UsageError(f"--gpus must list distinct device indices, got {printable(text, 60)!r}")
    return gpus


def _settings(args: argparse.Namespace, n_trials: int | None):
    from ..gpu import MeasureSettings
    from ..run import TuneSettings

    if n_trials is not None and n_trials <= 0:
        raise UsageError("--trials must be positive")
    for flag, value, least in (("--compile-workers", args.compile_workers, 1), ("--rounds", args.rounds, 1),
                               ("--top-k", args.top_k, 0)):
        if value < least:
            raise UsageError(f"{flag} must be at least {least}, not {value}")
    from ..compile import MAX_JOBS

    for flag, value, most in (("--compile-workers", args.compile_workers, MAX_JOBS), ("--rounds", args.rounds, 1000),
                              ("--top-k", args.top_k, 1000)):
        if value > most:
            raise UsageError(f"{flag} must be at most {most}, not {value}")
    for flag, value in (("--timeout", args.timeout), ("--trial-timeout", args.trial_timeout)):
        if value is not None and (not math.isfinite(value) or value <= 0):
            raise UsageError(f"{flag} must be a positive number of seconds, not {value:g}")
    _check_seed(args.seed)
    return TuneSettings(n_trials=n_trials, timeout_s=args.timeout, compile_workers=args.compile_workers,
                        trial_timeout_s=args.trial_timeout, measure=MeasureSettings(seed=args.seed or 0))


def cmd_tune(args: argparse.Namespace) -> int:
    from ..run import RunSpec, compile_processes, prepare_study, run_on_gpus
    from ..study import mask_url

    if getattr(args, "suite", None):
        return _tune_suite(args)
    if args.study is not None:
        _check_printable_name(args.study)
    problem = _problem(args)
    spec = RunSpec(family=args.family, problem=problem, storage_url=args.storage, study_name=args.study or "",
                   sampler=args.sampler, seed=args.seed, settings=_settings(args, args.trials))
    _validate_early(spec)
    gpus = _gpus(args.gpus)
    # the GPU workers (all GPUs at once) start before anything is created in the storage; they tune and re-time
    with compile_processes(spec.settings) as pool, _open_gpus(gpus) as (workers, infos):
        spec = prepare_study(spec, infos[0])
        info = infos[0]
        print(f"study {printable(spec.study_name, 200)} in {mask_url(spec.storage_url)} on {len(gpus)} x "
              f"{printable(info['name'], 80)} (sm_{printable(info['arch'], 8)}, driver "
              f"{printable(info.get('driver_version', info.get('driver', '?')), 40)})", file=sys.stderr)
        run_on_gpus(spec, gpus, infos, workers=workers, pool=pool)
        return _retime_and_print(spec, workers[0], args.top_k, args.rounds)


def cmd_worker(args: argparse.Namespace) -> int:
    from ..run import compile_processes, run_on_gpus, spec_from_study

    spec = spec_from_study(args.storage, args.study, n_trials=args.trials, settings=_settings(args, args.trials))
    gpus = _gpus(args.gpus)
    with compile_processes(spec.settings) as pool, _open_gpus(gpus) as (workers, infos):
        run_on_gpus(spec, gpus, infos, workers=workers, pool=pool)
        if args.top_k > 0:
            return _retime_and_print(spec, workers[0], args.top_k, args.rounds)
    return 0


def _validate_early(spec) -> None:
    """Check what needs no GPU before starting one, so bad input fails fast and touches nothing (the study
    database is created once a GPU is found)."""
    from ..search import make_sampler
    from ..space import load_space
    from ..study import check_storage

    space = load_space(spec.family)
    unsupported = space.supports(spec.problem)
    if unsupported:
        raise UsageError(unsupported)
    make_sampler(spec.sampler, space, spec.seed)
    check_storage(spec.storage_url)


def _retime_and_print(spec, worker, top_k: int, rounds: int) -> int:
    from ..run import retime_winner

    return _print_best(retime_winner(spec, worker.device, top_k=top_k, rounds=rounds, worker=worker), as_json=False)


def _print_best(study, *, as_json: bool) -> int:
    """The study's winner as ``export`` would serve it (:func:`tuner.study.choose`: made by flashtune, valid
    for today's space, a successful trial), or a :class:`~tuner.study.StudyError`."""
    from ..study import choose

    chosen = choose(study)
    if as_json:
        print(json.dumps(chosen.to_dict(), indent=2, allow_nan=False))
        return 0
    tflops = f"{chosen.tflops:.1f}" if chosen.tflops is not None else "?"
    speedup = chosen.speedup_over_default
    trial = f", trial {chosen.trial}" if chosen.trial is not None else ""
    print(f"best of {printable(chosen.study_name, 200)} ({printable(chosen.source, 80)}): {tflops} TFLOPS"
          + (f", {speedup:.2f}x the default config" if speedup else "") + trial)
    for name, value in chosen.config.items():
        print(f"  {name} = {value}")
    return 0


def cmd_best(args: argparse.Namespace) -> int:
    from ..study import open_storage
    from ..study import load_flashtune_study

    study = load_flashtune_study(open_storage(args.storage, create=False), args.study, args.storage)
    return _print_best(study, as_json=args.json)


def cmd_studies(args: argparse.Namespace) -> int:
    from ..study import mask_url, open_storage
    from ..study import describe

    rows = describe(open_storage(args.storage, create=False))
    if not rows:
        raise UsageError(f"no flashtune studies in {mask_url(args.storage)}; `flashtune tune` creates one")
    print(f"{'study':<64} {'trials':>6} {'ok':>4} {'best TFLOPS':>11} {'retimed':>8}  gpu")
    for r in rows:
        best = f"{r.best_tflops:.1f}" if r.best_tflops is not None else "-"
        won = f"{r.winner_tflops:.1f}" if r.winner_tflops is not None else "-"
        print(f"{printable(r.name, None):<64} {r.trials:>6} {r.complete:>4} {best:>11} {won:>8}  {printable(r.gpu, 80)}")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from ..compile import check_space
    from ..space import load_space

    _check_seed(args.seed)
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
    from ..bench import run_bench, study_for_bench
    from ..space import load_space

    if args.api:
        return _bench_api(args)
    if args.suite:
        return _bench_suite(args)
    if args.tuned:
        raise UsageError("--tuned goes with --api --config auto")
    if args.ablate or args.output:
        raise UsageError("--ablate and --output go with --suite")
    if args.study:
        if args.config:
            raise UsageError("--study times the study's winner; drop --config (or --study, to time a config)")
        explicit = _explicit_problem_flags(args)
        if explicit:
            raise UsageError(f"--study times the study's own problem and family; drop {' '.join(explicit)}")
        family, problem, config = study_for_bench(args.study, args.storage)
        print(f"study {printable(args.study, 200)}: its winner on its own problem", file=sys.stderr)
    else:
        family, problem = args.family, _problem(args)
        config = load_space(family).validate(_parse_config(args.config), partial=True, head_dim=problem.head_dim)
    worker, info = _start_worker(args.gpu)
    with worker:
        run_bench(worker, info, family, problem, config=config, out=sys.stdout)
    return 0


def _bench_api(args: argparse.Namespace) -> int:
    """``bench --api``: host time per call and eager vs kernel TFLOPS of tuner.attention, its op and SDPA."""
    from pathlib import Path

    from ..bench import DEFAULT_SHAPES, run_api_bench

    if args.suite or args.study or args.ablate or args.output:
        raise UsageError("--api times tuner.attention in this process on its own shapes; drop --suite, --study, "
                         "--ablate and -o")
    shape_flags = [f for f in _explicit_problem_flags(args) if f != "--family"]
    problems = [_problem(args)] if shape_flags else list(DEFAULT_SHAPES)
    config = args.config
    if config and config != "auto" and not (config.endswith(".h") or Path(config).is_file()):
        config = _parse_config(config)
    if (config == "auto") != bool(args.tuned):
        raise UsageError("--config auto and --tuned (a dispatch .json, suite file or storage URL) go together")
    run_api_bench(problems, family=args.family, config=config or None, tuned=args.tuned, device=args.gpu,
                  out=sys.stdout)
    return 0


def _bench_suite(args: argparse.Namespace) -> int:
    """``bench --suite FILE``: each study's winner against the peers, as a Markdown table (and JSON)."""
    from ..bench import bench_suite, markdown_table
    from ..files import check_output_path, is_stream, write_text
    from ..study import load_suite, suite_storage

    if args.study or args.config:
        raise UsageError("with --suite every problem's config comes from its study; drop --study/--config")
    json_out = None
    if args.output:
        out = check_output_path(args.output)  # before the GPU run, not after it
        if out.suffix == ".json":
            raise UsageError(f"-o {printable(out, 160)}: the table is Markdown (the JSON goes beside it); "
                             "give a .md name")
        if not is_stream(out):  # /dev/stdout or a pipe: the table only
            json_out = check_output_path(out.with_suffix(".json"))
    suite = load_suite(args.suite)
    storage_url = suite_storage(suite, args.storage)
    worker, info = _start_worker(args.gpu)
    with worker:
        rows = bench_suite(worker, info, suite, storage_url, ablate=args.ablate, log=sys.stderr,
                           compile_workers=default_compile_workers())
    table = markdown_table(rows, info, suite, storage_url)
    if args.output:
        write_text(table, out)
        if json_out is not None:
            write_text(json.dumps({"gpu": info, "rows": [r.to_dict() for r in rows]}, indent=1), json_out)
        print(f"wrote {printable(out, 200)}" + (f" and {printable(json_out, 200)}" if json_out else ""),
              file=sys.stderr)
    else:
        print(table, end="")
    return 0 if any(r.tflops for r in rows) else 1


def _tune_suite(args: argparse.Namespace) -> int:
    """``tune --suite FILE``: every problem of the suite through the same path as one ``tune``; finished
    studies (trial target reached, winner re-timed) are skipped, so rerunning the command resumes."""
    from ..run import RunSpec, tune_suite
    from ..study import load_suite, suite_storage

    if args.study:
        raise UsageError("--study names one study; with --suite every problem gets its default study name")
    _settings(args, args.trials)  # bad options fail before anything else
    suite = load_suite(args.suite)
    base = RunSpec(family=suite.family, problem=suite.problems[0], storage_url=suite_storage(suite, args.storage),
                   sampler=args.sampler, seed=args.seed, settings=_settings(args, args.trials))
    _validate_early(base)
    gpus = _gpus(args.gpus)
    tune_suite(suite, base, gpus, _gpu_infos(gpus), top_k=args.top_k, rounds=args.rounds, on_done=_print_winner)
    return 0


def _print_winner(study) -> None:
    """What a suite prints for each study it finished (module level: a suite's GPU processes pickle it)."""
    _print_best(study, as_json=False)


def cmd_replay(args: argparse.Namespace) -> int:
    import optuna

    from ..run import format_table, load_oracle, replay, summarize
    from ..study import open_storage

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
    from ..export import collect_dispatch
    from ..export import export_study
    from ..files import check_output_path, is_stream, write_text

    if args.output:
        check_output_path(args.output)
    if args.dispatch:
        if not args.study and not args.suite:
            raise UsageError("--dispatch needs --study PATTERN (a glob over study names) and/or --suite FILE")
        if args.output and args.output.endswith(".json"):
            raise UsageError(f"-o {args.output}: -o names the header; its JSON is written beside it (name.json)")
        selection = collect_dispatch(args.storage, pattern=args.study, suite_path=args.suite)
        text = selection.header()
        if args.output and not is_stream(args.output):  # the tables for tuner.attention(config="auto", tuned=...)
            json_path = check_output_path(check_output_path(args.output).with_suffix(".json"))
            print(f"wrote {printable(write_text(selection.json(), json_path), 200)}", file=sys.stderr)
    elif args.suite or not args.study:
        raise UsageError("export one study with --study NAME, or several with --dispatch (--study PATTERN, --suite FILE)")
    else:
        text = export_study(args.storage, args.study)
    if args.output:
        print(f"wrote {printable(write_text(text, args.output), 200)}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from ..files import check_output_path, write_text
    from ..report import build_report

    if args.output:
        check_output_path(args.output)
    text, stem = build_report(args.storage, study=args.study, suite_path=args.suite)
    path = write_text(text, args.output or f"{stem}.html")
    print(f"wrote {printable(path, 200)} ({len(text) // 1024} KiB): open it in a browser, no server needed",
          file=sys.stderr)
    return 0


# -- parser --------------------------------------------------------------------------------------
def _add_run_options(p: argparse.ArgumentParser, *, top_k: int = 5) -> None:
    p.add_argument("--gpus", default="0", help="CUDA devices: 0, 0,1,3 or all; one measuring process each (default 0)")
    p.add_argument("--compile-workers", type=int, default=default_compile_workers(),
                   help="CPU processes compiling ahead, shared by the GPUs (default %(default)s)")
    p.add_argument("--trial-timeout", type=float, default=120.0,
                   help="seconds before a trial counts as hung (default %(default)s)")
    p.add_argument("--top-k", type=int, default=top_k,
                   help="at the end, re-time the configs within the noise of the best, at most this many, with the "
                        "default (0: none; default %(default)s)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved re-timing rounds (default %(default)s)")


def build_parser() -> argparse.ArgumentParser:
    from ..search import SAMPLERS

    parser = _Parser(prog="flashtune", description="Autotune FlashAttention forward kernels.")
    parser.add_argument("--version", action="version", version=f"flashtune {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("tune", help="run (or resume) a tuning study on a GPU")
    _add_problem(p)
    _add_storage(p)
    p.add_argument("--study", type=_study_name, help="study name (default: derived from family, GPU and problem)")
    p.add_argument("--trials", type=int, default=50, help="evaluated trials the study should hold (default %(default)s)")
    p.add_argument("--timeout", type=float, default=None, help="stop this run after so many seconds")
    p.add_argument("--sampler", default="pattern", choices=sorted(SAMPLERS), help="search algorithm (default %(default)s)")
    p.add_argument("--seed", type=int, default=None, help="sampler and input seed")
    _add_run_options(p)
    p.add_argument("--suite", help="tune every problem of a suite file (studies/*.toml) instead; reruns resume")
    p.set_defaults(func=cmd_tune)

    p = sub.add_parser("worker", help="join an existing study from this host (several hosts: a shared PostgreSQL URL)")
    p.add_argument("--study", required=True, type=_study_name, help="the study to join")
    _add_storage(p)
    p.add_argument("--trials", type=int, default=None, help="override the study's trial target")
    p.add_argument("--timeout", type=float, default=None, help="stop this run after so many seconds")
    p.add_argument("--seed", type=int, default=None, help="input seed")
    _add_run_options(p, top_k=0)
    p.set_defaults(func=cmd_worker)

    p = sub.add_parser("best", help="print the best config of a study")
    p.add_argument("--study", required=True, type=_study_name, help="the study")
    _add_storage(p)
    p.add_argument("--json", action="store_true", help="machine-readable output (JSON, no NaN or infinity)")
    p.set_defaults(func=cmd_best)

    p = sub.add_parser("studies", help="list the studies in a storage with their best TFLOPS")
    _add_storage(p)
    p.set_defaults(func=cmd_studies)

    p = sub.add_parser("check", help="compile a space without a GPU: static feasibility and ptxas resources")
    _add_problem(p, shape=False)
    p.add_argument("--arch", type=int, default=None, choices=KNOWN_ARCHS,
                   help="compute capability x10 (default: the family's oldest, 80 for sm80, 90 for sm90)")
    p.add_argument("--samples", type=_samples, default=None,
                   help="compile N feasible configs, the default among them (default 32: about a minute on two "
                        "cores); 'all': every feasible config of a space small enough to enumerate (sm80: 552 "
                        "at d128, about 17 minutes on two cores)")
    p.add_argument("--jobs", type=int, default=default_compile_workers(),
                   help="parallel compiles (default %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random draws (default %(default)s)")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("bench", help="time one config against PyTorch SDPA backends in one run")
    _add_problem(p)
    _add_storage(p)
    p.add_argument("--config", help="knob values, e.g. block_m=128,block_n=64 (others: defaults); with --api also "
                                    "a header path or 'auto'")
    p.add_argument("--study", type=_study_name, help="take the config from this study's winner instead")
    p.add_argument("--suite", help="every problem of a suite file: its study's winner against the peers, as a table")
    p.add_argument("--ablate", action="store_true",
                   help="with --suite: also time each winner with each tuned knob put back to its default")
    p.add_argument("-o", "--output", type=_output, help="with --suite: Markdown file to write (and a .json beside it)")
    p.add_argument("--api", action="store_true",
                   help="host us per call of tuner.attention, its torch op and SDPA, and eager vs kernel TFLOPS, on a "
                        "few shapes (or the one the problem flags give); needs PyTorch")
    p.add_argument("--tuned", help="with --api --config auto: a dispatch .json, suite file or storage URL")
    p.add_argument("--gpu", type=_gpu_index, default=0, help="CUDA device index (default %(default)s)")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("replay", help="replay tuning runs against a stored exhaustive study (no GPU): "
                                      "evaluations each sampler needs to come near the best")
    p.add_argument("--study", required=True, help="a study that holds every feasible config (a --sampler grid sweep)")
    _add_storage(p)
    p.add_argument("--space", help="the space file the study was measured with, if not search_spaces/<family>.toml")
    p.add_argument("--samplers", default="pattern,tpe,random,grid", help="comma-separated, of: " + ", ".join(SAMPLERS)
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
    p.add_argument("--study", type=_study_name, help="the study; with --dispatch a glob over study names (e.g. 'sm80-*')")
    p.add_argument("--dispatch", action="store_true",
                   help="one C++17 header that selects a config per shape (with -o, and a .json beside it for "
                        "tuner.attention(config='auto'))")
    p.add_argument("--suite", help="with --dispatch: the studies of this suite file (studies/*.toml)")
    _add_storage(p)
    p.add_argument("-o", "--output", type=_output, help="header file to write (default: standard output)")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("report", help="write a self-contained HTML report of a study (and of a suite)")
    p.add_argument("--study", type=_study_name, help="the study to report on")
    p.add_argument("--suite", help="add a page comparing the winning configs across the shapes of this suite")
    _add_storage(p)
    p.add_argument("-o", "--output", type=_output, help="HTML file to write (default: <study or suite>.html)")
    p.set_defaults(func=cmd_report)
    return parser


def _error(command: str, message: str) -> None:
    """The one line a failed command prints: passwords of every storage URL seen redacted, control
    characters escaped, nothing that could look like a second line."""
    from ..study import redact

    try:
        print(f"flashtune {command}: error: {printable(redact(message), 2000)}", file=sys.stderr, flush=True)
    except (BrokenPipeError, OSError):
        pass


def _stdout_gone() -> None:
    """stdout's reader left (``flashtune best --json | head -1``): stop writing to it, quietly."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def main(argv: Sequence[str] | None = None) -> int:
    import optuna
    from sqlalchemy.exc import SQLAlchemyError

    from ..study import error_reason

    parser = build_parser()
    args = parser.parse_args(argv)
    command = args.command
    try:
        rc = args.func(args)
        sys.stdout.flush()  # a closed pipe shows here, inside the handlers below, not at exit
        return rc
    except BrokenPipeError:
        _stdout_gone()
        return 141  # 128 + SIGPIPE, as a shell reports a process killed by it
    except FlashtuneError as e:
        _error(command, str(e))
        return 2
    except (SQLAlchemyError, optuna.exceptions.StorageInternalError) as e:
        _error(command, f"the storage failed: {error_reason(e)}; check that --storage points at a healthy "
                        "study database (finished trials stay stored) and rerun")
        return 2
    except KeyboardInterrupt:
        print(f"flashtune {command}: interrupted; finished trials are stored", file=sys.stderr)
        return 130
    except MemoryError:
        _error(command, "out of memory")
        return 1
    except Exception as e:  # noqa: BLE001 - the last line of defence: one line, never a traceback
        if os.environ.get("FLASHTUNE_DEBUG"):
            raise
        _error(command, f"internal error ({type(e).__name__}: {e}); rerun with FLASHTUNE_DEBUG=1 for the "
                        "traceback, and please report it")
        return 1
