"""What this machine is and how much memory it has free: the device identity in reports and profile keys.

Where memory is read is ``device_policy.memory_source``'s choice: NVML by the device's UUID on a discrete
GPU (its index may differ from torch's under ``CUDA_VISIBLE_DEVICES``), the system's memory on a CPU and
on a Jetson (unified memory: NVML does not work there), torch's ``mem_get_info`` otherwise.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import psutil

from ppd_core.device_policy import DeviceProperties, cpu_name, memory_source, properties_of  # noqa: F401 - cpu_name: re-exported


@dataclass(frozen=True)
class DeviceInfo:
    kind: str  # "cpu" or "cuda"
    name: str
    memory_bytes: int
    threads: int
    driver: str = ""

    def to_json(self) -> dict:
        return asdict(self)


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


def memory_of(device, properties: DeviceProperties | None = None) -> MemoryReading:
    """Used and total memory of ``device`` ("cpu" or a ``torch.device``), read where its policy says."""
    properties = properties or properties_of(device)
    source = memory_source(properties)
    if source == "nvml":
        reading = nvml_probe(properties.uuid)
        if reading is not None:
            return MemoryReading("GPU", reading.used_bytes, reading.total_bytes)
    if source in ("system", "unified"):  # MemAvailable counts reclaimable memory (page cache) as free
        memory = psutil.virtual_memory()
        return MemoryReading("RAM" if source == "system" else "unified memory", int(memory.total - memory.available),
                             int(memory.total))
    import torch  # a GPU's memory, where NVML cannot tell: the torch path only

    free, total = torch.cuda.mem_get_info(device)
    return MemoryReading("GPU", int(total - free), int(total))


def describe(device, threads: int | None = None) -> DeviceInfo:
    """``device`` ("cpu" or a ``torch.device``) with ``threads`` (default: torch's, on a torch device)."""
    if threads is None:
        import torch  # a torch device's own thread count

        threads = torch.get_num_threads()
    properties = properties_of(device, threads)
    driver = ""
    if memory_source(properties) == "nvml":
        reading = nvml_probe(properties.uuid)
        driver = reading.driver if reading is not None else ""
    return DeviceInfo(properties.kind, properties.name, properties.total_memory_bytes, properties.threads, driver)
