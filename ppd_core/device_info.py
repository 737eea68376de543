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


@dataclass(frozen=True)
class NvmlReading:
    name: str
    total_bytes: int
    used_bytes: int  # by all processes
    driver: str


def nvml_probe(index: int) -> NvmlReading | None:
    """One NVML reading of GPU ``index``; None where NVML is missing or unusable (e.g. Jetson)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        name = pynvml.nvmlDeviceGetName(handle)
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
        driver = pynvml.nvmlSystemGetDriverVersion()
        name = name.decode() if isinstance(name, bytes) else name
        return NvmlReading(name, int(memory.total), int(memory.used), str(driver))
    except Exception:
        return None
    finally:
        pynvml.nvmlShutdown()


def describe(device: torch.device) -> DeviceInfo:
    if device.type == "cuda":
        index = device.index or 0
        reading = nvml_probe(index)
        if reading is not None:
            return DeviceInfo("cuda", reading.name, reading.total_bytes, torch.get_num_threads(), reading.driver)
        props = torch.cuda.get_device_properties(index)  # torch still knows the basics
        return DeviceInfo("cuda", props.name, int(props.total_memory), torch.get_num_threads())
    return DeviceInfo("cpu", cpu_name(), psutil.virtual_memory().total, torch.get_num_threads())
