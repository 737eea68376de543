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

import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ppd_core.device_policy import attention_plan, properties_of
from ppd_core.lean.attention import attend
from ppd_core.lean.cache import StaticCache
from ppd_core.lean.checkpoint import Checkpoint
from ppd_core.lean.quant import QuantLinear, quantize

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


STATIC_ROPE = ("default", "linear", "llama3", "yarn")  # RoPE types whose tables do not depend on the sequence


def rope_tables(config) -> tuple[torch.Tensor, torch.Tensor] | None:
    """RoPE cos and sin [positions, head_dim] for every position, computed as transformers' rotary module
    computes them (bitwise: same inverse frequencies, same ops); None for a type this does not cover."""
    parameters = getattr(config, "rope_parameters", None) or {}
    kind = parameters.get("rope_type", "default")
    if kind not in STATIC_ROPE or getattr(config, "partial_rotary_factor", 1.0) != 1.0:
        return None
    if kind == "default":
        dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        inv_freq, scaling = 1.0 / (parameters["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)), 1.0
    else:
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # no model code: a light import

        inv_freq, scaling = ROPE_INIT_FUNCTIONS[kind](config)
    positions = torch.arange(config.max_position_embeddings)[None]  # [1, P]
    freqs = positions[..., None].float() * inv_freq.float()  # [1, P, head_dim / 2]
    angles = torch.cat((freqs, freqs), dim=-1)
    return (angles.cos() * scaling)[0], (angles.sin() * scaling)[0]


Weight = torch.Tensor | QuantLinear


def _rms_norm(x: torch.Tensor, shape: tuple[int, ...], weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``F.rms_norm`` for torch < 2.4 (older JetPack builds), in the same ops transformers' Llama norm uses."""
    variance = x.float().pow(2).mean(-1, keepdim=True)  # [T, 1]
    return weight * (x.float() * torch.rsqrt(variance + eps)).to(x.dtype)


rms_norm = getattr(F, "rms_norm", None) or _rms_norm


def linear(x: torch.Tensor, weight: Weight, bias: torch.Tensor | None, skinny: bool) -> torch.Tensor:
    """x [T, in] @ weight [out, in].T; ``skinny``: as ``weight @ x.T``, faster for a few rows on some CPUs."""
    if isinstance(weight, QuantLinear):
        return weight(x)  # its bias included
    if skinny:
        out = (weight @ x.T).T.contiguous()  # contiguous: a transposed view pushes SDPA off its fast kernels
        return out if bias is None else out + bias
    return F.linear(x, weight, bias)


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
    wqkv: Weight  # [(heads + 2 * kv_heads) * head_dim, hidden]
    bqkv: torch.Tensor | None
    wo: Weight  # [hidden, heads * head_dim]
    bo: torch.Tensor | None
    mlp_norm: torch.Tensor  # [hidden]
    w13: Weight  # [2 * intermediate, hidden]: gate, then up
    w2: Weight  # [hidden, intermediate]

    @property
    def num_bytes(self) -> int:
        tensors = [self.attn_norm, self.mlp_norm, self.bqkv, self.bo]
        weights = [self.wqkv, self.wo, self.w13, self.w2]
        return sum(t.numel() * t.element_size() for t in tensors if t is not None) + sum(
            w.num_bytes if isinstance(w, QuantLinear) else w.numel() * w.element_size() for w in weights)


class LeanDecoder:
    """The decoder body of a Llama-family model over a ``StaticCache``: from a loaded transformers model
    (sharing its weights) or, for int4 from a GGUF file, from the file and its converted checkpoint alone."""

    def __init__(
        self,
        model: nn.Module,
        quant: str | None = None,
        int4_weights: list[dict[str, QuantLinear]] | None = None,  # a file's own 4-bit layers (``gguf_blocks``)
        head: QuantLinear | None = None,  # a file's own LM head as int8
    ):
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"no lean forward for this model: {reason}")
        body = model.base_model
        self._setup(model.config, quant, model.get_input_embeddings(), body.norm.weight.detach())
        self.model = model  # the LM head (unquantized) and generation config stay the model's own
        self.head = model.get_output_embeddings()
        if quant is None:
            self.layers = [self._layer(block) for block in body.layers]
        else:
            # Guards: the file's weights must be the model's (layer 0's q/k/v rows, a few head rows).
            first = body.layers[0].self_attn
            qkv = (first.q_proj.weight, first.k_proj.weight, first.v_proj.weight)
            if int4_weights and not (quant == "int4" and same_weight(int4_weights[0]["wqkv"], fused(*qkv))):
                logging.getLogger(__name__).warning("the file's 4-bit blocks do not match the model's weights: re-quantizing")
                int4_weights = None
            given = int4_weights or [None] * len(body.layers)
            self.layers = [self._quantized_layer(block, quant, weights) for block, weights in zip(body.layers, given)]
            if head is not None and not same_rows(head, self.head.weight):
                logging.getLogger(__name__).warning("the file's LM head does not match the model's: re-quantizing")
                head = None
            if head is None:
                head = quantize(self.head.weight, None, "int8")  # an int4 head: 88% agreement, int8: 98%
            head.bias = None if self.head.bias is None else self.head.bias.detach().clone()
            self.head = head
        # RoPE for every position, from the model's own rotary module (any rope scaling it has), on its device.
        weight = body.embed_tokens.weight
        positions = torch.arange(self.config.max_position_embeddings, device=weight.device)[None]
        with torch.no_grad():
            cos, sin = body.rotary_emb(weight[:1].float(), positions)  # [1, P, head_dim] each
        self._set_rope(cos[0], sin[0])

    @classmethod
    def from_checkpoint(
        cls,
        config,
        checkpoint: Checkpoint,  # the converted copy of the file the weights come from
        int4_weights: list[dict[str, QuantLinear]],  # the file's own 4-bit layers (``gguf_blocks``)
        head: QuantLinear,  # the file's own LM head as int8
    ) -> LeanDecoder:
        """The int4 forward with no transformers model: layers and head from the file, embeddings and norms
        mapped from ``checkpoint``. ValueError when the config needs the model (``config_reason``, a RoPE type
        ``rope_tables`` does not cover) or the file's weights fail the same guards as in ``__init__``."""
        reason = config_reason(config)
        tables = rope_tables(config)
        if reason is not None or tables is None:
            raise ValueError(f"no model-free lean forward for this model: {reason or 'its RoPE type'}")

        def optional(name: str) -> torch.Tensor | None:
            return checkpoint.tensor(name) if name in checkpoint else None

        first = [checkpoint.tensor(f"model.layers.0.self_attn.{part}_proj.weight") for part in "qkv"]
        if not same_weight(int4_weights[0]["wqkv"], fused(*first)):
            raise ValueError("the file's 4-bit blocks do not match its converted weights")
        embedding = checkpoint.tensor("model.embed_tokens.weight")
        if not same_rows(head, checkpoint.tensor("lm_head.weight") if "lm_head.weight" in checkpoint else embedding):
            raise ValueError("the file's LM head does not match its converted weights")
        self = cls.__new__(cls)
        self._setup(config, "int4", nn.Embedding.from_pretrained(embedding, freeze=True), checkpoint.tensor("model.norm.weight"))
        self.model = None
        head.bias = optional("lm_head.bias")
        self.head = head
        self.layers = []
        for index, given in enumerate(int4_weights):
            prefix = f"model.layers.{index}."
            given["wqkv"].bias = fused(*(optional(f"{prefix}self_attn.{part}_proj.bias") for part in "qkv"))
            given["wo"].bias = optional(f"{prefix}self_attn.o_proj.bias")
            given["w13"].bias = fused(optional(f"{prefix}mlp.gate_proj.bias"), optional(f"{prefix}mlp.up_proj.bias"))
            given["w2"].bias = optional(f"{prefix}mlp.down_proj.bias")
            self.layers.append(LeanLayer(
                attn_norm=checkpoint.tensor(f"{prefix}input_layernorm.weight"), wqkv=given["wqkv"], bqkv=None,
                wo=given["wo"], bo=None, mlp_norm=checkpoint.tensor(f"{prefix}post_attention_layernorm.weight"),
                w13=given["w13"], w2=given["w2"],
            ))
        self._set_rope(*tables)
        return self

    def _setup(self, config, quant: str | None, embedding: nn.Module, norm: torch.Tensor) -> None:
        """Shapes and settings shared by both builders."""
        self.config = config
        self.heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.hidden = config.hidden_size
        self.eps = config.rms_norm_eps
        self.skinny_sizes: frozenset[int] = frozenset()  # step sizes (rows) using ``weight @ x.T``: calibration's choice
        # Tree steps attend row by row (``_attention_by_row``): with row-invariant packed kernels this makes
        # greedy PPD bitwise equal to plain decoding. fp32 matmuls are not row-invariant, so there it would only cost.
        self.row_exact = quant is not None
        self.quant = quant  # None: the model's own weights (shared, no copy); "int8" / "int4": CPU kernels
        self.embedding = embedding
        self.norm = norm  # [hidden]
        self.attention = attention_plan(properties_of(norm.device))  # which SDPA calls suit this device

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

    @staticmethod
    def _quantized_layer(block: nn.Module, kind: str, given: dict[str, QuantLinear] | None) -> LeanLayer:
        """One block with int8 / int4 weights, biases folded in: ``given`` int4 weights as they are (the model's
        own weights, memory-mapped by transformers, are then never read), else quantized one layer at a time."""
        attention, mlp = block.self_attn, block.mlp
        q, k, v, o = attention.q_proj, attention.k_proj, attention.v_proj, attention.o_proj

        def weight(name: str, parts: list[nn.Linear]) -> QuantLinear:
            bias = fused(*(part.bias for part in parts))
            if given is None:
                return quantize(fused(*(part.weight for part in parts)), bias, kind)
            given[name].bias = bias
            return given[name]

        return LeanLayer(
            attn_norm=block.input_layernorm.weight.detach(),
            wqkv=weight("wqkv", [q, k, v]),
            bqkv=None,
            wo=weight("wo", [o]),
            bo=None,
            mlp_norm=block.post_attention_layernorm.weight.detach(),
            w13=weight("w13", [mlp.gate_proj, mlp.up_proj]),
            w2=weight("w2", [mlp.down_proj]),
        )

    def get_input_embeddings(self) -> nn.Module:
        return self.embedding

    def get_output_embeddings(self) -> nn.Module:
        return self.head

    @property
    def kernels(self) -> dict:
        """Which matmul kernels a step uses (recorded in benchmark results and profiles)."""
        if self.quant is not None:
            layers = {"int8": "aten._weight_int8pack_mm", "int4": "aten._weight_int4pack_mm_for_cpu, group 32"}[self.quant]
            return {"linear": f"{layers}, bf16 activations", "lm_head": "aten._weight_int8pack_mm", "compiled": False}
        sizes = ", ".join(map(str, sorted(self.skinny_sizes)))
        rows = "F.linear" + (f"; weight @ x.T for {sizes} rows" if sizes else "")
        return {"linear": rows, "lm_head": "F.linear", "compiled": False}

    @property
    def has_kernel_choice(self) -> bool:
        """Whether a step has two matmul implementations to choose between (fp32/bf16 weights)."""
        return self.quant is None

    @property
    def num_bytes(self) -> int:
        """Weights the lean forward reads: layers, final norm, LM head, and the input embedding table."""
        head = self.head.num_bytes if isinstance(self.head, QuantLinear) else self.head.weight.numel() * self.head.weight.element_size()
        embedding = self.get_input_embeddings().weight
        tied = not isinstance(self.head, QuantLinear) and self.head.weight.data_ptr() == embedding.data_ptr()
        return sum(layer.num_bytes for layer in self.layers) + self.norm.numel() * self.norm.element_size() + (
            0 if tied else head) + embedding.numel() * embedding.element_size()

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
        exact_rows: int | None = None,  # with a mask: the leading rows that must equal plain steps (None: all)
    ) -> torch.Tensor:
        """Hidden states [T, hidden] after the final norm; the T tokens' keys and values go into ``cache``.

        With ``row_exact``, the first ``exact_rows`` rows of a masked step (a tree's nodes) attend row by
        row, bitwise as plain decoding would; the rest (prompt tokens, which only guess) attend batched.
        """
        T = embeds.shape[0]
        chunk = self.attention.masked_prefill_rows
        if mask is None and cache.length > 0 and chunk and T > chunk:  # a long follow-up: its mask per chunk only
            return torch.cat([self(embeds[i : i + chunk], positions[i : i + chunk], None, cache) for i in range(0, T, chunk)])
        start, end = cache.length, cache.length + T
        cache.reserve(end)
        # a step's tree mask: row by row where that is exact; prefill (no mask) stays batched
        exact = T if exact_rows is None else exact_rows
        rows = visible_rows(mask, start, exact) if self.row_exact and mask is not None and exact else None
        causal = mask is None and T > 1 and start == 0 and self.attention.causal_prefill  # no mask at all: flash
        if mask is None and T > 1 and not causal:
            mask = torch.ones(T, end, dtype=torch.bool, device=embeds.device).tril(start)  # causal after the cache
        skinny = T in self.skinny_sizes
        cos, sin = self.cos[positions][:, None], self.sin[positions][:, None]  # [T, 1, head_dim]
        H, Hkv, D = self.heads, self.kv_heads, self.head_dim
        x = embeds
        for index, layer in enumerate(self.layers):
            h = rms_norm(x, (self.hidden,), layer.attn_norm, self.eps)
            qkv = linear(h, layer.wqkv, layer.bqkv, skinny)  # [T, (H + 2 Hkv) D]
            qk, v = qkv.split([(H + Hkv) * D, Hkv * D], dim=-1)
            qk = qk.view(T, H + Hkv, D)
            qk = qk * cos + qk.roll(D // 2, dims=-1) * sin  # RoPE on queries and keys at once
            q, k = qk.split([H, Hkv], dim=1)  # [T, H, D], [T, Hkv, D]
            k, v = k.transpose(0, 1), v.view(T, Hkv, D).transpose(0, 1)  # [Hkv, T, D] each
            if rows is None:
                keys, values = cache.write(index, start, k, v)  # [Hkv, end, D]
                attended = attend(q, keys, values, self.attention, mask, causal)  # [T, H, D]
            else:
                attended = self._attention_by_row(q, k, v, cache, index, start, rows)  # [exact, H, D]
                keys, values = cache.write(index, start, k, v)
                if exact < T:
                    rest = attend(q[exact:], keys, values, self.attention, mask[:, :, exact:])  # [T - exact, H, D]
                    attended = torch.cat([attended, rest])
            x = x + linear(attended.reshape(T, H * D), layer.wo, layer.bo, skinny)
            h = rms_norm(x, (self.hidden,), layer.mlp_norm, self.eps)
            gate, up = linear(h, layer.w13, None, skinny).chunk(2, dim=-1)  # [T, intermediate] each
            x = x + linear(F.silu(gate) * up, layer.w2, None, skinny)
        cache.length = end
        return rms_norm(x, (self.hidden,), self.norm, self.eps)

    def _attention_by_row(
        self,
        q: torch.Tensor,  # [T, H, D] (rows beyond ``rows`` are not used)
        k: torch.Tensor,  # [Hkv, T, D]
        v: torch.Tensor,  # [Hkv, T, D]
        cache: StaticCache,
        index: int,
        start: int,
        rows: list[list[int]],
    ) -> torch.Tensor:
        """Each row attends exactly as a 1-token step would: its visible rows sit right after the context.

        Row t's visible step rows (root ... itself) are written at ``start, start + 1, ...`` and one
        unmasked 1-row SDPA call runs over them and the context: the same call, on the same data
        at the same places, as plain decoding makes for that token. SDPA's result for one row
        depends on how many rows it is given, so this keeps a tree step bitwise equal to plain
        steps wherever the matmul kernels are row-invariant (the packed int8 / int4 ones are).
        Only the part of a row's sequence that differs from the previous row's is rewritten.
        """
        placed: list[int] = []  # step rows now at start, start + 1, ...
        out = []
        for t, sequence in enumerate(rows):
            same = 0
            while same < min(len(placed), len(sequence)) and placed[same] == sequence[same]:
                same += 1
            if same < len(sequence):
                changed = sequence[same:]
                cache.keys[index, :, start + same : start + len(sequence)] = k[:, changed]
                cache.values[index, :, start + same : start + len(sequence)] = v[:, changed]
            placed = sequence
            end = start + len(sequence)
            out.append(attend(q[t : t + 1], cache.keys[index, :, :end], cache.values[index, :, :end], self.attention)[0])  # [H, D]
        return torch.stack(out)  # [len(rows), H, D]


def visible_rows(mask: torch.Tensor, start: int, count: int) -> list[list[int]] | None:
    """For a step mask [1, 1, T, start + T] (additive or bool), the first ``count`` rows' visible step rows
    in order; None unless they see the whole context (only then can a row run as a plain step)."""
    seen = mask[0, 0, :count] if mask.dtype == torch.bool else mask[0, 0, :count] == 0  # [count, start + T]
    if not bool(seen[:, :start].all()):
        return None
    return [torch.nonzero(row).flatten().tolist() for row in seen[:, start:]]


def same_weight(layer: QuantLinear, weight: torch.Tensor, tolerance: float = 0.02) -> bool:
    """Whether ``layer`` stores ``weight`` [out, in] up to rounding (relative Frobenius error): guards the row order."""
    reference = weight.float()
    return bool((layer.dequantized() - reference).norm() <= tolerance * reference.norm())


def same_rows(head: QuantLinear, weight: torch.Tensor, rows: int = 16, tolerance: float = 0.02) -> bool:
    """Whether an int8 ``head`` stores ``weight`` [vocab, hidden] on a few spread rows (reads only those rows)."""
    if head.kind != "int8" or head.qweight.shape != weight.shape:
        return False
    index = torch.linspace(0, weight.shape[0] - 1, rows).long()
    stored = head.qweight[index].float() * head.scales[index].float()[:, None]
    reference = weight.detach()[index].float()
    return bool((stored - reference).norm() <= tolerance * reference.norm())


def share(fused_tensor: torch.Tensor, modules: list[nn.Module], name: str) -> None:
    """Point each module's ``name`` parameter at its slice of ``fused_tensor`` (same values, one copy in memory)."""
    offset = 0
    for module in modules:
        size = getattr(module, name).shape[0]
        setattr(module, name, nn.Parameter(fused_tensor[offset : offset + size], requires_grad=False))
        offset += size
