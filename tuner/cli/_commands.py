"""The ``flashtune`` commands but ``bench``: each takes the parsed options and returns the exit status.

A command raises :class:`~tuner.errors.FlashtuneError` (or a storage error) for a failure that
:func:`tuner.cli.main` turns into one line. What a command needs from a GPU goes through
:mod:`._gpus`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from ..devices import limits_for_arch
from ..errors import UsageError
from ..problem import Problem
from ..progress import Progress, log
from ..space import AUTO_FAMILY
from ..text import printable
from . import _gpus
from ._args import check_printable_name, check_seed, noise_floor, problem_from, resolve_family, tune_settings
from ._outputs import guard

__all__ = ["cmd_best", "cmd_check", "cmd_export", "cmd_replay", "cmd_report", "cmd_studies", "cmd_tune", "cmd_worker"]


def cmd_tune(args: argparse.Namespace) -> int:
    from ..run import RunSpec, compile_processes, prepare_study, run_on_gpus
    from ..study import mask_url

    if getattr(args, "model", None):
        from ._model import write_model_suite

        args.suite = write_model_suite(args)
        return _tune_suite(args)
    if getattr(args, "suite", None):
        return _tune_suite(args)
    if args.study is not None:
        check_printable_name(args.study)
    problem = problem_from(args)
    gpus = _gpus.parse(args.gpus)
    spec = RunSpec(
        family=args.family,  # "auto" is resolved once the GPUs report their arch
        problem=problem,
        storage_url=args.storage,
        study_name=args.study or "",
        sampler=args.sampler,
        seed=args.seed,
        settings=tune_settings(args, args.trials),
        noise_floor=noise_floor(args),
    )
    space = _validate_early(spec)
    # the GPU workers (all GPUs at once) start before anything is created in the storage; they tune and re-time
    with compile_processes(spec.settings) as pool, _gpus.open_all(gpus) as (workers, infos):
        info = infos[0]
        if spec.family == AUTO_FAMILY:
            spec = dataclasses.replace(spec, family=resolve_family(args, [problem], arch=int(info["arch"])))
            space = _validate_early(spec)
        spec = prepare_study(spec, info, space=space)
        print(
            f"study {printable(spec.study_name, 200)} in {mask_url(spec.storage_url)} on {len(gpus)} x "
            f"{printable(info['name'], 80)} (sm_{printable(info['arch'], 8)}, driver "
            f"{printable(info.get('driver_version', info.get('driver', '?')), 40)})",
            file=sys.stderr,
        )
        run_on_gpus(spec, gpus, infos, workers=workers, pool=pool)
        return _retime_and_print(spec, workers[0], args)


def _tune_suite(args: argparse.Namespace) -> int:
    """``tune --suite FILE``: every problem of the suite through the same path as one ``tune``; finished
    studies (trial target reached, winner re-timed) are skipped, so rerunning the command resumes."""
    from ..run import RunSpec, tune_suite
    from ..study import load_suite, suite_storage

    if args.study:
        raise UsageError("--study names one study; with --suite every problem gets its default study name")
    tune_settings(args, args.trials)  # bad options fail before anything else
    suite = load_suite(args.suite)
    base = RunSpec(
        family=suite.family,
        problem=suite.problems[0],
        storage_url=suite_storage(suite, args.storage),
        sampler=args.sampler,
        seed=args.seed,
        settings=tune_settings(args, args.trials),
        noise_floor=noise_floor(args),
    )
    _validate_early(base)
    gpus = _gpus.parse(args.gpus)
    tune_suite(suite, base, gpus, _gpus.infos(gpus), top_k=args.top_k, rounds=args.rounds, on_done=_print_winner)
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    from ..run import compile_processes, join_study, run_on_gpus

    spec = join_study(args.storage, args.study, n_trials=args.trials, settings=tune_settings(args, args.trials))
    gpus = _gpus.parse(args.gpus)
    with compile_processes(spec.settings) as pool, _gpus.open_all(gpus) as (workers, infos):
        run_on_gpus(spec, gpus, infos, workers=workers, pool=pool)
        if args.top_k > 0:
            return _retime_and_print(spec, workers[0], args)
    return 0


def _validate_early(spec):
    """Check what needs no GPU before starting one, so bad input fails fast and touches nothing (the study
    database is created once a GPU is found)."""
    from ..search import check_search
    from ..space import available_families, load_space
    from ..study import check_storage

    if spec.family == AUTO_FAMILY:  # the GPU decides among the families that support the problem
        fits = [s for s in map(load_space, available_families()) if s.supports(spec.problem) is None]
        if not fits:
            raise UsageError(
                f"--family auto: no kernel family supports head dim {spec.problem.head_dim} {spec.problem.dtype}; pass --family"
            )
        space = fits[0]
    else:
        space = load_space(spec.family)
    unsupported = space.supports(spec.problem)
    if unsupported:
        raise UsageError(unsupported)
    check_search(spec.sampler, space)
    check_storage(spec.storage_url)
    return space


def _retime_and_print(spec, worker, args: argparse.Namespace) -> int:
    from ..run import retime_winner

    study = retime_winner(
        spec, worker.device, top_k=args.top_k, rounds=args.rounds, worker=worker, noise_floor=noise_floor(args)
    )
    return _print_best(study, as_json=False)


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
    if chosen.beats_default is False:  # the re-timing kept the default: say so, with the margin
        head = f"the default config, {tflops} TFLOPS{trial}: {chosen.verdict}"
    elif chosen.verdict:
        head = f"{tflops} TFLOPS, {chosen.verdict}{trial}"
    else:  # a best trial, or a winner re-timed before winners were compared with a margin
        head = f"{tflops} TFLOPS" + (f", {speedup:.2f}x the default config" if speedup else "") + trial
    print(f"best of {printable(chosen.study_name, 200)} ({printable(chosen.source, 80)}): {head}")
    for name, value in chosen.config.items():
        print(f"  {name} = {value}")
    return 0


def _print_winner(study) -> None:
    """What a suite prints for each study it finished (module level: a suite's GPU processes pickle it)."""
    _print_best(study, as_json=False)


def _suite_storage(args: argparse.Namespace):
    """(suite or None, storage URL): ``--suite``'s storage unless ``--storage`` names another."""
    from ..study import load_suite, suite_storage

    suite = load_suite(args.suite) if args.suite else None
    return suite, suite_storage(suite, args.storage)


def cmd_best(args: argparse.Namespace) -> int:
    from ..study import load_flashtune_study, mask_url, open_storage, select_studies

    if not args.study and not args.suite:
        raise UsageError("say which study: --study NAME, or --suite FILE for every study of a suite")
    suite, url = _suite_storage(args)
    storage = open_storage(url, create=False)
    if args.study:
        return _print_best(load_flashtune_study(storage, args.study, url, suite_path=args.suite), as_json=args.json)
    names = select_studies(storage, suite=suite)
    if not names:
        raise UsageError(
            f"no study of suite {printable(suite.name, 80)} in {mask_url(url)}; "
            f"`flashtune tune --suite {printable(args.suite, 200)}` makes them"
        )
    studies = [load_flashtune_study(storage, name, url, suite_path=args.suite) for name in names]
    if args.json:
        from ..study import choose

        print(json.dumps([choose(s).to_dict() for s in studies], indent=2, allow_nan=False))
        return 0
    for study in studies:
        _print_best(study, as_json=False)
    return 0


def cmd_studies(args: argparse.Namespace) -> int:
    from ..study import describe, describe_problem, mask_url, open_storage, suite_studies

    suite, url = _suite_storage(args)
    storage = open_storage(url, create=False)
    rows = describe(storage)
    untuned = []
    if suite is not None:
        entries = suite_studies(storage, suite)
        names = {name for e in entries for name in e.studies}
        rows = [r for r in rows if r.name in names]
        untuned = [describe_problem(e.problem) for e in entries if not e.studies]
    if not rows:
        if suite is not None:
            raise UsageError(
                f"no study of suite {printable(suite.name, 80)} in {mask_url(url)}; "
                f"`flashtune tune --suite {printable(args.suite, 200)}` makes them"
            )
        raise UsageError(f"no flashtune studies in {mask_url(url)}; `flashtune tune` creates one")
    print(f"{'study':<64} {'trials':>6} {'ok':>4} {'best TFLOPS':>11} {'retimed':>8}  gpu")
    for r in rows:
        best = f"{r.best_tflops:.1f}" if r.best_tflops is not None else "-"
        won = f"{r.winner_tflops:.1f}" if r.winner_tflops is not None else "-"
        print(
            f"{printable(r.name, None):<64} {r.trials:>6} {r.complete:>4} {best:>11} {won:>8}  {printable(r.gpu, 80)}"
        )
    for problem in untuned:
        print(f"(no study yet) {problem}")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from ..compile import check_space
    from ..space import load_space

    check_seed(args.seed)
    problem = Problem(batch=1, seqlen_q=1, heads_q=1, head_dim=args.head_dim, dtype=args.dtype, causal=args.causal)
    args.family = resolve_family(args, [problem])
    arch = args.arch if args.arch is not None else load_space(args.family).family.min_arch
    device = limits_for_arch(arch)
    report = check_space(
        args.family, problem, device, samples=args.samples, jobs=args.jobs, seed=args.seed, out=sys.stdout
    )
    return 0 if report.ok else 1


def cmd_replay(args: argparse.Namespace) -> int:
    from ..compile import MAX_JOBS
    from ..run import format_table, load_oracle, replay, summarize
    from ..study import open_storage

    samplers = [s.strip() for s in args.samplers.split(",")]
    if not all(samplers):
        raise UsageError(f"--samplers {printable(args.samplers, 80)!r} names an empty sampler; give e.g. pattern,tpe")
    if len(set(samplers)) != len(samplers):
        raise UsageError(f"--samplers {printable(args.samplers, 80)!r} names a sampler twice; name each once")
    if args.seeds < 1 or args.budget < 1 or args.window < 1 or args.jobs < 1:
        raise UsageError("--seeds, --budget, --window and --jobs must be at least 1")
    for flag, value, most in (
        ("--jobs", args.jobs, MAX_JOBS),
        ("--seeds", args.seeds, 100_000),
        ("--budget", args.budget, 1_000_000),
        ("--window", args.window, 1000),
    ):
        if value > most:
            raise UsageError(f"{flag} must be at most {most}, not {value}")
    oracle = load_oracle(open_storage(args.storage, create=False), args.study, args.space, storage_url=args.storage)
    with Progress(len(samplers) * args.seeds, desc="replay", unit="run") as shown:

        def progress(run) -> None:
            shown.update(1, f"last {run.sampler} seed {run.seed}")
            log.debug("replayed %s seed %s", run.sampler, run.seed)

        runs = replay(
            oracle, samplers, range(args.seeds), args.budget, window=args.window, jobs=args.jobs, progress=progress
        )
    rows = summarize(oracle, runs)
    if args.json:
        print(
            json.dumps(
                {
                    "study": args.study,
                    "best_tflops": oracle.best,
                    "budget": args.budget,
                    "window": args.window,
                    "rows": rows,
                },
                indent=1,
                default=str,
            )
        )
    else:
        print(format_table(oracle, rows, args.budget), end="")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from ..export import collect_dispatch, export_study
    from ..files import check_output_path, is_stream, write_text

    json_path = None
    if args.output:
        check_output_path(args.output)
        if args.dispatch and args.output.endswith(".json"):
            raise UsageError(f"-o {args.output}: -o names the header; its JSON is written beside it (name.json)")
        if args.dispatch and not is_stream(args.output):  # the tables for tuner.attention(config="auto", tuned=...)
            json_path = check_output_path(check_output_path(args.output).with_suffix(".json"))
    guard(args, args.output, json_path)
    if args.dispatch:
        if not args.study and not args.suite:
            raise UsageError("--dispatch needs --study PATTERN (a glob over study names) and/or --suite FILE")
        selection = collect_dispatch(args.storage, pattern=args.study, suite_path=args.suite)
        text = selection.header()
        if json_path is not None:
            print(f"wrote {printable(write_text(selection.json(), json_path), 200)}", file=sys.stderr)
    elif args.suite or not args.study:
        raise UsageError(
            "export one study with --study NAME, or several with --dispatch (--study PATTERN, --suite FILE)"
        )
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
    guard(args, args.output)
    text, stem = build_report(args.storage, study=args.study, suite_path=args.suite)
    path = write_text(text, args.output or f"{stem}.html")
    print(
        f"wrote {printable(path, 200)} ({len(text) // 1024} KiB): open it in a browser, no server needed",
        file=sys.stderr,
    )
    return 0
