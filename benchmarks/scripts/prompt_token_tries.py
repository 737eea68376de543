"""Tries at better prompt tokens for the default model, each within the same budget, chosen on a development split.

Teacher answers come from ``ppd train``'s own cache format (``answers.jsonl`` records): the training set, a development
split of ShareGPT conversations training never sees, and the MT-Bench first turns docs/training.md reports on. Each
try continues the shipped tokens (or starts from "next word") with ``ppd train``'s trainer and one change, writes its
tokens and its figures (top-1 / top-10 per depth, docs/training.md's metric: how often the model's own next token is a
guess's top k, over every cut of every answer). Resumable: a finished try is skipped, an interrupted one resumes from its
checkpoint.

    python benchmarks/scripts/prompt_token_tries.py --answers DIR --out DIR [--tries a,b] [--report NAME,...]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from ppd_core.training.distillation import student_logits, teacher_pass, valid_cuts  # noqa: E402
from ppd_core.loading import load_model  # noqa: E402
from ppd_core.drafters.prompt_tokens import INIT_TEXT, PromptTokens  # noqa: E402
from ppd_core.training.answers import read_cache  # noqa: E402
from ppd_core.training.prompt_tensors import initial_prompt_tokens, prompt_table  # noqa: E402
from ppd_core.training.trainer import TrainConfig, train  # noqa: E402

SHIPPED = ROOT / "assets" / "smollm2-135m-instruct.prompt-tokens.safetensors"
BASE = dict(samples=1600, epochs=0.2, cuts=32, accumulate=2, ensemble_size=1, lr=3e-3, warmup_steps=10,
            max_prompt_tokens=256, max_new_tokens=128, checkpoint_every=20)  # 160 steps
TRIES = {  # name: (what changes, TrainConfig overrides, start)
    "control": ("forward KL, depth decay 0.8 (ppd train's default)", {}, "shipped"),
    "hard": ("loss: cross-entropy on the teacher's argmax", {"loss": "hard"}, "shipped"),
    "top20": ("loss: cross-entropy on the teacher's top 20", {"loss": "top20"}, "shipped"),
    "curriculum": ("curriculum: depth 1 alone for the first half", {"curriculum": 0.5}, "shipped"),
    "independent": ("attention: each prompt token sees the context only", {"chained": False}, "shipped"),
    "ensemble3": ("capacity: 3 members per prompt token, kept at inference", {"ensemble_size": 3}, "shipped"),
    "longer": ("schedule: 2x the steps (320)", {"epochs": 0.4}, "shipped"),
    "scratch": ("from 'next word', lr 1e-2 (no shipped start)", {"lr": 1e-2}, "scratch"),
    "conditioned": ("capacity: each prompt token's input plus a rank-64 map of its cut's token embedding", {}, "shipped"),
}
RANK = 64  # "conditioned": the low-rank map from the cut token's embedding to each prompt token's input


class Conditioned(torch.nn.Module):
    """Prompt token k's input at a cut whose last token is x: P[k] + (e(x) B[k]) A[k], e the frozen input embedding.
    Starts equal to P (A = 0). Not a product format: a try at capacity that costs no tree rows."""

    def __init__(self, tokens: PromptTokens, rank: int = RANK):
        super().__init__()
        n, hidden = tokens.num_prompt_tokens, tokens.hidden_size
        self.P = torch.nn.Parameter(torch.from_numpy(tokens.embeddings[:, 0].copy()))  # [n, hidden]
        self.B = torch.nn.Parameter(torch.randn(n, hidden, rank, generator=torch.Generator().manual_seed(0)) / hidden ** 0.5)
        self.A = torch.nn.Parameter(torch.zeros(n, rank, hidden))

    def rows(self, token_embeddings: torch.Tensor) -> torch.Tensor:
        """[C, hidden] embeddings of the cuts' last tokens -> [C * n, hidden] student rows, ordered (cut, token)."""
        delta = torch.einsum("ch,khr,krd->ckd", token_embeddings, self.B, self.A)  # [C, n, hidden]
        return (self.P[None] + delta).reshape(-1, self.P.shape[-1])


def conditioned_logits(model, cache, ids: torch.Tensor, module: Conditioned, cuts: torch.Tensor) -> torch.Tensor:
    """``distillation.student_logits`` with V = 1 and each cut's rows from ``module``: logits [C, n, vocab]."""
    from ppd_core.backends.torch import cache as kv_cache  # noqa: PLC0415
    from ppd_core.backends.torch.decoder import forward_hidden, logits_of  # noqa: PLC0415
    from ppd_core.training.distillation import cut_layout  # noqa: PLC0415

    n = module.P.shape[0]
    length = cache.length
    layout = cut_layout(cuts, n, 1, length)
    embeds = module.rows(model.get_input_embeddings()(ids[cuts]))  # [C * n, hidden]
    mask = torch.zeros(layout.allowed.shape)
    mask.masked_fill_(~layout.allowed, torch.finfo(torch.float32).min)
    try:
        hidden = forward_hidden(model, cache, embeds, layout.positions, mask[None, None])
    finally:
        cache.truncate(length)
    return logits_of(model, hidden).view(len(cuts), n, -1)


