"""Knob spaces: the one declaration of a kernel family's knobs, derived values and constraints.

A space file (``search_spaces/<family>.toml``, format in ``search_spaces/README.md``) is
loaded and checked here; everything else (distributions, ``-D`` flags, feasibility,
launch geometry, exported headers) is computed from the :class:`Space` it becomes.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..devices import KNOWN_ARCHS, DeviceLimits
from ..errors import FlashtuneError
from ..files import FileContentError, read_limited, read_toml
from ..paths import KERNEL_SRC, SEARCH_SPACES
from ..problem import DTYPES, Problem
from ..text import printable
from ._expr import Expr, ExprError, compile_expr

__all__ = [
    "KERNELS_ENV",
    "Completion",
    "Config",
    "ConfigError",
    "Constraint",
    "Derived",
    "Family",
    "Knob",
    "LaunchGeometry",
    "Space",
    "SpaceError",
    "available_families",
    "config_key",
    "kernel_dirs",
    "load_space",
]

Config = dict[str, int]

PROBLEM_NAMES = frozenset(Problem(batch=1, seqlen_q=1, heads_q=1, head_dim=64).env())
DEVICE_NAMES = frozenset(DeviceLimits(arch=80, smem_per_block_optin=0, num_sms=1).env())
PROBLEM_MACROS = frozenset(Problem(batch=1, seqlen_q=1, heads_q=1, head_dim=64).macros())
DEVICE_MACROS = frozenset(DeviceLimits(arch=80, smem_per_block_optin=0, num_sms=1).macros())

# every identifier a space file gives is matched whole (re.fullmatch: "$" would accept a trailing newline)
_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")
_MACRO = re.compile(r"FT_[A-Z0-9_]{1,60}")
_C_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_ARCH_SUFFIX = re.compile(r"[a-z]{0,2}")
_SOURCE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*(/[A-Za-z0-9_][A-Za-z0-9_.\-]*)*")  # relative, no "..", no spaces
_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"\n]+)"', re.MULTILINE)
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)
_MACRO_TOKEN = re.compile(r"\bFT_[A-Z0-9_]+\b")

#: limits of a CUDA launch (CUDA programming guide, "Features and Technical Specifications")
MAX_GRID = (2**31 - 1, 65535, 65535)
MAX_THREADS_PER_BLOCK = 1024
MAX_KNOB_VALUE = 2**31 - 1  # knob values become C ``int``s

#: the environment variable naming kernel directories (a path list, like PATH), searched before the package
KERNELS_ENV = "FLASHTUNE_KERNELS"
MAX_SOURCE_BYTES = 1 << 20  # one kernel source file
MAX_SOURCE_FILES = 256  # files a family's source and config header include, all together
#: kernel directories given as ``kernels=`` in this process: a space file in one, loaded later by its path
#: (a launch plan, a compile), has its sources there too
_NAMED_DIRS: set[Path] = set()


class SpaceError(FlashtuneError, ValueError):
    """A space file is malformed or inconsistent. The message names the file and the entry."""


class ConfigError(FlashtuneError, ValueError):
    """A config names an unknown knob, misses one, or has a value the space does not allow."""


@dataclass(frozen=True)
class Knob:
    name: str
    macro: str
    values: tuple[int, ...]
    default: int
    help: str
    head_dim_defaults: tuple[tuple[int, int], ...] = ()  # (head_dim, default) where the plain default does not fit
    ordered: bool = True  # values are searched as steps in the listed order (block sizes, budgets); False: categories
    arch_defaults: tuple[tuple[int, int], ...] = ()  # (arch, default) for devices of that arch or newer, ascending

    def default_for(self, head_dim: int | None = None, arch: int | None = None) -> int:
        """The default for problems of ``head_dim`` on a device of ``arch`` (None: the plain default).

        An arch default (``default_by_arch``, the highest key at or below ``arch``) wins over a head-dim
        default: it exists because the plain one does not build well on that arch."""
        if arch is not None:
            chosen = [value for since, value in self.arch_defaults if since <= arch]
            if chosen:
                return chosen[-1]
        return dict(self.head_dim_defaults).get(head_dim, self.default)


@dataclass(frozen=True)
class Derived:
    name: str
    expr: Expr
    macro: str | None
    help: str


@dataclass(frozen=True)
class Constraint:
    name: str
    expr: Expr
    message: str


@dataclass(frozen=True)
class DefaultRule:
    """``[[defaults]]``: where ``when`` holds, these knobs default to these values instead. Rules apply in file
    order (a later one wins a knob both set); ``when`` reads the problem, the device, and the knobs and derived
    values of the config the earlier rules left (``reads_config``), e.g. the work units of its tile."""

    when: Expr
    values: tuple[tuple[str, int], ...]
    help: str
    reads_config: bool = False


@dataclass(frozen=True)
class Completion:
    """A partial config made whole (:func:`tuner.space.complete`): every knob, and the defaults it had to move."""

    config: Config
    moved: tuple[tuple[str, int, int], ...] = ()  # (knob, its default, the value taken), in knob order
    note: str = ""  # one line: which defaults were moved and why ("" when none was)


@dataclass(frozen=True)
class Family:
    name: str
    description: str
    source: str
    config_header: str
    entry: str
    abi: str
    min_arch: int
    arch_suffix: str
    head_dims: tuple[int, ...]
    dtypes: tuple[str, ...]


@dataclass(frozen=True)
class LaunchGeometry:
    grid: tuple[int, int, int]
    threads: int
    smem_bytes: int
    abi: dict[str, int] = field(default_factory=dict)  # values the family's argument builder reads ([launch.abi])


@dataclass(frozen=True)
class Space:
    family: Family
    knobs: tuple[Knob, ...]
    derived: tuple[Derived, ...]
    constraints: tuple[Constraint, ...]
    launch_threads: Expr
    launch_smem_bytes: Expr
    launch_grid: tuple[Expr, Expr, Expr]
    path: Path
    launch_abi: tuple[tuple[str, Expr], ...] = ()
    root: Path = KERNEL_SRC  # the kernel directory the family's sources are relative to (also nvcc's -I)
    default_rules: tuple[DefaultRule, ...] = ()
    _by_name: dict[str, Knob] = field(default_factory=dict, repr=False, compare=False)
    #: knob and derived name -> the knobs, problem and device fields its value is computed from
    _sources: dict[str, frozenset[str]] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._by_name.update({k.name: k for k in self.knobs})
        self._sources.update({k.name: frozenset({k.name}) for k in self.knobs})
        for d in self.derived:  # each reads only what is declared before it
            self._sources[d.name] = self.reads(d.expr)

    # -- the knobs -------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.family.name

    def knob(self, name: str) -> Knob:
        try:
            return self._by_name[name]
        except KeyError:
            raise ConfigError(f"{self.name}: unknown knob {name!r}; knobs are {', '.join(self._by_name)}") from None

    def defaults(
        self,
        head_dim: int | None = None,
        arch: int | None = None,
        *,
        problem: Problem | None = None,
        device: DeviceLimits | None = None,
    ) -> Config:
        """The default config; for ``head_dim`` and a device of ``arch``, with the space file's
        ``default_by_head_dim`` and ``default_by_arch`` applied. Given a ``problem`` and a ``device``
        (their head dim and arch then), also the ``[[defaults]]`` rules that hold for them: the default
        of that problem on that device, which a study starts from and a winner is compared with."""
        if problem is not None:
            head_dim = problem.head_dim
        if device is not None:
            arch = device.arch
        config = {k.name: k.default_for(head_dim, arch) for k in self.knobs}
        if problem is not None and device is not None and self.default_rules:
            env = {**device.env(), **problem.env()}
            for rule in self.default_rules:
                seen = env
                if rule.reads_config:
                    try:
                        seen = self.environment(config, problem, device)  # the defaults the earlier rules left
                    except (
                        ExprError
                    ):  # they cannot be evaluated for this problem (beyond 64 bits): the rule does not hold
                        continue
                if rule.when(seen):
                    config.update(rule.values)
        return config

    def size(self) -> int:
        """Number of points in the full grid (before constraints)."""
        n = 1
        for k in self.knobs:
            n *= len(k.values)
        return n

    def validate(
        self, config: Mapping[str, Any], *, partial: bool = False, head_dim: int | None = None, arch: int | None = None
    ) -> Config:
        """Return ``config`` as a canonical dict in knob order, or raise :class:`ConfigError`.

        Values read from a database or a command line pass through here before they reach
        C source or a compiler flag. With ``partial`` missing knobs take their defaults (those
        for ``head_dim`` and a device of ``arch`` when given).
        """
        unknown = sorted(set(config) - set(self._by_name))
        if unknown:
            raise ConfigError(
                f"{self.name}: unknown knob(s) {', '.join(unknown)}; knobs are {', '.join(self._by_name)}"
            )
        out: Config = {}
        for k in self.knobs:
            if k.name not in config:
                if not partial:
                    raise ConfigError(f"{self.name}: config has no value for knob {k.name!r}")
                out[k.name] = k.default_for(head_dim, arch)
                continue
            value = config[k.name]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value:
                raise ConfigError(f"{self.name}: knob {k.name} must be an integer, got {value!r}")
            if int(value) not in k.values:
                raise ConfigError(f"{self.name}: knob {k.name}={value!r} is not one of {list(k.values)}")
            out[k.name] = int(value)
        return out

    # -- evaluation ------------------------------------------------------------------------
    def supports(self, problem: Problem) -> str | None:
        """Why this family cannot run ``problem`` at all, or None."""
        if problem.head_dim not in self.family.head_dims:
            return f"{self.name} supports head dims {list(self.family.head_dims)}, not {problem.head_dim}"
        if problem.dtype not in self.family.dtypes:
            return f"{self.name} supports dtypes {list(self.family.dtypes)}, not {problem.dtype}"
        return None

    def environment(self, config: Mapping[str, int], problem: Problem, device: DeviceLimits) -> dict[str, int]:
        """Knobs, problem, device and every derived value, as one name -> int mapping."""
        env = self._given(config, problem, device)
        for d in self.derived:
            env[d.name] = int(d.expr(env))
        return env

    def _given(self, config: Mapping[str, int], problem: Problem, device: DeviceLimits) -> dict[str, int]:
        """Device, problem and knobs, as one name -> int mapping (no derived values)."""
        return {**device.env(), **problem.env(), **self.validate(config)}

    def runs_on(self, arch: int) -> str | None:
        """Why this family cannot run on a device of compute capability ``arch`` (x10), or None.

        A family built with an arch suffix (``90a``: wgmma, setmaxnreg) runs on that arch only.
        """
        if self.family.arch_suffix and arch != self.family.min_arch:
            return (
                f"{self.name} is built for sm_{self.family.min_arch}{self.family.arch_suffix} only "
                f"(arch-specific instructions); the device is sm_{arch}"
            )
        if arch < self.family.min_arch:
            return f"{self.name} needs sm_{self.family.min_arch} or newer, the device is sm_{arch}"
        return None

    def violations(self, config: Mapping[str, int], problem: Problem, device: DeviceLimits) -> list[str]:
        """Every reason ``config`` cannot run ``problem`` on ``device`` (empty when feasible)."""
        return [reason for reason, _ in self.failures(config, problem, device)]

    def failures(
        self, config: Mapping[str, int], problem: Problem, device: DeviceLimits
    ) -> list[tuple[str, frozenset[str]]]:
        """:meth:`violations`, each with the names its check reads (:meth:`reads`): which knobs could mend it.
        The family's problems and archs read nothing (no knob mends them); an expression that cannot be
        evaluated reads every knob."""
        unsupported = self.supports(problem)
        if unsupported:
            return [(unsupported, frozenset())]
        wrong_arch = self.runs_on(device.arch)
        if wrong_arch:
            return [(wrong_arch, frozenset())]
        try:
            env = self.environment(config, problem, device)
            failed = [
                (f"{c.name}: {c.message.format(**env)}", self.reads(c.expr))
                for c in self.constraints
                if not c.expr(env)
            ]
            if failed:
                return failed
            reasons = _launch_violations(self.launch(config, problem, device))
            if not reasons:
                return []
            launch = self.reads(self.launch_threads, self.launch_smem_bytes, *self.launch_grid)
            return [(reason, launch) for reason in reasons]
        except ExprError as e:  # e.g. a value beyond 64 bits for this problem: the config cannot be built
            return [
                (f"cannot evaluate the {self.name} space for this config and problem: {e}", frozenset(self._by_name))
            ]

    def reads(self, *exprs: Expr) -> frozenset[str]:
        """The knobs, problem and device fields that ``exprs`` are computed from (derived values followed)."""
        names: set[str] = set()
        for expr in exprs:
            for name in expr.names:
                names |= self._sources.get(name, {name})
        return frozenset(names)

    def feasible(self, config: Mapping[str, int], problem: Problem, device: DeviceLimits) -> bool:
        """Whether :meth:`check` passes ``config``, without its reasons: it stops at the first constraint that
        fails and computes only the derived values the constraints before it read (a search asks this of
        thousands of configs)."""
        if self.supports(problem) or self.runs_on(device.arch):
            return False
        try:
            env = _LazyEnvironment(self._given(config, problem, device), self.derived)
            if not all(c.expr(env) for c in self.constraints):
                return False
            return not _launch_violations(self.launch(config, problem, device))  # every derived value, as check
        except ExprError:
            return False

    def check(self, config: Mapping[str, int], problem: Problem, device: DeviceLimits) -> str | None:
        """The first reason ``config`` is infeasible, or None."""
        reasons = self.violations(config, problem, device)
        return "; ".join(reasons) if reasons else None

    def macros(self, config: Mapping[str, int], problem: Problem, device: DeviceLimits) -> dict[str, int]:
        """The macros that make this config what it is: problem, knobs, then derived values that name one
        (what an exported header defines). A build also gets the device's: :meth:`build_macros`."""
        env = self.environment(config, problem, device)
        out = dict(problem.macros())
        out.update({k.macro: env[k.name] for k in self.knobs})
        out.update({d.macro: env[d.name] for d in self.derived if d.macro})
        return out

    def build_macros(self, config: Mapping[str, int], problem: Problem, device: DeviceLimits) -> dict[str, int]:
        """Every ``-D`` macro of a build of ``config`` for ``device``: :meth:`macros`, then the device limits
        that the config header checks (``DeviceLimits.macros``: the ones the constraints were checked against)."""
        return {**self.macros(config, problem, device), **device.macros()}

    def launch(self, config: Mapping[str, int], problem: Problem, device: DeviceLimits) -> LaunchGeometry:
        env = self.environment(config, problem, device)
        grid = tuple(int(g(env)) for g in self.launch_grid)
        return LaunchGeometry(
            grid=grid,  # type: ignore[arg-type]
            threads=int(self.launch_threads(env)),
            smem_bytes=int(self.launch_smem_bytes(env)),
            abi={name: int(expr(env)) for name, expr in self.launch_abi},
        )

    def arch_string(self, arch: int) -> str:
        """The nvcc arch (``80``, ``90a``) this family is built for on a device of ``arch``."""
        return f"{arch}{self.family.arch_suffix}"

    @property
    def source_path(self) -> Path:
        return self.root / self.family.source

    @property
    def origin(self) -> str:
        """Where the family comes from: ``package`` (kernel_src/ of flashtune), else its kernel directory."""
        return "package" if self.root.resolve() == KERNEL_SRC.resolve() else str(self.root.resolve())

    def source_digest(self) -> str:
        """Hash of the family's sources: its source and config header and every file they include from
        the kernel directory, names and contents (a study never resumes on a changed kernel)."""
        h = hashlib.sha256()
        root = self.root.resolve()
        for path in sorted(_source_files(self.family, root)):
            h.update(str(path.relative_to(root)).encode() + b"\0")
            h.update(_read_source(path))
        return h.hexdigest()[:16]


