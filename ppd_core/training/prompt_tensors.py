"""Prompt tokens meet torch here: a torch embedding table's fingerprint, untrained tokens started from it, the check
that a file's tokens fit the model, and the table as a tensor (``ppd_core.drafters.prompt_tokens`` stays NumPy)."""

from __future__ import annotations

import torch

from ppd_core.drafters.prompt_tokens import PromptTokens, signature_of


def embedding_signature(embedding_weight: torch.Tensor) -> list[float]:
    """``signature_of`` a torch embedding table [vocab, hidden]."""
    weight = embedding_weight.detach()
    return signature_of(lambda rows: weight[torch.from_numpy(rows).to(weight.device)].float().cpu().numpy(),
                        weight.shape[0])


def initial_prompt_tokens(
    embedding_weight: torch.Tensor,  # [vocab, hidden]
    init_token_ids: list[int],
    base_model: str,
    num_prompt_tokens: int = 3,
    ensemble_size: int = 1,
    seed: int = 0,
) -> PromptTokens:
    """Every prompt token at the mean embedding of ``init_token_ids`` (e.g. "next word").

    Ensemble members get a small seeded perturbation so they can diverge in training.
    """
    table = embedding_weight.detach().float()
    base = table[torch.tensor(init_token_ids, device=table.device)].mean(0).cpu()  # [hidden]
    embeddings = base.expand(num_prompt_tokens, ensemble_size, -1).clone()
    if ensemble_size > 1:
        generator = torch.Generator().manual_seed(seed)
        noise = torch.randn(embeddings.shape, generator=generator) * 0.02 * base.norm() / base.numel() ** 0.5
        embeddings += noise
    return PromptTokens(
        embeddings=embeddings.numpy(),
        base_model=base_model,
        signature=embedding_signature(embedding_weight),
        vocab_size=embedding_weight.shape[0],
        training={"trained": False},
    )


def check_compatible(tokens: PromptTokens, embedding_weight: torch.Tensor, model_name: str) -> None:
    """Refuse tokens trained for another model (hidden size, vocabulary or embedding table)."""
    vocab, hidden = embedding_weight.shape
    tokens.check_signature(embedding_signature(embedding_weight), vocab, hidden, model_name)


def prompt_table(tokens: PromptTokens, dtype: torch.dtype, device) -> torch.Tensor:
    """``tokens.table()`` as a torch tensor of ``dtype`` on ``device`` (training and the torch acceptance pass)."""
    return torch.from_numpy(tokens.table()).to(device=device, dtype=dtype)
