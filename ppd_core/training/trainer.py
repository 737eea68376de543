"""`ppd train`: learn prompt tokens by self-distillation, resumable, with a held-out evaluation."""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ppd_core.atomic_files import atomic_output, atomic_write
from ppd_core.distillation import student_logits, teacher_pass, teacher_targets, valid_cuts
from ppd_core.errors import PpdError
from ppd_core.loading import LoadedModel
from ppd_core.prompt_tokens import PromptTokens
from ppd_core.training.distill import DEPTH_DECAY, acceptance_hits, depth_weights, distill_loss


@dataclass
class TrainConfig:
    samples: int = 2000  # conversations answered by the model and trained on
    epochs: float = 2.0
    cuts: int = 32  # cuts per conversation per step
    accumulate: int = 4  # conversations per optimizer step
    num_prompt_tokens: int = 3
    ensemble_size: int = 2
    lr: float = 1e-2
    warmup_steps: int = 20
    max_prompt_tokens: int = 384
    max_new_tokens: int = 192
    generation_batch: int = 16
    checkpoint_every: int = 25  # optimizer steps
    seed: int = 0
    loss: str = "kl"  # distill_loss's kind: kl | top20 | hard
    depth_decay: float = DEPTH_DECAY  # depth k's loss weighs decay^(k-1)
    curriculum: float = 0.0  # the first fraction of the steps trains depth 1 only
    chained: bool = True  # prompt token k sees prompt tokens 1..k-1 of its cut (False: the context only)


@dataclass
class Evaluation:
    cuts: int
    top1: list[float]  # per depth
    top10: list[float]
    loss: float


LOSS_NAMES = {"kl": "forward KL", "top20": "cross-entropy on the teacher's top 20", "hard": "cross-entropy on the teacher's argmax"}


def cosine_lr(step: int, total: int, warmup: int, peak: float) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


@torch.no_grad()
def evaluate(model, table: torch.Tensor, records: list[dict], n: int, V: int, chunk: int = 64,
             chained: bool = True) -> Evaluation:
    """Acceptance of the prompt tokens' guesses at every cut of held-out answers."""
    hits = torch.zeros(n, 2)
    total, loss_sum = 0, 0.0
    for record in records:
        cache, teacher = teacher_pass(model, record["ids"])
        cuts = valid_cuts(record["prompt_length"], len(record["ids"]), n)
        for start in range(0, len(cuts), chunk):
            part = cuts[start : start + chunk]
            student = student_logits(model, cache, table, part, n, V, chained)
            target = teacher_targets(teacher, part, n)
            hits += acceptance_hits(student, target).cpu().float()
            loss_sum += float(distill_loss(student, target)) * len(part)
            total += len(part)
    total = max(total, 1)
    return Evaluation(total, (hits[:, 0] / total).tolist(), (hits[:, 1] / total).tolist(), loss_sum / total)


def save_checkpoint(path: Path, state: dict) -> None:
    with atomic_output(path) as tmp:
        torch.save(state, tmp)


def train(
    loaded: LoadedModel,
    initial: PromptTokens,
    records: list[dict],
    config: TrainConfig,
    checkpoint: Path,
    progress: Callable[[int, int, float, float], None] | None = None,
) -> tuple[PromptTokens, dict]:
    """Train ``initial``'s embeddings on ``records`` (answers); resumes from ``checkpoint`` if present."""
    model = loaded.model
    n, V = config.num_prompt_tokens, config.ensemble_size
    embeddings = torch.nn.Parameter(torch.from_numpy(initial.embeddings.copy()).to(loaded.device, torch.float32))  # [n, V, hidden]
    optimizer = torch.optim.AdamW([embeddings], lr=config.lr, weight_decay=0.0)
    total_steps = max(1, int(config.epochs * len(records) / config.accumulate))
    step, losses, seconds = 0, [], 0.0
    if checkpoint.is_file():
        state = torch.load(checkpoint, map_location=loaded.device, weights_only=False)
        if state["config"] != asdict(config) or state["samples"] != len(records):
            raise PpdError(f"{checkpoint} belongs to another training run (delete it or use another --work-dir)")
        embeddings.data.copy_(state["embeddings"])
        optimizer.load_state_dict(state["optimizer"])
        step, losses, seconds = state["step"], state["losses"], state["seconds"]

    rng = random.Random(config.seed)
    order = [i for _ in range(math.ceil(config.epochs) + 1) for i in rng.sample(range(len(records)), len(records))]
    while step < total_steps:
        started = time.perf_counter()
        for group in optimizer.param_groups:
            group["lr"] = cosine_lr(step, total_steps, config.warmup_steps, config.lr)
        step_loss = 0.0
        depths = 1 if step < config.curriculum * total_steps else None
        weights = depth_weights(n, config.depth_decay, depths)  # [n]
        for micro in range(config.accumulate):
            record = records[order[step * config.accumulate + micro]]
            cache, teacher = teacher_pass(model, record["ids"])
            choices = valid_cuts(record["prompt_length"], len(record["ids"]), n)
            if len(choices) == 0:
                continue
            pick = torch.randperm(len(choices), generator=torch.Generator().manual_seed(step * 997 + micro))
            cuts = choices[pick[: config.cuts]].sort().values
            student = student_logits(model, cache, embeddings.view(n * V, -1), cuts, n, V, config.chained)
            loss = distill_loss(student, teacher_targets(teacher, cuts, n), kind=config.loss, weights=weights)
            loss = loss / config.accumulate
            loss.backward()
            step_loss += float(loss.detach())
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        losses.append(step_loss)
        seconds += time.perf_counter() - started
        if progress:
            progress(step, total_steps, step_loss, seconds)
        if step % config.checkpoint_every == 0 or step == total_steps:
            save_checkpoint(checkpoint, {
                "embeddings": embeddings.detach().cpu(), "optimizer": optimizer.state_dict(), "step": step,
                "losses": losses, "seconds": seconds, "config": asdict(config), "samples": len(records),
            })

    trained = PromptTokens(
        embeddings=embeddings.detach().float().cpu().numpy().copy(),
        base_model=initial.base_model,
        signature=initial.signature,
        vocab_size=initial.vocab_size,
    )
    summary = {
        "trained": True,
        "method": f"self-distillation, {LOSS_NAMES[config.loss]}, depth decay {config.depth_decay}"
                  + (f", depth 1 alone for the first {config.curriculum:.0%} of steps" if config.curriculum else "")
                  + ("" if config.chained else ", each prompt token sees the context only") + ", ensemble prompt tokens",
        "samples": len(records),
        "steps": step,
        "final_loss": round(sum(losses[-20:]) / max(1, len(losses[-20:])), 5),
        "train_seconds": round(seconds, 1),
        "config": asdict(config),
    }
    return trained, summary


def write_json(path: Path, data: dict) -> None:
    atomic_write(path, json.dumps(data, indent=2) + "\n")
