"""The `ppd` command line. Argument parsing lives here and nowhere else."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from ppd_core.loading import DEVICE_CHOICES, DTYPE_CHOICES, QUANT_CHOICES
from ppd_core.static_trees import STATIC_TREES

DEFAULT_QUESTIONS = Path(__file__).resolve().parent.parent.parent / "shared" / "bench" / "mt_bench.jsonl"


def add_model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="default", help="Hugging Face model directory, .gguf file, or 'default'")
    parser.add_argument("--prompt-tokens", default=None, help="prompt-token file (default: the one shipped for the model)")
    parser.add_argument("--quant", default="none", choices=QUANT_CHOICES)
    parser.add_argument("--device", default="auto", choices=DEVICE_CHOICES)
    parser.add_argument("--dtype", default="auto", choices=list(DTYPE_CHOICES))
    parser.add_argument(
        "--tree", default="auto",
        help=f"guess tree: auto (calibrated for this device), {', '.join(STATIC_TREES)}, or a token budget such as 12",
    )


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


def sampling_of(args: argparse.Namespace):
    from ppd_core.sampling import SamplingParams

    return SamplingParams(args.temperature, args.top_p, args.top_k, args.acceptance, args.seed)


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
    bench.add_argument("--questions", type=Path, default=DEFAULT_QUESTIONS)
    bench.add_argument("--limit", type=int, default=None)
    bench.add_argument("--turns", type=int, default=1, choices=[1, 2])
    bench.add_argument("--max-new-tokens", type=int, default=128)
    bench.add_argument("--json", type=Path, default=None, dest="json_path", help="write the result object here")
    bench.add_argument("--plot", type=Path, default=None, help="write a tokens/s chart (PNG) here")
    bench.add_argument("--compare-generate", action="store_true", help="also time transformers generate()")
    add_sampling_options(bench)
    add_model_options(bench)

    chat = commands.add_parser("chat", help="the chat app, in your browser")
    chat.add_argument("--host", default="127.0.0.1")
    chat.add_argument("--port", type=int, default=7860)
    add_model_options(chat)

    calibrate = commands.add_parser("calibrate", help="measure this device and choose the guess tree")
    calibrate.add_argument("--json", type=Path, default=None, dest="json_path", help="also write the profile here")
    add_model_options(calibrate)

    train = commands.add_parser("train", help="learn prompt tokens by self-distillation")
    train.add_argument("--samples", type=int, default=2000, help="conversations the model answers and trains on")
    train.add_argument("--out", type=Path, default=None, help="output prompt-token file")
    train.add_argument("--data", type=Path, default=None, help="your conversations (JSON or JSONL); default ShareGPT")
    train.add_argument("--eval-questions", type=Path, default=DEFAULT_QUESTIONS, help="held-out MT-Bench style JSONL")
    train.add_argument("--eval-limit", type=int, default=20)
    train.add_argument("--epochs", type=float, default=2.0)
    train.add_argument("--cuts", type=int, default=32, help="cuts per conversation per step")
    train.add_argument("--accumulate", type=int, default=4, help="conversations per optimizer step")
    train.add_argument("--ensemble", type=int, default=2, help="ensemble members per prompt token")
    train.add_argument("--lr", type=float, default=1e-2)
    train.add_argument("--max-prompt-tokens", type=int, default=384)
    train.add_argument("--max-new-tokens", type=int, default=192, help="length of the model's teacher answers")
    train.add_argument("--generation-batch", type=int, default=16)
    train.add_argument("--work-dir", type=Path, default=None, help="answers and checkpoints (resumed if present)")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--init", type=Path, default=None, help="start from this prompt-token file (e.g. distil an ensemble into --ensemble 1)")
    add_model_options(train)
    return parser


class ProgressBars:
    """tqdm bars for a calibration's phases."""

    def __init__(self):
        self.bars = {}

    def __call__(self, phase: str, done: int, total: int) -> None:
        from tqdm import tqdm

        bar = self.bars.get(phase) or self.bars.setdefault(phase, tqdm(total=total, desc=f"calibrating: {phase}", leave=False))
        bar.n = done
        bar.refresh()
        if done >= total:
            bar.close()


def load_engine(args: argparse.Namespace, auto_calibrate: bool = True):
    from ppd_core.engine import Engine, EngineConfig

    config = EngineConfig(
        model=args.model, prompt_tokens=args.prompt_tokens, quant=args.quant, device=args.device,
        dtype=args.dtype, tree=args.tree, auto_calibrate=auto_calibrate,
    )
    return Engine.load(config, ProgressBars())


