"""Parse the resource report that ``ptxas -v`` prints for a kernel."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

__all__ = ["Resources", "parse_ptxas"]


@dataclass(frozen=True, kw_only=True)
class Resources:
    """What ptxas reports for one entry function."""

    registers: int
    spill_store_bytes: int
    spill_load_bytes: int
    stack_bytes: int
    static_smem_bytes: int

    @property
    def spills(self) -> bool:
        return bool(self.spill_store_bytes or self.spill_load_bytes)

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


_ENTRY = re.compile(r"Compiling entry function '(?P<name>[^']+)'")
_PROPERTIES = re.compile(r"Function properties for (?P<name>\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")


def parse_ptxas(log: str, entry: str) -> Resources:
    """Resources of ``entry`` in a ``-Xptxas=-v`` log; raise ValueError if it is not reported."""
    current = None
    properties_of = None  # the function a "Function properties for X" block describes (may be a callee)
    found: dict[str, int] = {}
    for line in log.splitlines():
        m = _ENTRY.search(line)
        if m:
            current = m.group("name")
            continue
        if (m := _PROPERTIES.search(line)) is not None:
            properties_of = m.group("name")
            continue
        if current != entry:
            continue
        if (m := _FRAME.search(line)) is not None and properties_of in (None, entry):
            found["stack_bytes"], found["spill_store_bytes"], found["spill_load_bytes"] = map(int, m.groups())
        if (m := _USED.search(line)) is not None:
            found["registers"] = int(m.group(1))
            s = _SMEM.search(line)
            found["static_smem_bytes"] = int(s.group(1)) if s else 0
    if "registers" not in found:
        raise ValueError(f"ptxas reported no resources for entry {entry!r}")
    found.setdefault("stack_bytes", 0)
    found.setdefault("spill_store_bytes", 0)
    found.setdefault("spill_load_bytes", 0)
    return Resources(**found)