def train_conditioned(loaded, records: list[dict], config: TrainConfig, log) -> tuple[Conditioned, float]:
    """``trainer.train``'s loop (the same cuts, loss, schedule) over the ``Conditioned`` parameters."""
    import math  # noqa: PLC0415
    import random  # noqa: PLC0415

    from ppd_core.training.distillation import teacher_targets  # noqa: PLC0415
    from ppd_core.training.distill import distill_loss  # noqa: PLC0415
    from ppd_core.training.trainer import cosine_lr  # noqa: PLC0415

    model, n = loaded.model, 3
    module = Conditioned(PromptTokens.load(SHIPPED))
    optimizer = torch.optim.AdamW(module.parameters(), lr=config.lr, weight_decay=0.0)
    total = max(1, int(config.epochs * len(records) / config.accumulate))
    rng = random.Random(config.seed)
    order = [i for _ in range(math.ceil(config.epochs) + 1) for i in rng.sample(range(len(records)), len(records))]
    started = time.perf_counter()
    for step in range(total):
        for group in optimizer.param_groups:
            group["lr"] = cosine_lr(step, total, config.warmup_steps, config.lr)
        for micro in range(config.accumulate):
            record = records[order[step * config.accumulate + micro]]
            cache, teacher = teacher_pass(model, record["ids"])
            choices = valid_cuts(record["prompt_length"], len(record["ids"]), n)
            pick = torch.randperm(len(choices), generator=torch.Generator().manual_seed(step * 997 + micro))
            cuts = choices[pick[: config.cuts]].sort().values
            student = conditioned_logits(model, cache, torch.tensor(record["ids"]), module, cuts)
            (distill_loss(student, teacher_targets(teacher, cuts, n)) / config.accumulate).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if (step + 1) % 20 == 0:
            log(f"conditioned {step + 1}/{total} {time.perf_counter() - started:.0f}s")
    return module, time.perf_counter() - started


def passes(model, records: list[dict]) -> list[tuple]:
    """(cache, model's token at every position [L], cuts, ids) per answer: the teacher side, computed once."""
    out = []
    for record in records:
        cache, logits = teacher_pass(model, record["ids"])
        out.append((cache, logits.argmax(-1), valid_cuts(record["prompt_length"], len(record["ids"]), 3),
                    torch.tensor(record["ids"])))
    return out


@torch.no_grad()
def figures(model, table, n: int, V: int, chained: bool, teacher: list[tuple], chunk: int = 64) -> dict:
    """Top-1 / top-10 per depth over every cut: docs/training.md's metric (``trainer.evaluate``'s, without the loss).
    ``table``: [n * V, hidden], or a ``Conditioned``."""
    hits, total = torch.zeros(n, 2), 0
    for cache, truth, cuts, ids in teacher:
        for start in range(0, len(cuts), chunk):
            part = cuts[start : start + chunk]
            if isinstance(table, Conditioned):
                student = conditioned_logits(model, cache, ids, table, part)
            else:
                student = student_logits(model, cache, table, part, n, V, chained)  # [C, n, vocab]
            target = truth[part[:, None] + torch.arange(1, n + 1)[None, :]]  # [C, n]: the token after prompt token k's position
            found = student.topk(10, dim=-1).indices == target[..., None]  # [C, n, 10]
            hits[:, 0] += found[..., 0].sum(0)
            hits[:, 1] += found.any(-1).sum(0)
            total += len(part)
    return {"cuts": total, "top1": [round(float(x) / total, 4) for x in hits[:, 0]],
            "top10": [round(float(x) / total, 4) for x in hits[:, 1]]}


def start_tokens(loaded, start: str, config: TrainConfig) -> PromptTokens:
    if start == "shipped":
        return PromptTokens.load(SHIPPED).with_ensemble_size(config.ensemble_size, config.seed)
    weight = loaded.model.get_input_embeddings().weight
    return initial_prompt_tokens(weight, loaded.tokenizer.encode(INIT_TEXT, add_special_tokens=False), loaded.name,
                                   3, config.ensemble_size, config.seed)


def tokens_path(name: str, out: Path) -> Path:
    return SHIPPED if name == "shipped" else Path(name) if name.endswith(".safetensors") else out / f"{name}.safetensors"


