"""The attention problem a study tunes for: shapes, dtype, masking."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .errors import FlashtuneError

__all__ = ["DTYPES", "MAX_DIM", "Dtype", "Problem", "ProblemError"]

#: largest size of any dimension: the kernels take them as 32-bit ``int``
MAX_DIM = 2**31 - 1


@dataclass(frozen=True, kw_only=True)
class Dtype:
    """One element type of the kernels' inputs and output (a 16-bit float; fp32 accumulation), as each
    library that holds such tensors spells it. NumPy and CuPy have no bfloat16: bf16 is stored as its
    ``uint16`` bits there."""

    name: str  # flashtune's name, as a problem, a space file and a header give it
    bytes: int  # per element
    torch_name: str  # the ``torch`` attribute of the dtype: ``getattr(torch, d.torch_name)``
    storage: str  # the NumPy/CuPy dtype that holds the elements (the values, or for bf16 their bits)
    nan_bits: int  # a quiet NaN's 16 bits (outputs are poisoned with it before a check)
    tma_data_type: int  # CUtensorMapDataType of cuda.h (CU_TENSOR_MAP_DATA_TYPE_FLOAT16, _BFLOAT16)


#: name -> dtype, in the order of the exported ``enum class DType``
DTYPES = {
    d.name: d
    for d in (
        Dtype(name="fp16", bytes=2, torch_name="float16", storage="float16", nan_bits=0x7E00, tma_data_type=6),
        Dtype(name="bf16", bytes=2, torch_name="bfloat16", storage="uint16", nan_bits=0x7FC0, tma_data_type=9),
    )
}


class ProblemError(FlashtuneError, ValueError):
    """The problem's shape or dtype is impossible or unsupported."""


@dataclass(frozen=True, kw_only=True)
class Problem:
    """One forward-attention shape. ``seqlen_k`` defaults to ``seqlen_q``, ``heads_kv`` to ``heads_q``."""

    batch: int
    seqlen_q: int
    heads_q: int
    head_dim: int
    dtype: str = "fp16"
    causal: bool = False
    seqlen_k: int | None = None
    heads_kv: int | None = None

    def __post_init__(self) -> None:
        if self.seqlen_k is None:
            object.__setattr__(self, "seqlen_k", self.seqlen_q)
        if self.heads_kv is None:
            object.__setattr__(self, "heads_kv", self.heads_q)
        for name in ("batch", "seqlen_q", "seqlen_k", "heads_q", "heads_kv", "head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ProblemError(f"{name} must be a positive integer, got {value!r:.40}")
            if value > MAX_DIM:
                raise ProblemError(
                    f"{name} must be at most {MAX_DIM} (the kernels index with 32-bit integers), got {value}"
                )
        if not isinstance(self.causal, bool):
            raise ProblemError(f"causal must be true or false, got {self.causal!r:.40}")
        if not isinstance(self.dtype, str) or self.dtype not in DTYPES:
            raise ProblemError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r:.40}")
        if self.heads_q % self.heads_kv:
            raise ProblemError(
                f"heads_kv ({self.heads_kv}) must divide heads_q ({self.heads_q}) for grouped-query attention"
            )

    @property
    def dtype_bytes(self) -> int:
        return DTYPES[self.dtype].bytes

    @property
    def dtype_spec(self) -> Dtype:
        """The dtype's names in PyTorch, NumPy/CuPy and the CUDA driver (see :data:`DTYPES`)."""
        return DTYPES[self.dtype]

    @property
    def flops(self) -> float:
        """Matrix FLOPs of the forward pass (2 GEMMs, 2 FLOPs per MAC), counting only unmasked pairs."""
        pairs = float(self.seqlen_q) * self.seqlen_k
        if self.causal:
            pairs = _causal_pairs(self.seqlen_q, self.seqlen_k)
        return 4.0 * self.batch * self.heads_q * pairs * self.head_dim

    def env(self) -> dict[str, int]:
        """Names a space expression may read about the problem."""
        return {
            "batch": self.batch,
            "seqlen_q": self.seqlen_q,
            "seqlen_k": self.seqlen_k,  # type: ignore[dict-item]
            "heads_q": self.heads_q,
            "heads_kv": self.heads_kv,  # type: ignore[dict-item]
            "head_dim": self.head_dim,
            "dtype_bytes": self.dtype_bytes,
            "is_bf16": int(self.dtype == "bf16"),
            "causal": int(self.causal),
        }

    def macros(self) -> dict[str, int]:
        """The problem's compile-time macros, common to every kernel family."""
        return {"FT_HEAD_DIM": self.head_dim, "FT_IS_BF16": int(self.dtype == "bf16"), "FT_IS_CAUSAL": int(self.causal)}

    def slug(self) -> str:
        """A short, stable, human-readable name fragment: ``fp16-d128-causal-b8-h16-n2048``."""
        parts = [
            self.dtype,
            f"d{self.head_dim}",
            "causal" if self.causal else "full",
            f"b{self.batch}",
            f"h{self.heads_q}",
        ]
        if self.heads_kv != self.heads_q:
            parts.append(f"kv{self.heads_kv}")
        parts.append(f"n{self.seqlen_q}" if self.seqlen_k == self.seqlen_q else f"n{self.seqlen_q}x{self.seqlen_k}")
        return "-".join(parts)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> Problem:
        """The problem stored as :meth:`to_dict`; :class:`ProblemError` for anything else."""
        if not isinstance(data, dict):
            raise ProblemError(f"a problem must be a table of its fields, got {type(data).__name__}")
        try:
            return cls(**data)  # type: ignore[arg-type]
        except TypeError as e:
            raise ProblemError(f"malformed problem fields: {e}") from None


def _causal_pairs(seqlen_q: int, seqlen_k: int) -> float:
    """Visible (query, key) pairs under bottom-right aligned causal masking.

    Row ``i`` sees ``i + seqlen_k - seqlen_q + 1`` keys, at most ``seqlen_k`` (reached by the
    last row) and at least 0, so the count is an arithmetic series over the rows that see any.
    """
    offset = seqlen_k - seqlen_q
    first = max(0, -offset)  # first row that sees at least one key
    rows = seqlen_q - first
    if rows <= 0:
        return 0.0
    return (first + offset + 1 + seqlen_k) * rows / 2.0
