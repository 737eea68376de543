"""The `ppd` command line. Argument parsing lives here and nowhere else."""

from __future__ import annotations

import argparse
import errno
import ipaddress
import json
import logging
import os
import socket
import sys
from pathlib import Path

# only plain data here: `ppd --help` and argument errors answer without importing torch or model code
from ppd_core.errors import PpdError
from ppd_core.options import (
    BACKEND_CHOICES, DEVICE_CHOICES, DTYPE_NAMES, FORWARD_CHOICES, MAX_LOOKUP, QUANT_CHOICES, STATIC_TREE_NAMES,
)
from ppd_core.sampling_params import SamplingParams

# MT-Bench questions shipped inside the package (app/data/README.md says where they come from).
DEFAULT_QUESTIONS = Path(__file__).resolve().parent / "data" / "mt_bench.jsonl"
AUTH_ENV = "PPD_AUTH"  # USER:PASS for `ppd chat`, instead of --auth (keeps the password out of `ps`)
API_KEY_ENV = "PPD_API_KEY"  # the OpenAI-compatible API's key, instead of --api-key
TRAIN_OPTIONS_ENV = "PPD_TRAIN_OPTIONS"  # more `ppd train` arguments for the trainings `ppd chat` starts (tests: tiny)


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
        help="CPU threads for the model (default: one per core; `ppd chat` leaves one core for the browser and server)",
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
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0, help="0 = off")
    parser.add_argument(
        "--acceptance", default="lossless", choices=["lossless", "typical"],
        help="when sampling: lossless keeps the model's distribution exactly; typical (the paper's) is faster "
        "but NOT distribution-preserving",
    )
    parser.add_argument("--seed", type=int, default=None, help="reproducible sampling")
    penalties = parser.add_argument_group("repetition penalties (llama.cpp's; off unless given)")
    penalties.add_argument("--repeat-penalty", type=float, default=1.0,
                           help="divide the logit of a token seen in the window by this (1 = off; 1.1 is usual)")
    penalties.add_argument("--repeat-last-n", type=int, default=64,
                           help="the window: the last N tokens of the context (-1: all of it; 0: no penalties)")
    penalties.add_argument("--presence-penalty", type=float, default=0.0, help="take this off a seen token's logit")
    penalties.add_argument("--frequency-penalty", type=float, default=0.0, help="take this off per time it was seen")


