"""``config="auto"``: the tuned config for each shape at run time, chosen as a dispatch header chooses.

``flashtune export --dispatch -o dispatch.h`` writes a C++ header whose ``select()`` picks a
config per shape, and beside it ``dispatch.json`` with the same tables. A
:class:`TunedConfigs` holds those tables, loaded from that JSON or built from a study
storage exactly as the export builds them (a suite file's studies, or every study of a
storage); :meth:`DispatchTable.select` is the header's ``select()`` in Python:

- among the tuned entries of the same (dtype, head_dim, causal), the one with the smallest
  tuned query length at or above the call's ``seqlen_q``; above the largest, the largest;
- at run time, where the device is known, the entry serves the call's batch and heads as well: an
  entry that is its study's default kept by the re-timing (the JSON's ``kept_default``; in a JSON that does
  not say, an entry equal to the plain default) gives way to the call's own default,
  the space's ``[[defaults]]`` rules for its size included (split-KV for few units, the tail split),
  and a tuned winner that cannot run the call's shape gives way to that default, with a warning;
- no entry for (dtype, head_dim, causal): the family's default config for that head dim, and
  :meth:`TunedConfigs.lookup` says so (``tuner.attention`` warns once per launch plan);
- a table of the user's that holds no configs of the call's family is refused (one line): it was
  tuned for another family, which ``family="auto"`` would have picked.

Measured tables ship inside the package (``tuner/serve/data/*.json``, dispatch JSONs as
``flashtune export --dispatch`` writes them): :func:`shipped_tuned` finds the one whose ``gpu``
is the device's name, which ``config="auto"`` without ``tuned=`` serves; a ``tuned=`` of the
user's takes precedence.

``tuner.attention(..., config="auto", tuned=SOURCE)`` takes a :class:`TunedConfigs` or a
source: a ``.json`` path, a suite file (``.toml``, its storage and studies) or a storage
URL. A JSON or suite file is reloaded when its content changes, a SQLite database when its
file changes; a database server is read once per process (pass a new
:func:`load_tuned` result to refresh). This module imports no Optuna until a storage is read.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..devices import DeviceLimits
from ..errors import FlashtuneError
from ..export import JSON_FORMAT, READABLE_FORMATS, DispatchTable, TableError, table_from_json
from ..files import FileContentError, read_content
from ..problem import Problem
from ..space import Config, ConfigError, Space

__all__ = [
    "SHIPPED_DIR",
    "TunedConfigs",
    "TunedError",
    "load_tuned",
    "parse_tuned_json",
    "shipped_tuned",
    "tuned_configs",
]

MAX_JSON_BYTES = 64 << 20
#: the dispatch JSONs shipped with flashtune, one per GPU model (README, "Measured defaults")
SHIPPED_DIR = Path(__file__).resolve().parent / "data"


class TunedError(FlashtuneError, ValueError):
    """A source of tuned configs cannot be read, or does not fit today's space files."""


