"""The model's own greedy answers (transformers' ``generate``): the sequences training learns from, and `ppd bench`'s
yardstick."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedModel  # type hints only: importing model code costs ~90 MB


@torch.inference_mode()
def greedy_batch(model: PreTrainedModel, prompts: Sequence[list[int]], max_new_tokens: int, pad_id: int, eos_ids: Sequence[int]) -> list[list[int]]:
    """Greedy answers for several prompts at once (left padding); each cut after its first EOS."""
    device = model.get_input_embeddings().weight.device
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt)
        mask[row, width - len(prompt) :] = 1
    output = model.generate(
        ids.to(device), attention_mask=mask.to(device), max_new_tokens=max_new_tokens, do_sample=False,
        pad_token_id=pad_id, eos_token_id=list(eos_ids),
    )
    answers = []
    for row in output[:, width:].tolist():
        end = next((i + 1 for i, t in enumerate(row) if t in eos_ids), len(row))
        answers.append(row[:end])
    return answers


def reference_answer(loaded, input_ids: Sequence[int], max_new_tokens: int) -> list[int]:
    """transformers ``generate(do_sample=False)`` after ``input_ids`` on ``loaded``'s torch model: the yardstick for
    exactness and speed (`ppd bench`)."""
    eos = sorted(loaded.eos_token_ids)
    return greedy_batch(loaded.model, [list(input_ids)], max_new_tokens, loaded.tokenizer.pad_token_id or eos[0], eos)[0]
