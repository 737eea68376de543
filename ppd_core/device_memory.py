"""How much memory a device has free, read where its policy says (``device_policy.memory_source``): NVML by the
device's UUID on a discrete GPU (its index may differ from torch's under ``CUDA_VISIBLE_DEVICES``), the system's
memory on a CPU and on a Jetson (unified memory: NVML does not work there), the GPU's own count otherwise (torch's
``mem_get_info``, which its caller, the torch wing, passes in)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import psutil

from ppd_core.device_policy import DeviceProperties, memory_source


@dataclass(frozen=True)
class MemoryReading:
    label: str  # "RAM", "GPU" or "unified memory"
    used_bytes: int  # by all processes
    total_bytes: int

    @property
    def free_bytes(self) -> int:
        return self.total_bytes - self.used_bytes


@dataclass(frozen=True)
class NvmlReading:
    name: str
    total_bytes: int
    used_bytes: int  # by all processes
    driver: str


def nvml_probe(uuid: str) -> NvmlReading | None:
    """One NVML reading of the GPU with this UUID; None where NVML is missing or does not know it."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
        name = pynvml.nvmlDeviceGetName(handle)
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
        driver = pynvml.nvmlSystemGetDriverVersion()
        name = name.decode() if isinstance(name, bytes) else name
        return NvmlReading(name, int(memory.total), int(memory.used), str(driver))
    except Exception:
        return None
    finally:
        pynvml.nvmlShutdown()


def read_memory(properties: DeviceProperties, gpu_memory: Callable[[], tuple[int, int]] | None = None) -> MemoryReading:
    """Used and total memory of the device ``properties`` describe; ``gpu_memory()`` gives (used, total) of a GPU
    NVML cannot name."""
    source = memory_source(properties)
    if source == "nvml":
        reading = nvml_probe(properties.uuid)
        if reading is not None:
            return MemoryReading("GPU", reading.used_bytes, reading.total_bytes)
    if source in ("system", "unified") or gpu_memory is None:  # MemAvailable counts reclaimable memory as free
        memory = psutil.virtual_memory()
        return MemoryReading("RAM" if source == "system" else "unified memory", int(memory.total - memory.available),
                             int(memory.total))
    return MemoryReading("GPU", *gpu_memory())
