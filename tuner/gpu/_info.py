"""What a study records about the GPU it measured on: name, limits, driver, clocks."""

from __future__ import annotations

import cupy

from ..devices import SMEM_RESERVED_PER_BLOCK

__all__ = ["gpu_info"]


def _clocks(pci_bus_id: str) -> dict[str, int]:
    """SM and memory clocks in MHz through NVML, when nvidia-ml-py is installed (else empty).

    The device is found by its PCI bus id: NVML numbers GPUs without CUDA_VISIBLE_DEVICES.
    """
    try:
        import pynvml
    except ImportError:
        return {}
    try:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByPciBusId(pci_bus_id.encode())
        driver = pynvml.nvmlSystemGetDriverVersion()
        return {
            "driver_version": driver.decode() if isinstance(driver, bytes) else str(driver),
            "sm_clock_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
            "sm_clock_max_mhz": pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM),
            "mem_clock_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM),
        }
    except pynvml.NVMLError:
        return {}


def gpu_info() -> dict[str, object]:
    device = cupy.cuda.Device()
    props = cupy.cuda.runtime.getDeviceProperties(device.id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    driver = cupy.cuda.runtime.driverGetVersion()
    return {
        "name": name,
        "index": device.id,
        "arch": props["major"] * 10 + props["minor"],
        "num_sms": props["multiProcessorCount"],
        "smem_per_block_optin": props["sharedMemPerBlockOptin"],
        "smem_per_sm": props["sharedMemPerMultiprocessor"],
        "smem_reserved_per_block": props.get("reservedSharedMemPerBlock", SMEM_RESERVED_PER_BLOCK),
        "regs_per_sm": props["regsPerMultiprocessor"],
        "l2_bytes": props["l2CacheSize"],
        "driver": f"{driver // 1000}.{driver % 1000 // 10}",  # the CUDA version the driver supports
        "cuda_runtime": cupy.cuda.runtime.runtimeGetVersion(),
        "cupy": cupy.__version__,
        **_clocks(device.pci_bus_id),
    }
