"""``tuner.attention``'s cached launch path without a GPU: PyTorch CPU tensors stand in for CUDA ones.

What stands in: the device index of a tensor (0), PyTorch's stream, the device limits (a
B200 by the nominal table, where ``family="auto"`` is sm80), the compiled kernel function and ``cuLaunchKernel`` (which
records what it was asked to launch and decodes the ``flat`` arguments). Everything else runs
for real: the space file, config headers and dispatch JSON, validation, launch geometry, the
plan cache and the argument packing.
"""

from __future__ import annotations

import builtins
import importlib
import logging
import os
import pathlib
import shutil
import struct
import time

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
pytest.importorskip("cupy", reason="tuner.gpu needs CuPy installed (not a GPU)")

import tuner  # noqa: E402
from tests.fakes.standin_launch import H200, StandInGPU, install  # noqa: E402
from tuner.files import _read as filekey  # noqa: E402
from tuner.paths import SEARCH_SPACES  # noqa: E402
from tuner.space import load_space  # noqa: E402

ta = importlib.import_module("tuner.serve._attention")  # the module (the attribute tuner.attention is the function)
FAMILY = "sm80"


@pytest.fixture
def gpu(monkeypatch):
    stand_in = StandInGPU()
    install(monkeypatch, stand_in)
    yield stand_in
    ta.clear_cache()


def qkv(batch=2, seqlen_q=256, seqlen_k=None, heads_q=4, heads_kv=None, head_dim=128, dtype=torch.float16):
    seqlen_k, heads_kv = seqlen_k or seqlen_q, heads_kv or heads_q
    return (
        torch.randn(batch, seqlen_q, heads_q, head_dim, dtype=dtype),
        torch.randn(batch, seqlen_k, heads_kv, head_dim, dtype=dtype),
        torch.randn(batch, seqlen_k, heads_kv, head_dim, dtype=dtype),
    )


def test_a_call_launches_the_geometry_and_arguments_of_its_plan(gpu):
    q, k, v = qkv(seqlen_q=300, seqlen_k=200, heads_q=8, heads_kv=2)
    o, lse = tuner.attention(q, k, v, causal=True, return_lse=True, softmax_scale=0.25)
    space = load_space(FAMILY)
    config = space.defaults(128, gpu.device.arch)  # the default for the device (a B200 stand-in)
    problem = gpu.loaded[-1]["problem"]
    geometry = space.launch(config, problem, gpu.device)
    assert gpu.loaded[-1]["config"] == config and problem.causal and problem.heads_kv == 2
    launched = gpu.last
    assert (launched["grid"], launched["threads"], launched["smem_bytes"]) == (
        geometry.grid,
        geometry.threads,
        geometry.smem_bytes,
    )
    assert launched["stream"] == 0x5EA
    args = launched["args"]
    assert args[:5] == [q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr()]
    assert args[5:10] == [2, 300, 200, 8, 2]
    assert args[10:22] == [*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o.stride()[:3]]
    assert args[22] == 0.25
    assert o.shape == q.shape and o.dtype == q.dtype and o.is_contiguous()
    assert lse.shape == (2, 8, 300) and lse.dtype == torch.float32
    tuner.attention(q, k, v, causal=True)
    assert gpu.last["args"][22] == pytest.approx(1 / 128**0.5)  # the default scale
    assert len(gpu.loaded) == 1  # one plan for both calls


def test_calls_that_do_not_return_the_lse_share_one_buffer_for_it(gpu):
    q, k, v = qkv()
    tuner.attention(q, k, v)
    scratch = gpu.last["args"][4]
    tuner.attention(q, k, v)
    assert gpu.last["args"][4] == scratch  # no allocation for an LSE nobody reads
    _, lse = tuner.attention(q, k, v, return_lse=True)
    assert gpu.last["args"][4] == lse.data_ptr() != scratch  # a returned LSE is the caller's own


def test_views_are_passed_by_pointer_and_unaddressable_ones_copied(gpu):
    packed = torch.randn(2, 256, 2, 4, 128, dtype=torch.bfloat16)
    q = packed[:, :, 0]  # strided view, 16-byte multiples: read in place
    _, k, v = qkv(dtype=torch.bfloat16)
    tuner.attention(q, k, v)
    assert gpu.last["args"][0] == q.data_ptr() and gpu.last["args"][10:13] == list(q.stride()[:3])
    padded = torch.randn(2, 256, 4, 136, dtype=torch.bfloat16)
    shifted = padded[..., 1:129]  # base 2 bytes off: copied, contiguous
    tuner.attention(shifted, k, v)
    assert gpu.last["args"][0] != shifted.data_ptr() and gpu.last["args"][10:13] == [256 * 4 * 128, 4 * 128, 128]
    assert len(gpu.loaded) == 1  # the same shapes and dtypes: the same plan


