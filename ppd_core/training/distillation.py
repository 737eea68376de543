"""Teacher and student passes of the prompt tokens over one sequence, at many cuts at once.

For a sequence x (the model's own greedy answer after a prompt) and a cut c (x[c] is the last
context token), prompt token k (1-based) at position c + k predicts x[c + k + 1]; its teacher
is the model's distribution at position c + k, computed by one causal forward over x.

The student attaches n x V prompt tokens at each of C cuts and runs them in ONE forward over
the teacher pass's KV cache. Row (cut i, token k, member j) sees the context up to c_i and
member j of tokens 1..k at the same cut: the ensemble mask of docs/design.md, "How a step works".

Training (the loss) and calibration (the acceptance statistics) both read these logits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from transformers import DynamicCache

from ppd_core.backends.torch import cache as kv_cache
from ppd_core.backends.torch.decoder import forward_hidden, logits_of

if TYPE_CHECKING:
    from transformers import PreTrainedModel  # type hints only: importing model code costs ~90 MB


@dataclass(frozen=True)
class CutLayout:
    """Student rows for C cuts, ordered (cut, prompt token, member)."""

    positions: torch.Tensor  # [R] position id of each row
    embedding_index: torch.Tensor  # [R] row of the flattened [n * V, hidden] table
    allowed: torch.Tensor  # [R, L + R] bool: context columns, then student columns


def cut_layout(cuts: torch.Tensor, num_prompt_tokens: int, ensemble_size: int, context_length: int,
               chained: bool = True) -> CutLayout:
    """Positions, table rows and attention pattern of the student rows (pure tensor math); ``chained``: a row sees
    the earlier prompt tokens of its cut and member (decoding's tree), else the context and itself only."""
    n, V = num_prompt_tokens, ensemble_size
    rows = torch.arange(len(cuts) * n * V)
    cut_of = rows // (n * V)  # [R]
    token_of = (rows // V) % n  # [R] 0-based prompt token
    member_of = rows % V  # [R]
    context = torch.arange(context_length)[None, :] <= cuts[cut_of][:, None]  # [R, L]
    same_chain = (cut_of[:, None] == cut_of[None, :]) & (member_of[:, None] == member_of[None, :])
    earlier = token_of[None, :] <= token_of[:, None] if chained else token_of[None, :] == token_of[:, None]
    student = same_chain & earlier  # [R, R]
    return CutLayout(
        positions=cuts[cut_of] + token_of + 1,
        embedding_index=token_of * V + member_of,
        allowed=torch.cat([context, student], dim=1),
    )


@torch.no_grad()
def teacher_pass(model: PreTrainedModel, ids: list[int]) -> tuple[DynamicCache, torch.Tensor]:
    """KV cache and float32 logits [L, vocab] of one causal forward over the sequence."""
    device = model.get_input_embeddings().weight.device
    tokens = torch.tensor(ids, device=device)
    cache = kv_cache.new_cache(model)
    hidden = forward_hidden(model, cache, model.get_input_embeddings()(tokens), torch.arange(len(ids), device=device), None)
    return cache, logits_of(model, hidden)


def student_logits(
    model: PreTrainedModel,
    cache: DynamicCache,
    table: torch.Tensor,  # [n * V, hidden], may require grad
    cuts: torch.Tensor,  # [C]
    num_prompt_tokens: int,
    ensemble_size: int,
    chained: bool = True,
) -> torch.Tensor:
    """Ensemble-averaged logits [C, n, vocab] of the prompt tokens attached at each cut.

    The student rows are appended to ``cache`` and removed again afterwards.
    """
    n, V = num_prompt_tokens, ensemble_size
    length = cache.length
    layout = cut_layout(cuts.cpu(), n, V, length, chained)
    device = table.device
    weight = model.get_input_embeddings().weight
    embeds = table[layout.embedding_index.to(device)].to(weight.dtype)  # [R, hidden]
    mask = torch.zeros(layout.allowed.shape, dtype=weight.dtype)
    mask.masked_fill_(~layout.allowed, torch.finfo(weight.dtype).min)
    try:
        hidden = forward_hidden(model, cache, embeds, layout.positions.to(device), mask.to(device)[None, None])
    finally:
        cache.truncate(length)
    logits = logits_of(model, hidden).view(len(cuts), n, V, -1)  # [C, n, V, vocab]
    return logits.mean(2)


def teacher_targets(teacher: torch.Tensor, cuts: torch.Tensor, num_prompt_tokens: int) -> torch.Tensor:
    """Teacher logits [C, n, vocab] for prompt tokens 1..n at each cut: positions c + k."""
    index = cuts[:, None] + torch.arange(1, num_prompt_tokens + 1, device=cuts.device)[None, :]  # [C, n]
    return teacher[index.to(teacher.device)]


def valid_cuts(prompt_length: int, length: int, num_prompt_tokens: int) -> torch.Tensor:
    """Cuts inside the answer whose n targets all lie inside the sequence."""
    return torch.arange(prompt_length, length - num_prompt_tokens)
