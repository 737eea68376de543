"""Training's loss and top-k metric on the student and teacher logits of ``ppd_core.training.distillation``."""

from __future__ import annotations

import torch
import torch.nn.functional as F

DEPTH_DECAY = 0.8
LOSSES = ("kl", "top20", "hard")  # the teacher's full distribution, its 20 likeliest tokens renormalized, its argmax
TOP_TARGETS = 20


def depth_weights(n: int, decay: float = DEPTH_DECAY, depths: int | None = None) -> torch.Tensor:
    """[n] decay^(k-1) for depths k = 1..n, zero past ``depths`` (a curriculum's early steps train the first ones)."""
    weights = decay ** torch.arange(n, dtype=torch.float32)
    if depths is not None:
        weights[depths:] = 0.0
    return weights


def distill_loss(student: torch.Tensor, teacher: torch.Tensor, decay: float = DEPTH_DECAY, kind: str = "kl",
                 weights: torch.Tensor | None = None) -> torch.Tensor:
    """(1/n) * sum_k w_k * loss_k, mean over cuts; w_k = decay^(k-1) unless ``weights`` [n] says otherwise.

    ``kind``: "kl" is forward KL(teacher_k || student_k) at temperature 1; "top20" the cross-entropy against the
    teacher's 20 likeliest tokens renormalized; "hard" the cross-entropy of the teacher's argmax (its greedy token).
    """
    n = student.shape[1]
    student_log = F.log_softmax(student.float(), dim=-1)  # [C, n, vocab]
    if kind == "kl":
        teacher_log = F.log_softmax(teacher.float(), dim=-1)
        per_cut = (teacher_log.exp() * (teacher_log - student_log)).sum(-1)  # [C, n]
    elif kind == "top20":
        top = teacher.float().topk(TOP_TARGETS, dim=-1)  # [C, n, 20]
        per_cut = -(top.values.softmax(-1) * student_log.gather(-1, top.indices)).sum(-1)
    elif kind == "hard":
        per_cut = -student_log.gather(-1, teacher.argmax(-1, keepdim=True)).squeeze(-1)
    else:
        raise ValueError(f"unknown distillation loss {kind!r}: one of {', '.join(LOSSES)}")
    if weights is None:
        weights = depth_weights(n, decay)
    return (per_cut.mean(0) * weights.to(per_cut)).sum() / n


def acceptance_hits(student: torch.Tensor, teacher: torch.Tensor, top_ks: tuple[int, ...] = (1, 10)) -> torch.Tensor:
    """Counts [n, len(top_ks)]: how often the teacher's argmax is in the student's top k, per depth."""
    truth = teacher.argmax(-1)  # [C, n]
    ranked = student.topk(max(top_ks), dim=-1).indices  # [C, n, K]
    found = ranked == truth[..., None]  # [C, n, K]
    return torch.stack([found[..., :k].any(-1).sum(0) for k in top_ks], dim=-1)