def test_the_cached_path_reads_no_file_and_parses_nothing(gpu, monkeypatch, tmp_path):
    """After the first call of a shape, calls only stat the space file and the header: no read, no parse."""
    monkeypatch.setattr(filekey, "RACY_NS", 0)  # the header below was just written: trust its stat at once
    header = write_header(tmp_path / "best.h", load_space(FAMILY), {"block_n": 32})
    q, k, v = qkv()
    tuner.attention(q, k, v, causal=True, config=header)
    tuner.attention(q, k, v, config={"block_m": 64})

    def refuse(*args, **kwargs):
        raise AssertionError("the cached path read or parsed a file")

    with monkeypatch.context() as m:
        for target, name in (
            (ta, "load_space"),
            (ta, "parse_header"),
            (filekey, "read_limited"),
            (ta, "_load_function"),
            (ta, "_device_limits"),
            (pathlib.Path, "read_text"),
            (pathlib.Path, "read_bytes"),
            (builtins, "open"),
            (os, "open"),
        ):
            m.setattr(target, name, refuse)
        for _ in range(50):
            tuner.attention(q, k, v, causal=True, config=header)
            tuner.attention(q, k, v, config={"block_m": 64})
    assert len(gpu.launches) == 102 and len(gpu.loaded) == 2


def test_clear_cache_forgets_everything_the_plan_cache_holds(gpu, tmp_path):
    """Plans, spaces, headers, device limits, cubins and loaded modules: every cache of the one
    :class:`PlanCache` is emptied, and the next call builds its plan again."""
    header = write_header(tmp_path / "best.h", load_space(FAMILY), {"block_n": 32})
    q, k, v = qkv()
    tuner.attention(q, k, v, causal=True, config=header)
    cache = ta._cache
    caches = {name: value for name, value in vars(cache).items() if isinstance(value, dict)}
    assert set(caches) == {
        "space_paths",
        "spaces",
        "header_configs",
        "header_families",
        "plans",
        "limits",
        "cubins",
        "modules",
    }
    # the stand-in GPU skips the device query, the compile and the module load: fill those as a GPU would
    cache.limits[0], cache.cubins[("space", "config")], cache.modules[(0, "k.cubin")] = H200, ("k.cubin", "e"), object()
    assert all(caches.values()), [name for name, value in caches.items() if not value]
    ta.clear_cache()
    assert not any(caches.values()), [name for name, value in caches.items() if value]
    tuner.attention(q, k, v, causal=True, config=header)
    assert len(gpu.loaded) == 2 and gpu.loaded[-1]["config"]["block_n"] == 32


def test_host_time_of_the_python_part_is_small(gpu):
    """The Python part of a cached call (stat, lookup, allocation, packing): a guard against a return of
    per-call parsing (about 2.9 ms per call before the cache); the real figure comes from `flashtune bench --api`."""
    q, k, v = qkv(batch=1, seqlen_q=64, heads_q=1)
    tuner.attention(q, k, v)
    rounds = []
    for _ in range(5):
        start = time.perf_counter_ns()
        for _ in range(200):
            tuner.attention(q, k, v)
        rounds.append((time.perf_counter_ns() - start) / 200 / 1e3)
    assert min(rounds) < 200, f"{min(rounds):.1f} us per call"


