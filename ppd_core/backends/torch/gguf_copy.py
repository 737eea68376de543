"""A GGUF file's float32 copy for torch, where that is asked for (``--backend torch``, or training on one):
transformers de-quantizes it, and that copy is cached once as a plain Hugging Face directory in the user's cache
(keyed by the file's path, size and modification time); ``loading`` loads it like any other.

transformers takes about 20 s to de-quantize the default model (minutes for a large one) and parses the whole GGUF
into memory to do it, while the cached copy loads in well under a second, memory-mapped, and can be re-quantized by
bitsandbytes. Training, calibration's acceptance pass and the transformers comparisons all load it again, so that
conversion is paid once, not every time; the cost is disk, said with the memory in the one warning line that comes
first (``dequantization_note``).
"""

from __future__ import annotations

import hashlib
import logging
import re
import shutil
from pathlib import Path

import platformdirs
import torch
from filelock import FileLock, Timeout
from transformers import AutoTokenizer

from ppd_core.atomic_files import atomic_directory
from ppd_core.backends.torch.device import memory_of
from ppd_core.loaded import ModelLoadError

log = logging.getLogger(__name__)

FLOAT32_BYTES = 4
GGUF_BITS_PER_WEIGHT = 4.5  # a guess for a file whose header cannot be read: about Q4 (the size-based estimate)


def quiet_transformers() -> None:
    """transformers' own progress bars and notices off: ppd reports loading in its own lines."""
    import transformers  # noqa: PLC0415 - already imported above; its logging module

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def dequantized_copy(gguf_file: Path, name: str) -> Path:
    """The cached float32 copy of ``gguf_file``, made now if there is none; refused in one line where the float32
    model would not fit in the free memory. Logs ``dequantization_note`` first."""
    quiet_transformers()
    gguf_file = Path(gguf_file)
    target = conversion_folder(gguf_file)
    cached = (target / "config.json").is_file()
    parameters = copy_bytes(target) // FLOAT32_BYTES if cached else gguf_parameters(gguf_file)
    log.warning(dequantization_note(name, parameters))
    free = memory_of(torch.device("cpu")).free_bytes
    if not cached and parameters * FLOAT32_BYTES > free:
        raise ModelLoadError(f"transformers' float32 copy of {name} needs about {gigabytes(parameters * FLOAT32_BYTES)} GB "
                             f"but only {gigabytes(free)} GB is free; run it on llama.cpp (leave out --backend torch)")
    return converted_gguf_dir(gguf_file)


def dequantization_note(name: str, parameters: int) -> str:
    """The one line said before a GGUF goes through transformers: its float32 size in memory and on disk."""
    size = gigabytes(parameters * FLOAT32_BYTES)
    return (f"transformers de-quantizes {name} to float32: about {size} GB of memory "
            f"(and {size} GB on disk for the cached copy)")


def gigabytes(count: int) -> str:
    value = count / 1e9
    return f"{value:.1f}" if value >= 1 else f"{value:.2f}"


def gguf_parameters(gguf_file: Path) -> int:
    """Weights in ``gguf_file``: its tensors' element counts (``gguf.GGUFReader``: about 2 s for the default
    model), or an estimate from its size where the header cannot be read."""
    import gguf  # noqa: PLC0415

    try:
        return sum(int(tensor.n_elements) for tensor in gguf.GGUFReader(gguf_file).tensors)
    except Exception:  # noqa: BLE001 - whatever is wrong with it, transformers' conversion will say
        return int(gguf_file.stat().st_size * 8 / GGUF_BITS_PER_WEIGHT)


def copy_bytes(folder: Path) -> int:
    """Bytes of the weights in a cached copy (float32 safetensors)."""
    return sum(path.stat().st_size for path in folder.glob("*.safetensors"))


GGUF_SOURCE_FILE = ".ppd-gguf-source"  # in each conversion: the resolved path of the GGUF it came from
GGUF_LOCK_TIMEOUT_S = 1800  # a conversion of a large GGUF can take minutes


def conversion_folder(gguf_file: Path) -> Path:
    """Where the Hugging Face copy of ``gguf_file`` lives (keyed by path, size and modification time)."""
    stat = gguf_file.stat()
    key = hashlib.sha256(f"{gguf_file.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    return Path(platformdirs.user_cache_dir("ppd")) / "gguf" / f"{gguf_file.stem}-{key}"


def converted_gguf_dir(gguf_file: Path) -> Path:
    """A Hugging Face copy of a GGUF model in the user's cache, made on first use.

    A file lock per GGUF stem serializes conversions: a second process waits, then reuses the first
    one's result. A new conversion deletes older conversions of the same file.
    """
    target = conversion_folder(gguf_file)
    cache = target.parent
    if (target / "config.json").is_file():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    lock = FileLock(cache / f".{gguf_file.stem}.lock")
    try:
        lock.acquire(timeout=0)
    except Timeout:
        log.warning("another process is converting %s; waiting for it", gguf_file.name)
        try:
            lock.acquire(timeout=GGUF_LOCK_TIMEOUT_S)
        except Timeout:
            raise ModelLoadError(f"another process has been converting {gguf_file.name} for {GGUF_LOCK_TIMEOUT_S} s "
                                 f"(lock {lock.lock_file})") from None
    try:
        if not (target / "config.json").is_file():
            shutil.rmtree(target, ignore_errors=True)  # an incomplete folder, never made by this code
            log.info("converting %s once; cached in %s", gguf_file.name, target)
            with atomic_directory(target) as staging:
                _convert_gguf(gguf_file, staging)
                (staging / GGUF_SOURCE_FILE).write_text(str(gguf_file.resolve()), encoding="utf-8")
            _remove_stale_conversions(cache, gguf_file, target)
    finally:
        lock.release()
    return target


def _convert_gguf(gguf_file: Path, staging: Path) -> None:
    """Save a Hugging Face copy of ``gguf_file`` into ``staging``: the slow step."""
    from transformers import AutoModelForCausalLM  # noqa: PLC0415 - the model code: imported only where a model is built

    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
        model = AutoModelForCausalLM.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name, dtype=torch.float32)
    except (OSError, ValueError, KeyError, RuntimeError) as error:
        raise ModelLoadError(f"transformers cannot load {gguf_file.name}: {str(error).splitlines()[0]}") from None
    # The GGUF quantizer marks the model unserializable; its weights are plain tensors by now.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    model.generation_config.save_pretrained(staging)


def _remove_stale_conversions(cache: Path, gguf_file: Path, keep: Path) -> None:
    """Delete older conversions of ``gguf_file`` (made before it changed) and staging folders of killed runs.

    Runs under the stem's lock, so no staging folder of this stem belongs to a live conversion. A
    conversion of another file with the same stem (another folder) is kept: its source file differs.
    """
    stem = re.escape(gguf_file.stem)
    conversion, staging = re.compile(rf"{stem}-[0-9a-f]{{16}}"), re.compile(rf"\.{stem}-[0-9a-f]{{16}}\..+\.staging")
    source = str(gguf_file.resolve())
    for entry in cache.iterdir():
        if entry == keep or entry.is_symlink() or not entry.is_dir():
            continue
        if conversion.fullmatch(entry.name):
            try:
                stale = (entry / GGUF_SOURCE_FILE).read_text(encoding="utf-8") == source
            except OSError:
                stale = False  # made by an older version: whose it is cannot be told
        else:
            stale = staging.fullmatch(entry.name) is not None
        if stale:
            shutil.rmtree(entry, ignore_errors=True)