def sampling_of(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(args.temperature, args.top_p, args.top_k, args.acceptance, args.seed,
                          repeat_penalty=args.repeat_penalty, repeat_last_n=args.repeat_last_n,
                          presence_penalty=args.presence_penalty, frequency_penalty=args.frequency_penalty)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ppd", description="Parallel Prompt Decoding for local chat")
    commands = parser.add_subparsers(dest="command", required=True)

    generate = commands.add_parser("generate", help="answer one chat message")
    generate.add_argument("text")
    generate.add_argument("--mode", default="ppd", choices=["ppd", "vanilla"])
    generate.add_argument("--max-new-tokens", type=int, default=256)
    add_sampling_options(generate)
    generate.add_argument("--system", default=None, help="system prompt")
    generate.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")
    add_model_options(generate)

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

    chat = commands.add_parser("chat", help="the chat app, in your browser")
    chat.add_argument("--host", default="127.0.0.1", help="address to serve on; any but a loopback one needs --auth or --no-auth")
    chat.add_argument("--port", type=int, default=7860)
    login = chat.add_mutually_exclusive_group()
    login.add_argument("--auth", default=None, metavar="USER:PASS", help=f"require this login (default: ${AUTH_ENV} if set)")
    login.add_argument("--no-auth", action="store_true", help="serve a non-loopback --host without a login (anyone who reaches it can use it)")
    chat.add_argument(
        "--api-key", default=None, metavar="KEY",
        help=f"key for the OpenAI-compatible API at /v1 (default: ${API_KEY_ENV} if set); on a non-loopback --host "
        "the API is served only with a key or --no-auth",
    )
    add_queue_option(chat)
    add_guard_options(chat)
    add_model_options(chat)

    serve = commands.add_parser("serve", help="an OpenAI-compatible API (/v1/chat/completions) for editors and chat front-ends")
    serve.add_argument("--host", default="127.0.0.1", help="address to serve on; any but a loopback one needs --api-key or --no-auth")
    serve.add_argument("--port", type=int, default=8000)
    add_queue_option(serve)
    keys = serve.add_mutually_exclusive_group()
    keys.add_argument("--api-key", default=None, metavar="KEY", help=f"require 'Authorization: Bearer KEY' (default: ${API_KEY_ENV} if set)")
    keys.add_argument("--no-auth", action="store_true", help="serve a non-loopback --host without a key (anyone who reaches it can use it)")
    add_guard_options(serve)
    add_model_options(serve)

    calibrate = commands.add_parser("calibrate", help="measure this device and choose the guess tree")
    calibrate.add_argument("--json", type=Path, default=None, dest="json_path", help="also write the profile here")
    calibrate.add_argument("--acceptance-file", type=Path, default=None, metavar="FILE",
                           help="also write the guesses' acceptance record here (ship it beside the prompt-token file as "
                           "NAME.acceptance.json: calibrations elsewhere then measure only the latency curve)")
    calibrate.add_argument("--latency-curve", type=Path, default=None, metavar="FILE",
                           help="choose the tree for this step-latency curve (JSON: tree tokens -> ms, e.g. a GPU's) "
                           "instead of timing this device; the result is not saved as this device's profile")
    calibrate.add_argument("--no-type-curves", action="store_true",
                           help="for an F16/BF16/Q8_0 file, skip timing the flatter types Q4_0, IQ4_NL and Q4_K_M")
    add_model_options(calibrate)

    train = commands.add_parser("train", help="learn prompt tokens by self-distillation")
    train.add_argument("--samples", type=int, default=2000, help="conversations the model answers and trains on")
    train.add_argument("--out", type=Path, default=None, help="output prompt-token file")
    train.add_argument("--data", type=Path, default=None, help="your conversations (JSON or JSONL); default ShareGPT")
    train.add_argument("--eval-questions", type=Path, default=DEFAULT_QUESTIONS, help="held-out MT-Bench style JSONL (default: the shipped MT-Bench questions)")
    train.add_argument("--eval-limit", type=int, default=20, help="held-out questions to evaluate on; 0 skips the evaluation")
    train.add_argument("--epochs", type=float, default=2.0)
    train.add_argument("--cuts", type=int, default=32, help="cuts per conversation per step")
    train.add_argument("--accumulate", type=int, default=4, help="conversations per optimizer step")
    train.add_argument("--ensemble", type=int, default=2, help="ensemble members per prompt token")
    train.add_argument("--lr", type=float, default=1e-2)
    train.add_argument("--loss", choices=("kl", "top20", "hard"), default="kl",
                       help="kl: forward KL to the model's whole distribution (default); top20: cross-entropy on its 20 "
                            "likeliest tokens; hard: cross-entropy on its own next token")
    train.add_argument("--curriculum", type=float, default=0.0, metavar="FRACTION",
                       help="train depth 1 alone for this fraction of the steps first (default 0)")
    train.add_argument("--max-prompt-tokens", type=int, default=384)
    train.add_argument("--max-new-tokens", type=int, default=192, help="length of the model's teacher answers")
    train.add_argument("--generation-batch", type=int, default=16)
    train.add_argument("--work-dir", type=Path, default=None, help="answers and checkpoints (resumed if present)")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--status", type=Path, default=None, metavar="FILE",
                       help="keep a JSON status here (phase, progress, seconds): how the chat app follows a training")
    train.add_argument("--acceptance-prompts", type=int, default=12, metavar="N",
                       help="afterwards, measure how often the new tokens' guesses are right on N calibration "
                       "conversations, with the decoding backend, and keep it beside the file (calibrations then "
                       "measure only their latency curve); 0 skips it")
    train.add_argument("--init", type=Path, default=None, help="start from this prompt-token file (e.g. distil an ensemble into --ensemble 1)")
    add_model_options(train)

    quantize = commands.add_parser("quantize", help="re-quantize a GGUF file with llama.cpp's quantizer and report "
                                   "its perplexity before and after")
    quantize.add_argument("file", help="a .gguf file, 'default' (the embedded model) or hf:OWNER/REPO:FILE.gguf")
    quantize.add_argument("--to", required=True, metavar="TYPE", dest="type_name",
                          help="Q4_0, IQ4_NL, Q4_K_M, Q8_0, ... (ppd quantize --to list names them all)")
    quantize.add_argument("--out", type=Path, default=None,
                          help="the new file (default: NAME.TYPE.gguf in ppd's models folder)")
    quantize.add_argument("--force", action="store_true", help="replace --out if it exists")
    quantize.add_argument("--no-perplexity", action="store_true", help="skip the perplexity before and after")
    quantize.add_argument("--threads", type=int, default=None, help="CPU threads (default: one per core)")

    doctor = commands.add_parser("doctor", help="check ppd on this machine (environment, exactness, step latency, "
                                 "speed) and write a report to paste into an issue")
    doctor.add_argument("--prompts", type=int, default=5, metavar="N",
                        help="MT-Bench first turns answered both ways (default 5)")
    doctor.add_argument("--max-new-tokens", type=int, default=128, metavar="N")
    doctor.add_argument("--out", type=Path, default=Path("doctor-report"), metavar="DIR",
                        help="where doctor.json and doctor.md go (default ./doctor-report)")
    add_model_options(doctor)
    return parser


