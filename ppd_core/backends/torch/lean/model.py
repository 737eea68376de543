"""A lean decoder forward for Llama-family models, reading the loaded transformers model's weights.

In the spirit of gpt-fast's ``model.py``: per layer one fused QKV matmul, RoPE as four ops on
queries and keys together, one SDPA call over a preallocated cache written by position, one
fused gate/up matmul. The tree mask and the positions are arguments, never state. A 1-token
step runs about 20 ops per layer instead of the generic model's many small ones, which on a
CPU is most of a step's cost at this model size.

Supported: Llama, SmolLM (Llama), Qwen2 (q/k/v biases), Mistral without a sliding window;
``unsupported_reason`` says why anything else keeps the transformers path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ppd_core.backends.torch.device import torch_properties
from ppd_core.backends.torch.lean.attention import attend
from ppd_core.backends.torch.lean.cache import StaticCache
from ppd_core.device_policy import attention_plan

ARCHITECTURES = ("llama", "qwen2", "mistral")


def sliding_window(config) -> int | None:
    """The attention window of a model that attends to fewer tokens than its context, else None."""
    window = getattr(config, "sliding_window", None)
    if window is not None and getattr(config, "use_sliding_window", True) and window < config.max_position_embeddings:
        return int(window)
    return None


def config_reason(config) -> str | None:
    """Why a model with this config cannot run on the lean forward (None when it can)."""
    kind = getattr(config, "model_type", "?")
    if kind not in ARCHITECTURES:
        return f"architecture {kind!r} (lean forward: {', '.join(ARCHITECTURES)})"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"activation {config.hidden_act!r}"
    if sliding_window(config) is not None:
        return "sliding-window attention"
    return None


def unsupported_reason(model: nn.Module) -> str | None:
    """Why ``model`` cannot run on the lean forward (None when it can)."""
    reason = config_reason(model.config)
    if reason is not None:
        return reason
    for module in model.modules():
        if isinstance(module, nn.Linear) and type(module.weight) is not nn.Parameter:
            return f"quantized linear layers ({type(module.weight).__name__})"
        if isinstance(module, nn.Linear) and module.weight.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            return f"weights in {module.weight.dtype}"
    return None


def _rms_norm(x: torch.Tensor, shape: tuple[int, ...], weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``F.rms_norm`` for torch < 2.4 (older JetPack builds), in the same ops transformers' Llama norm uses."""
    variance = x.float().pow(2).mean(-1, keepdim=True)  # [T, 1]
    return weight * (x.float() * torch.rsqrt(variance + eps)).to(x.dtype)


rms_norm = getattr(F, "rms_norm", None) or _rms_norm


def fused(*parts: torch.Tensor | None) -> torch.Tensor | None:
    """Concatenate weights (or biases) along the output dimension; None if all are None."""
    present = [p for p in parts if p is not None]
    if not present:
        return None
    if len(present) != len(parts):
        raise ValueError("some but not all projections have a bias")
    return torch.cat([p.detach() for p in present])


@dataclass
class LeanLayer:
    attn_norm: torch.Tensor  # [hidden]
    wqkv: torch.Tensor  # [(heads + 2 * kv_heads) * head_dim, hidden]
    bqkv: torch.Tensor | None
    wo: torch.Tensor  # [hidden, heads * head_dim]
    bo: torch.Tensor | None
    mlp_norm: torch.Tensor  # [hidden]
    w13: torch.Tensor  # [2 * intermediate, hidden]: gate, then up
    w2: torch.Tensor  # [hidden, intermediate]


