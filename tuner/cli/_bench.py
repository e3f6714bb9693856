"""``flashtune bench``: one config, a study's winner, every study of a suite (``--suite``), or the host
cost of a call (``--api``), each against PyTorch's attention."""

from __future__ import annotations

import argparse
import json
import sys

from ..errors import UsageError
from ..run import default_compile_workers
from ..text import printable
from . import _gpus
from ._args import explicit_problem_flags, parse_config, problem_from, resolve_family
from ._outputs import guard

__all__ = ["cmd_bench"]


def cmd_bench(args: argparse.Namespace) -> int:
    from ..bench import run_bench, study_for_bench
    from ..devices import DeviceLimits
    from ..progress import log
    from ..space import AUTO_FAMILY, complete, load_space

    if args.api:
        return _bench_api(args)
    if args.suite:
        return _bench_suite(args)
    if args.tuned:
        raise UsageError("--tuned goes with --api --config auto")
    if args.ablate or args.output or args.rounds is not None:
        raise UsageError("--ablate, --output and --rounds go with --suite")
    if args.study:
        if args.config:
            raise UsageError("--study times the study's winner; drop --config (or --study, to time a config)")
        explicit = explicit_problem_flags(args)
        if explicit:
            raise UsageError(f"--study times the study's own problem and family; drop {' '.join(explicit)}")
        family, problem, config = study_for_bench(args.study, args.storage)
        print(f"study {printable(args.study, 200)}: its winner on its own problem", file=sys.stderr)
    else:
        family, problem, config = args.family, problem_from(args), parse_config(args.config)
        _check_config_early(family, problem, config)
    worker, info = _gpus.start_worker(args.gpu)
    with worker:
        if not args.study:
            family = resolve_family(args, [problem], arch=int(info["arch"])) if family == AUTO_FAMILY else family
            completion = complete(load_space(family), config, problem, DeviceLimits.from_info(info))
            if completion.note:
                log.info(completion.note)
            config = completion.config
        run_bench(worker, info, family, problem, config=config, out=sys.stdout)
    return 0


def _bench_api(args: argparse.Namespace) -> int:
    """``bench --api``: host time per call and eager vs kernel TFLOPS of tuner.attention, its op and SDPA."""
    from pathlib import Path

    from ..bench import DEFAULT_SHAPES, run_api_bench

    if args.suite or args.study or args.ablate or args.output:
        raise UsageError(
            "--api times tuner.attention in this process on its own shapes; drop --suite, --study, --ablate and -o"
        )
    shape_flags = [f for f in explicit_problem_flags(args) if f != "--family"]
    problems = [problem_from(args)] if shape_flags else list(DEFAULT_SHAPES)
    config = args.config
    if config and config != "auto" and not (config.endswith(".h") or Path(config).is_file()):
        config = parse_config(config)
    if (config == "auto") != bool(args.tuned):
        raise UsageError("--config auto and --tuned (a dispatch .json, suite file or storage URL) go together")
    run_api_bench(
        problems, family=args.family, config=config or None, tuned=args.tuned, device=args.gpu, out=sys.stdout
    )
    return 0


def _bench_suite(args: argparse.Namespace) -> int:
    """``bench --suite FILE``: each study's winner against the peers, as a Markdown table (and JSON)."""
    from ..bench import ROUNDS, bench_suite, markdown_table
    from ..files import check_output_path, is_stream, write_text
    from ..study import load_suite, suite_storage

    if args.study or args.config:
        raise UsageError("with --suite every problem's config comes from its study; drop --study/--config")
    json_out = None
    if args.output:
        out = check_output_path(args.output)  # before the GPU run, not after it
        if out.suffix == ".json":
            raise UsageError(
                f"-o {printable(out, 160)}: the table is Markdown (the JSON goes beside it); give a .md name"
            )
        if not is_stream(out):  # /dev/stdout or a pipe: the table only
            json_out = check_output_path(out.with_suffix(".json"))
        guard(args, out, json_out)
    suite = load_suite(args.suite)
    storage_url = suite_storage(suite, args.storage)
    worker, info = _gpus.start_worker(args.gpu)
    with worker:
        rows = bench_suite(
            worker,
            info,
            suite,
            storage_url,
            ablate=args.ablate,
            log=sys.stderr,
            compile_workers=default_compile_workers(),
            rounds=ROUNDS if args.rounds is None else args.rounds,
        )
    table = markdown_table(rows, info, suite, storage_url)
    if args.output:
        write_text(table, out)
        if json_out is not None:
            write_text(json.dumps({"gpu": info, "rows": [r.to_dict() for r in rows]}, indent=1), json_out)
        print(
            f"wrote {printable(out, 200)}" + (f" and {printable(json_out, 200)}" if json_out else ""), file=sys.stderr
        )
    else:
        print(table, end="")
    return 0 if any(r.tflops for r in rows) else 1


def _check_config_early(family: str, problem, config) -> None:
    """``--config`` checked before a GPU starts: its knobs and values, and the checks they fail whatever the
    other knobs and the GPU (:func:`tuner.space.conflicts`); against the family, or for ``auto`` (which waits for the
    GPU's arch) against each family that supports the problem, refused only where none takes it."""
    from ..space import AUTO_FAMILY, ConfigError, SpaceError, available_families, load_space
    from ..space import conflicts as space_conflicts

    names = [family] if family != AUTO_FAMILY else available_families()
    spaces = [s for s in map(load_space, names) if family != AUTO_FAMILY or s.supports(problem) is None]
    errors = []
    for space in spaces:
        try:
            conflicts = space_conflicts(space, config, problem)
        except (ConfigError, SpaceError) as e:  # an unknown knob or value is a ConfigError
            errors.append(e)
            continue
        if not conflicts:
            return
        given = ", ".join(f"{k}={v}" for k, v in config.items())
        errors.append(
            ConfigError(f"{space.name}: --config {given} cannot run {problem.slug()}: {'; '.join(conflicts)}")
        )
    if len(errors) == 1:
        raise errors[0]
    if errors:  # family auto: no family takes it, each for its reason
        raise ConfigError(f"--config fits no family that supports {problem.slug()}: {' | '.join(map(str, errors))}")
