"""What the commands read from their parsed options: a problem, a config, tuning settings, checked."""

from __future__ import annotations

import argparse
import math

from ..errors import UsageError
from ..problem import Problem
from ..text import printable

__all__ = [
    "MAX_SEED",
    "check_printable_name",
    "check_seed",
    "explicit_problem_flags",
    "noise_floor",
    "parse_config",
    "problem_from",
    "resolve_family",
    "tune_settings",
]


MAX_SEED = 2**32 - 1  # numpy's and Optuna's samplers take seeds below 2**32
MAX_SECONDS = 1e7  # the longest --timeout or --trial-timeout (about 16 weeks)


def problem_from(args: argparse.Namespace) -> Problem:
    return Problem(
        batch=args.batch,
        seqlen_q=args.seqlen,
        seqlen_k=args.seqlen_k,
        heads_q=args.heads,
        heads_kv=args.kv_heads,
        head_dim=args.head_dim,
        dtype=args.dtype,
        causal=args.causal,
    )


def explicit_problem_flags(args: argparse.Namespace) -> list[str]:
    """The problem flags (``_add_problem``) given on the command line: those that differ from their defaults."""
    return [flag for flag, dest, default in args.problem_flags if getattr(args, dest) != default]


def parse_config(text: str | None) -> dict[str, int]:
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


def check_seed(seed: int | None) -> None:
    if seed is not None and not 0 <= seed <= MAX_SEED:
        raise UsageError(f"--seed must be from 0 to {MAX_SEED}, not {seed}")


def noise_floor(args: argparse.Namespace) -> float:
    """``--noise-floor`` (percent) as the fraction the re-timing takes."""
    value = args.noise_floor
    if not math.isfinite(value) or not 0 <= value < 100:
        raise UsageError(f"--noise-floor is a percentage from 0 to below 100, not {value:g}")
    return value / 100


def check_printable_name(name: str) -> None:
    """A study name this command would create: printable (it reaches terminals, file names and headers)."""
    if not name.isprintable():
        raise UsageError(f"study name {printable(name, 120)!r} holds control characters; choose a printable name")


def tune_settings(args: argparse.Namespace, n_trials: int | None):
    from ..gpu import MeasureSettings
    from ..run import TuneSettings

    if n_trials is not None and n_trials <= 0:
        raise UsageError("--trials must be positive")
    for flag, value, least in (
        ("--compile-workers", args.compile_workers, 1),
        ("--rounds", args.rounds, 1),
        ("--top-k", args.top_k, 0),
    ):
        if value < least:
            raise UsageError(f"{flag} must be at least {least}, not {value}")
    from ..compile import MAX_JOBS

    for flag, value, most in (
        ("--compile-workers", args.compile_workers, MAX_JOBS),
        ("--rounds", args.rounds, 1000),
        ("--top-k", args.top_k, 1000),
    ):
        if value > most:
            raise UsageError(f"{flag} must be at most {most}, not {value}")
    # a trial needs a compile and a measurement (seconds); a run's timeout is waited on as a thread's
    # timeout is, which overflows past about 9e9 s
    for flag, value, least in (("--timeout", args.timeout, 1.0), ("--trial-timeout", args.trial_timeout, 1.0)):
        if value is not None and (not math.isfinite(value) or not least <= value <= MAX_SECONDS):
            raise UsageError(f"{flag} must be from {least:g} to {MAX_SECONDS:g} seconds, not {value:g}")
    check_seed(args.seed)
    if hasattr(args, "noise_floor"):
        noise_floor(args)
    return TuneSettings(
        n_trials=n_trials,
        timeout_s=args.timeout,
        compile_workers=args.compile_workers,
        trial_timeout_s=args.trial_timeout,
        measure=MeasureSettings(seed=args.seed or 0),
    )


def resolve_family(args: argparse.Namespace, problems, *, gpu: int | None = None, arch: int | None = None) -> str:
    """``--family``, or for ``auto`` the family the rule picks (:func:`tuner.space.choose_family`, README
    "Kernel families") for ``arch``, else ``--arch`` where the command has one, else GPU ``gpu`` (default 0)
    as its driver reports it: the most specialised family that runs there and supports every problem."""
    from ..space import AUTO_FAMILY, rank_families

    if args.family != AUTO_FAMILY:
        return args.family
    arch = arch if arch is not None else getattr(args, "arch", None)
    if arch is None:
        from . import _gpus

        arch = int(_gpus.infos([gpu or 0])[0]["arch"])
    ranked = [s for s in rank_families(arch) if all(s.supports(p) is None for p in problems)]
    if not ranked:
        shapes = ", ".join(f"head dim {p.head_dim} {p.dtype}" for p in problems[:3])
        raise UsageError(f"--family auto: no kernel family runs {shapes} on sm_{arch}; pass --family NAME")
    return ranked[0].name
