"""Training's loss and top-k metric on the student and teacher logits of ``ppd_core.distillation``."""

from __future__ import annotations

import torch
import torch.nn.functional as F

DEPTH_DECAY = 0.8


def distill_loss(student: torch.Tensor, teacher: torch.Tensor, decay: float = DEPTH_DECAY) -> torch.Tensor:
    """(1/n) * sum_k decay^(k-1) * KL(teacher_k || student_k), forward KL at temperature 1, mean over cuts."""
    n = student.shape[1]
    teacher_log = F.log_softmax(teacher.float(), dim=-1)  # [C, n, vocab]
    student_log = F.log_softmax(student.float(), dim=-1)
    kl = (teacher_log.exp() * (teacher_log - student_log)).sum(-1)  # [C, n]
    weights = decay ** torch.arange(n, dtype=kl.dtype, device=kl.device)  # [n]
    return (kl.mean(0) * weights).sum() / n


def acceptance_hits(student: torch.Tensor, teacher: torch.Tensor, top_ks: tuple[int, ...] = (1, 10)) -> torch.Tensor:
    """Counts [n, len(top_ks)]: how often the teacher's argmax is in the student's top k, per depth."""
    truth = teacher.argmax(-1)  # [C, n]
    ranked = student.topk(max(top_ks), dim=-1).indices  # [C, n, K]
    found = ranked == truth[..., None]  # [C, n, K]
    return torch.stack([found[..., :k].any(-1).sum(0) for k in top_ks], dim=-1)
