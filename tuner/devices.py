"""Hardware limits that space constraints are checked against, and that reach the compiler.

On a machine with a GPU the limits are read from the device (the GPU worker's ``gpu_info``, tuner/gpu);
without one, ``flashtune check --arch 80`` uses the table below, taken from the CUDA programming
guide's per-compute-capability limits ("Technical Specifications per Compute Capability").
:meth:`DeviceLimits.macros` passes the same limits to a build as ``-D`` macros, which the
kernels' config headers restate as ``static_assert``s: this module is their one source.
"""

from __future__ import annotations

import ctypes
from dataclasses import asdict, dataclass

from .errors import UsageError

__all__ = ["DEVICE_MACROS", "KNOWN_ARCHS", "DeviceLimits", "gpu_unavailable", "limits_for_arch", "missing_driver"]

#: Shared memory the system reserves for every resident CTA (cudaDevAttrReservedSharedMemoryPerBlock), sm_80 on.
SMEM_RESERVED_PER_BLOCK = 1024

#: Device limits that reach the compiler (:meth:`DeviceLimits.macros`): ``DeviceLimits.env`` name -> macro.
DEVICE_MACROS = {
    "smem_per_block_optin": "FT_SMEM_PER_BLOCK_OPTIN",
    "smem_per_sm": "FT_SMEM_PER_SM",
    "smem_reserved_per_block": "FT_SMEM_RESERVED_PER_BLOCK",
    "regs_per_sm": "FT_REGS_PER_SM",
    "max_regs_per_thread": "FT_MAX_REGS_PER_THREAD",
}


@dataclass(frozen=True, kw_only=True)
class DeviceLimits:
    """What a kernel config must fit into. ``arch`` is the compute capability times ten.

    ``smem_per_sm``: shared memory of one SM, shared by its resident CTAs, each of which also
    takes ``smem_reserved_per_block``. 0 (unknown, e.g. limits stored by an older flashtune)
    becomes the table's value for ``arch``, else room for exactly one CTA of the opt-in maximum.
    """

    arch: int
    smem_per_block_optin: int
    smem_per_sm: int = 0
    smem_reserved_per_block: int = SMEM_RESERVED_PER_BLOCK
    regs_per_sm: int = 65536
    max_regs_per_thread: int = 255
    num_sms: int
    name: str = ""

    def __post_init__(self) -> None:
        if not self.smem_per_sm:
            known = _TABLE.get(self.arch)
            per_sm = known[1] if known else self.smem_per_block_optin + self.smem_reserved_per_block
            object.__setattr__(self, "smem_per_sm", per_sm)

    def env(self) -> dict[str, int]:
        """Names a space expression may read about the device."""
        return {
            "arch": self.arch,
            "smem_per_block_optin": self.smem_per_block_optin,
            "smem_per_sm": self.smem_per_sm,
            "smem_reserved_per_block": self.smem_reserved_per_block,
            "regs_per_sm": self.regs_per_sm,
            "max_regs_per_thread": self.max_regs_per_thread,
            "num_sms": self.num_sms,
        }

    def macros(self) -> dict[str, int]:
        """The ``-D`` macros of the limits a kernel's config header checks at compile time (its
        ``static_assert``s): the values the space's constraints are checked against, so that a config the
        static check accepts for this device also compiles for it. Not ``arch`` (nvcc's ``__CUDA_ARCH__``)
        nor ``num_sms`` (the host sizes persistent grids, so one cubin serves every part of an arch)."""
        env = self.env()
        return {macro: env[name] for name, macro in DEVICE_MACROS.items()}

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_info(cls, info: dict[str, object]) -> DeviceLimits:
        """Limits from what the GPU worker reports (``tuner.gpu.info.gpu_info``); info stored before
        ``smem_per_sm`` was reported gets the table's value for its arch."""
        return cls(
            arch=int(info["arch"]),
            smem_per_block_optin=int(info["smem_per_block_optin"]),
            smem_per_sm=int(info.get("smem_per_sm", 0) or 0),
            smem_reserved_per_block=int(info.get("smem_reserved_per_block", SMEM_RESERVED_PER_BLOCK)),
            regs_per_sm=int(info["regs_per_sm"]),
            num_sms=int(info["num_sms"]),
            name=str(info["name"]),
        )


# arch -> (opt-in shared memory per block, shared memory per SM, both in bytes; SM count of the flagship part)
_TABLE = {
    80: (166912, 167936, 108, "A100"),
    86: (101376, 102400, 84, "RTX 30"),
    87: (166912, 167936, 16, "Orin"),
    89: (101376, 102400, 128, "RTX 40 / L40"),
    90: (232448, 233472, 132, "H100/H200"),
    100: (232448, 233472, 148, "B200"),
    103: (232448, 233472, 148, "B300"),
    120: (101376, 102400, 188, "RTX 50"),
}
KNOWN_ARCHS = tuple(sorted(_TABLE))


def limits_for_arch(arch: int) -> DeviceLimits:
    """Nominal limits of a compute capability, for checks on a machine without that GPU."""
    if arch not in _TABLE:
        raise ValueError(f"unknown arch {arch}; known: {', '.join(map(str, KNOWN_ARCHS))}")
    smem, per_sm, sms, name = _TABLE[arch]
    return DeviceLimits(
        arch=arch, smem_per_block_optin=smem, smem_per_sm=per_sm, num_sms=sms, name=f"sm_{arch} ({name}, nominal)"
    )


_DRIVER_LIBRARIES = ("libcuda.so.1", "libcuda.so", "nvcuda.dll")


def missing_driver() -> str | None:
    """Why this machine has no NVIDIA driver to run kernels with (its CUDA library cannot be loaded), or None.

    Only loads the library (no CUDA call): safe in a process that starts GPU workers afterwards.
    """
    for name in _DRIVER_LIBRARIES:
        try:
            ctypes.CDLL(name)
            return None
        except OSError:
            continue
    return "no NVIDIA driver on this machine (libcuda.so.1 cannot be loaded)"


def gpu_unavailable(index: int | None, detail: str) -> UsageError:
    """The one message for "this command needs a GPU and cannot have one": the missing driver when that is
    the cause (CUDA itself then blames a "driver version insufficient"), else what the GPU worker said."""
    lines = [line.strip() for line in str(detail).splitlines() if line.strip()]
    reason = missing_driver() or (lines[-1] if lines else "the GPU worker did not start")
    which = "" if index is None else f" {index}"
    return UsageError(
        f"no usable GPU{which}: {reason}; tuning and benchmarking need an NVIDIA GPU with its driver "
        "(`flashtune check` compiles and checks a space without one)"
    )
