"""The worked example of a kernel directory of your own (examples/my_kernel, family my_fa) on a real GPU: the
same correctness matrix as the package's families (tests/gpu/test_correctness.py: every dtype, head dim and
mask, odd lengths, GQA, fully masked rows, inputs at two scales, configs covering every knob value), compiled
and checked through the tuner's own path; then ``tuner.attention(..., kernels=)`` against fp32.

Needs a GPU of sm_80 or newer, nvcc and CuPy; skipped with the reason elsewhere.
"""

from __future__ import annotations

import pytest

import tuner
from tests.conftest import REPO_ROOT
from tuner.gpu import MeasureSettings, measure_job_for
from tuner.space import KERNELS_ENV, load_space

from .conftest import compile_many
from .test_attention import _problem, check
from .test_correctness import SHAPES, covering_configs, problems_for, statics

pytestmark = pytest.mark.gpu

EXAMPLE = REPO_ROOT / "examples" / "my_kernel"


@pytest.fixture(scope="module")
def my_fa(device):
    """The family, with the example's directory on $FLASHTUNE_KERNELS while the module runs (the compile
    processes find the family's sources there, as under `flashtune tune --kernels`)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(KERNELS_ENV, str(EXAMPLE))
        space = load_space("my_fa")
        reason = space.runs_on(device.arch)
        if reason:
            pytest.skip(reason)
        yield space


def test_my_fa_is_correct_on_the_whole_matrix(my_fa, worker, device):
    space = my_fa
    configs = {d: covering_configs(space, device, d) for d in space.family.head_dims}
    jobs = [(space, c, problems_for(*static)[0]) for static in statics(space) for c in configs[static[1]]]
    outcomes = compile_many(jobs, device)
    failed = [(c, p.slug(), o.reason) for (_, c, p), o in zip(jobs, outcomes) if o.status != "ok"]
    assert not failed, f"compile failures: {failed[:3]}"
    failures, checked = [], 0
    for (_, config, first), outcome in zip(jobs, outcomes):
        for problem in problems_for(first.dtype, first.head_dim, first.causal):
            for scale in (1.0, 3.0):
                settings = MeasureSettings(timing=False, input_scale=scale)
                job = measure_job_for(space, config, problem, device, outcome.payload, settings, tag="my_fa")
                result = worker.measure(job, timeout_s=120)
                checked += 1
                if not result.ok:
                    failures.append(f"{problem.slug()} x{scale} {config}: {result.status} {result.detail}")
    assert checked == len(jobs) * len(SHAPES) * 2
    assert not failures, f"{len(failures)} of {checked} failed:\n" + "\n".join(failures[:20])


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_tuner_attention_runs_my_fa_from_its_directory(dtype, causal):
    from tuner.gpu._tensors import random_inputs

    problem = _problem((2, 257, 300, 4, 2, 128), dtype, causal)
    q, k, v = random_inputs(problem, seed=3)
    o, lse = tuner.attention(
        q, k, v, causal=causal, family="my_fa", kernels=EXAMPLE, config={"block_n": 16}, return_lse=True
    )
    import cupy

    cupy.cuda.Device().synchronize()
    check(problem, q, k, v, o, lse)
