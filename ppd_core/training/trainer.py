"""`ppd train`: learn prompt tokens by self-distillation, resumable, with a held-out evaluation."""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ppd_core.atomic_files import atomic_output, atomic_write
from ppd_core.errors import PpdError
from ppd_core.drafters.prompt_tokens import PromptTokens
from ppd_core.training.distillation import student_logits, teacher_pass, teacher_targets, valid_cuts
from ppd_core.training.distill import DEPTH_DECAY, acceptance_hits, depth_weights, distill_loss

if TYPE_CHECKING:
    from ppd_core.loaded import LoadedModel


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


@dataclass
class TrainState:
    """Where a training run stands: what a checkpoint holds."""

    embeddings: torch.nn.Parameter  # [n, V, hidden]
    optimizer: torch.optim.Optimizer
    step: int = 0
    losses: list[float] = field(default_factory=list)
    seconds: float = 0.0

    def save(self, path: Path, config: TrainConfig, samples: int) -> None:
        save_checkpoint(path, {
            "embeddings": self.embeddings.detach().cpu(), "optimizer": self.optimizer.state_dict(), "step": self.step,
            "losses": self.losses, "seconds": self.seconds, "config": asdict(config), "samples": samples,
        })


def start_state(loaded: LoadedModel, initial: PromptTokens, config: TrainConfig, samples: int,
                checkpoint: Path) -> TrainState:
    """``initial``'s embeddings and a fresh optimizer, or where ``checkpoint`` (of this very run) stopped."""
    embeddings = torch.nn.Parameter(torch.from_numpy(initial.embeddings.copy()).to(loaded.device, torch.float32))
    state = TrainState(embeddings, torch.optim.AdamW([embeddings], lr=config.lr, weight_decay=0.0))
    if checkpoint.is_file():
        saved = torch.load(checkpoint, map_location=loaded.device, weights_only=False)
        if saved["config"] != asdict(config) or saved["samples"] != samples:
            raise PpdError(f"{checkpoint} belongs to another training run (delete it or use another --work-dir)")
        embeddings.data.copy_(saved["embeddings"])
        state.optimizer.load_state_dict(saved["optimizer"])
        state.step, state.losses, state.seconds = saved["step"], saved["losses"], saved["seconds"]
    return state


def train(
    loaded: LoadedModel,
    initial: PromptTokens,
    records: list[dict],
    config: TrainConfig,
    checkpoint: Path,
    progress: Callable[[int, int, float, float], None] | None = None,
) -> tuple[PromptTokens, dict]:
    """Train ``initial``'s embeddings on ``records`` (answers); resumes from ``checkpoint`` if present."""
    model, state = loaded.model, start_state(loaded, initial, config, len(records), checkpoint)
    total_steps = max(1, int(config.epochs * len(records) / config.accumulate))
    rng = random.Random(config.seed)
    order = [i for _ in range(math.ceil(config.epochs) + 1) for i in rng.sample(range(len(records)), len(records))]
    while state.step < total_steps:
        started = time.perf_counter()
        for group in state.optimizer.param_groups:
            group["lr"] = cosine_lr(state.step, total_steps, config.warmup_steps, config.lr)
        batch = [records[order[state.step * config.accumulate + micro]] for micro in range(config.accumulate)]
        step_loss = accumulate(model, state, batch, config, total_steps)
        state.optimizer.step()
        state.optimizer.zero_grad(set_to_none=True)
        state.step += 1
        state.losses.append(step_loss)
        state.seconds += time.perf_counter() - started
        if progress:
            progress(state.step, total_steps, step_loss, state.seconds)
        if state.step % config.checkpoint_every == 0 or state.step == total_steps:
            state.save(checkpoint, config, len(records))
    trained = PromptTokens(embeddings=state.embeddings.detach().float().cpu().numpy().copy(),
                           base_model=initial.base_model, signature=initial.signature, vocab_size=initial.vocab_size)
    return trained, summary(config, len(records), state)


def accumulate(model, state: TrainState, batch: list[dict], config: TrainConfig, total_steps: int) -> float:
    """The gradients of one optimizer step over ``batch``'s conversations (``config.cuts`` random cuts each); its loss."""
    n, V = config.num_prompt_tokens, config.ensemble_size
    depths = 1 if state.step < config.curriculum * total_steps else None
    weights = depth_weights(n, config.depth_decay, depths)  # [n]
    step_loss = 0.0
    for micro, record in enumerate(batch):
        cache, teacher = teacher_pass(model, record["ids"])
        choices = valid_cuts(record["prompt_length"], len(record["ids"]), n)
        if len(choices) == 0:
            continue
        pick = torch.randperm(len(choices), generator=torch.Generator().manual_seed(state.step * 997 + micro))
        cuts = choices[pick[: config.cuts]].sort().values
        student = student_logits(model, cache, state.embeddings.view(n * V, -1), cuts, n, V, config.chained)
        loss = distill_loss(student, teacher_targets(teacher, cuts, n), kind=config.loss, weights=weights)
        loss = loss / config.accumulate
        loss.backward()
        step_loss += float(loss.detach())
    return step_loss


def summary(config: TrainConfig, samples: int, state: TrainState) -> dict:
    """What the prompt-token file records of its training."""
    return {
        "trained": True,
        "method": f"self-distillation, {LOSS_NAMES[config.loss]}, depth decay {config.depth_decay}"
                  + (f", depth 1 alone for the first {config.curriculum:.0%} of steps" if config.curriculum else "")
                  + ("" if config.chained else ", each prompt token sees the context only") + ", ensemble prompt tokens",
        "samples": samples,
        "steps": state.step,
        "final_loss": round(sum(state.losses[-20:]) / max(1, len(state.losses[-20:])), 5),
        "train_seconds": round(state.seconds, 1),
        "config": asdict(config),
    }


def write_json(path: Path, data: dict) -> None:
    atomic_write(path, json.dumps(data, indent=2) + "\n")
