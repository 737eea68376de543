"""`ppd bench`: plain decoding against PPD on the same questions, interleaved in one process."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import torch

from ppd_core.device_info import describe
from ppd_core.engine import Engine
from ppd_core.errors import PpdError
from ppd_core.sampling import GREEDY, SamplingParams


def read_questions(path: Path, limit: int | None) -> list[list[str]]:
    """The ``turns`` of each MT-Bench style JSONL record; a missing or malformed file is a one-line PpdError."""
    path = Path(path)
    if not path.is_file():
        raise PpdError(f"question file not found: {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise PpdError(f"cannot read the question file {path} ({error})") from None
    questions = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            turns = json.loads(line)["turns"]
        except (json.JSONDecodeError, KeyError, TypeError):
            turns = None
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
            raise PpdError(f"{path}:{number} is not a JSON object with a 'turns' list")
        questions.append(turns)
    if not questions:
        raise PpdError(f"{path} holds no questions (expected one JSON object with a 'turns' list per line)")
    return questions[:limit] if limit else questions


class PeakMemory:
    """Peak memory over a block: the CUDA allocator's peak, or the process's peak resident set.

    On Linux the kernel's peak-RSS counter (VmHWM) is reset by writing 5 to
    /proc/self/clear_refs, so nothing has to poll (a polling thread would slow the decode loop).
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.peak = 0

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            try:
                Path("/proc/self/clear_refs").write_text("5")
            except OSError:
                pass  # not Linux: the peak then covers the whole process lifetime
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            self.peak = torch.cuda.max_memory_allocated(self.device)
            return
        try:
            status = Path("/proc/self/status").read_text()
            self.peak = int(next(l for l in status.splitlines() if l.startswith("VmHWM:")).split()[1]) * 1024
        except (OSError, StopIteration):
            self.peak = psutil.Process().memory_info().rss


@dataclass
class ModeTotals:
    new_tokens: int = 0
    seconds: float = 0.0
    steps: int = 0
    decode_tokens: int = 0
    peak_bytes: int = 0
    answers: list[list[int]] = field(default_factory=list)

    def to_json(self, with_steps: bool) -> dict:
        out = {
            "new_tokens": self.new_tokens,
            "seconds": round(self.seconds, 3),
            "tok_s": round(self.new_tokens / self.seconds, 3) if self.seconds else 0.0,
            "peak_mem_mb": round(self.peak_bytes / 2**20, 1),
        }
        if with_steps:
            out["steps"] = self.steps
            out["mean_accepted"] = round(self.decode_tokens / self.steps, 4) if self.steps else 0.0
        return out


def timed_answer(engine: Engine, ids: list[int], mode: str, max_new_tokens: int, totals: ModeTotals, sampling: SamplingParams) -> list[int]:
    with PeakMemory(engine.loaded.device) as memory:
        result = engine.generate(ids, mode, max_new_tokens, sampling=sampling)
    stats = result.stats
    totals.new_tokens += stats.new_tokens
    totals.seconds += stats.seconds
    totals.steps += stats.steps
    totals.decode_tokens += sum(stats.accepted_per_step)
    totals.peak_bytes = max(totals.peak_bytes, memory.peak)
    totals.answers.append(result.tokens)
    return result.tokens


