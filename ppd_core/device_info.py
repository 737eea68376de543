"""What this machine is: the device identity used in reports and profile keys."""

from __future__ import annotations

import platform
from dataclasses import asdict, dataclass

import psutil
import torch


@dataclass(frozen=True)
class DeviceInfo:
    kind: str  # "cpu" or "cuda"
    name: str
    memory_bytes: int
    threads: int
    driver: str = ""

    def to_json(self) -> dict:
        return asdict(self)


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_identity(index: int) -> tuple[str, int, str]:
    """Name, total memory and driver from NVML; falls back to torch where NVML is missing."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            total = pynvml.nvmlDeviceGetMemoryInfo(handle).total
            driver = pynvml.nvmlSystemGetDriverVersion()
            return (name.decode() if isinstance(name, bytes) else name), int(total), str(driver)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # NVML absent or unusable: torch still knows the basics
        props = torch.cuda.get_device_properties(index)
        return props.name, int(props.total_memory), ""


def describe(device: torch.device) -> DeviceInfo:
    if device.type == "cuda":
        name, memory, driver = gpu_identity(device.index or 0)
        return DeviceInfo("cuda", name, memory, torch.get_num_threads(), driver)
    return DeviceInfo("cpu", cpu_name(), psutil.virtual_memory().total, torch.get_num_threads())
