"""The ABIs as a written contract (kernel_src/README.md), held to the code: one description
(``tuner/gpu/_abi.py``) gives the host's argument layout, and every kernel's ``extern "C"`` entry (the
package's families and the worked example of examples/my_kernel) and the README's declarations must
declare exactly its parameters, in order, with its types. The flat packer puts every value at the
parameter of its name. No GPU (the packer is host memory), no nvcc."""

from __future__ import annotations

import re
import struct
from pathlib import Path

import pytest

from tuner.gpu._abi import ABI_PARAMS, c_parameters, scalar_format, tensor_map_count
from tuner.paths import KERNEL_SRC, REPO_ROOT
from tuner.problem import Problem
from tuner.space import available_families, load_space

ROOT = REPO_ROOT or Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def _spaces():
    spaces = [load_space(name) for name in available_families()]
    spaces += [load_space(p, kernels=p.parent) for p in sorted(EXAMPLES.glob("*/*.toml"))]
    return [pytest.param(s, id=f"{s.name}") for s in spaces]


def _normalized(param: str) -> tuple[str, str]:
    """(type, name) of one C parameter, with __restrict__ dropped and flashtune's CUtensorMap stand-in named so."""
    text = re.sub(r"\b__restrict__\b", " ", param)
    text = re.sub(r"\b(?:ptx::)?TmaDesc\b", "CUtensorMap", text)
    text = re.sub(r"\s*\*\s*", "* ", text)
    words = text.split()
    return " ".join(words[:-1]).replace("* ", "*").rstrip(), words[-1]


def declared_parameters(text: str, entry: str) -> list[tuple[str, str]]:
    """The parameters of ``entry``'s ``extern "C" __global__`` declaration in C source ``text``."""
    text = re.sub(r"//[^\n]*|/\*.*?\*/", " ", text, flags=re.DOTALL)
    attributes = r"(?:__launch_bounds__\([^)]*\)\s*|[A-Z_][A-Z0-9_]*\s+)*"  # bounds, and macros such as FT_CLUSTER_DIMS
    match = re.search(r'extern\s+"C"\s+__global__\s+void\s+' + attributes + entry + r"\s*\(", text)
    assert match, f'no extern "C" __global__ void {entry}( in the source'
    depth, end = 1, match.end()
    while depth:
        depth += {"(": 1, ")": -1}.get(text[end], 0)
        end += 1
    return [_normalized(p) for p in text[match.end() : end - 1].split(",")]


def _expected(abi: str) -> list[tuple[str, str]]:
    return [(" ".join(t.split()).replace(" *", "*"), n) for t, n in c_parameters(abi)]


@pytest.mark.parametrize("space", _spaces())
def test_every_kernel_entry_declares_its_abi(space):
    assert space.family.abi in ABI_PARAMS, f"{space.name}: ABI {space.family.abi!r} is not described"
    text = space.source_path.read_text()
    assert declared_parameters(text, space.family.entry) == _expected(space.family.abi)


@pytest.mark.parametrize("abi", sorted(ABI_PARAMS))
def test_the_readme_declares_each_abi_as_the_code_does(abi):
    readme = (KERNEL_SRC / "README.md").read_text()
    section = readme.split(f"## ABI `{abi}`", 1)
    assert len(section) == 2, f"kernel_src/README.md has no section ## ABI `{abi}`"
    block = re.search(r"```c\+\+\n(.*?)```", section[1], re.DOTALL)
    assert block, f"the ABI {abi} section has no C++ declaration"
    assert declared_parameters(block.group(1), "flashtune_fwd") == _expected(abi)


def test_a_declaration_that_differs_is_caught():
    good = 'extern "C" __global__ void f(const elem_t* q, int n, float s) {}'
    assert declared_parameters(good, "f") == [("const elem_t*", "q"), ("int", "n"), ("float", "s")]
    swapped = 'extern "C" __global__ void f(float s, int n) {}'
    assert declared_parameters(swapped, "f") != [("int", "n"), ("float", "s")]


def test_the_host_layout_derives_from_the_description():
    assert scalar_format("flat") == "PPPPP" + "i" * 5 + "q" * 12 + "f"
    assert (tensor_map_count("flat"), tensor_map_count("sm90_tma"), tensor_map_count("sm90_tma_sched")) == (0, 4, 4)
    assert scalar_format("sm90_tma") == "P" + "i" * 5 + "f"
    # the tile counter, then split-KV's counters and partials
    assert scalar_format("sm90_tma_sched") == scalar_format("sm90_tma") + "PPP"


