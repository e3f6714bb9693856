"""The ``flashtune`` argument parser: the subcommands, their options, and the checks of option values.

Each subcommand has a function that adds its options (``_add_tune``, ...); the groups several
share (the problem, the storage, the run options) are added by one function each.
"""

from __future__ import annotations

import argparse

from .._version import __version__
from ..bench import ROUNDS as BENCH_ROUNDS
from ..devices import KNOWN_ARCHS
from ..problem import DTYPES
from ..run import DEFAULT_NOISE_FLOOR, DEFAULT_ROUNDS, default_compile_workers
from ..text import printable
from ._bench import cmd_bench
from ._commands import cmd_best, cmd_check, cmd_export, cmd_replay, cmd_report, cmd_studies, cmd_tune, cmd_worker

__all__ = ["MAX_STUDY_NAME", "build_parser"]


MAX_STUDY_NAME = 512  # Optuna's limit on a study name (a longer one is no study anywhere)


class _Parser(argparse.ArgumentParser):
    """argparse with its errors as one line (``flashtune tune: error: ...; see --help``), not usage + error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {printable(message, 500)}; see `{self.prog} --help`\n")


# -- option types: each refuses a bad value with one line naming the option ----------------------
def _study_name(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("a study name must not be empty (leave --study out for the default name)")
    if len(text) > MAX_STUDY_NAME:
        raise argparse.ArgumentTypeError(f"a study name has at most {MAX_STUDY_NAME} characters, this one {len(text)}")
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
        raise argparse.ArgumentTypeError(
            f"expected 'all' or a number of configs, not {printable(text, 40)!r}"
        ) from None
    if value < 1:  # 0 is no number of configs to compile ('all' says every one)
        raise argparse.ArgumentTypeError(f"expected 'all' or a positive number of configs, not {value}")
    return value


def _rounds(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a number of rounds (1, 2, ...), not {printable(text, 40)!r}"
        ) from None
    if not 1 <= value <= 100:
        raise argparse.ArgumentTypeError(f"expected 1 to 100 rounds, not {value}")
    return value


def _gpu_index(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a device index (0, 1, ...), not {printable(text, 40)!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a device index (0, 1, ...), not {value}")
    return value


# -- options several subcommands share -------------------------------------------------------
def _family_help() -> str:
    from ..space import available_families

    families = ", ".join(available_families()) or "none installed"
    return (
        f"kernel family: auto, {families} (search_spaces/<family>.toml, or a space file's path); default "
        '%(default)s (auto: the most specialised family that runs on the GPU, README "Kernel families")'
    )


def _add_problem(p: argparse.ArgumentParser, *, shape: bool = True, family: str = "auto") -> None:
    g = p.add_argument_group("problem")
    actions = [
        g.add_argument("--family", default=family, help=_family_help()),
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
            g.add_argument(
                "--kv-heads", type=int, default=None, help="key/value heads, dividing --heads (default: --heads)"
            ),
        ]
    p.set_defaults(problem_flags=tuple((a.option_strings[0], a.dest, a.default) for a in actions))


def _add_storage(p: argparse.ArgumentParser) -> None:
    from ..study import DEFAULT_STORAGE

    p.add_argument(
        "--storage",
        default=DEFAULT_STORAGE,
        type=_storage_url,
        help="SQLAlchemy URL of the study database (default %(default)s)",
    )


def _add_suite_lookup(p: argparse.ArgumentParser, what: str) -> None:
    """``--suite FILE`` on a command that reads studies: the suite's storage and its studies."""
    p.add_argument("--suite", help=what)


def _add_run_options(p: argparse.ArgumentParser, *, top_k: int = 5) -> None:
    p.add_argument("--gpus", default="0", help="CUDA devices: 0, 0,1,3 or all; one measuring process each (default 0)")
    p.add_argument(
        "--compile-workers",
        type=int,
        default=default_compile_workers(),
        help="CPU processes compiling ahead, shared by the GPUs (default %(default)s)",
    )
    p.add_argument(
        "--trial-timeout", type=float, default=120.0, help="seconds before a trial counts as hung (default %(default)s)"
    )
    p.add_argument(
        "--top-k",
        type=int,
        default=top_k,
        help="at the end, re-time the best config and those within its noise, at most this many, with the "
        "default (0: no re-timing; default %(default)s)",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=DEFAULT_ROUNDS,
        help="interleaved re-timing rounds, each a paired sample of every config and the default (default %(default)s)",
    )
    p.add_argument(
        "--noise-floor",
        type=float,
        default=100 * DEFAULT_NOISE_FLOOR,
        metavar="PERCENT",
        help="the smallest lead over the default (percent) that makes a re-timed config the winner, however "
        "small the measured noise; else the default is stored (default %(default)g: a measurement's "
        "error between runs)",
    )