def test_sm90_tensor_maps_describe_the_tensors_of_the_call(monkeypatch):
    """Family sm90 (ABI sm90_tma_sched): each map gets the tensor's address, shape and byte strides; the static
    scheduler gets a null tile counter."""
    from tests.fakes.standin_launch import fake_tensor_map_encoder
    from tuner.gpu import _tma as tma

    gpu = StandInGPU(abi="sm90_tma_sched")
    install(monkeypatch, gpu)
    monkeypatch.setattr(tma, "encoder", lambda: fake_tensor_map_encoder)
    packed = torch.randn(2, 300, 2, 8, 128, dtype=torch.bfloat16)
    q = packed[:, :, 1]  # a strided view
    k, v = (torch.randn(2, 200, 2, 128, dtype=torch.bfloat16) for _ in range(2))
    o, lse = tuner.attention(
        q, k, v, causal=True, family="sm90", config={"scheduler": 0}, return_lse=True, softmax_scale=0.5
    )
    maps = [struct.unpack("=13Q", raw[:104]) for raw in gpu.last["args"][:4]]
    for words, t in zip(maps, (q, k, v, o), strict=True):
        b, n, h, d = t.shape
        assert words[0] == tma.CU_TENSOR_MAP_DATA_TYPE["bf16"] and words[1] == t.data_ptr()
        assert words[2:6] == (d, n, h, b)
        assert words[6:9] == (2 * t.stride(1), 2 * t.stride(2), 2 * t.stride(0))  # row, head, batch (bytes)
    assert gpu.last["args"][4:] == [lse.data_ptr(), 2, 300, 200, 8, 2, 0.5, 0, 0, 0]  # null counter and workspace
    assert gpu.allocations == []


def test_sm90_dynamic_scheduler_gets_one_counter_per_stream(monkeypatch):
    """scheduler=1: the kernel's tile counter argument (before split-KV's two) is its stream's tile counter, the same one at every call on that
    stream, another on another stream; one zeroed allocation holds the counters of many streams."""
    from tests.fakes.standin_launch import fake_tensor_map_encoder
    from tuner.gpu import _launch as launch
    from tuner.gpu import _tma as tma

    gpu = StandInGPU(abi="sm90_tma_sched")
    install(monkeypatch, gpu)
    monkeypatch.setattr(tma, "encoder", lambda: fake_tensor_map_encoder)
    stream = [0x5EA]
    monkeypatch.setattr(ta, "_torch_stream", lambda torch, device: stream[0])
    q, k, v = qkv(batch=1, seqlen_q=1000, heads_q=8, heads_kv=2, dtype=torch.bfloat16)
    dynamic = {"scheduler": 1}

    def counter_of_call() -> int:
        tuner.attention(q, k, v, causal=True, family="sm90", config=dynamic)
        assert gpu.last["stream"] == stream[0]
        return gpu.last["args"][-3]

    first = counter_of_call()
    assert first != 0 and counter_of_call() == first
    stream[0] = 0x5EB
    second = counter_of_call()
    assert second not in (0, first)
    stream[0] = 0x5EA
    assert counter_of_call() == first
    assert len(gpu.allocations) == 1 and gpu.allocations[0] >= 2 * 8  # made when the kernel was loaded
    assert {first, second} <= set(range(0xC0DE0000 + 0x100000, 0xC0DE0000 + 0x100000 + gpu.allocations[0], 8))
    assert launch.TILE_COUNTERS.get(0, 0x5EB) == second


def test_sm90_a_partial_config_takes_the_defaults_nearest_that_run_and_logs_them(monkeypatch):
    """config={"persistent": 0}: the default scheduler=1 orders persistent CTAs only, so the plan takes the static
    order (a null tile counter) and the one log line says so; given knobs that conflict are an AttentionError."""
    from tests.fakes.standin_launch import fake_tensor_map_encoder
    from tuner.gpu import _tma as tma
    from tuner.progress import log

    gpu = StandInGPU(abi="sm90_tma_sched")
    install(monkeypatch, gpu)
    monkeypatch.setattr(tma, "encoder", lambda: fake_tensor_map_encoder)
    records = []
    handler = logging.Handler(logging.INFO)
    handler.emit = records.append
    monkeypatch.setattr(log, "level", logging.INFO)
    log.addHandler(handler)
    try:
        q, k, v = qkv(dtype=torch.bfloat16)
        tuner.attention(q, k, v, family="sm90", config={"persistent": 0})
        tuner.attention(q, k, v, family="sm90", config={"persistent": 0})  # the same plan: no second line
    finally:
        log.removeHandler(handler)
    assert gpu.last["args"][-3] == 0 and len(gpu.launches) == 2  # the tile counter (then the split workspace)
    (plan,) = ta._cache.plans.values()
    assert plan.config["persistent"] == 0 and plan.config["scheduler"] == 0
    (line,) = [r.getMessage() for r in records]
    assert line.startswith("sm90: the default scheduler=1 cannot run") and "took scheduler=0" in line, line
    with pytest.raises(ta.AttentionError, match=r"persistent=0, q_stages=1 cannot run .*q_stages_persistent"):
        tuner.attention(q, k, v, family="sm90", config={"persistent": 0, "q_stages": 1})