@dataclass(frozen=True, kw_only=True, eq=False)  # compared and hashed by identity: a launch-cache key
class TunedConfigs:
    """Dispatch tables by family, and where they came from."""

    tables: Mapping[str, DispatchTable]
    source: str
    gpu: str = ""
    not_covered: tuple[str, ...] = field(default=())
    shipped: bool = False  # flashtune's own measured table: a family it lacks gets the default, not an error

    def config_for(self, space: Space, problem: Problem) -> Config:
        """The config a dispatch header's ``select()`` gives ``problem``, checked against today's ``space``."""
        return self.lookup(space, problem)[0]

    def lookup(
        self, space: Space, problem: Problem, arch: int | None = None, device: DeviceLimits | None = None
    ) -> tuple[Config, str | None]:
        """(config, None) for a tuned entry; (the family default, why) where the table has none for the
        problem's (dtype, head dim, mask): the table's, unless the space gives the device's ``arch`` a default
        of its own. Given the ``device``, a tuned entry is made to serve the problem's batch and heads too
        (:meth:`_for_problem`). A user's table without ``space``'s family raises :class:`TunedError`."""
        table = self.tables.get(space.name)
        if table is None:
            if self.tables and not self.shipped:
                raise TunedError(
                    f"{self.source} holds {', '.join(sorted(self.tables))} configs, not {space.name}: leave "
                    f'family= out ("auto" picks the table\'s family) or tune {space.name} and export it'
                )
            return space.defaults(problem.head_dim, arch, problem=problem, device=device), (
                f"{self.source} holds no {space.name} configs; the {space.name} default config serves "
                f"{_bucket(problem)}"
            )
        knobs = tuple(k.name for k in space.knobs)
        if table.knobs != knobs:
            raise TunedError(
                f"{self.source}: its {space.name} configs have knobs {', '.join(table.knobs)}, today's "
                f"space file has {', '.join(knobs)}; export the dispatch header and JSON again"
            )
        config = table.select(problem.dtype, problem.head_dim, bool(problem.causal), problem.seqlen_q)
        try:
            config = space.validate(config)
        except ConfigError as e:
            raise TunedError(
                f"{self.source}: a tuned {space.name} config no longer fits the space ({e}); export "
                "the dispatch header and JSON again"
            ) from None
        if table.covers(problem.dtype, problem.head_dim, bool(problem.causal)):
            if device is None:  # the dispatch header's choice, as its select() makes it
                return config, None
            kept = table.kept_default(problem.dtype, problem.head_dim, bool(problem.causal), problem.seqlen_q)
            return self._for_problem(space, config, kept, problem, device)
        if device is not None:  # the problem's default on this device (its arch's, its [[defaults]] rules)
            config = space.defaults(problem=problem, device=device)
        elif space.defaults(problem.head_dim, arch) != space.defaults(problem.head_dim):
            config = space.defaults(problem.head_dim, arch)  # the plain default does not build well there
        return config, (
            f"{self.source} has no tuned {space.name} config for {_bucket(problem)}; the family default serves it"
        )

    def _for_problem(
        self, space: Space, config: Config, kept: bool | None, problem: Problem, device: DeviceLimits
    ) -> tuple[Config, str | None]:
        """The bucket's tuned ``config`` made to serve ``problem`` on ``device``, whose batch and heads the
        bucket does not see. An entry that is its study's default kept by the re-timing (``kept``; where the
        table does not say, an entry equal to the head dim's plain default) was measured as the default of
        another shape: the call gets its own problem's default, with the space's ``[[defaults]]`` rules for
        its size (split-KV where the units are few, the tail split, the warpgroups by waves), as a call without
        ``config`` does. A tuned winner is served as it is where it can run the problem; where it cannot (a
        split-KV winner of a shape with fewer units), the problem's default serves, and the reason says why."""
        if kept is None:
            kept = config == space.defaults(problem.head_dim, device.arch)
        if kept:
            return space.defaults(problem=problem, device=device), None
        reason = space.check(config, problem, device)
        if reason is None:
            return config, None
        return space.defaults(problem=problem, device=device), (
            f"{self.source}'s tuned {space.name} config for {_bucket(problem)} at {problem.seqlen_q} queries "
            f"cannot run batch {problem.batch} x {problem.heads_q} heads ({reason}); the default of this shape "
            "serves it"
        )


def _bucket(problem: Problem) -> str:
    return f"{problem.dtype} head dim {problem.head_dim} {'causal' if problem.causal else 'full'}"


def _no_constant(name: str) -> Any:
    raise TunedError(f"not valid JSON: {name}")


def parse_tuned_json(text: str | bytes, where: str) -> TunedConfigs:
    """The tables of a JSON written by ``flashtune export --dispatch``; :class:`TunedError` if malformed."""
    try:
        data = json.loads(text, parse_constant=_no_constant)
    except TunedError as e:
        raise TunedError(f"{where}: {e}") from None
    except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise TunedError(
            f"{where} is not a dispatch JSON written by `flashtune export --dispatch`: "
            f"{str(e).splitlines()[0][:120] if str(e) else type(e).__name__}"
        ) from None
    if not isinstance(data, dict) or data.get("format") not in READABLE_FORMATS:
        raise TunedError(
            f"{where} is not a dispatch JSON written by `flashtune export --dispatch` (its format is "
            f"not {JSON_FORMAT!r} or an earlier one this version reads)"
        )
    families = data.get("families")
    if not isinstance(families, list):
        raise TunedError(f"{where}: families must be a list")
    try:
        tables = [table_from_json(f, where) for f in families]
    except TableError as e:
        raise TunedError(str(e)) from None
    if len({t.family for t in tables}) != len(tables):
        raise TunedError(f"{where}: a family appears twice")
    gpu = data.get("gpu", "")
    not_covered = data.get("not_covered", [])
    return TunedConfigs(
        tables={t.family: t for t in tables},
        source=where,
        gpu=gpu if isinstance(gpu, str) else "",
        not_covered=tuple(str(n) for n in not_covered) if isinstance(not_covered, list) else (),
    )


# -- sources ----------------------------------------------------------------------------------------
def load_tuned(source: str | os.PathLike, *, pattern: str | None = None) -> TunedConfigs:
    """Tuned configs from a dispatch JSON (``.json``), a suite file (``.toml``: its storage's studies of the
    suite) or a storage URL (its studies matching ``pattern``, default all), chosen as
    ``flashtune export --dispatch`` chooses them. Raises :class:`TunedError`."""
    text = os.fspath(source)
    if text.endswith(".json"):
        try:
            _, data = read_content(text, limit_bytes=MAX_JSON_BYTES)
        except FileContentError as e:
            raise TunedError(str(e)) from None
        return parse_tuned_json(data, text)
    if text.endswith(".toml"):
        return _from_storage(None, suite_path=text, pattern=pattern)
    if "://" in text:
        return _from_storage(text, suite_path=None, pattern=pattern or "*")
    raise TunedError(
        f"tuned={text[:200]!r}: give the .json written by `flashtune export --dispatch`, a suite file "
        "(.toml) or a storage URL"
    )


