"""The CPU-side plan of tuner.gpu.measure's reference check: which rows of which heads are compared
(the check itself runs on the GPU: tests/gpu/)."""

from __future__ import annotations

import numpy as np
import pytest

from tuner.gpu.measure import _FULL_CHECK_ELEMENTS, _MAX_ROW_STRIDE, check_rows


def test_a_small_problem_is_checked_on_every_row():
    assert check_rows(4, 8, 1000, 1000, np.random.default_rng(0)) is None


@pytest.mark.parametrize(("batch", "heads", "seqlen_q", "seqlen_k"), [
    (8, 16, 2048, 2048),     # the default study: 2^29 score elements
    (1, 16, 16384, 16384),   # the sweep's longest shape
    (1, 32, 16384, 16384),
    (1, 16, 65536, 65536),   # beyond any budget: the stride stops at one row per 64-row block
    (3, 5, 4097, 9000),
])
def test_a_large_problem_is_checked_on_strided_rows_of_every_block(batch, heads, seqlen_q, seqlen_k):
    for seed in range(5):
        rows = check_rows(batch, heads, seqlen_q, seqlen_k, np.random.default_rng(seed))
        assert rows is not None and np.all(np.diff(rows) > 0) and 0 <= rows[0] and rows[-1] == seqlen_q - 1
        blocks = set((rows // _MAX_ROW_STRIDE).tolist())
        assert blocks == set(range(-(-seqlen_q // _MAX_ROW_STRIDE)))  # every 64-row block has a checked row
        stride = rows[1] - rows[0]
        if stride < _MAX_ROW_STRIDE:  # within the budget, and no finer stride would be
            assert batch * heads * (len(rows) - 1) * seqlen_k <= _FULL_CHECK_ELEMENTS
            assert batch * heads * -(-seqlen_q // (stride // 2)) * seqlen_k > _FULL_CHECK_ELEMENTS
