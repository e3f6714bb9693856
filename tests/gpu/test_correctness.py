"""The correctness matrix on a real GPU, through the tuner's own compile and measure path.

Every family the GPU can run × fp16/bf16 × head dims × causal or not × odd lengths, GQA and
seqlen_q != seqlen_k (fully masked rows) × a set of configs in which every value of every
knob appears at least once. Outputs are poisoned, inputs random, the reference float32.

Fast by the tuner's own means: every kernel of the matrix is compiled up front in one pool
sized to the cores, the jobs are check-only, and they run problem by problem, so the worker
makes each problem's inputs and reference once and checks every config on them.
"""

from __future__ import annotations

import os
import random

import pytest

from tests.kernels.sm90_configs import REPRESENTATIVE
from tuner.gpu import MeasureSettings, measure_job_for
from tuner.problem import Problem
from tuner.space import ConfigError, available_families, complete, load_space

from .conftest import compile_many

pytestmark = pytest.mark.gpu

# (batch, seqlen_q, seqlen_k, heads_q, heads_kv); the last three have more query blocks than an H100/H200
# has SMs, so that a persistent CTA (or cluster) loops over several work units; in the last one most
# causal units see no key at all (seqlen_q - seqlen_k >= block_m), which once broke ping-pong's turns.
# Split-KV (kv_splits) runs on all of them; (1, 512, 512, 4, 1) is the few-units shape it is for (GQA 4:1,
# 4 key blocks of 128: kv_splits 6 and 8 leave splits without a key)
SHAPES = [
    (2, 1, 1, 2, 2),
    (1, 17, 17, 3, 3),
    (2, 257, 257, 4, 2),
    (1, 512, 512, 4, 1),
    (1, 1000, 1000, 8, 2),
    (1, 100, 300, 2, 2),
    (1, 300, 100, 2, 1),
    (1, 2048, 2048, 4, 4),
    (8, 1000, 1000, 8, 2),
    (4, 700, 900, 16, 4),
    (4, 2048, 256, 16, 4),
]

# The tail split (tail_splits > 1) splits only the last, partly filled wave's tiles, which the shapes above leave
# empty or too full on 132 SMs; its configs also run on these (tiles on an H200, T mod 132 = r, and the splits each
# takes): 12 heads over 4 (GQA) at N 3000: 288 tiles of 128 rows (r = 24: tail_splits 2-4 run as given), 192 of
# 192 (r = 60: 3 and 4 clamped to 2), 144 clusters of 256 rows on 66 (r = 12), 564 of 64 on 264 CTAs (r = 36);
# B2 10 heads over 5 at N 1100: 180 tiles of 128 (r = 48: 3 and 4 clamped to 2), 120 of 192 (one wave: none);
# 22 heads, 1500 queries over 1300 keys (causal rows that see no key): 176 tiles of 192 (r = 44: 3 splits).
TAIL_SHAPES = [(1, 3000, 3000, 12, 4), (2, 1100, 1100, 10, 5), (1, 1500, 1300, 22, 22)]


def statics(space):
    return [
        (dtype, d, causal) for dtype in space.family.dtypes for d in space.family.head_dims for causal in (False, True)
    ]


def problems_for(dtype, head_dim, causal, shapes=SHAPES):
    return [
        Problem(
            batch=b, seqlen_q=nq, seqlen_k=nk, heads_q=hq, heads_kv=hk, head_dim=head_dim, dtype=dtype, causal=causal
        )
        for b, nq, nk, hq, hk in shapes
    ]


def covering_configs(space, device, head_dim, seed=0, causal_only=()):
    """For one head dim: its default, the family's representative knob combinations
    (tests/kernels/sm90_configs.py, completed for the first static problem), then configs feasible for every static problem of that head dim
    so that every knob value that fits it appears at least once. With ``causal_only`` (those configs, run on every
    problem): the same over the causal problems alone, less those configs: what runs only with the causal mask."""
    rng = random.Random(seed)
    probes = [problems_for(*s)[0] for s in statics(space) if s[1] == head_dim and (s[2] or not causal_only)]
    chosen = list(causal_only) or [space.defaults(head_dim)]
    for partial in REPRESENTATIVE.get(space.name, {}).values():
        try:
            c = complete(space, partial, probes[0], device).config
        except ConfigError:  # the given knobs do not run at this head dim
            continue
        if c not in chosen and all(space.check(c, p, device) is None for p in probes):
            chosen.append(c)
    for knob in space.knobs:
        for value in knob.values:
            if any(c[knob.name] == value for c in chosen):
                continue
            for _ in range(500):
                c = {k.name: rng.choice(k.values) for k in space.knobs}
                c[knob.name] = value
                if all(space.check(c, p, device) is None for p in probes):
                    chosen.append(c)
                    break
    return only_matching(chosen[len(causal_only) :])