def test_sm90_split_kv_gets_a_workspace_per_stream_grown_for_a_larger_problem(monkeypatch):
    """kv_splits > 1: the kernel's last two arguments are its stream's split-KV counters and partials (the counters
    first, the partials past them in one allocation), the same at every call on that stream, others on another
    stream; a larger problem on the stream gets a larger workspace, a smaller one keeps it; kv_splits = 1 passes
    null pointers."""
    from tests.fakes.standin_launch import fake_tensor_map_encoder
    from tuner.gpu import _tma as tma

    gpu = StandInGPU(abi="sm90_tma_sched")
    install(monkeypatch, gpu)
    monkeypatch.setattr(tma, "encoder", lambda: fake_tensor_map_encoder)
    stream = [0x5EA]
    monkeypatch.setattr(ta, "_torch_stream", lambda torch, device: stream[0])
    split = {"kv_splits": 4}

    def workspace_of_call(seqlen: int, config=split) -> tuple[int, int]:
        q, k, v = qkv(batch=1, seqlen_q=seqlen, heads_q=4, heads_kv=2, dtype=torch.float16)
        tuner.attention(q, k, v, causal=True, family="sm90", config=config)
        assert gpu.last["stream"] == stream[0]
        return tuple(gpu.last["args"][-2:])

    first = workspace_of_call(512)
    assert 0 not in first and first[0] < first[1] and workspace_of_call(512) == first
    stream[0] = 0x5EB
    assert workspace_of_call(512) not in (first, (0, 0))
    stream[0] = 0x5EA
    larger = workspace_of_call(2048)  # four times the query blocks: more counters and partials
    assert larger != first and workspace_of_call(1024) == larger
    assert workspace_of_call(512, {"kv_splits": 1}) == (0, 0)


# -- files that change while the process runs ---------------------------------------------------------
def write_header(
    path: pathlib.Path, space, knobs: dict, *, head_dim=128, dtype="fp16", causal=True, arch=100
) -> pathlib.Path:
    """A header as `flashtune export` writes one (problem macros, every knob), for ``knobs`` over the defaults of
    a device of ``arch`` (the flat stand-in GPU's, a B200)."""
    from tuner.problem import Problem

    config = space.validate(knobs, partial=True, head_dim=head_dim, arch=arch)
    problem = Problem(batch=1, seqlen_q=128, heads_q=1, head_dim=head_dim, dtype=dtype, causal=causal)
    lines = [f'#define FLASHTUNE_FAMILY "{space.name}"']
    lines += [f"#define {name} {value}" for name, value in problem.macros().items()]
    lines += [f"#define {k.macro} {config[k.name]}" for k in space.knobs]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_an_edited_space_file_is_never_served_stale(gpu, tmp_path):
    space_file = tmp_path / "sm80.toml"
    shutil.copy(SEARCH_SPACES / "sm80.toml", space_file)
    q, k, v = qkv()
    tuner.attention(q, k, v, family=str(space_file))
    assert gpu.loaded[-1]["config"]["rescale_slack"] == 8
    text = space_file.read_text()
    start = text.index("[knobs.rescale_slack]")
    edited = text[:start] + text[start:].replace("default = 8", "default = 4", 1)
    assert len(edited) == len(text)  # same size, written within the same timestamp tick: content decides
    space_file.write_text(edited)
    tuner.attention(q, k, v, family=str(space_file))
    assert gpu.loaded[-1]["config"]["rescale_slack"] == 4
    space_file.write_text(text)  # back to the first content: its plan again, no new build
    tuner.attention(q, k, v, family=str(space_file))
    assert len(gpu.loaded) == 2 and gpu.last["function"] == 0xF00D + 1


def test_an_edited_header_is_never_served_stale(gpu, tmp_path):
    space = load_space(FAMILY)
    header = write_header(tmp_path / "best.h", space, {"rescale_slack": 4})
    q, k, v = qkv()
    tuner.attention(q, k, v, causal=True, config=header)
    assert gpu.loaded[-1]["config"]["rescale_slack"] == 4
    write_header(header, space, {"rescale_slack": 0})  # same size, at once
    tuner.attention(q, k, v, causal=True, config=pathlib.Path(header))
    assert gpu.loaded[-1]["config"]["rescale_slack"] == 0
    header.unlink()
    with pytest.raises(ta.AttentionError, match=r"cannot read config header .*best.h"):
        tuner.attention(q, k, v, causal=True, config=header)


