"""What ppd's Python decoding loop costs per token beyond llama.cpp's own compute (``llama_decode``).

    .venv/bin/python benchmarks/scripts/loop_overhead.py [--prompts 20] [--max-new-tokens 128] [--threads 2]
        [--mode plain|ppd] [--model FILE.gguf] [--profile-prompts 5] [--top 15] [--json FILE]

ppd decodes the first ``--prompts`` MT-Bench first turns greedily, in this process, on the GGUF's llama.cpp
backend (plain decoding by default), each from a fresh cache after one warm-up answer. Before ppd is imported,
``llama_cpp.llama_decode`` (and its twin in ``llama_cpp.llama_cpp``) is replaced by a shim that adds up the wall
time spent inside it, so

    overhead per token = (wall time of the answers - time inside llama_decode) / new tokens

is everything else the loop does per token: building batches, copying logits out, choosing the token, the tree and
cache bookkeeping, detokenizing. A second pass over ``--profile-prompts`` prompts runs under cProfile (which slows
Python, so it is not the timed pass) and prints the ``--top`` functions by own time (tottime), with ms per token.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from collections.abc import Callable
from pathlib import Path

from measurement import default_gguf, first_turns, machine, now, report


class DecodeClock:
    """Wall time inside ``llama_decode``, split into single-row calls (a plain step) and larger batches."""

    def __init__(self):
        self.seconds = self.single_seconds = 0.0
        self.calls = self.single_calls = self.rows = 0

    def install(self) -> None:
        """Wrap ``llama_cpp.llama_decode`` where any caller looks it up (the package and its ``llama_cpp`` module)."""
        import llama_cpp  # noqa: PLC0415

        original = llama_cpp.llama_cpp.llama_decode
        clock, now_ = self, time.perf_counter

        def llama_decode(context, batch):
            start = now_()
            status = original(context, batch)
            elapsed = now_() - start
            rows = getattr(batch, "n_tokens", 0)
            clock.seconds += elapsed
            clock.calls += 1
            clock.rows += rows
            if rows == 1:
                clock.single_seconds += elapsed
                clock.single_calls += 1
            return status

        llama_cpp.llama_decode = llama_cpp.llama_cpp.llama_decode = llama_decode

    def reset(self) -> None:
        self.__init__()


# ---- the one function coupled to ppd's API (ppd_core.engine as of this commit) ----

ENGINE_CALLS = ("engine = Engine.load(EngineConfig(model=GGUF, backend='llamacpp', threads={threads}, "
                "auto_calibrate={calibrate})); per prompt: ids = engine.chat_ids([{{'role': 'user', 'content': PROMPT}}]) "
                "(untimed), then timed: result = engine.generate(ids, {mode!r}, {tokens}); len(result.tokens), "
                "result.stats.steps")


def plain_decoder(gguf: Path, threads: int, mode: str) -> tuple[Callable[[str], list[int]], Callable[[list[int], int], tuple[int, int]]]:
    """``(prompt ids of a question, answer(ids, max new tokens) -> (new tokens, steps))`` through ``ppd_core.engine``."""
    from ppd_core import Engine, EngineConfig  # noqa: PLC0415 - after the shim

    engine = Engine.load(EngineConfig(model=str(gguf), backend="llamacpp", threads=threads, auto_calibrate=mode == "ppd"))

    def ids(question: str) -> list[int]:
        return engine.chat_ids([{"role": "user", "content": question}])

    def answer(prompt_ids: list[int], max_new_tokens: int) -> tuple[int, int]:
        result = engine.generate(prompt_ids, mode, max_new_tokens)
        return len(result.tokens), result.stats.steps

    return ids, answer


# ---- the run ----


def profile_table(profile: cProfile.Profile, top: int, tokens: int) -> list[dict]:
    """The ``top`` functions by own time, with their share per generated token."""
    stats = pstats.Stats(profile, stream=io.StringIO())
    rows = []
    for (file, line, name), (_, calls, own, cumulative, _) in stats.stats.items():
        where = name if file == "~" else f"{Path(file).name}:{line}({name})"
        rows.append({"function": where, "calls": calls, "tottime_s": round(own, 4), "cumtime_s": round(cumulative, 4),
                     "tottime_ms_per_token": round(1000 * own / tokens, 4)})
    return sorted(rows, key=lambda row: row["tottime_s"], reverse=True)[:top]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="the GGUF file (default: ppd's default model)")
    parser.add_argument("--prompts", type=int, default=20, help="MT-Bench first turns timed (default 20)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--mode", default="plain", choices=("plain", "ppd"), help="plain decoding (default) or PPD")
    parser.add_argument("--profile-prompts", type=int, default=5, help="prompts of the cProfile pass (0: none)")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    gguf = (args.model or default_gguf()).resolve()
    clock = DecodeClock()
    clock.install()  # before ppd is imported
    ids_of, answer = plain_decoder(gguf, args.threads, args.mode)
    prompts = [ids_of(question) for question in first_turns(args.prompts)]

    answer(ids_of("Say hello."), 16)  # warm-up
    if not clock.calls:
        raise SystemExit("ppd's backend did not call llama_cpp.llama_decode through the module: the shim saw nothing")
    clock.reset()
    tokens = steps = 0
    wall = 0.0
    for prompt in prompts:
        start = time.perf_counter()
        new, taken = answer(prompt, args.max_new_tokens)
        wall += time.perf_counter() - start
        tokens, steps = tokens + new, steps + taken
    overhead = wall - clock.seconds
    timed = {
        "prompts": len(prompts), "new_tokens": tokens, "steps": steps, "wall_s": round(wall, 3),
        "tok_s": round(tokens / wall, 2),
        "llama_decode": {"calls": clock.calls, "rows": clock.rows, "seconds": round(clock.seconds, 3),
                         "single_row_calls": clock.single_calls,
                         "ms_per_single_row_call": round(1000 * clock.single_seconds / clock.single_calls, 3)
                         if clock.single_calls else None},
        "overhead_s": round(overhead, 3),
        "overhead_ms_per_token": round(1000 * overhead / tokens, 3),
        "overhead_ms_per_step": round(1000 * overhead / steps, 3),
        "overhead_share": round(overhead / wall, 4),
    }
    print(f"{tokens} tokens in {wall:.2f} s ({tokens / wall:.1f} tok/s); inside llama_decode {clock.seconds:.2f} s; "
          f"loop overhead {1000 * overhead / tokens:.3f} ms/token ({100 * overhead / wall:.1f}% of the wall time)",
          file=sys.stderr)

    table = []
    if args.profile_prompts:
        profile, profiled_tokens = cProfile.Profile(), 0
        for prompt in prompts[: args.profile_prompts]:
            profile.enable()
            new, _ = answer(prompt, args.max_new_tokens)
            profile.disable()
            profiled_tokens += new
        table = profile_table(profile, args.top, profiled_tokens)
        print(f"\ncProfile, {min(args.profile_prompts, len(prompts))} prompts, {profiled_tokens} tokens; "
              f"top {args.top} by own time:", file=sys.stderr)
        print(f"{'calls':>9} {'tottime s':>10} {'ms/token':>9} {'cumtime s':>10}  function", file=sys.stderr)
        for row in table:
            print(f"{row['calls']:>9} {row['tottime_s']:>10.4f} {row['tottime_ms_per_token']:>9.4f} "
                  f"{row['cumtime_s']:>10.4f}  {row['function']}", file=sys.stderr)
        print(file=sys.stderr)

    report({"command": " ".join(["python", "benchmarks/scripts/loop_overhead.py", *sys.argv[1:]]), "date": now(),
            "machine": machine(), "model": gguf.name, "mode": args.mode, "threads": args.threads,
            "max_new_tokens": args.max_new_tokens, "engine_calls": ENGINE_CALLS.format(
                threads=args.threads, calibrate=args.mode == "ppd", mode=args.mode, tokens=args.max_new_tokens),
            "timed": timed, "profile_top_by_tottime": table}, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