def only_matching(configs: list[dict]) -> list[dict]:
    """FLASHTUNE_MATRIX_ONLY="knob=value,...": only the configs with those values (to check one new knob's
    configs on a GPU without the whole matrix); unset: all of them."""
    wanted = os.environ.get("FLASHTUNE_MATRIX_ONLY", "")
    pairs = [item.split("=", 1) for item in wanted.split(",") if item]
    return [c for c in configs if all(str(c.get(k)) == v for k, v in pairs)]


@pytest.fixture(scope="module")
def matrix(device) -> dict:
    """family -> (space, kernels by (config items, dtype, head dim, causal), compile failures), for every
    family that runs on this GPU; all of them compiled in one pool."""
    spaces = [space for space in map(load_space, available_families()) if space.runs_on(device.arch) is None]
    jobs = []
    for space in spaces:
        every = {d: covering_configs(space, device, d) for d in space.family.head_dims}
        causal = {d: covering_configs(space, device, d, causal_only=every[d]) for d in space.family.head_dims}
        for dtype, d, is_causal in statics(space):
            jobs += [
                (space, c, problems_for(dtype, d, is_causal)[0]) for c in every[d] + (causal[d] if is_causal else [])
            ]
    outcomes = compile_many(jobs, device)
    out = {space.name: (space, {}, []) for space in spaces}
    for (space, c, p), o in zip(jobs, outcomes):
        _, kernels, failed = out[space.name]
        if o.status == "ok":
            kernels[(tuple(c.items()), p.dtype, p.head_dim, p.causal)] = o.payload
        else:
            failed.append((c, p.slug(), o.reason))
    return out


@pytest.fixture(scope="module", params=available_families())
def compiled(request, device, matrix):
    space = load_space(request.param)
    reason = space.runs_on(device.arch)
    if reason:
        pytest.skip(reason)
    space, kernels, failed = matrix[request.param]
    assert not failed, f"compile failures: {failed[:3]}"
    return space, kernels


def test_every_config_is_correct_on_every_shape(compiled, worker, device):
    space, kernels = compiled
    by_static: dict[tuple, list] = {}
    for (items, dtype, head_dim, causal), kernel in kernels.items():
        by_static.setdefault((dtype, head_dim, causal), []).append((dict(items), kernel))
    failures, checked = [], 0
    for static, configs in by_static.items():
        for problem in problems_for(*static):
            for scale in (1.0, 3.0):  # 3.0 widens the score range: stresses lazy rescaling
                settings = MeasureSettings(timing=False, input_scale=scale)
                for config, kernel in configs:  # one problem's inputs and reference serve every config
                    job = measure_job_for(space, config, problem, device, kernel, settings, tag="matrix")
                    result = worker.measure(job, timeout_s=120)
                    checked += 1
                    if not result.ok:
                        failures.append(f"{problem.slug()} x{scale} {config}: {result.status} {result.detail}")
    assert checked == len(kernels) * len(SHAPES) * 2
    assert not failures, f"{len(failures)} of {checked} failed:\n" + "\n".join(failures[:20])


def test_the_tail_split_is_correct_where_it_splits(compiled, worker, device):
    """The configs with tail_splits > 1 on TAIL_SHAPES, where the last wave's tiles are split (on an H200)."""
    space, kernels = compiled
    if not any(knob.name == "tail_splits" for knob in space.knobs):
        pytest.skip(f"{space.name} has no tail split")
    failures, checked = [], 0
    for (items, dtype, head_dim, causal), kernel in kernels.items():
        config = dict(items)
        if config["tail_splits"] == 1:
            continue
        for problem in problems_for(dtype, head_dim, causal, TAIL_SHAPES):
            job = measure_job_for(space, config, problem, device, kernel, MeasureSettings(timing=False), tag="tail")
            result = worker.measure(job, timeout_s=120)
            checked += 1
            if not result.ok:
                failures.append(f"{problem.slug()} {config}: {result.status} {result.detail}")
    if not checked and os.environ.get("FLASHTUNE_MATRIX_ONLY"):
        pytest.skip("FLASHTUNE_MATRIX_ONLY left no tail-split config in the matrix")
    assert checked, "no tail-split config in the matrix"
    assert not failures, f"{len(failures)} of {checked} failed:\n" + "\n".join(failures[:20])