class ProgressBars:
    """tqdm bars for a calibration's phases; ``also`` hears every report too (the chat page's startup line)."""

    def __init__(self, also=None):
        self.bars = {}
        self.also = also

    def __call__(self, phase: str, done: int, total: int) -> None:
        from tqdm import tqdm

        if self.also is not None:
            self.also(phase, done, total)
        if phase == "downloading":  # the Hub's own bars show the download here
            return
        bar = self.bars.get(phase) or self.bars.setdefault(phase, tqdm(total=total, desc=f"calibrating: {phase}", leave=False))
        bar.n = done
        bar.refresh()
        if done >= total:
            bar.close()


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
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cores - 1)


def add_queue_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-queue", type=int, default=8, metavar="N",
                        help="answers that may wait for the model behind the one running (default 8); beyond them an "
                        "API request gets 503 and a page a busy notice")


def add_guard_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--allow-host", action="append", default=None, metavar="NAME",
                        help="also answer requests whose Host is NAME (a name this server is reached by, e.g. behind a "
                        "proxy; patterns like *.lan; repeatable; default: $PPD_ALLOWED_HOSTS, comma-separated). Other "
                        "names than localhost and the --host address are refused: a page may be trying DNS rebinding")
    parser.add_argument("--allow-origin", action="append", default=None, metavar="ORIGIN",
                        help="let web pages from ORIGIN call this server (e.g. http://localhost:3000 for a chat "
                        "front-end; patterns like chrome-extension://*; repeatable; default: $PPD_ORIGINS, "
                        "comma-separated). Pages from other origins are refused")


def check_max_queue(args: argparse.Namespace) -> None:
    if args.max_queue < 0:
        raise PpdError(f"--max-queue must be 0 or more, got {args.max_queue}")


def load_engine(args: argparse.Namespace, auto_calibrate: bool = True, progress=None):
    """The engine of the model options; ``progress(phase, done, total)`` hears the calibration's phases too."""
    from ppd_core.engine import Engine, EngineConfig

    config = EngineConfig(
        model=args.model, prompt_tokens=args.prompt_tokens, quant=args.quant, device=args.device,
        dtype=args.dtype, forward=args.forward, tree=args.tree, auto_calibrate=auto_calibrate,
        threads=model_threads(args), lookup=args.lookup, backend=args.backend, gpu_layers=args.gpu_layers,
    )
    return Engine.load(config, ProgressBars(also=progress))


def run_calibrate(args: argparse.Namespace) -> int:
    from ppd_core.engine import chains_text

    curve = None
    if args.latency_curve is not None:
        from ppd_core.engine import read_curve

        curve = read_curve(args.latency_curve)  # a bad file fails before the model loads
    args.tree = "auto"  # with auto_calibrate off: no calibration at load (a static tree would need prompt tokens)
    engine = load_engine(args, auto_calibrate=False)
    profile = engine.calibrate(ProgressBars()) if curve is None else engine.calibrate_with_curve(curve, ProgressBars())
    measured = set(next(iter(profile.latency_ms.values())))
    print(f"{'tokens':>6} {'step ms':>8} {'tokens/step':>11} {'tokens/s':>9}")
    for row in profile.budgets:
        if row["budget"] in measured or row["budget"] == profile.budget:
            mark = "  <- chosen" if row["budget"] == profile.budget else ""
            print(f"{row['budget']:>6} {row['ms_per_step']:>8.1f} {row['tokens_per_step']:>11.3f} {row['tokens_per_second']:>9.2f}{mark}")
    print(
        f"chosen: {profile.budget} tokens per step (trees of {', '.join(map(str, profile.tree_sizes))} tokens by guess depth), "
        f"expected {profile.expected_tokens_per_step:.2f} tokens/step, expected speedup {profile.expected_speedup:.2f}x; "
        f"calibrated in {profile.calibration_seconds:.0f} s"
    )
    print(
        f"lookup: {chains_text(profile.lookup_lengths)}; with them "
        f"expected {profile.expected_tokens_per_step_with_lookup:.2f} tokens/step, expected speedup "
        f"{profile.expected_speedup_with_lookup:.2f}x"
    )
    for name, part in profile.expected_with_lookup_by_turn.items():
        print(f"  {name} ({part['answers']} answers): {part['tokens_per_step']:.2f} tokens/step, {part['speedup']:.2f}x")
    print(f"steps: {profile.policy.line()}")
    if curve is None:
        print(f"profile saved to {engine.profile_path}; guess acceptance from {profile.acceptance_from}")
    else:
        print(f"latency curve from {curve.path}: {curve.device} (source: {curve.source}); not saved as this device's "
              f"profile; guess acceptance from {profile.acceptance_from}")
    if args.json_path:
        write_output(args.json_path, json.dumps(profile.to_json(), indent=1) + "\n")
    if args.acceptance_file:
        print(f"acceptance record written to {engine.export_acceptance(args.acceptance_file, profile)}")
    if curve is None and engine.loaded.gguf_file is not None and not args.no_type_curves:
        report_type_curves(engine)
    return 0


