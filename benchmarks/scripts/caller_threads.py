"""Plain and PPD speed of the same greedy answer asked from the main thread and from new threads, in one process.

    python benchmarks/scripts/caller_threads.py [--rounds 3] [--direct] [--json FILE]

The chat app calls the engine from many threads (the page's events, the API's requests, a background calibration).
llama.cpp's OpenMP build keeps a worker team per calling thread; ``ppd_core/backends/compute_thread.py`` runs every
``llama_decode`` on one thread. ``--direct`` calls llama.cpp from the caller's thread instead (before that fix).
Default model on llama.cpp, ``Chat.compare`` (no cache reuse, each mode timed alone). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import statistics
import threading

from measurement import machine, report

from app.chat import Chat
from app.chat_settings import ChatSettings
from app.model_host import ModelHost
from ppd_core.backends.llamacpp import compute_thread
from ppd_core import Engine, EngineConfig

MESSAGE = [{"role": "user", "content": "Give me three tips for staying healthy."}]


def compared(chat: Chat, on_new_thread: bool) -> dict:
    result = {}

    def run():
        comparison = chat.compare(MESSAGE, ChatSettings(max_new_tokens=256))
        result.update(plain=comparison.plain_stats.tok_s, ppd=comparison.ppd_stats.tok_s)

    if on_new_thread:
        worker = threading.Thread(target=run)
        worker.start()
        worker.join()
    else:
        run()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--direct", action="store_true", help="llama.cpp called from the caller's thread")
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args()
    if args.direct:
        compute_thread.run = lambda function, *call: function(*call)
    engine = Engine.load(EngineConfig(model="default", backend="llamacpp", tree="auto", auto_calibrate=False))
    chat = Chat(ModelHost(engine))  # one chat: which mode runs first alternates between its comparisons
    rows = {"main thread": [], "new threads": []}
    for _ in range(args.rounds):
        rows["main thread"].append(compared(chat, False))
        rows["new threads"].append(compared(chat, True))
    medians = {where: {mode: round(statistics.median(r[mode] for r in runs), 1) for mode in ("plain", "ppd")}
               for where, runs in rows.items()}
    report({"what": "tokens/s of one greedy answer (256 max), asked from the main thread and from new threads",
            "llama_cpp_calls": "from the caller's thread" if args.direct else "on one compute thread",
            "machine": machine(), "rounds": args.rounds, "median_tokens_per_s": medians, "runs": rows}, args.json)


if __name__ == "__main__":
    main()
