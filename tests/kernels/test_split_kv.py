"""Split-KV's LSE merge (kernel_src/sm90/split_merge.cuh) on the CPU, for every kv_splits value of the space:
rows of keys split into contiguous ranges as the kernel splits key blocks (BlockInfo: range s of n is
[n s / S, n (s + 1) / S)), each split's normalised O and LSE computed in float64, merged by the kernel's code
built for the host, and compared with a softmax over all the row's keys. Rows include splits without keys
(fewer keys than splits), splits whose keys are all masked for the row (LSE -inf), rows no split sees
(O = 0, LSE = -inf) and peaked rows (large scores). Needs nvcc, not a GPU."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import build_host_check
from tuner.space import load_space

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")

CHECK = Path(__file__).parent / "split_merge_check.cu"
SPLITS = load_space("sm90").knob("kv_splits").values
DIM = 8


def _partial(scores: np.ndarray, values: np.ndarray) -> tuple[float, np.ndarray]:
    """(LSE, normalised O) of one split: -inf and zeros when it sees no key (scores all -inf or none)."""
    seen = np.isfinite(scores)
    if not seen.any():
        return -np.inf, np.zeros(values.shape[1])
    m = scores[seen].max()
    p = np.where(seen, np.exp(scores - m), 0.0)
    return m + np.log(p.sum()), p @ values / p.sum()


def _rows(rng: np.random.Generator, splits: int, count: int):
    """(per-split LSEs, per-split O, reference LSE, reference O) of random rows."""
    for i in range(count):
        keys = int(rng.integers(0, 3 * splits + 3)) if i % 7 else int(rng.integers(0, splits))  # some n < S
        scale = (1.0, 4.0, 40.0)[i % 3]  # 40: one key dominates, far past fp32's exp range without the max
        scores = rng.standard_normal(keys) * scale
        if i % 5 == 1:  # a causal-like mask: keys past a random diagonal, so late splits may see none
            scores[int(rng.integers(0, keys + 1)) :] = -np.inf
        values = rng.standard_normal((keys, DIM))
        parts = [
            _partial(
                scores[keys * s // splits : keys * (s + 1) // splits],
                values[keys * s // splits : keys * (s + 1) // splits],
            )
            for s in range(splits)
        ]
        yield [p[0] for p in parts], [p[1] for p in parts], *_partial(scores, values)


@pytest.fixture(scope="module")
def binaries(tmp_path_factory):
    out = tmp_path_factory.mktemp("split_merge")
    built = {}
    for splits in SPLITS:
        built[splits] = build_host_check(CHECK, out / f"merge{splits}", {"FT_KV_SPLITS": splits})
    return built


def _merge(exe: Path, lses, outs) -> np.ndarray:
    lines = [f"{len(lses)} {DIM}"]
    for lse, o in zip(lses, outs, strict=True):
        lines.append(" ".join(f"{x:.9g}" for x in [*lse, *np.concatenate(o)]))
    run = subprocess.run([str(exe)], input="\n".join(lines), capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    return np.array([[float(x) for x in line.split()] for line in run.stdout.splitlines()])


@pytest.mark.parametrize("splits", SPLITS)
def test_the_merge_of_the_splits_is_the_softmax_over_all_keys(binaries, splits):
    rows = list(_rows(np.random.default_rng(splits), splits, 400))
    got = _merge(binaries[splits], [r[0] for r in rows], [r[1] for r in rows])
    want_lse = np.array([r[2] for r in rows])
    want_o = np.array([r[3] for r in rows])
    empty = ~np.isfinite(want_lse)
    assert empty.any() and (~empty).any()  # the rows include ones that no split sees
    assert np.all(got[empty, 0] == -np.inf) and np.all(got[empty, 1:] == 0.0)
    np.testing.assert_allclose(got[~empty, 0], want_lse[~empty], rtol=1e-6, atol=1e-5)
    np.testing.assert_allclose(got[~empty, 1:], want_o[~empty], rtol=1e-5, atol=1e-5)
    if splits > 1:  # the check can fail: the same partials, each split weighted alike, are far off
        naive = np.mean([np.array(r[1]) for r in rows], axis=1)
        assert not np.allclose(naive[~empty], want_o[~empty], atol=1e-3)