class _LazyEnvironment(dict):
    """Knobs, problem and device, and each derived value computed when first read (:meth:`Space.feasible`)."""

    def __init__(self, given: dict[str, int], derived: Sequence[Derived]) -> None:
        super().__init__(given)
        self._derived = {d.name: d for d in derived}

    def __missing__(self, name: str) -> int:
        if name not in self._derived:
            raise KeyError(name)
        self[name] = value = int(self._derived[name].expr(self))
        return value


def _launch_violations(geometry: LaunchGeometry) -> list[str]:
    """Why a launch of ``geometry`` is impossible on any CUDA device (grid and block limits), or nothing."""
    reasons = []
    for axis, size, limit in zip("xyz", geometry.grid, MAX_GRID):
        if not 1 <= size <= limit:
            reasons.append(f"launch_grid: grid.{axis} = {size} is outside CUDA's limit of 1..{limit} blocks")
    if not 1 <= geometry.threads <= MAX_THREADS_PER_BLOCK:
        reasons.append(f"launch_threads: {geometry.threads} threads per block, CUDA allows 1..{MAX_THREADS_PER_BLOCK}")
    if geometry.smem_bytes < 0:
        reasons.append(f"launch_smem: {geometry.smem_bytes} B of shared memory")
    return reasons


def config_key(config: Mapping[str, int]) -> str:
    """A short stable hash of a config, for caches and de-duplication."""
    text = json.dumps(dict(sorted(config.items())), separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# -- loading -------------------------------------------------------------------------------
def kernel_dirs(kernels: str | Path | list[str | Path] | tuple[str | Path, ...] | None = None) -> tuple[Path, ...]:
    """The user's kernel directories: ``kernels`` (a directory or a list of them), then those of
    ``$FLASHTUNE_KERNELS`` (a path list); each must be an existing directory."""
    given = [] if kernels is None else [kernels] if isinstance(kernels, (str, Path)) else list(kernels)
    env = [p for p in os.environ.get(KERNELS_ENV, "").split(os.pathsep) if p]
    out: list[Path] = []
    for where, entries in (("kernels", given), (KERNELS_ENV, env)):
        for entry in entries:
            path = Path(entry).expanduser()
            if not path.is_dir():
                raise SpaceError(
                    f"{where}: {printable(entry, 200)!r} is not a directory; give a kernel directory "
                    "(space files <family>.toml and their sources)"
                )
            if path.resolve() not in out:
                out.append(path.resolve())
    _NAMED_DIRS.update(Path(entry).expanduser().resolve() for entry in given)
    return tuple(out)


def available_families(kernels: str | Path | list[str | Path] | None = None) -> list[str]:
    """The package's families, and with ``kernels`` those of the user's kernel directories."""
    dirs = kernel_dirs(kernels) if kernels is not None else ()
    return sorted({p.stem for d in (*dirs, SEARCH_SPACES) for p in d.glob("*.toml") if _NAME.fullmatch(p.stem)})


def _find_family(name: str, dirs: tuple[Path, ...]) -> tuple[Path, Path]:
    """(space file, kernel root) of family ``name``: in the user's directories, else in the package; a name
    found in two places is refused (the user gives the space file's path)."""
    found = [(d / f"{name}.toml", d) for d in dirs if (d / f"{name}.toml").is_file()]
    if (SEARCH_SPACES / f"{name}.toml").is_file():
        found.append((SEARCH_SPACES / f"{name}.toml", KERNEL_SRC))
    if not _NAME.fullmatch(name) or not found:
        raise SpaceError(
            f"unknown kernel family {printable(name, 80)!r}; available: "
            f"{', '.join(available_families(dirs)) or 'none'} (or give a space file's path, *.toml; "
            f"kernel directories: --kernels DIR or {KERNELS_ENV})"
        )
    if len(found) > 1:
        places = " and ".join(printable(p, 200) for p, _ in found)
        raise SpaceError(
            f"kernel family {name!r} is defined twice ({places}); give the space file's path to pick one, "
            "or rename one family"
        )
    return found[0]


def _root_of(path: Path, dirs: tuple[Path, ...]) -> Path:
    """The kernel root of a space file given by path: its own directory when that is one of the user's
    kernel directories, else the package's kernel_src/ (a variant of an in-tree family)."""
    parent = path.resolve().parent
    return parent if parent in dirs or parent in _NAMED_DIRS else KERNEL_SRC


def load_space(
    name_or_path: str | Path, *, kernels: str | Path | list[str | Path] | tuple[str | Path, ...] | None = None
) -> Space:
    """Load a family by name (``sm80``, found in the ``kernels`` directories and ``$FLASHTUNE_KERNELS``,
    then in the package) or a space file by path (``*.toml``), checking it thoroughly."""
    dirs = kernel_dirs(kernels)
    path = Path(name_or_path)
    if path.suffix != ".toml":
        path, root = _find_family(str(name_or_path), dirs)
    else:
        root = _root_of(path, dirs)
    shown = printable(path, 200)
    try:
        data = read_toml(path, what="the space file")
    except FileContentError as e:
        raise SpaceError(f"{shown}: no such space file" if e.missing else str(e)) from None
    try:
        return _parse(data, path, root)
    except (ExprError, KeyError, TypeError, ValueError) as e:
        if isinstance(e, SpaceError):
            raise
        raise SpaceError(f"{shown}: {e}") from None


def _head_dim_defaults(table: Any, values: list[int], family: Family, where: str) -> tuple[tuple[int, int], ...]:
    """``default_by_head_dim = { 256 = 80 }``: head dims of the family -> a default among the values."""
    if not isinstance(table, dict):
        raise SpaceError(f"{where}: default_by_head_dim must be a table such as {{ 256 = 80 }}")
    out = []
    for key, value in table.items():
        # a head dim as written in head_dims: "0128" or "128.0" would be a second key for head dim 128
        if not re.fullmatch(r"[1-9][0-9]{0,4}", key, re.ASCII) or int(key) not in family.head_dims:
            raise SpaceError(
                f"{where}: default_by_head_dim key {key!r} is not one of the family's head_dims "
                f"{list(family.head_dims)}"
            )
        if not _is_int(value) or value not in values:
            raise SpaceError(f"{where}: default_by_head_dim {key} = {value!r} is not one of the values {values}")
        out.append((int(key), int(value)))
    return tuple(sorted(out))


def _arch_defaults(table: Any, values: list[int], family: Family, where: str) -> tuple[tuple[int, int], ...]:
    """``default_by_arch = { 100 = 32 }``: from this compute capability (x10) on, a default among the values."""
    if not isinstance(table, dict):
        raise SpaceError(f"{where}: default_by_arch must be a table such as {{ 100 = 32 }}")
    out = []
    for key, value in table.items():
        if not re.fullmatch(r"[0-9]{2,4}", key) or int(key) <= family.min_arch:
            raise SpaceError(
                f"{where}: default_by_arch key {key!r} must be a compute capability times ten above the "
                f"family's min_arch {family.min_arch} (the plain default is the one for min_arch)"
            )
        if isinstance(value, bool) or value not in values:
            raise SpaceError(f"{where}: default_by_arch {key} = {value!r} is not one of the values {values}")
        out.append((int(key), int(value)))
    return tuple(sorted(out))


def _is_int(value: Any) -> bool:
    """An integer as TOML writes one (not a float such as 128.0, not a boolean)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _table(data: Mapping[str, Any], key: str, where: str, *, required: bool = True) -> dict[str, Any]:
    value = data.get(key, None)
    if value is None:
        if required:
            raise SpaceError(f"{where}: missing [{key}]")
        return {}
    if not isinstance(value, dict):
        raise SpaceError(f"{where}: [{key}] must be a table")
    return value


def _keys(entry: Mapping[str, Any], where: str, required: set[str], optional: set[str] = frozenset()) -> None:
    if not isinstance(entry, Mapping):
        raise SpaceError(f"{where}: must be a table, got {entry!r}")
    missing = required - set(entry)
    if missing:
        raise SpaceError(f"{where}: missing {', '.join(sorted(missing))}")
    unknown = set(entry) - required - set(optional)
    if unknown:
        raise SpaceError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")


def _parse(data: Mapping[str, Any], path: Path, root: Path) -> Space:
    where = str(path)
    _keys(data, where, {"family", "launch", "knobs"}, {"derived", "constraints", "defaults"})
    family = _parse_family(_table(data, "family", where), path, root)
    macros: set[str] = set()  # knob and derived macros so far (the problem's and the device's are reserved)
    known: set[str] = set(PROBLEM_NAMES | DEVICE_NAMES)  # grows by each knob and derived value, in file order
    knob_tables = _table(data, "knobs", where)
    if not knob_tables:
        raise SpaceError(f"{where}: [knobs] declares no knob")
    knobs = [
        _parse_knob(name, entry, f"{where} [knobs.{name}]", family, known, macros)
        for name, entry in knob_tables.items()
    ]
    derived = [
        _parse_derived(name, entry, f"{where} [derived.{name}]", known, macros)
        for name, entry in _table(data, "derived", where, required=False).items()
    ]
    constraints = [
        _parse_constraint(name, entry, f"{where} [constraints.{name}]", known)
        for name, entry in _table(data, "constraints", where, required=False).items()
    ]
    threads, smem_bytes, grid, launch_abi = _parse_launch(_table(data, "launch", where), where, known)
    rules = _parse_default_rules(data.get("defaults", []), where, knobs, derived)
    _check_macros_are_read(
        family,
        root,
        [(f"[knobs.{k.name}]", k.macro) for k in knobs]
        + [(f"[derived.{d.name}]", d.macro) for d in derived if d.macro],
        where,
    )
    return Space(
        family=family,
        knobs=tuple(knobs),
        derived=tuple(derived),
        constraints=tuple(constraints),
        launch_threads=threads,
        launch_smem_bytes=smem_bytes,
        launch_grid=grid,
        path=path,
        launch_abi=launch_abi,
        root=root,
        default_rules=rules,
    )


def _parse_default_rules(
    entries: Any, where: str, knobs: list[Knob], derived: list[Derived]
) -> tuple[DefaultRule, ...]:
    """``[[defaults]]``: each a ``when`` over problem, device, knob and derived names (the knobs' values being
    the defaults the earlier rules left), a ``set`` table of knob values, a ``help``."""
    if not isinstance(entries, list):
        raise SpaceError(f"{where}: defaults must be an array of tables ([[defaults]])")
    by_name = {k.name: k for k in knobs}
    rules = []
    for i, entry in enumerate(entries, 1):
        kw = f"{where} [[defaults]] #{i}"
        _keys(entry, kw, {"when", "set", "help"})
        if not isinstance(entry["help"], str) or not entry["help"].strip():
            raise SpaceError(f"{kw}: help must say why the rule holds (a non-empty string)")
        try:
            when = compile_expr(entry["when"])
        except ExprError as e:
            raise SpaceError(f"{kw}: when: {e}") from None
        config_names = {k.name for k in knobs} | {d.name for d in derived}
        outside = sorted(when.names - PROBLEM_NAMES - DEVICE_NAMES - config_names)
        if outside:
            raise SpaceError(
                f"{kw}: when {entry['when']!r} reads {', '.join(outside)}, which is no name of the problem, the "
                f"device, a knob or a derived value; it may read {', '.join(sorted(PROBLEM_NAMES | DEVICE_NAMES))} "
                "and the knobs and derived values of the defaults so far"
            )
        chosen = entry["set"]
        if not isinstance(chosen, dict) or not chosen:
            raise SpaceError(f"{kw}: set must be a table of knob = value, e.g. {{ consumer_wgs = 2 }}")
        values = []
        for name, value in chosen.items():
            knob = by_name.get(name)
            if knob is None:
                raise SpaceError(f"{kw}: set names {name!r}, which is not a knob; knobs are {', '.join(by_name)}")
            if isinstance(value, bool) or value not in knob.values:
                raise SpaceError(f"{kw}: set {name} = {value!r} is not one of the values {list(knob.values)}")
            values.append((name, int(value)))
        rules.append(
            DefaultRule(
                when=when,
                values=tuple(values),
                help=entry["help"].strip(),
                reads_config=bool(when.names & config_names),
            )
        )
    return tuple(rules)


def _parse_family(fam: dict[str, Any], path: Path, root: Path) -> Family:
    """``[family]``: names, sources, entry, ABI, arch, head dims and dtypes, each checked."""
    where = str(path)
    _keys(
        fam,
        f"{where} [family]",
        {"name", "source", "config_header", "entry", "abi", "min_arch", "head_dims", "dtypes"},
        {"description", "arch_suffix"},
    )
    if not isinstance(fam["name"], str) or not _NAME.fullmatch(fam["name"]) or fam["name"] == "auto":
        raise SpaceError(
            f"{where}: [family] name {fam['name']!r:.80} must be lower_snake_case (it names C++ "
            'namespaces and study names) and not "auto" (family="auto" picks a family by the device)'
        )
    if fam["name"] != path.stem:
        raise SpaceError(f"{where}: [family] name {fam['name']!r} must equal the file name {path.stem!r}")
    for key in ("source", "config_header"):
        _check_source(fam[key], f"{where}: [family] {key}", root)
    for key, pattern, what in (
        ("entry", _C_IDENT, "a C identifier"),
        ("abi", _NAME, "lower_snake_case"),
        ("arch_suffix", _ARCH_SUFFIX, 'empty or up to two lower-case letters, e.g. "a"'),
    ):
        value = fam.get(key, "")
        if not isinstance(value, str) or not pattern.fullmatch(value):
            raise SpaceError(f"{where}: [family] {key} {value!r:.80} must be {what}")
    if not isinstance(fam.get("description", ""), str):
        raise SpaceError(f"{where}: [family] description must be a string")
    _check_targets(fam, where)
    return Family(
        name=fam["name"],
        description=fam.get("description", ""),
        source=fam["source"],
        config_header=fam["config_header"],
        entry=fam["entry"],
        abi=fam["abi"],
        min_arch=int(fam["min_arch"]),
        arch_suffix=fam.get("arch_suffix", ""),
        head_dims=tuple(fam["head_dims"]),
        dtypes=tuple(fam["dtypes"]),
    )


def _check_targets(fam: dict[str, Any], where: str) -> None:
    """``[family]`` min_arch (an arch flashtune knows), dtypes and head_dims (each listed once)."""
    min_arch = fam["min_arch"]
    if isinstance(min_arch, bool) or not isinstance(min_arch, int) or min_arch not in KNOWN_ARCHS:
        raise SpaceError(
            f"{where}: [family] min_arch must be a compute capability times ten that flashtune knows "
            f"({', '.join(map(str, KNOWN_ARCHS))}), got {min_arch!r:.40}"
        )
    dtypes = fam["dtypes"]
    if (
        not isinstance(dtypes, list)
        or not dtypes
        or not all(isinstance(d, str) for d in dtypes)
        or set(dtypes) - set(DTYPES)
    ):
        raise SpaceError(f"{where}: [family] dtypes must be a non-empty subset of {sorted(DTYPES)}")
    head_dims = fam["head_dims"]
    if (
        not isinstance(head_dims, list)
        or not head_dims
        or not all(isinstance(d, int) and not isinstance(d, bool) and 0 < d <= 1024 for d in head_dims)
    ):
        raise SpaceError(f"{where}: [family] head_dims must be a non-empty list of positive integers (up to 1024)")
    for key, listed in (("head_dims", head_dims), ("dtypes", dtypes)):
        if len(set(listed)) != len(listed):
            raise SpaceError(f"{where}: [family] {key} repeat: {listed}; list each once")


def _parse_knob(name: str, entry: Any, kw: str, family: Family, known: set[str], macros: set[str]) -> Knob:
    """``[knobs.<name>]``; adds the knob's name to ``known`` and its macro to ``macros``."""
    _keys(entry, kw, {"macro", "values", "default", "help"}, {"default_by_head_dim", "default_by_arch", "ordered"})
    _check_name(name, kw, known)
    _check_macro(entry["macro"], kw, macros)
    values = entry["values"]
    if not isinstance(values, list) or not values:
        raise SpaceError(f"{kw}: values must be a non-empty list")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise SpaceError(f"{kw}: values must be integers (booleans as 0/1), got {values!r:.200}")
    if not all(abs(v) <= MAX_KNOB_VALUE for v in values):
        raise SpaceError(f"{kw}: values must fit a C int (at most {MAX_KNOB_VALUE} in size)")
    if len(set(values)) != len(values):
        raise SpaceError(f"{kw}: values repeat: {values}")
    if not _is_int(entry["default"]) or entry["default"] not in values:
        raise SpaceError(f"{kw}: default {entry['default']!r} is not one of the values {values}")
    if not isinstance(entry["help"], str):
        raise SpaceError(f"{kw}: help must be a string")
    by_head_dim = _head_dim_defaults(entry.get("default_by_head_dim", {}), values, family, kw)
    by_arch = _arch_defaults(entry.get("default_by_arch", {}), values, family, kw)
    ordered = entry.get("ordered", True)
    if not isinstance(ordered, bool):
        raise SpaceError(f"{kw}: ordered must be true (values are steps in the listed order) or false (categories)")
    known.add(name)
    return Knob(
        name,
        entry["macro"],
        tuple(int(v) for v in values),
        int(entry["default"]),
        entry["help"],
        by_head_dim,
        ordered,
        by_arch,
    )


def _parse_derived(name: str, entry: Any, kw: str, known: set[str], macros: set[str]) -> Derived:
    """``[derived.<name>]``: an expression over what is declared before it; adds the name to ``known``."""
    _keys(entry, kw, {"expr"}, {"macro", "help"})
    _check_name(name, kw, known)
    if "macro" in entry:
        _check_macro(entry["macro"], kw, macros)
    if not isinstance(entry.get("help", ""), str):
        raise SpaceError(f"{kw}: help must be a string")
    expr = _expr(entry["expr"], kw, known)
    known.add(name)
    return Derived(name, expr, entry.get("macro"), entry.get("help", ""))


def _parse_constraint(name: str, entry: Any, kw: str, known: set[str]) -> Constraint:
    """``[constraints.<name>]``: a condition and the message shown when it is false."""
    _keys(entry, kw, {"expr", "message"})
    if not _NAME.fullmatch(name):
        raise SpaceError(f"{kw}: name must be lower_snake_case")
    expr = _expr(entry["expr"], kw, known)
    _check_message(entry["message"], kw, known)
    return Constraint(name, expr, entry["message"])


def _parse_launch(
    launch: dict[str, Any], where: str, known: set[str]
) -> tuple[Expr, Expr, tuple[Expr, Expr, Expr], tuple[tuple[str, Expr], ...]]:
    """``[launch]``: (threads, smem_bytes, grid, ``[launch.abi]`` entries), as expressions."""
    kw = f"{where} [launch]"
    _keys(launch, kw, {"threads", "smem_bytes", "grid"}, {"abi"})
    if not isinstance(launch["grid"], list) or len(launch["grid"]) != 3:
        raise SpaceError(f"{kw}: grid must be a list of three expressions")
    grid = tuple(_expr(str(g), kw, known) for g in launch["grid"])
    abi = launch.get("abi", {})
    if not isinstance(abi, dict):
        raise SpaceError(f"{kw}: abi must be a table of name = expression")
    for name in abi:
        if not _NAME.fullmatch(name):
            raise SpaceError(f"{where} [launch.abi]: {name!r} must be lower_snake_case")
    launch_abi = tuple((name, _expr(str(e), f"{where} [launch.abi] {name}", known)) for name, e in abi.items())
    threads = _expr(str(launch["threads"]), kw, known)
    smem_bytes = _expr(str(launch["smem_bytes"]), kw, known)
    return threads, smem_bytes, grid, launch_abi  # type: ignore[return-value]


def _check_name(name: str, where: str, known: set[str]) -> None:
    if not _NAME.fullmatch(name):
        raise SpaceError(f"{where}: name must be lower_snake_case")
    if name in known:
        raise SpaceError(f"{where}: name {name!r} is already used by a knob, derived value, problem or device field")


def _check_macro(macro: Any, where: str, macros: set[str]) -> None:
    if not isinstance(macro, str) or not _MACRO.fullmatch(macro):
        raise SpaceError(f"{where}: macro {macro!r:.80} must look like FT_UPPER_CASE")
    if macro in PROBLEM_MACROS | DEVICE_MACROS:
        raise SpaceError(
            f"{where}: macro {macro} is reserved: every build gets it from the problem or the device; "
            "name the knob's macro differently"
        )
    if macro in macros:
        raise SpaceError(f"{where}: macro {macro} is used twice")
    macros.add(macro)


def _check_source(value: Any, where: str, root: Path) -> None:
    """A kernel source path: relative to the kernel directory ``root`` and inside it (no "..", no link out of
    it), an existing file of bounded size."""
    inside = "kernel_src/" if root == KERNEL_SRC else printable(root, 200)
    if not isinstance(value, str) or not _SOURCE.fullmatch(value) or ".." in value.split("/"):
        raise SpaceError(
            f"{where} {value!r:.120} must be a relative path inside {inside} (letters, digits, _ . - and /; no '..')"
        )
    path = (root / value).resolve()
    if not path.is_relative_to(root.resolve()) or not path.is_file():
        raise SpaceError(f"{where} {value!r} is not a file under {inside} (a link out of it does not count)")
    if path.stat().st_size > MAX_SOURCE_BYTES:
        raise SpaceError(f"{where} {value!r} is larger than {MAX_SOURCE_BYTES} bytes; a kernel source cannot be")


def _read_source(path: Path) -> bytes:
    """A kernel file's bytes, refused beyond ``MAX_SOURCE_BYTES``."""
    try:
        _, data = read_limited(path, MAX_SOURCE_BYTES, what="a kernel source file")
    except FileContentError as e:
        raise SpaceError(str(e)) from None
    return data


def _source_files(family: Family, root: Path) -> set[Path]:
    """The family's source and config header and every file they include (``#include "x"``, found under
    ``root`` or beside the including file, never outside ``root``), at most ``MAX_SOURCE_FILES``."""
    pending = [root / family.source, root / family.config_header]
    seen: set[Path] = set()
    while pending:
        path = pending.pop().resolve()
        if path in seen or not path.is_relative_to(root) or not path.is_file():
            continue
        seen.add(path)
        if len(seen) > MAX_SOURCE_FILES:
            raise SpaceError(f"{family.name}: its sources include more than {MAX_SOURCE_FILES} files")
        text = _COMMENT.sub(" ", _read_source(path).decode("utf-8", errors="replace"))
        for include in _INCLUDE.findall(text):
            for base in (root, path.parent):
                candidate = (base / include).resolve()
                if candidate.is_relative_to(root) and candidate.is_file():
                    pending.append(candidate)
                    break
    return seen


def _kernel_text(family: Family, root: Path) -> str:
    """The family's source and config header with every file they include from ``root``, comments removed."""
    files = sorted(_source_files(family, root.resolve()))
    return "\n".join(_COMMENT.sub(" ", _read_source(p).decode("utf-8", errors="replace")) for p in files)


def _check_macros_are_read(family: Family, root: Path, declared: list[tuple[str, str]], where: str) -> None:
    """Every knob and derived macro must be read by the family's kernel: a macro it never reads would make a
    study tune a knob that does nothing."""
    read = set(_MACRO_TOKEN.findall(_kernel_text(family, root)))
    shown = "kernel_src" if root == KERNEL_SRC else printable(root, 200)
    for entry, macro in declared:
        if macro not in read:
            raise SpaceError(
                f"{where} {entry}: macro {macro} is never read by the {family.name} kernel "
                f"({shown}/{family.source} and what it includes); use the name "
                f"{shown}/{family.config_header} reads, or add it there"
            )


def _expr(text: Any, where: str, known: set[str]) -> Expr:
    try:
        expr = compile_expr(text)
    except ExprError as e:
        raise SpaceError(f"{where}: {e}") from None
    missing = sorted(expr.names - known)
    if missing:
        raise SpaceError(
            f"{where}: {text!r} uses unknown name(s) {', '.join(missing)} "
            "(knobs and derived values must be declared before use)"
        )
    return expr


def _check_message(message: Any, where: str, known: set[str]) -> None:
    if not isinstance(message, str) or not message:
        raise SpaceError(f"{where}: message must be a non-empty string")
    try:
        fields = [(name, spec, conversion) for _, name, spec, conversion in string.Formatter().parse(message)]
    except ValueError as e:
        raise SpaceError(
            f"{where}: message {message!r:.120} is not a valid format string ({e}); write names as {{name}}"
        ) from None
    for name, spec, conversion in fields:
        if name is None:  # plain text (and {{ }}) after the last field
            continue
        # only {name}: a format spec ({x:1000000000}) or an attribute ({x.__class__}) would run on every violation
        if spec or conversion or name not in known:
            shown = "{" + name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
            why = "names no knob, derived value or problem value" if name not in known else "has a format"
            raise SpaceError(
                f"{where}: message {message!r:.120} is not a valid format string for a constraint: field "
                f"{shown[:80]!r} {why}; write a value as {{name}}"
            )