# -- the subcommands ----------------------------------------------------------------------------
def _add_tune(sub) -> None:
    """The options of ``flashtune tune``."""
    from ..search import DEFAULT_SEARCH, SEARCHES

    p = sub.add_parser("tune", help="run (or resume) a tuning study on a GPU")
    _add_problem(p)
    _add_storage(p)
    p.add_argument("--study", type=_study_name, help="study name (default: derived from family, GPU and problem)")
    p.add_argument(
        "--trials", type=int, default=50, help="evaluated trials the study should hold (default %(default)s)"
    )
    p.add_argument("--timeout", type=float, default=None, help="stop this run after so many seconds")
    p.add_argument(
        "--sampler", default=DEFAULT_SEARCH, choices=sorted(SEARCHES), help="search algorithm (default %(default)s)"
    )
    p.add_argument("--seed", type=int, default=None, help="sampler and input seed")
    _add_run_options(p)
    p.add_argument("--suite", help="tune every problem of a suite file (studies/*.toml) instead; reruns resume")
    _add_model(p)
    p.set_defaults(func=cmd_tune)


def _seqlens(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected lengths such as 1024,4096, not {printable(text, 60)!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive lengths such as 1024,4096, not {printable(text, 60)!r}")
    return values


def _add_model(p: argparse.ArgumentParser) -> None:
    """``tune --model config.json``: a Hugging Face model's attention shapes, tuned as a suite."""
    g = p.add_argument_group("a model's shapes")
    g.add_argument(
        "--model",
        metavar="CONFIG_JSON",
        help="tune the attention of the model this Hugging Face config.json describes (heads, KV heads, head "
        "dim, dtype; --dtype and --causal override it) at --seqlens and --batch, as a suite",
    )
    g.add_argument("--seqlens", type=_seqlens, help="with --model: sequence lengths, e.g. 1024,4096 (default --seqlen)")
    g.add_argument(
        "--model-suite",
        metavar="TOML",
        help="with --model: the suite file to write (default <model>-attention.toml here); rerunning resumes it",
    )


def _add_worker(sub) -> None:
    """The options of ``flashtune worker``."""
    p = sub.add_parser("worker", help="join an existing study from this host (several hosts: a shared PostgreSQL URL)")
    p.add_argument("--study", required=True, type=_study_name, help="the study to join")
    _add_storage(p)
    p.add_argument("--trials", type=int, default=None, help="override the study's trial target")
    p.add_argument("--timeout", type=float, default=None, help="stop this run after so many seconds")
    p.add_argument("--seed", type=int, default=None, help="input seed")
    _add_run_options(p, top_k=0)
    p.set_defaults(func=cmd_worker)


def _add_best(sub) -> None:
    """The options of ``flashtune best``."""
    p = sub.add_parser("best", help="print the best config of a study (or of every study of a suite)")
    p.add_argument("--study", type=_study_name, help="the study (with --suite: one of the suite's)")
    _add_suite_lookup(p, "every study of this suite file, in its storage (unless --storage is given)")
    _add_storage(p)
    p.add_argument("--json", action="store_true", help="machine-readable output (JSON, no NaN or infinity)")
    p.set_defaults(func=cmd_best)


def _add_studies(sub) -> None:
    """The options of ``flashtune studies``."""
    p = sub.add_parser("studies", help="list the studies in a storage (or of a suite) with their best TFLOPS")
    _add_suite_lookup(p, "only the studies of this suite file, in its storage (unless --storage is given)")
    _add_storage(p)
    p.set_defaults(func=cmd_studies)


def _add_check(sub) -> None:
    """The options of ``flashtune check``."""
    p = sub.add_parser("check", help="compile a space without a GPU: static feasibility and ptxas resources")
    _add_problem(p, shape=False, family="sm80")  # no GPU needed: the portable family
    p.add_argument(
        "--arch",
        type=int,
        default=None,
        choices=KNOWN_ARCHS,
        help="compute capability x10 (default: the family's oldest, 80 for sm80, 90 for sm90)",
    )
    p.add_argument(
        "--samples",
        type=_samples,
        default=None,
        help="compile N feasible configs, the default among them (default 32: about a minute on two "
        "cores); 'all': every feasible config of a space small enough to enumerate (sm80: 552 "
        "at d128, about 17 minutes on two cores)",
    )
    p.add_argument(
        "--jobs", type=int, default=default_compile_workers(), help="parallel compiles (default %(default)s)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the random draws (default %(default)s)")
    p.set_defaults(func=cmd_check)


def _add_bench(sub) -> None:
    """The options of ``flashtune bench``."""
    p = sub.add_parser("bench", help="time one config against PyTorch SDPA backends in one run")
    _add_problem(p)
    _add_storage(p)
    p.add_argument(
        "--config",
        help="knob values, e.g. block_m=128,block_n=64 (others: their defaults, or where those cannot run beside "
        "the given ones the nearest that do, said on stderr); with --api also a header path or 'auto'",
    )
    p.add_argument("--study", type=_study_name, help="take the config from this study's winner instead")
    p.add_argument("--suite", help="every problem of a suite file: its study's winner against the peers, as a table")
    p.add_argument(
        "--ablate",
        action="store_true",
        help="with --suite: also time each winner with each tuned knob put back to its default",
    )
    p.add_argument("-o", "--output", type=_output, help="with --suite: Markdown file to write (and a .json beside it)")
    p.add_argument(
        "--rounds",
        type=_rounds,
        help="with --suite: interleaved rounds of the winner, the default and the peers per problem; each figure "
        f"is the median (default {BENCH_ROUNDS})",
    )
    p.add_argument(
        "--api",
        action="store_true",
        help="host us per call of tuner.attention, its torch op and SDPA, and eager vs kernel TFLOPS, on a "
        "few shapes (or the one the problem flags give); needs PyTorch",
    )
    p.add_argument("--tuned", help="with --api --config auto: a dispatch .json, suite file or storage URL")
    p.add_argument("--gpu", type=_gpu_index, default=0, help="CUDA device index (default %(default)s)")
    p.set_defaults(func=cmd_bench)


def _add_replay(sub) -> None:
    """The options of ``flashtune replay``."""
    from ..search import SEARCHES

    p = sub.add_parser(
        "replay",
        help="replay tuning runs against a stored exhaustive study (no GPU): "
        "evaluations each sampler needs to come near the best",
    )
    p.add_argument("--study", required=True, help="a study that holds every feasible config (a --sampler grid sweep)")
    _add_storage(p)
    p.add_argument("--space", help="the space file the study was measured with, if not search_spaces/<family>.toml")
    p.add_argument(
        "--samplers",
        default="pattern,tpe,random,grid",
        help="comma-separated, of: "
        + ", ".join(SEARCHES)
        + " (default %(default)s; grid replays a random order of the feasible configs)",
    )
    p.add_argument("--seeds", type=int, default=20, help="runs per sampler (default %(default)s)")
    p.add_argument("--budget", type=int, default=100, help="evaluations per run (default %(default)s)")
    p.add_argument(
        "--window",
        type=int,
        default=1,
        help="configs in flight at once, as with compile-ahead (default %(default)s: each result is "
        "known before the next proposal)",
    )
    p.add_argument("--jobs", type=int, default=default_compile_workers(), help="parallel runs (default %(default)s)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_replay)


def _add_export(sub) -> None:
    """The options of ``flashtune export``."""
    p = sub.add_parser(
        "export", help="write a study's best config as a C/C++ header, or a dispatch header over studies"
    )
    p.add_argument(
        "--study", type=_study_name, help="the study; with --dispatch a glob over study names (e.g. 'sm80-*')"
    )
    p.add_argument(
        "--dispatch",
        action="store_true",
        help="one C++17 header that selects a config per shape (with -o, and a .json beside it for "
        "tuner.attention(config='auto'))",
    )
    p.add_argument("--suite", help="with --dispatch: the studies of this suite file (studies/*.toml)")
    _add_storage(p)
    p.add_argument("-o", "--output", type=_output, help="header file to write (default: standard output)")
    p.set_defaults(func=cmd_export)


def _add_report(sub) -> None:
    """The options of ``flashtune report``."""
    p = sub.add_parser("report", help="write a self-contained HTML report of a study (and of a suite)")
    p.add_argument("--study", type=_study_name, help="the study to report on")
    p.add_argument("--suite", help="add a page comparing the winning configs across the shapes of this suite")
    _add_storage(p)
    p.add_argument("-o", "--output", type=_output, help="HTML file to write (default: <study or suite>.html)")
    p.set_defaults(func=cmd_report)


def build_parser() -> argparse.ArgumentParser:
    """The ``flashtune`` parser: one subcommand each, its options, and the function that runs it (``func``)."""
    parser = _Parser(prog="flashtune", description="Autotune FlashAttention forward kernels.")
    parser.add_argument("--version", action="version", version=f"flashtune {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_tune(sub)
    _add_worker(sub)
    _add_best(sub)
    _add_studies(sub)
    _add_check(sub)
    _add_bench(sub)
    _add_replay(sub)
    _add_export(sub)
    _add_report(sub)
    _add_kernels(sub)
    for command in sub.choices.values():
        _add_verbosity(command)
    return parser


def _add_kernels(sub) -> None:
    """``--kernels DIR`` (repeatable) on every command that names a family (``--family``) or a study (whose
    family may live in the user's kernel directory): searched before the package, and before
    ``$FLASHTUNE_KERNELS``."""
    for p in sub.choices.values():
        if any(a.dest in ("family", "study") for a in p._actions):
            p.add_argument(
                "--kernels",
                action="append",
                metavar="DIR",
                help="a kernel directory of your own (space files <family>.toml and their sources), searched "
                "for families before the package; repeatable; also $FLASHTUNE_KERNELS (a path list)",
            )


def _add_verbosity(p: argparse.ArgumentParser) -> None:
    """``-v``/``-q`` (each may repeat) on every subcommand: see :func:`tuner.progress.configure_logging`."""
    p.add_argument(
        "-v", "--verbose", action="count", default=0, help="say more: -v each trial and run, -vv Optuna's log too"
    )
    p.add_argument(
        "-q", "--quiet", action="count", default=0, help="say less: -q no progress or information, -qq errors only"
    )
