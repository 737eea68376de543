"""`ppd quantize`: re-quantize a GGUF file with llama.cpp's quantizer and report its perplexity before and after."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from app.commands.options import model_threads
from ppd_core.cpu_cores import usable_cores
from ppd_core.errors import PpdError


def register(commands) -> None:
    """Add `ppd quantize`'s sub-parser to ``commands``."""
    quantize = commands.add_parser("quantize", help="re-quantize a GGUF file with llama.cpp's quantizer and report "
                                   "its perplexity before and after")
    quantize.add_argument("file", help="a .gguf file, 'default' (the embedded model) or hf:OWNER/REPO:FILE.gguf")
    quantize.add_argument("--to", required=True, metavar="TYPE", dest="type_name",
                          help="Q4_0, IQ4_NL, Q4_K_M, Q8_0, ... (ppd quantize --to list names them all)")
    quantize.add_argument("--out", type=Path, default=None,
                          help="the new file (default: NAME.TYPE.gguf in ppd's models folder)")
    quantize.add_argument("--force", action="store_true", help="replace --out if it exists")
    quantize.add_argument("--no-perplexity", action="store_true", help="skip the perplexity before and after")
    quantize.add_argument("--threads", type=int, default=None, help="CPU threads (default: one per core this process may use)")


def run(args: argparse.Namespace) -> int:
    """Plan (every check), quantize, then the perplexity of both files on the shipped text."""
    import time

    import platformdirs

    from ppd_core.backends.llamacpp.perplexity import SHIPPED_TEXT, perplexity
    from ppd_core.backends.llamacpp.quantize import TYPES, plan, quantize
    from ppd_core.loading import model_path

    if args.type_name.lower() == "list":
        print(" ".join(TYPES))
        return 0
    threads = model_threads(args) or usable_cores()
    source = model_path(args.file)
    if source.suffix.lower() != ".gguf":
        raise PpdError(f"{source} is not a .gguf file (ppd quantize takes GGUF files)")
    stem = source.name[: -len(".gguf")]
    for name in TYPES:  # "model.Q4_1" -> "model"
        stem = stem.removesuffix(f".{name}").removesuffix(f"-{name}")
    out = args.out or Path(platformdirs.user_data_dir("ppd")) / "models" / f"{stem}.{args.type_name.upper()}.gguf"
    if args.out is None:
        out.parent.mkdir(parents=True, exist_ok=True)
    job = plan(source, out, args.type_name, args.force)
    print(f"ppd quantize: {source.name} ({job.source_type}, {job.parameters / 1e6:.1f} M weights) -> {job.output} "
          f"({job.type_name}, about {job.estimated_bytes / 2**20:.0f} MiB)", flush=True)
    if job.warning:
        print(f"ppd: warning: {job.warning}", file=sys.stderr, flush=True)
    start = time.perf_counter()
    quantize(job, threads)
    print(f"wrote {job.output} ({job.output.stat().st_size / 2**20:.1f} MiB) in {time.perf_counter() - start:.1f} s", flush=True)
    if args.no_perplexity:
        return 0
    text = SHIPPED_TEXT.read_text(encoding="utf-8")
    before = perplexity(source, text, threads)
    after = perplexity(job.output, text, threads)
    print(f"perplexity on {SHIPPED_TEXT.name} ({before.scored_tokens} tokens scored, {before.context}-token chunks, "
          f"CPU): {job.source_type} {before.value:.3f}, {job.type_name} {after.value:.3f} "
          f"({(after.value / before.value - 1) * 100:+.1f}%)")
    return 0