def run_benchmark(
    engine: Engine,
    questions_path: Path,
    limit: int | None = None,
    turns: int = 1,
    max_new_tokens: int = 128,
    compare_generate: bool = False,
    sampling: SamplingParams = GREEDY,
    log=sys.stderr,
) -> dict:
    """Answers both ways for every question (order alternating), then the JSON summary.

    Greedy by default: the answers must then be identical. When sampling, both modes get
    the same seed per question, and ``identical`` is null (samples differ by design).
    """
    questions = read_questions(questions_path, limit)
    warmup = engine.chat_ids([{"role": "user", "content": "Say hello."}])
    for mode in ("vanilla", "ppd"):
        engine.generate(warmup, mode, 16)

    totals = {"vanilla": ModeTotals(), "ppd": ModeTotals()}
    reference = ModeTotals()
    mismatches = []
    for number, question in enumerate(questions):
        history: list[dict] = []
        for turn in question[:turns]:
            history.append({"role": "user", "content": turn})
            ids = engine.chat_ids(history)
            order = ("vanilla", "ppd") if number % 2 == 0 else ("ppd", "vanilla")
            seeded = dataclasses.replace(sampling, seed=(sampling.seed or 0) + number) if not sampling.greedy else sampling
            answers = {mode: timed_answer(engine, ids, mode, max_new_tokens, totals[mode], seeded) for mode in order}
            if compare_generate and sampling.greedy:
                with PeakMemory(engine.loaded.device) as memory:
                    start = time.perf_counter()
                    tokens = engine.reference_generate(ids, max_new_tokens)
                    reference.seconds += time.perf_counter() - start
                reference.new_tokens += len(tokens)
                reference.peak_bytes = max(reference.peak_bytes, memory.peak)
            if answers["ppd"] != answers["vanilla"]:
                mismatches.append(number)
            history.append({"role": "assistant", "content": engine.tokenizer.decode(answers["vanilla"], skip_special_tokens=True)})
        done = totals["ppd"]
        print(
            f"[{number + 1}/{len(questions)}] ppd {done.new_tokens / max(done.seconds, 1e-9):.1f} tok/s, "
            f"vanilla {totals['vanilla'].new_tokens / max(totals['vanilla'].seconds, 1e-9):.1f} tok/s",
            file=log,
            flush=True,
        )

    vanilla, ppd = totals["vanilla"].to_json(False), totals["ppd"].to_json(True)
    family = engine.family.trees[-1]
    result = {
        "model": engine.loaded.name,
        "device": describe(engine.loaded.device).to_json(),
        "quant": engine.loaded.quant,
        "dtype": str(engine.loaded.dtype).removeprefix("torch."),
        "questions": len(questions),
        "turns": turns,
        "max_new_tokens": max_new_tokens,
        "tree": {
            "name": engine.family.name,
            "tokens_per_step": family.num_tokens,
            "candidates": family.num_nodes - 1,
            "prompt_tokens": family.num_tokens - family.num_nodes,
            "tokens_by_guess_depth": [tree.num_tokens for tree in engine.family.trees],
        },
        "prompt_tokens": engine.prompt_tokens.training,
        "vanilla": vanilla,
        "ppd": ppd,
        "speedup": round(ppd["tok_s"] / vanilla["tok_s"], 4) if vanilla["tok_s"] else 0.0,
        "identical": not mismatches if sampling.greedy else None,
        "mismatches": mismatches if sampling.greedy else [],
        "sampling": sampling.describe(),
        "memory_overhead_bytes": engine.prompt_tokens.num_bytes + sum(t.attention_mask.numel() for t in engine.family.trees),
    }
    if engine.profile is not None:  # what calibration expects of the tree in use
        budget = engine.tree_budget or engine.profile.budget
        row = next((r for r in engine.profile.budgets if r["budget"] == budget), None)
        result["calibration"] = {
            "budget": budget,
            "chosen_budget": engine.profile.budget,
            "expected_tokens_per_step": row["tokens_per_step"] if row else None,
            "expected_tokens_per_second": row["tokens_per_second"] if row else None,
            "expected_speedup_of_chosen": engine.profile.expected_speedup,
        }
    if compare_generate:
        result["transformers_generate"] = reference.to_json(False)
    return result


def plot_result(result: dict, path: Path) -> None:
    """Bar chart of tokens/s per mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = ["vanilla", "ppd"] + (["transformers_generate"] if "transformers_generate" in result else [])
    values = [result[m]["tok_s"] for m in modes]
    figure, axis = plt.subplots(figsize=(5, 3))
    axis.bar(modes, values, color=["#888", "#2a7", "#57c"][: len(modes)])
    axis.set_ylabel("tokens / s")
    axis.set_title(f"{result['model']} on {result['device']['name'][:40]}\nspeedup {result['speedup']:.2f}x", fontsize=9)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)