def llamacpp_report(args) -> int:
    """docs/training.md's metric through the product's own path: llama.cpp on the shipped GGUF answers each MT-Bench
    first turn greedily (128 tokens), and the prompt tokens' guesses are ranked at every cut through llama.cpp's tree
    rows."""
    from app.questions import DEFAULT_QUESTIONS, read_questions  # noqa: PLC0415
    from ppd_core.calibration.acceptance import answer_ranks, decoder_answers  # noqa: PLC0415
    from ppd_core import Engine, EngineConfig  # noqa: PLC0415

    prompts = None
    for name in [n for n in args.llamacpp.split(",") if n]:
        engine = Engine.load(EngineConfig(prompt_tokens=str(tokens_path(name, args.out)), threads=args.threads,
                                          tree="small", auto_calibrate=False))
        backend, tokens = engine.loaded.backend, engine.prompt_tokens
        if prompts is None:
            questions = read_questions(DEFAULT_QUESTIONS, None)
            prompts = [engine.chat_ids([{"role": "user", "content": q.turns[0]}]) for q in questions]
            answers = decoder_answers(backend, 128, sorted(engine.loaded.eos_token_ids))(prompts)
        started = time.perf_counter()
        ranks = torch.from_numpy(np.concatenate([
            answer_ranks(backend, tokens.table(), 3, tokens.ensemble_size, p, a) for p, a in zip(prompts, answers)]))
        result = {"tokens": name, "backend": backend.describe(), "answers": len(answers), "cuts": len(ranks),
                  "top1": [round(float(x), 4) for x in (ranks == 0).float().mean(0)],
                  "top10": [round(float(x), 4) for x in (ranks >= 0).float().mean(0)],
                  "seconds": round(time.perf_counter() - started, 1)}
        (args.out / f"llamacpp-{Path(name).stem}.json").write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result), flush=True)
        engine.close()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--answers", type=Path, required=True, help="folder with train.jsonl, dev.jsonl, mtbench.jsonl")
    parser.add_argument("--out", type=Path, required=True, help="folder for each try's tokens, checkpoint and figures")
    parser.add_argument("--tries", default=",".join(TRIES), help="comma-separated names (default: all)")
    parser.add_argument("--report", default="", help="evaluate these token files or try names on MT-Bench too")
    parser.add_argument("--llamacpp", default="", help="measure these token files or try names through llama.cpp on "
                        "the shipped GGUF (its own greedy answers to the MT-Bench first turns) and stop")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.llamacpp:
        return llamacpp_report(args)
    loaded = load_model("default", "none", "cpu", "float32")
    model = loaded.model
    train_records = read_cache(args.answers / "train.jsonl")
    dev = passes(model, [r for name in ("dev.jsonl", "dev2.jsonl") for r in read_cache(args.answers / name)])
    print(f"{len(train_records)} training answers, {len(dev)} development answers", flush=True)
    for name in [t for t in args.tries.split(",") if t]:
        result_path = args.out / f"{name}.json"
        if result_path.is_file():
            continue
        change, overrides, start = TRIES[name]
        config = TrainConfig(**{**BASE, **overrides, "samples": len(train_records)})
        if name == "conditioned":
            module, seconds = train_conditioned(loaded, train_records, config, lambda line: print(line, flush=True))
            torch.save(module.state_dict(), args.out / "conditioned.pt")
            started = time.perf_counter()
            result = {"try": name, "change": change, "start": start, "config": dataclasses.asdict(config),
                      "rank": RANK, "train_seconds": round(seconds, 1), "steps": int(config.epochs * len(train_records) / config.accumulate),
                      "dev": figures(model, module, 3, 1, True, dev), "dev_answers": len(dev),
                      "eval_seconds": round(time.perf_counter() - started, 1)}
            result_path.write_text(json.dumps(result, indent=2) + "\n")
            print(json.dumps(result), flush=True)
            continue
        initial = start_tokens(loaded, start, config)
        trained, summary = train(loaded, initial, train_records, config, args.out / f"{name}.checkpoint.pt",
                                 lambda step, total, loss, s: print(f"{name} {step}/{total} loss {loss:.3f} {s:.0f}s",
                                                                    flush=True) if step % 20 == 0 else None)
        trained.training = {**summary, "try": name, "change": change, "start": start}
        trained.save(args.out / f"{name}.safetensors")
        started = time.perf_counter()
        table = prompt_table(trained, torch.float32, "cpu")
        dev_figures = figures(model, table, 3, config.ensemble_size, config.chained, dev)
        result = {"try": name, "change": change, "start": start, "config": dataclasses.asdict(config),
                  "train_seconds": summary["train_seconds"], "steps": summary["steps"], "dev": dev_figures,
                  "dev_answers": len(dev), "eval_seconds": round(time.perf_counter() - started, 1)}
        result_path.write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result), flush=True)
    reports = [r for r in args.report.split(",") if r]
    if reports:  # a report's figures are kept: delete its file to measure again
        mtbench = passes(model, read_cache(args.answers / "mtbench.jsonl"))
        for name in [r for r in reports if not (args.out / f"report-{Path(r).stem}.json").is_file()]:
            if name == "conditioned":
                table, V, chained = Conditioned(PromptTokens.load(SHIPPED)), 1, True
                table.load_state_dict(torch.load(args.out / "conditioned.pt"))
            else:
                tokens = PromptTokens.load(tokens_path(name, args.out))
                chained = tokens.training.get("config", {}).get("chained", True)
                table, V = prompt_table(tokens, torch.float32, "cpu"), tokens.ensemble_size
            result = {"tokens": name, "mtbench": figures(model, table, 3, V, chained, mtbench),
                      "mtbench_answers": len(mtbench), "dev": figures(model, table, 3, V, chained, dev), "dev_answers": len(dev)}
            (args.out / f"report-{Path(name).stem}.json").write_text(json.dumps(result, indent=2) + "\n")
            print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