class LeanDecoder:
    """The decoder body of a Llama-family model over a ``StaticCache``, sharing the loaded transformers model's
    weights (fp32, bf16 or fp16: one copy in memory)."""

    forward_name = "lean"  # what ``TorchDecoder`` reports as its forward

    def __init__(self, model: nn.Module):
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"no lean forward for this model: {reason}")
        body = model.base_model
        config = model.config
        self.config = config
        self.heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.hidden = config.hidden_size
        self.eps = config.rms_norm_eps
        self.model = model  # the LM head and generation config stay the model's own
        self.embedding = model.get_input_embeddings()
        self.head = model.get_output_embeddings()
        self.norm = body.norm.weight.detach()  # [hidden]
        self.attention = attention_plan(torch_properties(self.norm.device))  # which SDPA calls suit this device
        self.layers = [self._layer(block) for block in body.layers]
        # RoPE for every position, from the model's own rotary module (any rope scaling it has), on its device.
        weight = body.embed_tokens.weight
        positions = torch.arange(config.max_position_embeddings, device=weight.device)[None]
        with torch.no_grad():
            cos, sin = body.rotary_emb(weight[:1].float(), positions)  # [1, P, head_dim] each
        self._set_rope(cos[0], sin[0])

    def _set_rope(self, cos: torch.Tensor, sin: torch.Tensor) -> None:
        """Keep RoPE tables [P, head_dim] in the weights' dtype, with rotate_half's sign folded into sin."""
        dtype = self.norm.dtype
        half = self.head_dim // 2
        sign = torch.cat([-torch.ones(half), torch.ones(self.head_dim - half)]).to(sin)
        self.cos = cos.to(dtype)  # [P, head_dim]
        self.sin = (sin * sign).to(dtype)  # [P, head_dim]: rotate_half(x) * sin == roll(x) * this

    @staticmethod
    def _layer(block: nn.Module) -> LeanLayer:
        """Fuse one block's projections; the model's own Linear modules then view the fused tensors (one copy)."""
        attention, mlp = block.self_attn, block.mlp
        q, k, v, o = attention.q_proj, attention.k_proj, attention.v_proj, attention.o_proj
        layer = LeanLayer(
            attn_norm=block.input_layernorm.weight.detach(),
            wqkv=fused(q.weight, k.weight, v.weight),
            bqkv=fused(q.bias, k.bias, v.bias),
            wo=o.weight.detach(),
            bo=None if o.bias is None else o.bias.detach(),
            mlp_norm=block.post_attention_layernorm.weight.detach(),
            w13=fused(mlp.gate_proj.weight, mlp.up_proj.weight),
            w2=mlp.down_proj.weight.detach(),
        )
        share(layer.wqkv, [q, k, v], "weight")
        if layer.bqkv is not None:
            share(layer.bqkv, [q, k, v], "bias")
        share(layer.w13, [mlp.gate_proj, mlp.up_proj], "weight")
        return layer

    def get_input_embeddings(self) -> nn.Module:
        return self.embedding

    def get_output_embeddings(self) -> nn.Module:
        return self.head

    @property
    def kernels(self) -> dict:
        """Which matmul kernels a step uses (recorded in benchmark results and profiles)."""
        return {"linear": "F.linear", "lm_head": "F.linear", "compiled": False}

    @property
    def num_bytes(self) -> int:
        """Weights the lean forward reads: layers, final norm, LM head, and the input embedding table."""
        tensors = [self.norm, self.embedding.weight]
        for layer in self.layers:
            tensors += [layer.attn_norm, layer.wqkv, layer.bqkv, layer.wo, layer.bo, layer.mlp_norm, layer.w13, layer.w2]
        if self.head.weight.data_ptr() != self.embedding.weight.data_ptr():  # untied
            tensors.append(self.head.weight)
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)

    def new_cache(self) -> StaticCache:
        weight = self.norm
        return StaticCache.empty(len(self.layers), self.kv_heads, self.config.max_position_embeddings, self.head_dim,
                                 weight.dtype, weight.device)

    @torch.inference_mode()
    def __call__(
        self,
        embeds: torch.Tensor,  # [T, hidden]
        positions: torch.Tensor,  # [T] RoPE positions
        mask: torch.Tensor | None,  # [1, 1, T, cached + T] additive or bool; None: causal
        cache: StaticCache,
    ) -> torch.Tensor:
        """Hidden states [T, hidden] after the final norm; the T tokens' keys and values go into ``cache``."""
        T = embeds.shape[0]
        chunk = self.attention.masked_prefill_rows
        if mask is None and cache.length > 0 and chunk and T > chunk:  # a long follow-up: its mask per chunk only
            return torch.cat([self(embeds[i : i + chunk], positions[i : i + chunk], None, cache) for i in range(0, T, chunk)])
        start, end = cache.length, cache.length + T
        cache.reserve(end)
        causal = mask is None and T > 1 and start == 0 and self.attention.causal_prefill  # no mask at all: flash
        if mask is None and T > 1 and not causal:
            mask = torch.ones(T, end, dtype=torch.bool, device=embeds.device).tril(start)  # causal after the cache
        cos, sin = self.cos[positions][:, None], self.sin[positions][:, None]  # [T, 1, head_dim]
        H, Hkv, D = self.heads, self.kv_heads, self.head_dim
        x = embeds
        for index, layer in enumerate(self.layers):
            h = rms_norm(x, (self.hidden,), layer.attn_norm, self.eps)
            qkv = F.linear(h, layer.wqkv, layer.bqkv)  # [T, (H + 2 Hkv) D]
            qk, v = qkv.split([(H + Hkv) * D, Hkv * D], dim=-1)
            qk = qk.view(T, H + Hkv, D)
            qk = qk * cos + qk.roll(D // 2, dims=-1) * sin  # RoPE on queries and keys at once
            q, k = qk.split([H, Hkv], dim=1)  # [T, H, D], [T, Hkv, D]
            k, v = k.transpose(0, 1), v.view(T, Hkv, D).transpose(0, 1)  # [Hkv, T, D] each
            keys, values = cache.write(index, start, k, v)  # [Hkv, end, D]
            attended = attend(q, keys, values, self.attention, mask, causal)  # [T, H, D]
            x = x + F.linear(attended.reshape(T, H * D), layer.wo, layer.bo)
            h = rms_norm(x, (self.hidden,), layer.mlp_norm, self.eps)
            gate, up = F.linear(h, layer.w13).chunk(2, dim=-1)  # [T, intermediate] each
            x = x + F.linear(F.silu(gate) * up, layer.w2)
        cache.length = end
        return rms_norm(x, (self.hidden,), self.norm, self.eps)


def share(fused_tensor: torch.Tensor, modules: list[nn.Module], name: str) -> None:
    """Point each module's ``name`` parameter at its slice of ``fused_tensor`` (same values, one copy in memory)."""
    offset = 0
    for module in modules:
        size = getattr(module, name).shape[0]
        setattr(module, name, nn.Parameter(fused_tensor[offset : offset + size], requires_grad=False))
        offset += size