def report_type_curves(engine) -> None:
    """For an F16/BF16/Q8_0 file: this device's step curve for it, and what flatter types would decode at."""
    from ppd_core.engine import TYPE_CURVE_CONTEXT, TYPE_CURVE_SIZES, other_type_curves, read_source

    gguf, threads, layers = engine.loaded.gguf_file, engine.threads, engine.loaded.kernels.get("gpu_layers")
    own_type = read_source(gguf)[0]
    if own_type not in ("F32", "F16", "BF16", "Q8_0"):
        return
    print(f"step ms after {TYPE_CURVE_CONTEXT} cached tokens, {' / '.join(map(str, TYPE_CURVE_SIZES))} rows "
          "(other types made in a temporary folder and timed here; this takes a while):", flush=True)
    curves = {f"{own_type} (this file)": engine.step_curve(TYPE_CURVE_SIZES, TYPE_CURVE_CONTEXT)}
    engine.close()  # one model in memory at a time
    curves.update(other_type_curves(gguf, threads, layers))
    for name, curve in curves.items():
        if isinstance(curve, str):
            print(f"  {name}: not measured ({curve})")
            continue
        sizes = TYPE_CURVE_SIZES
        how = "" if "this file" in name else f"; `ppd quantize {gguf.name} --to {name}` makes it and reports its perplexity"
        print(f"  {name}: {' / '.join(f'{curve[s]:.1f}' for s in sizes)}; {sizes[-1]} rows cost "
              f"{curve[sizes[-1]] / curve[1]:.1f}x one; plain {1000 / curve[1]:.1f} tokens/s{how}")


def write_output(path: Path, text: str) -> None:
    """Write a result file the user asked for, atomically; a path that cannot be written is a PpdError."""
    from ppd_core.atomic_files import atomic_write

    try:
        atomic_write(path, text)
    except OSError as error:
        raise PpdError(f"cannot write {path}: {error.strerror or error}") from None


def parse_auth(value: str) -> tuple[str, str]:
    """``USER:PASS`` (the password may hold colons) -> (user, password)."""
    user, colon, password = value.partition(":")
    if not colon or not user or not password:
        raise PpdError("--auth must be USER:PASS with a non-empty user and password")
    return user, password


