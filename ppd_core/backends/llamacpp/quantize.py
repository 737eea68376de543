"""`ppd quantize`: a GGUF file re-quantized by llama.cpp's own quantizer (``llama_model_quantize``), checked first.

What is refused, in one line each, before anything is written: an unknown type, a source that is not a GGUF file,
an output that exists (unless ``force``), too little free disk for the output's estimated size, and the IQ types
llama.cpp quantizes only with an importance matrix. A source already at 4 bits or fewer is allowed with a warning:
quantizing again compounds the rounding (the quality lost shows in the perplexity ``ppd quantize`` reports).
"""

from __future__ import annotations

import ctypes
import shutil
from dataclasses import dataclass
from pathlib import Path

from ppd_core.errors import PpdError

# type -> (llama.cpp's LLAMA_FTYPE_ suffix, bits per weight of its main tensors: the output size estimate)
TYPES = {
    "F32": ("ALL_F32", 32.0), "F16": ("MOSTLY_F16", 16.0), "BF16": ("MOSTLY_BF16", 16.0),
    "Q8_0": ("MOSTLY_Q8_0", 8.5), "Q6_K": ("MOSTLY_Q6_K", 6.5625), "Q5_1": ("MOSTLY_Q5_1", 6.0),
    "Q5_0": ("MOSTLY_Q5_0", 5.5), "Q5_K_M": ("MOSTLY_Q5_K_M", 5.7), "Q5_K_S": ("MOSTLY_Q5_K_S", 5.5),
    "Q4_1": ("MOSTLY_Q4_1", 5.0), "Q4_0": ("MOSTLY_Q4_0", 4.5), "Q4_K_M": ("MOSTLY_Q4_K_M", 4.85),
    "Q4_K_S": ("MOSTLY_Q4_K_S", 4.58), "IQ4_NL": ("MOSTLY_IQ4_NL", 4.5), "IQ4_XS": ("MOSTLY_IQ4_XS", 4.25),
    "Q3_K_L": ("MOSTLY_Q3_K_L", 4.27), "Q3_K_M": ("MOSTLY_Q3_K_M", 3.91), "Q3_K_S": ("MOSTLY_Q3_K_S", 3.5),
    "IQ3_M": ("MOSTLY_IQ3_M", 3.7), "IQ3_S": ("MOSTLY_IQ3_S", 3.44), "IQ3_XS": ("MOSTLY_IQ3_XS", 3.3),
    "IQ3_XXS": ("MOSTLY_IQ3_XXS", 3.06), "Q2_K": ("MOSTLY_Q2_K", 3.35), "Q2_K_S": ("MOSTLY_Q2_K_S", 3.0),
    "IQ2_M": ("MOSTLY_IQ2_M", 2.7), "IQ2_S": ("MOSTLY_IQ2_S", 2.5), "IQ2_XS": ("MOSTLY_IQ2_XS", 2.31),
    "IQ2_XXS": ("MOSTLY_IQ2_XXS", 2.06), "IQ1_M": ("MOSTLY_IQ1_M", 1.75), "IQ1_S": ("MOSTLY_IQ1_S", 1.56),
    "TQ2_0": ("MOSTLY_TQ2_0", 2.06), "TQ1_0": ("MOSTLY_TQ1_0", 1.69),
}
# llama.cpp's quantizer stops on these without an importance matrix (llama-quantize --imatrix)
NEEDS_IMATRIX = {"IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "Q2_K_S"}
HEADROOM = 1.05  # free disk asked for beyond the estimate (metadata, the estimate's error)


@dataclass(frozen=True)
class QuantizePlan:
    source: Path
    output: Path
    type_name: str
    source_type: str  # the source's file type ("Q4_1", "F16", ...; "unknown" where the file does not say)
    parameters: int  # weights in the file
    estimated_bytes: int
    warning: str | None  # a source already at 4 bits or fewer


def file_type_name(ftype: int | None) -> str:
    """``general.file_type`` (a llama_ftype value) as a TYPES key, or "unknown"."""
    import llama_cpp  # noqa: PLC0415 - the enum values are llama.cpp's

    for name, (suffix, _) in TYPES.items():
        if getattr(llama_cpp, f"LLAMA_FTYPE_{suffix}", None) == ftype:
            return name
    return "unknown"


def read_source(source: Path) -> tuple[str, int]:
    """(file type name, parameter count) of a GGUF file, read with the gguf package; PpdError if it is not one."""
    from gguf import GGUFReader  # noqa: PLC0415

    try:
        reader = GGUFReader(str(source))
    except (ValueError, OSError) as error:
        raise PpdError(f"{source} is not a GGUF file ({str(error).splitlines()[0]})") from None
    field = reader.fields.get("general.file_type")
    ftype = int(field.parts[field.data[0]][0]) if field is not None else None
    return file_type_name(ftype), sum(int(tensor.n_elements) for tensor in reader.tensors)


def plan(source: Path, output: Path, type_name: str, force: bool = False) -> QuantizePlan:
    """Every check before quantizing; PpdError (one line) for what cannot be done."""
    type_name = type_name.upper()
    if type_name not in TYPES:
        raise PpdError(f"unknown type {type_name!r}; choose one of {', '.join(TYPES)}")
    if type_name in NEEDS_IMATRIX:
        raise PpdError(f"{type_name} needs an importance matrix, which ppd does not make: make one with llama.cpp's "
                       "llama-imatrix and quantize with llama-quantize --imatrix, or choose IQ4_XS, IQ4_NL, Q4_K_M or Q4_0")
    source, output = Path(source).expanduser(), Path(output).expanduser()
    if not source.is_file():
        raise PpdError(f"{source} is not a file")
    if output.exists() and not force:
        raise PpdError(f"{output} exists: choose another name, or --force to replace it")
    if output.resolve() == source.resolve():
        raise PpdError("the output would replace the source: choose another name")
    if not output.parent.is_dir():
        raise PpdError(f"{output.parent} is not a folder")
    source_type, parameters = read_source(source)
    estimated = int(parameters * TYPES[type_name][1] / 8)
    free = shutil.disk_usage(output.parent).free + (output.stat().st_size if output.is_file() else 0)
    if free < estimated * HEADROOM:
        raise PpdError(f"{output.parent} has {free / 2**30:.2f} GiB free; the {type_name} file needs about "
                       f"{estimated * HEADROOM / 2**30:.2f} GiB")
    bits = TYPES.get(source_type, (None, 16.0))[1]
    warning = None
    if bits <= 5.0 and source_type != type_name:
        warning = (f"{source.name} is already {source_type}: {type_name} from it keeps what that rounding lost and, "
                   "at fewer bits, rounds again (an F16 or BF16 source loses less); compare the perplexities below")
    return QuantizePlan(source, output, type_name, source_type, parameters, estimated, warning)


def quantize_file(source: Path, output: Path, type_name: str, threads: int, embedding_type: int | None = None) -> None:
    """``source`` written to ``output`` in ``type_name`` (a TYPES key) by ``llama_model_quantize``, re-quantizing
    allowed; the token embedding in the ggml type id ``embedding_type`` where given. No checks: ``plan`` makes them."""
    from ppd_core.backends.llamacpp.library import import_llama_cpp, quiet_logs  # noqa: PLC0415

    llama = import_llama_cpp()
    llama.llama_backend_init()
    quiet_logs(llama)
    params = llama.llama_model_quantize_default_params()
    params.nthread = threads
    params.ftype = getattr(llama, f"LLAMA_FTYPE_{TYPES[type_name][0]}")
    params.allow_requantize = True
    if embedding_type is not None:
        params.token_embedding_type = embedding_type
    status = llama.llama_model_quantize(str(source).encode(), str(output).encode(), ctypes.byref(params))
    if status != 0:
        raise PpdError(f"llama.cpp's quantizer failed on {Path(source).name} to {type_name} (status {status})")


def quantize(job: QuantizePlan, threads: int) -> Path:
    """Write ``job.output`` with llama.cpp's quantizer (to a temporary name, renamed when complete)."""
    partial = job.output.with_name(job.output.name + ".partial")
    try:
        quantize_file(job.source, partial, job.type_name, threads)
        partial.replace(job.output)
    finally:
        partial.unlink(missing_ok=True)
    return job.output
