"""Weight-only int8 / int4 linear layers for CPUs, on torch's own packed kernels (bf16 activations).

int8: per output channel, symmetric, ``aten._weight_int8pack_mm``.
int4: groups of 32 along the input, asymmetric (w = (q - 8) * scale + zero, zero = min + 8 * scale,
as in gpt-fast), ``aten._weight_int4pack_mm_for_cpu``. A GGUF Q4_1 block (w = d * q + m over 32
weights) is exactly this format with scale d and zero m + 8d, so quantizing the weights that
transformers de-quantized from Q4_1 finds the file's own levels again wherever a block uses its
lowest and highest level.

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

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, kind: str):
        super().__init__()
        if kind not in QUANT_KINDS:
            raise ValueError(f"unknown weight quantization {kind!r}")
        self.kind = kind
        self.out_features, self.in_features = weight.shape
        self.bias = None if bias is None else bias.detach().clone()
        weight = weight.detach().float()
        if kind == "int8":
            self.scales = (weight.abs().amax(1) / 127).clamp_min(1e-12)  # [out]
            self.qweight = torch.round(weight / self.scales[:, None]).clamp(-128, 127).to(torch.int8)  # [out, in]
            self.scales = self.scales.to(torch.bfloat16)
        else:
            if self.in_features % INT4_GROUP:
                raise ValueError(f"int4 needs input sizes divisible by {INT4_GROUP}, got {self.in_features}")
            groups = weight.view(self.out_features, -1, INT4_GROUP)  # [out, in / 32, 32]
            low, high = groups.amin(-1), groups.amax(-1)  # [out, in / 32]
            scale = ((high - low) / 15).clamp_min(1e-12)
            levels = torch.round((groups - low[..., None]) / scale[..., None]).clamp(0, 15).to(torch.int32)
            self.qweight = torch.ops.aten._convert_weight_to_int4pack_for_cpu(levels.view(self.out_features, -1), 1)
            zero = low + 8 * scale
            self.scales = torch.stack([scale, zero], -1).transpose(0, 1).contiguous().to(torch.bfloat16)  # [in / 32, out, 2]

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
        return sum(t.numel() * t.element_size() for t in (self.qweight, self.scales) + ((self.bias,) if self.bias is not None else ()))
