"""OpenAI's JSON shapes for ppd's answers: choices and chunks, usage, ppd's own figures, model cards."""

from __future__ import annotations

import json

from app.api.schemas import Job, Outcome
from app.model_catalog import public_name
from ppd_core import ModelSnapshot


def finish_reason(outcome: Outcome) -> str:
    """OpenAI's reason; an answer cut short by ppd quitting (SIGTERM) is "abort" (vLLM's word), never "stop"."""
    return {"length": "length", "cancelled": "abort"}.get(outcome.finish_reason, "stop")


def usage(job: Job, outcome: Outcome) -> dict:
    return {"prompt_tokens": len(job.ids), "completion_tokens": outcome.completion_tokens,
            "total_tokens": len(job.ids) + outcome.completion_tokens}


def ppd_figures(job: Job, outcome: Outcome) -> dict:
    """ppd's own numbers, in a field standard clients ignore: of the model that answered (``outcome.model``)."""
    stats, sampling = outcome.stats, job.sampling
    if stats is None or outcome.model is None:  # never reached the model
        return {"queued_seconds": round(outcome.queued_seconds, 4)}
    return {
        "tokens_per_second": round(stats.tok_s, 3),  # answer tokens per second, prompt processing included
        "tokens_per_step": round(stats.mean_accepted, 4),
        "acceptance": "greedy" if sampling.greedy else sampling.acceptance,
        "distribution_preserving": sampling.lossless,
        "tree": outcome.model.tree["name"],
        "steps": stats.steps,
        "new_tokens": stats.new_tokens,
        "accepted_by_source": dict(stats.accepted),  # accepted guesses by source (a drafter's name)
        "drafted_by_source": dict(stats.drafted),  # tree nodes each source owned
        "prefill_seconds": round(stats.prefill_seconds, 4),
        "seconds": round(stats.seconds, 4),
        "queued_seconds": round(outcome.queued_seconds, 4),
        "started_at": outcome.started_at,
        "finished_at": outcome.finished_at,
    }


def answered_by(job: Job, outcome: Outcome) -> str:
    """The name of the model that answered (read under the job's turn), else the one the job was made for."""
    return outcome.model.name if outcome.model is not None else job.model


def sse(body: dict | str) -> str:
    """One server-sent event."""
    return f"data: {body if isinstance(body, str) else json.dumps(body)}\n\n"


def chunk(job: Job, model: str, choices: list[dict], **extra) -> str:
    kind = "text_completion" if job.completion else "chat.completion.chunk"
    return sse({"id": job.id, "object": kind, "created": job.created, "model": model, "choices": choices, **extra})


def text_choice(text: str, reason: str | None = None, logprobs: dict | None = None) -> list[dict]:
    """/v1/completions' choice (a whole answer or a streamed piece of one)."""
    return [{"index": 0, "text": text, "logprobs": logprobs, "finish_reason": reason}]


def choice(delta: dict, reason: str | None = None, logprobs: list[dict] | None = None) -> list[dict]:
    return [{"index": 0, "delta": delta, "logprobs": None if logprobs is None else {"content": logprobs, "refusal": None},
             "finish_reason": reason}]


def unloaded_card(name: str, created: int) -> dict:
    """A model ppd has but has not loaded (named by ``public_name``)."""
    return {"id": name, "object": "model", "created": created, "owned_by": "ppd", "ppd": {"loaded": False}}


def model_card(model: ModelSnapshot, spec: str, created: int) -> dict:
    tokens = model.prompt_tokens
    return {
        "id": model.name, "object": "model", "created": created, "owned_by": "ppd",
        "ppd": {
            "loaded": True,
            "model": public_name(spec),  # as --model names it (a local path: its file name)
            "quant": model.quant,
            "dtype": model.dtype,
            "device": model.device,
            "backend": model.backend,
            "chat_template": model.template_note or "the model's own",
            "plain_only": model.plain_only,
            "forward": model.forward,
            "max_context": model.max_context,
            "prompt_tokens": {"count": tokens.count, "ensemble_size": tokens.ensemble_size, "trained": tokens.trained,
                              "base_model": tokens.base_model, "bytes": tokens.bytes},
            "tree": model.tree,
            "calibration": model.calibration,
            "sampling_defaults": model.sampling_defaults.describe(),  # what a request leaving a field unset gets
        },
    }


def legacy_logprobs(entries: list[dict] | None, start: int = 0) -> dict | None:
    """Chat-style logprobs entries in /v1/completions' shape; ``start``: the text offset of the first."""
    if entries is None:
        return None
    offsets, at = [], start
    for entry in entries:
        offsets.append(at)
        at += len(entry["token"])
    return {"tokens": [e["token"] for e in entries], "token_logprobs": [e["logprob"] for e in entries],
            "top_logprobs": [{t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in entries],
            "text_offset": offsets}
