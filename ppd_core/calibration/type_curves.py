"""What another GGUF type of the same model would decode at on this device: its step curve, measured.

An F16, BF16 or Q8_0 file's step cost climbs with the rows of a step more steeply than a 4-bit type's on a CPU
(the quantized mat-vec kernels are compute-bound there: docs/gpu.md, "What a GPU would gain, on paper"), so ppd's
trees pay more with a flatter type. ``other_type_curves`` makes each candidate type in a temporary folder with
llama.cpp's quantizer, times the same ``measure_latency`` probes on it, and deletes it; ``ppd quantize`` makes the
file for good and reports what it costs in perplexity.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path

from ppd_core.backends.llamacpp.decoder import LlamaCppDecoder
from ppd_core.calibration.latency import measure_latency
from ppd_core.errors import PpdError
from ppd_core.backends.llamacpp.quantize import plan, quantize, read_source

WIDE_TYPES = ("F32", "F16", "BF16", "Q8_0")  # files a flatter type may help
FLATTER_TYPES = ("Q4_0", "IQ4_NL", "Q4_K_M")  # K-quants fall back to legacy types where rows are not 256-wide
TYPE_CURVE_SIZES = (1, 2, 4, 8, 16)
TYPE_CURVE_CONTEXT = 256


def other_type_curves(gguf_file: Path, threads: int, gpu_layers: int | None = None,
                      types: Sequence[str] = FLATTER_TYPES) -> dict[str, dict[int, float] | str]:
    """``{type: {rows: step ms}}`` for each of ``types`` (or why it was not measured), empty unless ``gguf_file`` is
    one of ``WIDE_TYPES``."""
    if read_source(gguf_file)[0] not in WIDE_TYPES:
        return {}
    curves: dict[str, dict[int, float] | str] = {}
    with tempfile.TemporaryDirectory(prefix="ppd-types-") as folder:
        for type_name in types:
            path = Path(folder) / f"candidate.{type_name}.gguf"
            try:
                quantize(plan(gguf_file, path, type_name), threads)
            except PpdError as error:
                curves[type_name] = str(error)
                continue
            decoder = LlamaCppDecoder(path, threads, gpu_layers)
            try:
                curves[type_name] = measure_latency(decoder, None, 0, 1, TYPE_CURVE_SIZES, (TYPE_CURVE_CONTEXT,), repeats=5)[TYPE_CURVE_CONTEXT]
            finally:
                decoder.close()
                path.unlink(missing_ok=True)
    return curves