def _from_storage(storage_url: str | None, *, suite_path: str | None, pattern: str | None) -> TunedConfigs:
    from ..export import collect_dispatch  # deferred: imports Optuna

    try:
        selection = collect_dispatch(storage_url, pattern=pattern, suite_path=suite_path, log=io.StringIO())
    except FlashtuneError as e:
        raise TunedError(str(e)) from None
    return TunedConfigs(
        tables={f.space.name: f.table() for f in selection.families},
        source=suite_path or selection.masked_url,
        gpu=selection.gpu,
        not_covered=tuple(selection.not_covered),
    )


_SERVER_ONCE: dict[str, TunedConfigs] = {}
_by_token: dict[tuple, TunedConfigs] = {}
_suite_storage: dict[str, str] = {}  # suite file digest -> storage URL


_sqlite_files: dict[str, str | None] = {}  # storage URL -> its SQLite file (None: a database server)


def _sqlite_file(url: str) -> str | None:
    if url not in _sqlite_files:
        from sqlalchemy.engine import make_url

        try:
            parsed = make_url(url)
        except Exception:
            return None
        database = parsed.database
        sqlite = parsed.get_backend_name() == "sqlite" and database and database != ":memory:"
        _sqlite_files[url] = database if sqlite else None
    return _sqlite_files[url]


def _sqlite_signature(url: str) -> tuple | None:
    """The stat of a SQLite database file (None for a database server): it changes with every write."""
    database = _sqlite_file(url)
    if database is None:
        return None
    try:
        info = os.stat(database)
    except OSError:
        return ("missing",)
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


def _token(text: str, pattern: str | None) -> tuple:
    if text.endswith(".json"):
        try:
            digest, _ = read_content(text, limit_bytes=MAX_JSON_BYTES)
        except FileContentError as e:
            raise TunedError(str(e)) from None
        return ("json", digest)
    if text.endswith(".toml"):
        try:
            digest, _ = read_content(text)
        except FileContentError as e:
            raise TunedError(str(e)) from None
        if digest not in _suite_storage:
            from ..study import load_suite, suite_storage

            try:
                _suite_storage[digest] = suite_storage(load_suite(text), None)
            except FlashtuneError as e:
                raise TunedError(str(e)) from None
        url = _suite_storage[digest]
        return ("suite", text, digest, url, _sqlite_signature(url))
    if "://" in text:
        return ("storage", text, pattern, _sqlite_signature(text))
    raise TunedError(
        f"tuned={text[:200]!r}: give the .json written by `flashtune export --dispatch`, a suite file "
        "(.toml) or a storage URL"
    )


def tuned_configs(source: TunedConfigs | str | os.PathLike) -> TunedConfigs:
    """:func:`load_tuned` with memory: the same object while the source is unchanged (one ``stat`` per call)."""
    if isinstance(source, TunedConfigs):
        return source
    text = os.fspath(source)
    token = _token(text, None)
    found = _by_token.get(token)
    if found is None:
        if token[0] != "json" and token[-1] is None:  # a database server: read once per process
            found = _SERVER_ONCE.get(text)
        if found is None:
            found = load_tuned(text)
            if token[0] != "json" and token[-1] is None:
                _SERVER_ONCE[text] = found
        if len(_by_token) > 64:
            _by_token.clear()
        _by_token[token] = found
    return found


# -- the tables shipped with flashtune ---------------------------------------------------------------
def _gpu_key(name: str) -> str:
    return " ".join(name.split()).casefold()


@functools.cache
def _shipped_tables(directory: Path) -> dict[str, TunedConfigs]:
    """Every shipped dispatch JSON by its GPU's name (normalised); the first file by name wins a tie."""
    found: dict[str, TunedConfigs] = {}
    for path in sorted(directory.glob("*.json")) if directory.is_dir() else ():
        tuned = dataclasses.replace(load_tuned(path), shipped=True, source=f"flashtune's {path.name}")
        if tuned.gpu:
            found.setdefault(_gpu_key(tuned.gpu), tuned)
    return found


def shipped_tuned(gpu_name: str, directory: Path | None = None) -> TunedConfigs:
    """The measured table shipped for the GPU named ``gpu_name`` (as CUDA names it, e.g. ``NVIDIA H200``), or
    an empty shipped table (every shape gets its family default) where flashtune ships none for it."""
    found = _shipped_tables(directory or SHIPPED_DIR).get(_gpu_key(gpu_name))
    if found is not None:
        return found
    return TunedConfigs(
        tables={}, source=f"flashtune's shipped tables (none for {gpu_name or 'this GPU'})", gpu=gpu_name, shipped=True
    )
