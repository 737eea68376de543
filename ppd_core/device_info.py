"""What this machine is and how much memory it has free (``device_memory``), for any device a model runs on: the
device identity in reports and profile keys. A ``torch.device`` is read by the torch wing (``backends/torch/device``),
which only a model on torch hands out: a GGUF on llama.cpp ("cpu") never imports torch."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass

import ppd_core.device_memory as device_memory
from ppd_core.device_memory import MemoryReading, read_memory
from ppd_core.device_policy import DeviceProperties, cpu_name, cpu_properties, memory_source  # noqa: F401 - cpu_name: re-exported


@dataclass(frozen=True)
class DeviceInfo:
    kind: str  # "cpu" or "cuda"
    name: str
    memory_bytes: int
    threads: int
    driver: str = ""

    def to_json(self) -> dict:
        return asdict(self)


def properties_of(device, threads: int = 1) -> DeviceProperties:
    """The properties of a live device: "cpu", or a ``torch.device`` (read by the torch wing: a model on torch)."""
    if isinstance(device, str):
        return cpu_properties(threads)
    from ppd_core.backends.torch.device import torch_properties  # noqa: PLC0415 - a torch device: torch is loaded

    return torch_properties(device, threads)


def memory_of(device, properties: DeviceProperties | None = None) -> MemoryReading:
    """Used and total memory of ``device`` ("cpu" or a ``torch.device``), read where its policy says."""
    properties = properties or properties_of(device)

    def gpu_memory() -> tuple[int, int]:
        from ppd_core.backends.torch.device import cuda_memory  # noqa: PLC0415 - a GPU NVML cannot name: torch's

        return cuda_memory(device)

    return read_memory(properties, None if isinstance(device, str) else gpu_memory)


def describe(device, threads: int | None = None) -> DeviceInfo:
    """``device`` ("cpu" or a ``torch.device``) with ``threads`` (default: torch's, on a torch device; else one per
    core)."""
    if threads is None and isinstance(device, str):
        threads = os.cpu_count() or 1
    elif threads is None:
        from ppd_core.backends.torch.device import num_threads  # noqa: PLC0415 - a torch device: torch is loaded

        threads = num_threads()
    properties = properties_of(device, threads)
    driver = ""
    if memory_source(properties) == "nvml":
        reading = device_memory.nvml_probe(properties.uuid)
        driver = reading.driver if reading is not None else ""
    return DeviceInfo(properties.kind, properties.name, properties.total_memory_bytes, properties.threads, driver)
