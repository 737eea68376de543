"""The chat app's streamed speed against the engine alone, with Chromium open on the same machine.

    python benchmarks/scripts/app_vs_generate.py [--rounds 3] [--threads 2] [--model FILE.gguf] [--tree auto]

Each round answers the same message twice from a fresh conversation, alternating which goes
first: once typed into the app in Chromium (speed from the app's readout, which the engine
measures, and the wall time from click to the final readout) and once with ``Engine.generate``
in the same process with no page open (what ``ppd generate`` does). Default: the default GGUF on llama.cpp.
Needs Playwright and Chromium at /usr/bin/chromium. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import time
from pathlib import Path

from app.history import ConversationStore
from app.model_host import ModelHost
from app.ui import build_app
from ppd_core import Engine, EngineConfig
from measurement import free_port

MAX_NEW = 256  # the app's default "Max new tokens"
MESSAGE = "Write a short story about a robot who learns to paint."
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def app_round(page) -> tuple[float, int, float]:
    """(readout tokens/s, tokens, wall seconds) for one message from a fresh conversation."""
    from playwright.sync_api import expect

    page.locator("#clear").click()
    page.locator("#message textarea").fill(MESSAGE)
    start = time.perf_counter()
    page.locator("#send").click()
    readout = page.locator("#readout")
    expect(readout).to_contain_text("(streaming)", timeout=120_000)
    expect(readout).not_to_contain_text("(streaming)", timeout=600_000)
    wall = time.perf_counter() - start
    text = readout.inner_text()
    tok_s = float(re.search(r"([\d.]+) tokens/s", text).group(1))
    tokens = int(re.search(r"(\d+) tokens · prompt", text).group(1))
    return tok_s, tokens, wall


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="CPU threads for the model (default: one per core)")
    parser.add_argument("--model", default="default", help="a GGUF file or Hugging Face model (default: the default GGUF)")
    parser.add_argument("--tree", default="auto")
    parser.add_argument("--store", default="/tmp/ppd-bench-conversations")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    engine = Engine.load(EngineConfig(model=args.model, tree=args.tree, threads=args.threads))
    service = ModelHost(engine)
    app = build_app(service, ConversationStore(Path(args.store)))
    port = free_port()
    app.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    ids = engine.chat_ids([{"role": "user", "content": MESSAGE}])
    engine.generate(ids, "ppd", 16)  # warm-up
    rows = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS, headless=True)
        page = browser.new_page(viewport={"width": 1400, "height": 1100})
        page.goto(f"http://127.0.0.1:{port}/")
        page.locator("#device").wait_for()
        for number in range(args.rounds):
            row = {}
            for side in (("app", "engine") if number % 2 == 0 else ("engine", "app")):
                if side == "app":
                    row["app_tok_s"], row["app_tokens"], row["app_wall_s"] = app_round(page)
                else:
                    result = engine.generate(ids, "ppd", MAX_NEW)
                    row["engine_tok_s"], row["engine_tokens"] = result.stats.tok_s, result.stats.new_tokens
            rows.append(row)
            print(json.dumps(row), flush=True)
        browser.close()
    app.close()
    app_speed = statistics.mean(r["app_tok_s"] for r in rows)
    engine_speed = statistics.mean(r["engine_tok_s"] for r in rows)
    print(json.dumps({
        "threads": engine.threads, "model": engine.loaded.name, "backend": engine.loaded.backend.name,
        "quant": engine.loaded.quant, "tree": engine.plan.family.name, "rounds": rows,
        "app_tok_s": round(app_speed, 2), "engine_tok_s": round(engine_speed, 2),
        "app_over_engine": round(app_speed / engine_speed, 3),
        "app_wall_tok_s": round(statistics.mean(r["app_tokens"] / r["app_wall_s"] for r in rows), 2),
    }, indent=1))


if __name__ == "__main__":
    main()
