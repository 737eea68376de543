"""`ppd bench`: plain decoding against PPD on the same questions (``app.bench``), as one JSON result."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from app.commands.loading import load_engine
from app.commands.options import add_model_options, add_sampling_options, model_threads, sampling_of, write_output
from app.questions import DEFAULT_QUESTIONS
from ppd_core.errors import PpdError


def register(commands) -> None:
    """Add `ppd bench`'s sub-parser to ``commands``."""
    bench = commands.add_parser("bench", help="plain decoding against PPD on the same questions")
    bench.add_argument("--questions", type=Path, default=DEFAULT_QUESTIONS, help="MT-Bench style JSONL (default: the shipped MT-Bench questions)")
    bench.add_argument("--limit", type=int, default=None)
    bench.add_argument("--category", default=None, help="only the questions of this category (e.g. coding)")
    bench.add_argument("--turns", type=int, default=1, choices=[1, 2])
    bench.add_argument("--max-new-tokens", type=int, default=128)
    bench.add_argument("--json", type=Path, default=None, dest="json_path", help="write the result object here")
    bench.add_argument("--plot", type=Path, default=None, help="write a tokens/s chart (PNG) here")
    bench.add_argument("--compare-generate", action="store_true", help="also time transformers generate()")
    bench.add_argument("--compare-llama-cpp", action="store_true",
                       help="also time llama-cpp-python's create_chat_completion on the same GGUF file and threads")
    bench.add_argument("--compare-llama-server", type=Path, default=None, metavar="BIN",
                       help="also time this llama-server binary on the same GGUF file, threads and conversations: plain "
                       "and with --spec-type ngram-simple and ngram-mod (benchmarks/scripts/llama_server_bench.py "
                       "--build-only builds one from llama-cpp-python's own llama.cpp)")
    add_sampling_options(bench)
    add_model_options(bench)


def run(args: argparse.Namespace) -> int:
    sampling = sampling_of(args)
    if args.max_new_tokens < 1:
        raise PpdError("--max-new-tokens must be at least 1")
    if args.limit is not None and args.limit < 1:
        raise PpdError("--limit must be at least 1")
    model_threads(args)  # a bad --threads fails before the heavy imports
    from app.bench import BenchConfig, run_benchmark
    from app.questions import read_questions

    questions = read_questions(args.questions, None)  # a missing or malformed file fails before the model loads
    if args.compare_llama_server is not None:
        from app.server_peer import executable

        args.compare_llama_server = executable(args.compare_llama_server)  # fails before the model loads
    if args.category is not None:
        categories = sorted({q.category for q in questions})
        questions = [q for q in questions if q.category == args.category]
        if not questions:
            raise PpdError(f"no question of category {args.category!r}; the file has {', '.join(categories)}")
    questions = questions[: args.limit] if args.limit else questions
    engine = load_engine(args)
    config = BenchConfig(args.turns, args.max_new_tokens, args.compare_generate, args.compare_llama_cpp, sampling,
                         args.compare_llama_server)
    result = run_benchmark(engine, questions, config)
    text = json.dumps(result, indent=2)
    if args.json_path:
        write_output(args.json_path, text + "\n")
    if args.plot:
        from app.bench import plot_result

        try:
            plot_result(result, args.plot)
        except OSError as error:
            raise PpdError(f"cannot write {args.plot}: {error.strerror or error}") from None
    print(text)
    return 0