def test_a_header_for_another_problem_is_refused(gpu, tmp_path):
    space = load_space(FAMILY)
    q, k, v = qkv()
    for made_for in ({"head_dim": 64}, {"causal": False}, {"dtype": "bf16"}):
        header = write_header(tmp_path / "other.h", space, {}, **made_for)
        with pytest.raises(ta.AttentionError, match=r"was exported for .* but this call is head_dim 128, fp16, causal"):
            tuner.attention(q, k, v, causal=True, config=header)
    assert not gpu.launches


# -- bad input -----------------------------------------------------------------------------------------
def test_bad_inputs_get_one_line_errors(gpu, monkeypatch):
    q, k, v = qkv()
    cases = [
        ((q.float(), k.float(), v.float()), {}, "float16 or bfloat16"),
        ((q, k, v[:, :8]), {}, "same shape"),
        ((q[0], k, v), {}, r"q must be \[batch, seqlen, heads, head_dim\]"),
        ((q[..., :96], k[..., :96], v[..., :96]), {}, "head dims"),
        ((q, k.bfloat16(), v), {}, "share a dtype"),
        ((q, k.numpy(), v), {}, "must all be CuPy arrays or all PyTorch tensors"),
        ((q, k, v), {"config": 42}, "config must be None, 'auto'"),
        ((q, k, v), {"tuned": "x.json"}, "tuned= goes with config='auto'"),
        ((q, k, v), {"config": "auto", "tuned": "x.txt"}, "give the .json"),
        ((q, k, v), {"config": {"block_m": [64]}}, "map knob names to integers"),
    ]
    for args, kwargs, message in cases:
        with pytest.raises(ta.AttentionError, match=message):
            tuner.attention(*args, **kwargs)
    with pytest.raises(Exception, match="not one of"):
        tuner.attention(q, k, v, config={"block_m": 12345})
    monkeypatch.setattr(ta, "_torch_device", lambda t: t.get_device() if t.is_cuda else -1)
    with pytest.raises(ta.AttentionError, match="must be on a CUDA device"):
        tuner.attention(q, k, v)
    assert not gpu.launches


def test_inputs_that_require_grad_are_refused_not_detached(gpu):
    q, k, v = qkv()
    with pytest.raises(ta.AttentionError, match="forward-only"):
        tuner.attention(q.requires_grad_(), k, v)
    assert not gpu.launches
    with torch.no_grad():  # inference with parameters that require grad: fine
        tuner.attention(q, k, v)
    assert len(gpu.launches) == 1


def test_first_call_inside_a_graph_capture_is_refused_before_any_cuda_call(gpu, monkeypatch):
    q, k, v = qkv()
    monkeypatch.setattr(ta, "_torch_capturing", lambda torch: True)
    with pytest.raises(ta.AttentionError, match="warm-up"):
        tuner.attention(q, k, v)
    assert not gpu.loaded and not gpu.launches
    monkeypatch.setattr(ta, "_torch_capturing", lambda torch: False)
    tuner.attention(q, k, v)  # the warm-up
    monkeypatch.setattr(ta, "_torch_capturing", lambda torch: True)
    tuner.attention(q, k, v)  # captured: the cached plan
    assert len(gpu.launches) == 2 and len(gpu.loaded) == 1


def test_import_tuner_without_pytorch_or_cupy(tmp_path):
    """`import tuner` needs neither PyTorch nor CuPy (nor Optuna) and does not import them."""
    import subprocess
    import sys

    blocker = tmp_path / "sitecustomize.py"
    blocker.write_text(
        "import sys\nclass Block:\n    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('torch', 'cupy'):\n"
        "            raise ImportError(f'{name} is blocked')\n"
        "sys.meta_path.insert(0, Block())\n"
    )
    probe = (
        "import sys, tuner; assert callable(tuner.attention); "
        "assert not {'torch', 'cupy', 'optuna'} & set(sys.modules), sorted({'torch', 'cupy', 'optuna'} & "
        "set(sys.modules))"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(pathlib.Path(ta.__file__).parents[1])]))
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 0, run.stderr
