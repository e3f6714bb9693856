"""The reduced sweep spaces of sweeps 7-14 and of the sweeps planned next (tests/data/README.md), from sm90.toml.

    python -m tests.gpu.derive_sweep_spaces [--check]

Each space is sm90.toml's own text (knobs, macros, launch geometry, derived values, constraints, the warpgroup
rules) with fewer values per knob (every one a value of sm90.toml, the head dim's default among them), one head
dim (its ``default_by_head_dim`` entry becomes the knob's default), the split rules dropped (kv_splits and
tail_splits held at 1) and so are the rules that read another head dim. Writes
``tests/data/sweep_spaces/<name>.toml`` for each space whose file is absent: a stored space describes the sweeps
measured with it and is never rewritten. ``--check`` instead says which stored files no longer match sm90.toml:
the ``*c`` spaces were derived at 5e9dacd, the ``*d`` spaces at 0dd2aa9, the ``*e`` spaces at aa1e843 and
``sm90_sweep_d256f`` at 57196ad (a mismatch means sm90.toml changed since, and the stored sweeps describe the older
space). Not collected by pytest.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / "search_spaces" / "sm90.toml"
OUT = REPO / "tests" / "data" / "sweep_spaces"

_HELD = dict(kv_barriers=[2], rescale_slack=[8], pv_split=[0], p_smem=[0], poly_exp=[0], kv_splits=[1], tail_splits=[1])
_SCHEDULE = dict(intra_wg_overlap=[0, 1], pingpong=[0, 1], cta_mode=[1, 2], persistent=[0, 1], scheduler=[0, 1])
#: name -> (head dim, knob -> values); knobs not named keep all of sm90.toml's values
SPACES: dict[str, tuple[int, dict[str, list[int]]]] = {
    "sm90_sweep_d64c": (
        64,
        _HELD
        | _SCHEDULE
        | dict(kv_stages=[2, 3], block_n=[64, 96, 128, 160, 192], consumer_wgs=[1, 2, 3], producer_regs=[24, 32])
        | dict(consumer_regs=[160, 240], ctas_per_sm=[1, 2], q_stages=[1, 2]),
    ),
    "sm90_sweep_d128c": (
        128,
        _HELD
        | _SCHEDULE
        | dict(kv_stages=[2, 3], block_n=[80, 112, 128, 144, 176], consumer_wgs=[1, 2], producer_regs=[24, 32])
        | dict(consumer_regs=[160, 232, 240], ctas_per_sm=[1, 2], q_stages=[1, 2]),
    ),
    # d256's registers and shared memory admit few tiles; K/V barriers vary instead of CTAs per SM (one fits)
    "sm90_sweep_d256c": (
        256,
        _HELD
        | _SCHEDULE
        | dict(kv_stages=[2, 3], kv_barriers=[1, 2], block_n=[64, 80, 96, 112, 128], consumer_wgs=[1, 2])
        | dict(producer_regs=[24, 32], consumer_regs=[232, 240, 256], ctas_per_sm=[1], q_stages=[1, 2]),
    ),
}
#: the spaces of the sweeps planned next (tests/gpu/measure_sweeps.py ``PLANNED``): the same value lists from
#: sm90.toml at 0dd2aa9, where a d64 problem's default may take 176-key blocks (2 consumer warpgroups)
_NEXT = {
    "sm90_sweep_d64d": "sm90_sweep_d64c",
    "sm90_sweep_d128d": "sm90_sweep_d128c",
    "sm90_sweep_d256d": "sm90_sweep_d256c",
}
for _name, _base in _NEXT.items():
    _dim, _values = SPACES[_base]
    SPACES[_name] = (_dim, _values | ({"block_n": [64, 96, 128, 160, 176, 192]} if _dim == 64 else {}))
#: the spaces of sweeps 36-39: the ``*d`` value lists with the causal unit order added, the value a rule may choose
#: at the head dim beside one head after another (sections at d64 and d128, the last section at d256)
for _name, _dim in {"sm90_sweep_d64e": 64, "sm90_sweep_d128e": 128, "sm90_sweep_d256e": 256}.items():
    SPACES[_name] = (_dim, SPACES[_name[:-1] + "d"][1] | {"unit_order": [0, 2] if _dim == 256 else [0, 1]})
#: the d256 space of sweeps 40-43: the ``*e`` value lists over sm90.toml with the d256 causal tile rule (session 35);
#: at d64 and d128 sm90.toml still gives the ``*e`` spaces (the rule is dropped there), so those sweeps use them
SPACES["sm90_sweep_d256f"] = SPACES["sm90_sweep_d256e"]
#: name's suffix -> (the sweeps it serves, the sm90.toml commit it was derived at)
_GENERATIONS = {
    "c": ("sweeps 7-11", "5e9dacd"),
    "d": ("the planned sweeps", "0dd2aa9"),
    "e": ("sweeps 36-39", "aa1e843"),
    "f": ("sweeps 40-43", "57196ad"),
}


def _header(name: str, head_dim: int, values: dict[str, list[int]]) -> str:
    held = ", ".join(k for k, v in values.items() if len(v) == 1)
    sweeps, commit = _GENERATIONS[name[-1]]
    return f"""# A reduced sm90 space for one exhaustive measurement at head dim {head_dim} (tests/data/README.md, {sweeps}),
