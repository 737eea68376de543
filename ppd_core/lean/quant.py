"""Weight-only int8 / int4 linear layers for CPUs, on torch's own packed kernels (bf16 activations).

int8: per output channel, symmetric, ``aten._weight_int8pack_mm``.
int4: groups of 32 along the input, asymmetric (w = (q - 8) * scale + zero, zero = min + 8 * scale,
as in gpt-fast), ``aten._weight_int4pack_mm_for_cpu``. A GGUF Q4_1 block (w = d * q + m over 32
weights) is exactly this format with scale d and zero m + 8d: ``int4_from_levels`` takes such
blocks as they are (see ``gguf_blocks.py``), and ``quantize`` finds the same levels again in
weights de-quantized from Q4_1 wherever a block uses its lowest and highest level.
Scales are rounded to bf16 before the levels are chosen, so each weight is rounded to the grid
the kernel actually uses (error at most half a step).

Measured on the 2-core AMD EPYC (all linear layers of SmolLM2-135M plus its LM head, ms for
1 / 4 / 16 rows): fp32 53 / 83 / 91, int8 16 / 18 / 55, int4 6.0 / 10.4 / 36.
"""

from __future__ import annotations

import torch
from torch import nn

INT4_GROUP = 32
QUANT_KINDS = ("int8", "int4")


class QuantLinear(nn.Module):
    """y = x @ W.T (+ bias) with W stored as int8 or int4; x and y keep their dtype, the kernel runs in bf16."""

    def __init__(self, kind: str, qweight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None, in_features: int):
        super().__init__()
        self.kind = kind
        self.qweight = qweight  # int8 [out, in], or int4 packed by ``_convert_weight_to_int4pack_for_cpu``
        self.scales = scales  # int8: bf16 [out]; int4: bf16 [in / 32, out, 2] (scale, zero)
        self.bias = bias
        self.in_features = in_features
        self.out_features = scales.shape[0] if kind == "int8" else scales.shape[1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        rows = x.reshape(-1, self.in_features).to(torch.bfloat16)  # [T, in]
        if self.kind == "int8":
            out = torch.ops.aten._weight_int8pack_mm(rows, self.qweight, self.scales)
        else:
            out = torch.ops.aten._weight_int4pack_mm_for_cpu(rows, self.qweight, INT4_GROUP, self.scales)
        out = out.to(x.dtype)  # [T, out]
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*shape[:-1], self.out_features)

    def dequantized(self) -> torch.Tensor:
        """The weight [out, in] in float32, as the kernel sees it (for tests and error bounds)."""
        eye = torch.eye(self.in_features)
        bias, self.bias = self.bias, None
        try:
            return self.forward(eye).T.float().contiguous()  # bf16 products of exact 1s: the stored levels x scales
        finally:
            self.bias = bias

    @property
    def num_bytes(self) -> int:
        tensors = (self.qweight, self.scales) + ((self.bias,) if self.bias is not None else ())
        return sum(t.numel() * t.element_size() for t in tensors)


def _bias(bias: torch.Tensor | None) -> torch.Tensor | None:
    return None if bias is None else bias.detach().clone()


def quantize(weight: torch.Tensor, bias: torch.Tensor | None, kind: str) -> QuantLinear:
    """Round a float weight [out, in] to int8 (per channel) or int4 (per group of 32)."""
    if kind not in QUANT_KINDS:
        raise ValueError(f"unknown weight quantization {kind!r}")
    weight = weight.detach().float()
    out_features, in_features = weight.shape
    if kind == "int8":
        scales = (weight.abs().amax(1) / 127).clamp_min(1e-12).to(torch.bfloat16)  # [out]
        levels = torch.round(weight / scales.float()[:, None]).clamp(-128, 127).to(torch.int8)  # [out, in]
        return QuantLinear("int8", levels, scales, _bias(bias), in_features)
    if in_features % INT4_GROUP:
        raise ValueError(f"int4 needs input sizes divisible by {INT4_GROUP}, got {in_features}")
    groups = weight.view(out_features, -1, INT4_GROUP)  # [out, in / 32, 32]
    low, high = groups.amin(-1), groups.amax(-1)  # [out, in / 32]
    scale = ((high - low) / 15).clamp_min(1e-12).to(torch.bfloat16).float()
    zero = (low + 8 * scale).to(torch.bfloat16).float()
    levels = torch.round((groups - (zero - 8 * scale)[..., None]) / scale[..., None]).clamp(0, 15)
    return int4_from_levels(levels.view(out_features, in_features), scale, zero, bias)


def int4_from_levels(
    levels: torch.Tensor,  # [out, in] integers in 0..15
    scale: torch.Tensor,  # [out, in / 32]
    zero: torch.Tensor,  # [out, in / 32]: the value of level 8
    bias: torch.Tensor | None = None,
) -> QuantLinear:
    """An int4 layer from levels and group scales as they are (w = (q - 8) * scale + zero)."""
    out_features, in_features = levels.shape
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(levels.to(torch.int32).contiguous(), 1)
    scales = torch.stack([scale.float(), zero.float()], -1).transpose(0, 1).contiguous().to(torch.bfloat16)  # [in / 32, out, 2]
    return QuantLinear("int4", packed, scales, _bias(bias), in_features)