def test_the_flat_packer_puts_each_value_at_the_parameter_of_its_name():
    pytest.importorskip("cupy")  # the launch module imports it; no GPU is used
    from tuner.gpu._launch import FlatArgs

    problem = Problem(batch=3, seqlen_q=5, seqlen_k=7, heads_q=8, heads_kv=2, head_dim=64)
    args = FlatArgs(problem, {})
    operands = {t: (0x1000 * (i + 1), 100 + 10 * i, 101 + 10 * i, 102 + 10 * i) for i, t in enumerate("qkvo")}
    args.pack(*(operands[t] for t in "qkvo"), 0xABC0, 0.125)
    expected = {t: operands[t][0] for t in "qkvo"} | {"lse": 0xABC0, "softmax_scale": 0.125}
    expected |= {n: getattr(problem, n) for n in ("batch", "seqlen_q", "seqlen_k", "heads_q", "heads_kv")}
    expected |= {f"{t}_{a}_stride": operands[t][j + 1] for t in "qkvo" for j, a in enumerate(("batch", "row", "head"))}
    for index, param in enumerate(ABI_PARAMS["flat"]):
        size = struct.calcsize("@" + param.code)
        (value,) = struct.unpack("@" + param.code, args.buffer.param_bytes(index, size))
        assert value == expected[param.name], param


@pytest.mark.parametrize("split", [0, 1], ids=["no_split", "split"])
@pytest.mark.parametrize("tile_counter", [1, 0])
def test_the_sched_packer_puts_each_value_at_the_parameter_of_its_name(monkeypatch, tile_counter, split):
    """ABI sm90_tma_sched: the scalars of sm90_tma, then the tile counter and split-KV's workspace, which the launch
    sets for its stream (null, and not used, when the space's [launch.abi] tile_counter, split_counter_bytes is
    0)."""
    pytest.importorskip("cupy")  # the launch module imports it; no GPU is used
    from tests.fakes.standin_launch import fake_tensor_map_encoder
    from tuner.gpu import _tma as tma
    from tuner.gpu._launch import TmaSchedArgs

    monkeypatch.setattr(tma, "encoder", lambda: fake_tensor_map_encoder)
    problem = Problem(batch=3, seqlen_q=5, seqlen_k=7, heads_q=8, heads_kv=2, head_dim=64)
    params = {"q_box_rows": 128, "kv_box_rows": 64, "o_box_rows": 64, "tile_counter": tile_counter}
    params |= {"split_counter_bytes": 96 * split, "split_partial_bytes": 4096 * split}
    args = TmaSchedArgs(problem, params)
    assert args.uses_tile_counter == bool(tile_counter)
    assert args.split_workspace == ((96, 4096) if split else None)
    operands = {t: (0x1000 * (i + 1), 64 * (i + 1), 64, 128) for i, t in enumerate("qkvo")}

    def values() -> dict:
        out = {}
        for index, param in enumerate(ABI_PARAMS["sm90_tma_sched"]):
            if param.code:
                size = struct.calcsize("@" + param.code)
                (out[param.name],) = struct.unpack("@" + param.code, args.buffer.param_bytes(index, size))
        return out

    expected = {"lse": 0xABC0, "softmax_scale": 0.125, "tile_counter": 0, "split_counters": 0, "split_partials": 0}
    expected |= {n: getattr(problem, n) for n in ("batch", "seqlen_q", "seqlen_k", "heads_q", "heads_kv")}
    args.pack(*(operands[t] for t in "qkvo"), 0xABC0, 0.125)
    assert values() == expected
    if tile_counter:
        args.set_tile_counter(0xC0DE0008)  # a launch on another stream: only the counter changes
        assert values() == expected | {"tile_counter": 0xC0DE0008}
        args.pack(*(operands[t] for t in "qkvo"), 0xABC0, 0.125)  # repacking keeps it
        assert values() == expected | {"tile_counter": 0xC0DE0008}
        expected |= {"tile_counter": 0xC0DE0008}
    if split:
        args.set_split_workspace(0xA0000100, 0xA0000200)  # a launch on another stream: only the workspace changes
        split_values = {"split_counters": 0xA0000100, "split_partials": 0xA0000200}
        assert values() == expected | split_values
        args.pack(*(operands[t] for t in "qkvo"), 0xABC0, 0.125)  # repacking keeps it
        assert values() == expected | split_values