# written by tests/gpu/derive_sweep_spaces.py: the knobs, macros, launch geometry, derived values, constraints and
# warpgroup rules of search_spaces/sm90.toml at commit {commit}, with fewer values per knob (every one a value of
# sm90.toml, the d{head_dim} default among them) and head dim {head_dim} only. Held at their default: {held}.
# The split-KV and tail-split rules are left out (kv_splits and tail_splits are held at 1; the sweeps' shapes have
# many units and a last wave more than half full, so neither rule would fire).
# Copy it into search_spaces/ to use it as --family {name} (tests/gpu/measure_sweeps.py does).
"""


def derive(name: str) -> str:
    """The text of space ``name`` (:data:`SPACES`) from sm90.toml's."""
    head_dim, values = SPACES[name]
    text = SOURCE.read_text()
    text = text.replace('name = "sm90"', f'name = "{name}"', 1)
    text = re.sub(r"head_dims = \[[^\]]*\]", f"head_dims = [{head_dim}]", text, count=1)
    for knob, vals in values.items():
        pattern = re.compile(rf"(\[knobs\.{knob}\]\n(?:[^\[]*?\n)?)values = \[[^\]]*\]")
        text, n = pattern.subn(lambda m, vals=vals: m.group(1) + f"values = {vals}", text, count=1)
        if n != 1:
            raise SystemExit(f"{SOURCE}: no [knobs.{knob}] values list to replace")

    def one_head_dim(m: re.Match) -> str:  # default = X, comments, default_by_head_dim = {...}
        by_head = dict(kv.split("=") for kv in m.group(4).replace(" ", "").split(",") if kv)
        return m.group(1) + by_head.get(str(head_dim), m.group(2)) + m.group(3)

    text = re.sub(r"(\ndefault = )(\d+)((?:\n#[^\n]*)*)\ndefault_by_head_dim = \{([^}]*)\}[^\n]*", one_head_dim, text)
    split_rule = r"\[\[defaults\]\]\nwhen = [^\n]*\nset = \{ (?:kv_splits|tail_splits) = \d+ \}\nhelp = [^\n]*\n\n?"
    text, n = re.subn(split_rule, "", text)
    if n != 6:
        raise SystemExit(f"{SOURCE}: expected 6 split rules to drop, found {n}")

    def other_head_dim(m: re.Match) -> str:  # a rule that never fires at this head dim may set values it lacks
        tests = re.findall(r"head_dim (==|<=|>=|<|>) (\d+)", m.group(1))
        holds = {"==": int.__eq__, "<=": int.__le__, ">=": int.__ge__, "<": int.__lt__, ">": int.__gt__}
        return m.group(0) if all(holds[op](head_dim, int(n)) for op, n in tests) else ""

    text = re.sub(r'\[\[defaults\]\]\nwhen = "([^"\n]*)"\nset = [^\n]*\nhelp = [^\n]*\n\n?', other_head_dim, text)
    return _header(name, head_dim, values) + text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the stored files instead of writing")
    args = parser.parse_args(argv)
    stale = []
    for name in SPACES:
        path, text = OUT / f"{name}.toml", derive(name)
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        elif path.exists():
            print(f"kept {path.relative_to(REPO)} (stored: never rewritten)")
        else:
            path.write_text(text)
            print(f"wrote {path.relative_to(REPO)}")
    if stale:
        print(f"differ from sm90.toml today: {', '.join(stale)}", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