def run_calibrate(args: argparse.Namespace) -> int:
    args.tree = "medium"  # calibration replaces it; never calibrate twice
    engine = load_engine(args, auto_calibrate=False)
    profile = engine.calibrate(ProgressBars())
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
    print(f"profile saved to {engine.profile_path}")
    if args.json_path:
        args.json_path.parent.mkdir(parents=True, exist_ok=True)
        args.json_path.write_text(json.dumps(profile.to_json(), indent=1) + "\n")
    return 0


def run_chat(args: argparse.Namespace) -> int:
    from app.chat_service import ChatService
    from app.ui import build_app

    engine = load_engine(args)  # the first launch on a device calibrates it (about a minute on a CPU)
    app = build_app(ChatService(engine))
    print(f"ppd: chat on http://{args.host}:{args.port} (Ctrl+C to quit)", file=sys.stderr)
    app.launch(server_name=args.host, server_port=args.port, inbrowser=False, quiet=True)
    return 0


def run_generate(args: argparse.Namespace) -> int:
    sampling = sampling_of(args)
    if args.max_new_tokens < 1:
        raise ValueError("--max-new-tokens must be at least 1")
    if not args.text.strip():
        raise ValueError("the message is empty")
    from ppd_core.decoding import check_prompt_fits

    engine = load_engine(args, auto_calibrate=args.tree != "auto")  # "auto" calibrates below, after the checks
    messages = ([{"role": "system", "content": args.system}] if args.system else []) + [
        {"role": "user", "content": args.text}
    ]
    ids = engine.chat_ids(messages)
    check_prompt_fits(len(ids), engine.max_context)  # bad input fails before any calibration
    if args.tree == "auto" and engine.profile is None and args.mode == "ppd":
        engine.calibrate(ProgressBars())  # the first run on this device
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
    from app.bench import run_benchmark

    sampling = sampling_of(args)
    engine = load_engine(args)
    result = run_benchmark(
        engine, args.questions, limit=args.limit, turns=args.turns, max_new_tokens=args.max_new_tokens,
        compare_generate=args.compare_generate, sampling=sampling,
    )
    text = json.dumps(result, indent=2)
    if args.json_path:
        args.json_path.parent.mkdir(parents=True, exist_ok=True)
        args.json_path.write_text(text + "\n")
    if args.plot:
        from app.bench import plot_result

        plot_result(result, args.plot)
    print(text)
    return 0


def run_train(args: argparse.Namespace) -> int:
    import platformdirs
    from tqdm import tqdm

    from ppd_core.loading import load_model
    from ppd_core.training.pipeline import TrainRun, run_training
    from ppd_core.training.trainer import TrainConfig

    if args.samples < 1:
        raise ValueError("--samples must be at least 1")
    loaded = load_model(args.model, args.quant, args.device, args.dtype)
    config = TrainConfig(
        samples=args.samples, epochs=args.epochs, cuts=args.cuts, accumulate=args.accumulate,
        ensemble_size=args.ensemble, lr=args.lr, max_prompt_tokens=args.max_prompt_tokens,
        max_new_tokens=args.max_new_tokens, generation_batch=args.generation_batch, seed=args.seed,
    )
    out = args.out or Path(platformdirs.user_data_dir("ppd")) / "prompt-tokens" / f"{loaded.name}.safetensors"
    eval_questions = args.eval_questions if args.eval_questions and args.eval_questions.is_file() else None
    run = TrainRun(out=out, data=args.data, eval_questions=eval_questions, eval_limit=args.eval_limit, work_dir=args.work_dir, init=args.init)
    bars: dict[str, tqdm] = {}

    def progress(phase: str, done: int, total: int, numbers: dict) -> None:
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
    return 0


def quiet_libraries() -> None:
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    logging.basicConfig(level=logging.WARNING, format="ppd: %(message)s")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    quiet_libraries()
    from ppd_core.decoding import PromptTooLongError
    from ppd_core.loading import ModelLoadError
    from ppd_core.prompt_tokens import PromptTokenError

    handlers = {"generate": run_generate, "bench": run_bench, "train": run_train, "calibrate": run_calibrate, "chat": run_chat}
    try:
        return handlers[args.command](args)
    except (ModelLoadError, PromptTokenError, PromptTooLongError, ValueError, FileNotFoundError) as error:
        print(f"ppd: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("ppd: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
