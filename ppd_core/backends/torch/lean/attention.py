"""The lean forward's attention calls: one function, with the device's ``AttentionPlan`` choosing the form.

Query head h reads key/value head h // G (G = heads / kv_heads), as transformers' ``repeat_kv`` has it.
Three ways to give SDPA grouped queries, all the same attention:

- native: ``enable_gqa=True`` (torch >= 2.5). On CUDA, with a mask, SDPA then falls back to its math
  kernel, which repeats K/V and builds a full fp32 score matrix.
- folded: the G query heads of a group become G x T rows of one batch entry over the group's K/V head,
  and the mask is repeated per group ([G * T, S] booleans, no score matrix). The memory-efficient CUDA
  kernel takes this as it is, and it needs no ``enable_gqa``.
- repeat: K/V repeated G times (linear memory; only for calls without a mask on torch < 2.5).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ppd_core.device_policy import AttentionPlan


def attend(
    q: torch.Tensor,  # [T, H, D]
    keys: torch.Tensor,  # [Hkv, S, D]
    values: torch.Tensor,  # [Hkv, S, D]
    plan: AttentionPlan,
    mask: torch.Tensor | None = None,  # [1, 1, T, S] additive or bool
    causal: bool = False,  # no mask, T == S: each row sees itself and the rows before (a prefill from empty)
) -> torch.Tensor:
    """Attention output [T, H, D]."""
    T, H, D = q.shape
    groups = H // keys.shape[0]
    if mask is not None and plan.masked_gqa == "folded" and groups > 1:
        return _folded(q, keys, values, mask, groups)
    queries = q.transpose(0, 1)[None]  # [1, H, T, D]
    gqa = plan.masked_gqa if mask is not None else plan.gqa
    if groups > 1 and gqa == "repeat":
        keys, values = keys.repeat_interleave(groups, dim=0), values.repeat_interleave(groups, dim=0)  # [H, S, D]
    options = {"enable_gqa": True} if groups > 1 and gqa == "native" else {}
    out = F.scaled_dot_product_attention(queries, keys[None], values[None], attn_mask=mask,
                                         is_causal=causal and mask is None, **options)  # [1, H, T, D]
    return out[0].transpose(0, 1)  # [T, H, D]


def _folded(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, groups: int) -> torch.Tensor:
    """Masked attention with each group's query heads as rows over its one K/V head."""
    T, H, D = q.shape
    Hkv = H // groups
    rows = q.view(T, Hkv, groups, D).permute(1, 2, 0, 3).reshape(1, Hkv, groups * T, D)  # [1, Hkv, G*T, D]
    S = mask.shape[-1]
    folded_mask = mask.reshape(1, 1, T, S).expand(1, groups, T, S).reshape(1, 1, groups * T, S)  # [1, 1, G*T, S]
    out = F.scaled_dot_product_attention(rows, keys[None], values[None], attn_mask=folded_mask)  # [1, Hkv, G*T, D]
    return out.view(Hkv, groups, T, D).permute(2, 0, 1, 3).reshape(T, H, D)
