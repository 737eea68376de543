"""What this machine is and how much memory it has free (``device_memory``), for any device a model runs on: the
device identity in reports and profile keys. A backend's wing reads its device (``BackendInfo.properties`` and
``read_memory``); this module only words what it read, so it never asks which backend or device it holds."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

import ppd_core.device_memory as device_memory
from ppd_core.device_memory import MemoryReading, read_memory
from ppd_core.device_policy import DeviceProperties, cpu_name, memory_source  # noqa: F401 - cpu_name: re-exported


@dataclass(frozen=True)
class DeviceInfo:
    kind: str  # "cpu" or "cuda"
    name: str
    memory_bytes: int
    threads: int
    driver: str = ""

    def to_json(self) -> dict:
        return asdict(self)


def memory_of(properties: DeviceProperties, gpu_memory: Callable[[], tuple[int, int]] | None = None) -> MemoryReading:
    """Used and total memory of the device ``properties`` describe, read where its policy says (``gpu_memory``: the
    wing's reading of a GPU NVML cannot name)."""
    return read_memory(properties, gpu_memory)


def describe(properties: DeviceProperties) -> DeviceInfo:
    """The device ``properties`` describe (with the threads they carry), its driver named where NVML reads it."""
    driver = ""
    if memory_source(properties) == "nvml":
        reading = device_memory.nvml_probe(properties.uuid)
        driver = reading.driver if reading is not None else ""
    return DeviceInfo(properties.kind, properties.name, properties.total_memory_bytes, properties.threads, driver)