def is_loopback(host: str) -> bool:
    """Whether ``host`` only listens on this machine (127.0.0.0/8, ::1, or a name resolving only to those)."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        raise PpdError(f"--host {host} is not an address or a name this machine can resolve") from None
    return bool(infos) and all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in infos)


def chat_auth(args: argparse.Namespace) -> tuple[str, str] | None:
    """The login for `ppd chat`; a non-loopback --host needs --auth (or $PPD_AUTH) or an explicit --no-auth."""
    value = args.auth if args.auth is not None else (None if args.no_auth else os.environ.get(AUTH_ENV) or None)
    if value is not None:
        return parse_auth(value)
    if not is_loopback(args.host):
        if not args.no_auth:
            raise PpdError(
                f"--host {args.host} serves beyond this machine: add --auth USER:PASS (or set {AUTH_ENV}), "
                "or --no-auth to serve it without a login"
            )
        print(
            f"ppd: warning: serving on {args.host} without a login (--no-auth): anyone who can reach it can read "
            "the saved conversations and recalibrate",
            file=sys.stderr,
        )
    return None


def api_key_of(args: argparse.Namespace) -> tuple[bool, str | None]:
    """Whether to serve the OpenAI-compatible API, and the key its requests need (None: no key).

    The rule of the chat login: --api-key (or $PPD_API_KEY) sets a key; without one, a non-loopback
    --host needs an explicit --no-auth. `ppd serve` refuses to start otherwise; `ppd chat` (whose
    --auth protects only the page) then serves the page without the API.
    """
    key = args.api_key if args.api_key is not None else (None if args.no_auth else os.environ.get(API_KEY_ENV) or None)
    if key is not None:
        if not key or not all("!" <= char <= "~" for char in key):  # what an Authorization header can carry
            raise PpdError("--api-key must be a non-empty key of printable ASCII characters without spaces "
                           "(clients cannot send others in a header)")
        return True, key
    if is_loopback(args.host):
        return True, None
    if args.no_auth:
        print(f"ppd: warning: serving the OpenAI-compatible API on {args.host} without a key (--no-auth): anyone who "
              "can reach it can use the model", file=sys.stderr)
        return True, None
    if args.command == "serve":
        raise PpdError(
            f"--host {args.host} serves beyond this machine: add --api-key KEY (or set {API_KEY_ENV}), "
            "or --no-auth to serve the API without a key"
        )
    print(f"ppd: note: the OpenAI-compatible API (/v1) is off: on --host {args.host} it needs --api-key KEY "
          f"(or {API_KEY_ENV})", file=sys.stderr)
    return False, None


def train_options_of_environment() -> list[str]:
    """``$PPD_TRAIN_OPTIONS``, split as a shell would: more `ppd train` arguments for the page's trainings (a testing
    hook: tests and benchmarks/scripts/chaos.py make them tiny); a value that does not split is one line."""
    import shlex

    try:
        return shlex.split(os.environ.get(TRAIN_OPTIONS_ENV, ""))
    except ValueError as error:
        raise PpdError(f"{TRAIN_OPTIONS_ENV}: {error}") from None


def check_port_free(host: str, port: int) -> None:
    """Fail before the model loads if the server could not listen on ``host:port``.

    Binds like the server does (SO_REUSEADDR), on the host's address and, as Gradio also
    probes it, on 127.0.0.1.
    """
    if not 1 <= port <= 65535:
        raise PpdError(f"--port must be between 1 and 65535, got {port}")
    try:
        infos = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        raise PpdError(f"--host {host} is not an address or a name this machine can resolve") from None
    probes = [(host, infos[0][0], infos[0][4])]
    if infos[0][4][0] != "127.0.0.1":
        probes.append(("127.0.0.1", socket.AF_INET, ("127.0.0.1", port)))
    for name, family, address in probes:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError as error:
                if error.errno == errno.EADDRINUSE:
                    raise PpdError(f"port {port} on {name} is already in use; pick another with --port") from None
                raise PpdError(f"cannot serve on {host}:{port} ({error.strerror or error})") from None


def guard_policy(args: argparse.Namespace):
    """Who may call the server (``app.guard``): its own page, and the hosts and origins the options allow."""
    from app.guard import HOSTS_ENV, ORIGINS_ENV, Policy, listed

    return Policy(args.host, listed(args.allow_host, HOSTS_ENV), listed(args.allow_origin, ORIGINS_ENV))


def run_chat(args: argparse.Namespace) -> int:
    auth = chat_auth(args)  # bad host, login, key, queue or port: fail before loading the model
    serve_api, api_key = api_key_of(args)
    check_max_queue(args)
    check_threads(args)
    check_port_free(args.host, args.port)
    train_options = train_options_of_environment()
    from app.chat_service import ChatService
    from ppd_core.engine import limit_malloc_arenas

    limit_malloc_arenas()  # before the server's threads start

    def load(spec: str, progress) -> object:  # the model options, with another model (the page switches models)
        # a first launch on this device calibrates beside the first answers (ChatService.calibrate_in_background)
        return load_engine(argparse.Namespace(**{**vars(args), "model": spec}), auto_calibrate=False, progress=progress)

    # the page first: it shows the model's loading, and sends once it is ready; one model and one line for it, for the
    # page and the API
    service = ChatService(None, max_waiting=args.max_queue, spec=args.model, loader=load, calibrate_in_background=True,
                          train_options=train_options)
    # gradio's import first (loading the model beside it measured no sooner to a first answer, and the page later)
    from app.server import Serving, server_app
    from app.ui import build_app

    app = server_app(service, guard_policy(args), page=build_app(service), auth=auth, api_key=api_key,
                     serve_api=serve_api)
    print(f"ppd: chat on http://{url_host(args.host)}:{args.port} (Ctrl+C to quit); the page shows the model loading",
          file=sys.stderr)

    def ready() -> None:
        if serve_api:
            print(f"ppd: OpenAI-compatible API on http://{url_host(args.host)}:{args.port}/v1"
                  + (" (key required)" if api_key else ""), file=sys.stderr)
        print("ppd: the model is ready", file=sys.stderr)

    Serving(app, args.host, args.port).run(service, lambda progress: load(args.model, progress), ready)
    return 0


def run_serve(args: argparse.Namespace) -> int:
    _, api_key = api_key_of(args)  # bad host, key, queue or port: fail before loading the model
    check_max_queue(args)
    check_threads(args)
    check_port_free(args.host, args.port)
    from app.chat_service import ChatService
    from app.server import Serving, server_app
    from ppd_core.engine import limit_malloc_arenas

    limit_malloc_arenas()  # before the server's threads start
    # listening at once (/health and /v1 answer 503 with Retry-After while the model loads); a first launch on this
    # device calibrates behind the answers
    service = ChatService(None, max_waiting=args.max_queue, spec=args.model, calibrate_in_background=True)
    app = server_app(service, guard_policy(args), api_key=api_key)
    url = f"http://{url_host(args.host)}:{args.port}/v1"
    print(f"ppd: OpenAI-compatible API on {url}" + (" (key required)" if api_key else "")
          + " (Ctrl+C to quit); it answers once the model is loaded", file=sys.stderr)
    Serving(app, args.host, args.port).run(
        service, lambda progress: load_engine(args, auto_calibrate=False, progress=progress),
        lambda: print("ppd: the model is ready", file=sys.stderr))
    return 0


def url_host(host: str) -> str:
    """``host`` as a URL writes it (an IPv6 address in brackets)."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def run_generate(args: argparse.Namespace) -> int:
    sampling = sampling_of(args)
    if args.max_new_tokens < 1:
        raise PpdError("--max-new-tokens must be at least 1")
    if not args.text.strip():
        raise PpdError("the message is empty")
    from ppd_core.engine import check_prompt_fits

    engine = load_engine(args, auto_calibrate=False)  # the answer never waits for a calibration
    if engine.has_chat_template:
        messages = ([{"role": "system", "content": args.system}] if args.system else []) + [
            {"role": "user", "content": args.text}
        ]
        ids = engine.chat_ids(messages)
    else:  # a base model: it completes the text as written
        if args.system:
            raise PpdError(f"--system needs a chat template, and {engine.loaded.name} has none")
        print(f"ppd: {engine.loaded.name} has no chat template: completing the text as written", file=sys.stderr)
        ids = engine.completion_ids(args.text)
    check_prompt_fits(len(ids), engine.max_context)
    if engine.awaiting_calibration and args.mode == "ppd":
        print("ppd: this device is not calibrated for this model yet: plain steps with chains copied from the "
              "conversation (`ppd calibrate` measures it once; `ppd chat` and `ppd serve` do it in the background)",
              file=sys.stderr)
    event = None
    for event in engine.stream(ids, args.mode, args.max_new_tokens, sampling=sampling):
        if not args.json:
            print(event.delta, end="", flush=True)
    stats = event.stats
    if args.json:
        print(json.dumps({
            "text": event.text,
            "new_tokens": stats.new_tokens,
            "steps": stats.steps,
            "mean_accepted": round(stats.mean_accepted, 4),
            "tok_s": round(stats.tok_s, 3),
            "mode": args.mode,
            "sampling": sampling.describe(),
        }))
    else:
        print()
        if event.stop_reason == "context":
            print("ppd: stopped at the end of the model's context window", file=sys.stderr)
        print(
            f"[{args.mode}] {stats.new_tokens} tokens in {stats.seconds:.2f} s, {stats.tok_s:.1f} tokens/s, "
            f"{stats.mean_accepted:.2f} tokens/step",
            file=sys.stderr,
        )
    return 0


