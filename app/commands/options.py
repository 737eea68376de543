"""The options several commands share (the model, sampling, threads) and their checks; plain data only: `ppd --help`
and argument errors answer without importing torch or model code."""

from __future__ import annotations

import argparse
from pathlib import Path

from ppd_core.cpu_cores import usable_cores
from ppd_core.errors import PpdError
from ppd_core.options import (
    BACKEND_CHOICES, DEVICE_CHOICES, DTYPE_NAMES, FORWARD_CHOICES, MAX_LOOKUP, QUANT_CHOICES, STATIC_TREE_NAMES,
)
from ppd_core.sampling.fields import FIELDS
from ppd_core.sampling.params import SamplingParams


def add_model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="default",
                        help="'default', a Hugging Face model directory, a .gguf file, or from the Hub: hf:OWNER/REPO "
                        "(safetensors) or hf:OWNER/REPO:FILE.gguf (downloaded once into the Hub cache)")
    parser.add_argument(
        "--prompt-tokens", default=None, metavar="FILE|none",
        help="prompt-token file (default: yours from `ppd train`, else the one shipped for the model, else none); "
        "none: guesses from the conversation only (n-gram lookup)",
    )
    parser.add_argument(
        "--quant", default="auto", choices=QUANT_CHOICES,
        help="a GGUF runs in its own quantization on llama.cpp; a Hugging Face model: auto/none (its own dtype), "
        "4bit/8bit (bitsandbytes)",
    )
    parser.add_argument(
        "--backend", default="auto", choices=BACKEND_CHOICES,
        help="auto (default): llama.cpp for a GGUF file (CPU, CUDA, Metal), torch for a Hugging Face model; "
        "torch on a GGUF: transformers de-quantizes it first (GBs of memory for a large model)",
    )
    parser.add_argument(
        "--gpu-layers", type=int, default=None, metavar="N",
        help="llama.cpp on a GPU build: layers to offload (default: all); fewer for a model that does not fit",
    )
    parser.add_argument("--device", default="auto", choices=DEVICE_CHOICES)
    parser.add_argument(
        "--threads", type=int, default=None,
        help="CPU threads for the model (default: one per core this process may use, within a container's CPU quota; "
        "`ppd chat` leaves one core for the browser and server)",
    )
    parser.add_argument("--dtype", default="auto", choices=DTYPE_NAMES)
    parser.add_argument(
        "--forward", default="lean", choices=list(FORWARD_CHOICES),
        help="lean: the fast Llama-family forward where the model allows it (default); transformers: the generic one",
    )
    parser.add_argument(
        "--tree", default="auto",
        help=f"guess tree: auto (calibrated for this device), {', '.join(STATIC_TREE_NAMES)}, or a token budget such as 12",
    )
    parser.add_argument(
        "--lookup", type=lookup_length, default=None, metavar="auto|fixed|N",
        help="guesses copied from the conversation (n-gram lookup) per PPD step: auto (default: chains as long as "
        "they pay, learnt per conversation from calibration's figures), fixed (calibration's lengths), 0 (off) or up "
        "to N tokens",
    )
    parser.add_argument(
        "--drafters", type=source_names, default=None, metavar="NAME,...",
        help="the guess sources beside the prompt tokens, in drafting order: lookup (copied from the conversation), "
             "grammar (text a JSON schema forces), recycling (the model's own earlier top next tokens), suffix "
             "(continuations of earlier matches, this model's earlier answers too); default: lookup,grammar",
    )


def source_names(text: str) -> tuple[str, ...]:
    """``--drafters``: comma-separated guess-source names ("" for none); the engine checks them."""
    return tuple(name.strip() for name in text.split(",") if name.strip())


def lookup_length(text: str) -> int | str | None:
    """``--lookup``: "auto" (None), "fixed" or a chain length."""
    if text in ("auto", "fixed"):
        return None if text == "auto" else text
    try:
        length = int(text)
    except ValueError:
        length = -1
    if not 0 <= length <= MAX_LOOKUP:
        raise argparse.ArgumentTypeError(f"expected auto, fixed, 0 (off) or a number of tokens up to {MAX_LOOKUP}, got {text!r}")
    return length


def add_sampling_options(parser: argparse.ArgumentParser) -> None:
    """One option per sampling field (``ppd_core.sampling.fields``), off unless given (the temperature: greedy), with
    the acceptance rule and the seed after the samplers and the repetition penalties in their own group."""
    for field in FIELDS:
        if not field.penalty:
            parser.add_argument(field.flag, type=field.kind, default=field.default, help=field.help)
    parser.add_argument(
        "--acceptance", default="lossless", choices=["lossless", "typical"],
        help="when sampling: lossless keeps the model's distribution exactly; typical (the paper's) is faster "
        "but NOT distribution-preserving",
    )
    parser.add_argument("--seed", type=int, default=None, help="reproducible sampling")
    penalties = parser.add_argument_group("repetition penalties (llama.cpp's; off unless given)")
    for field in FIELDS:
        if field.penalty:
            penalties.add_argument(field.flag, type=field.kind, default=field.default, help=field.help)


def sampling_of(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(acceptance=args.acceptance, seed=args.seed,
                          **{field.name: getattr(args, field.name) for field in FIELDS})


def check_threads(args: argparse.Namespace) -> None:
    if args.threads is not None and args.threads < 1:
        raise PpdError(f"--threads must be at least 1, got {args.threads}")


def model_threads(args: argparse.Namespace) -> int:
    """--threads, else 0 (one per core) except for `ppd chat`, which leaves a core to the browser and server, and
    `ppd calibrate`, which calibrates for the chat (profiles are per thread count on a CPU).

    Measured on the 2-core AMD EPYC with Chromium showing the app (torch int4 then, plain decoding): the app
    streamed 20.1 tokens/s with 1 thread against 14.4 with 2.
    """
    check_threads(args)
    if args.threads is not None:
        return args.threads
    if args.command not in ("chat", "calibrate"):
        return 0
    return max(1, usable_cores() - 1)


def write_output(path: Path, text: str) -> None:
    """Write a result file the user asked for, atomically; a path that cannot be written is a PpdError."""
    from ppd_core.atomic_files import atomic_write

    try:
        atomic_write(path, text)
    except OSError as error:
        raise PpdError(f"cannot write {path}: {error.strerror or error}") from None
