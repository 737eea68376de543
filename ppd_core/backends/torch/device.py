"""What torch says of a device: its properties, its free memory (a GPU's by torch where NVML cannot tell), its
threads, and the doctor's report of torch's build. The rest of ppd asks through ``ppd_core.device_info`` only where
it holds a ``torch.device`` (a model on torch), so nothing imports torch for a GGUF on llama.cpp."""

from __future__ import annotations

from dataclasses import replace

import torch

from ppd_core.cpu_cores import usable_cores
from ppd_core.device_memory import MemoryReading, read_memory
from ppd_core.device_policy import DeviceProperties, cpu_properties, nvml_uuid, parse_version


def torch_properties(device: torch.device, threads: int = 1) -> DeviceProperties:
    """The properties of a torch device: the CPU's with torch's version, or a CUDA GPU's."""
    version = parse_version(torch.__version__)
    if device.type != "cuda":
        return replace(cpu_properties(threads), torch_version=version)
    index = device.index if device.index is not None else torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    uuid = getattr(props, "uuid", None)
    return DeviceProperties(
        "cuda", props.name, int(props.total_memory), (props.major, props.minor),
        integrated=bool(getattr(props, "is_integrated", False)),
        uuid=None if uuid is None else nvml_uuid(str(uuid)), threads=threads, torch_version=version,
    )


def cuda_memory(device: torch.device) -> tuple[int, int]:
    """(used, total) bytes of a GPU, by ``torch.cuda.mem_get_info`` (where NVML cannot name it)."""
    free, total = torch.cuda.mem_get_info(device)
    return int(total - free), int(total)


def memory_of(device: torch.device) -> MemoryReading:
    """Used and total memory of a torch device, read where its policy says."""
    return read_memory(torch_properties(device), lambda: cuda_memory(device))


def num_threads() -> int:
    """torch's CPU threads (process-wide)."""
    return torch.get_num_threads()


def set_threads(threads: int) -> None:
    torch.set_num_threads(threads)


def fit_threads_to_cores() -> None:
    """torch's CPU threads no more than the cores this process may use: torch counts the machine's cores, and in a
    container given fewer (``--cpus``) its threads wait on each other at every operation."""
    cores = usable_cores()
    if torch.get_num_threads() > cores:
        torch.set_num_threads(cores)


def torch_report(device) -> dict:
    """torch's build for ``ppd doctor``: its version, CUDA and cuDNN, and cuda:0's properties where CUDA is
    available but ``device`` ("cpu" or a ``torch.device``) is not a GPU."""
    cuda = torch.cuda.is_available()
    gpu = torch_properties(torch.device("cuda", 0)) if cuda and getattr(device, "type", device) != "cuda" else None
    return {"torch": torch.__version__, "torch_cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
            "cuda_available": cuda, "gpu": gpu}