def run_bench(args: argparse.Namespace) -> int:
    sampling = sampling_of(args)
    if args.max_new_tokens < 1:
        raise PpdError("--max-new-tokens must be at least 1")
    if args.limit is not None and args.limit < 1:
        raise PpdError("--limit must be at least 1")
    model_threads(args)  # a bad --threads fails before the heavy imports
    from app.bench import BenchConfig, read_questions, run_benchmark

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


def run_quantize(args: argparse.Namespace) -> int:
    """Plan (every check), quantize, then the perplexity of both files on the shipped text."""
    import time

    import platformdirs

    from ppd_core.engine import QUANT_TYPES as TYPES, SHIPPED_TEXT, model_path, perplexity, quantize, quantize_plan as plan

    if args.type_name.lower() == "list":
        print(" ".join(TYPES))
        return 0
    threads = model_threads(args) or os.cpu_count() or 1
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


def run_doctor(args: argparse.Namespace) -> int:
    """Exit 0 when every check passes, 1 when one fails (the report says which); bad input is 2, as elsewhere."""
    if args.prompts < 1:
        raise PpdError(f"--prompts must be at least 1, got {args.prompts}")
    if args.max_new_tokens < 1:
        raise PpdError(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")
    model_threads(args)  # a bad --threads fails before the heavy imports
    import shlex

    from app.bench import read_questions
    from app.doctor import DoctorConfig, check_out, markdown, run_doctor as check, write_report

    questions = read_questions(DEFAULT_QUESTIONS, None)
    if args.prompts > len(questions):
        raise PpdError(f"--prompts must be at most {len(questions)} (the MT-Bench questions shipped), got {args.prompts}")
    check_out(args.out)
    engine = load_engine(args)  # --tree auto: the device's profile, calibrated first where there is none (as `ppd bench`)
    defaults = vars(build_parser().parse_args(["doctor"]))  # the command as run: the options that differ, the sizes
    command = ["ppd", "doctor"] + [word for name, value in vars(args).items()
                                   if name in ("prompts", "max_new_tokens") or value != defaults[name]
                                   for word in (f"--{name.replace('_', '-')}", str(value))]
    config = DoctorConfig(args.prompts, args.max_new_tokens, shlex.join(command))
    report = check(engine, [q.turns[0] for q in questions[: args.prompts]], config)
    summary = markdown(report, engine.tokenizer)
    paths = write_report(report, summary, args.out)
    print(summary, end="")
    print(f"ppd doctor: report written to {paths[0]} and {paths[1]}", file=sys.stderr)
    return 0 if report["verdict"] == "PASS" else 1


def run_train(args: argparse.Namespace) -> int:
    from app.bench import read_questions
    from ppd_core.engine import PromptTokens

    for option in ("samples", "epochs", "cuts", "accumulate", "ensemble", "lr", "max_prompt_tokens", "max_new_tokens", "generation_batch"):
        if not getattr(args, option) > 0:
            raise PpdError(f"--{option.replace('_', '-')} must be positive, got {getattr(args, option)}")
    if args.eval_limit < 0:
        raise PpdError(f"--eval-limit must be 0 (no evaluation) or positive, got {args.eval_limit}")
    if not 0 <= args.curriculum < 1:
        raise PpdError(f"--curriculum must be a fraction of the steps, at least 0 and below 1, got {args.curriculum}")
    if not 0 <= args.acceptance_prompts <= 40:  # the calibration conversations shipped
        raise PpdError(f"--acceptance-prompts must be between 0 (skip) and 40, got {args.acceptance_prompts}")
    # user files fail here, in one line, before the model loads and answers are generated
    if args.data is not None and not args.data.is_file():
        raise PpdError(f"conversation file not found: {args.data}")
    eval_questions = args.eval_questions if args.eval_limit > 0 else None
    if eval_questions is not None:
        read_questions(eval_questions, args.eval_limit)
    if args.init is not None:
        PromptTokens.load(args.init).with_ensemble_size(args.ensemble)  # a file or a size it cannot become: one line, now
    from app.trainer_lock import WorkDirLock

    held: list[WorkDirLock] = []

    def claim(folder: Path) -> None:
        """One training per work directory, held until this run ends; a busy folder is one line (exit 2)."""
        if not held:
            held.append(WorkDirLock(folder).acquire())

    try:
        from app.signals import sigterm_interrupts

        with sigterm_interrupts():  # the chat app's Stop: the run stops where it is, resumable, and lets the folder go
            if args.work_dir is not None:
                claim(args.work_dir)  # before the model loads (else once loaded: the default folder is named after it)
            # the first stage is on the page at once (a folder held by another trainer is refused above, its status kept)
            status = StatusFile(args.status, training_stages(eval_questions is not None, args.acceptance_prompts > 0))
            status.write("load", 0, 0)
            return train_model(args, eval_questions, claim, status)
    finally:
        for lock in held:
            lock.release()


def training_stages(evaluates: bool, measures_acceptance: bool) -> tuple[str, ...]:
    """The phases a `ppd train` run goes through, in order (``StatusFile`` numbers them for the page)."""
    return ("load", "data", "network", "answers", *(("held-out answers",) if evaluates else ()), "train",
            *(("evaluate",) if evaluates else ()), *(("acceptance",) if measures_acceptance else ()))


def train_model(args: argparse.Namespace, eval_questions: Path | None, claim, status: StatusFile) -> int:
    """`ppd train` once its input is checked: load, answer, train, evaluate, save, measure the acceptance."""
    from tqdm import tqdm

    from ppd_core.engine import TrainConfig, TrainRun, load_model, model_signature, run_training, user_prompt_tokens_path

    if model_threads(args):
        import torch

        torch.set_num_threads(model_threads(args))
    # training differentiates through the transformers model: auto means its own weights here
    loaded = load_model(args.model, "none" if args.quant == "auto" else args.quant, args.device, args.dtype)
    config = TrainConfig(
        samples=args.samples, epochs=args.epochs, cuts=args.cuts, accumulate=args.accumulate,
        ensemble_size=args.ensemble, lr=args.lr, max_prompt_tokens=args.max_prompt_tokens,
        max_new_tokens=args.max_new_tokens, generation_batch=args.generation_batch, seed=args.seed, loss=args.loss,
        curriculum=args.curriculum,
    )
    out = args.out or user_prompt_tokens_path(loaded.name, model_signature(loaded))  # where the engine looks first
    run = TrainRun(out=out, data=args.data, eval_questions=eval_questions, eval_limit=args.eval_limit, work_dir=args.work_dir,
                   init=args.init, claim=claim)
    bars: dict[str, tqdm] = {}

    def progress(phase: str, done: int, total: int, numbers: dict) -> None:
        status.write(phase, done, total, loss=numbers.get("loss"))
        if not total:  # a stage with no count (reading the data, building the training model): the status says it
            return
        bar = bars.get(phase) or bars.setdefault(phase, tqdm(total=total, desc=phase, unit="step" if phase == "train" else "item"))
        bar.n = done
        if "loss" in numbers:
            bar.set_postfix(loss=f"{numbers['loss']:.3f}")
        bar.refresh()
        if done >= total:
            bar.close()

    trained = run_training(loaded, config, run, progress)
    print(json.dumps(trained.training, indent=2))
    print(f"prompt tokens written to {out}")
    if args.acceptance_prompts:
        status.write("acceptance", 0, 0)
        del loaded  # the training model; decoding loads its own
        args.prompt_tokens, args.tree = str(out), "medium"
        engine = load_engine(args, auto_calibrate=False)
        record = engine.record_acceptance(ProgressBars(lambda _, done, total: status.write("acceptance", done, total)),
                                          prompts=args.acceptance_prompts)
        print(f"acceptance record ({engine.loaded.backend.name}, {engine.loaded.quant}) written to {record}")
    status.write("done", 1, 1, force=True)
    return 0


class StatusFile:
    """`ppd train --status FILE`: the stage (its number among ``stages``), its progress, the seconds it has run and the
    latest loss, rewritten at most once a second (atomically: a reader never sees half of it); no file, nothing written.
    A stage's clock and ``first`` count start at its first report (a resumed stage's rate is this run's alone)."""

    def __init__(self, path: Path | None, stages: tuple[str, ...] = ()):
        import time

        self.path, self.stages, self.clock, self.written = path, stages, time.monotonic, 0.0
        self.phase, self.total, self.first, self.phase_started = None, 0, 0, 0.0

    def write(self, phase: str, done: int, total: int, force: bool = False, loss: float | None = None) -> None:
        if self.path is None:
            return
        now = self.clock()
        if (phase, total) != (self.phase, self.total):  # a new stage (or a new count within it: acceptance's parts)
            self.phase, self.total, self.first, self.phase_started, force = phase, total, done, now, True
        if not force and now - self.written < 1.0 and done < total:
            return
        from ppd_core.atomic_files import atomic_write

        self.written = now
        record = {"phase": phase, "done": done, "total": total, "first": self.first,
                  "phase_seconds": round(now - self.phase_started, 1)}
        if phase in self.stages:
            record.update(stage=self.stages.index(phase) + 1, stages=len(self.stages))
        if loss is not None:
            record["loss"] = round(float(loss), 4)
        atomic_write(self.path, json.dumps(record) + "\n")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="ppd: %(message)s")
    handlers = {"generate": run_generate, "bench": run_bench, "train": run_train, "calibrate": run_calibrate, "chat": run_chat, "serve": run_serve,
                "doctor": run_doctor, "quantize": run_quantize}
    try:
        return handlers[args.command](args)
    except PpdError as error:  # bad input: one line; anything else is a bug and keeps its traceback
        message = " ".join(str(error).split("\n")).strip() or type(error).__name__
        print(f"ppd: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("ppd: interrupted", file=sys.stderr)
        return 130


def entry() -> None:
    """The `ppd` command. The servers (chat, serve) have stopped everything they could within their quit time when
    main returns: the process then ends at once, not waiting on a thread still inside llama.cpp (a calibration step)
    or a worker; what matters is on disk already (conversations and trainings are written atomically as they go)."""
    argv = sys.argv[1:]
    code = main(argv)
    if argv and argv[0] in ("chat", "serve"):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()
