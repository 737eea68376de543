"""Does torch.compile (inductor, CPU) pay for the lean int4 forward? Eager vs compiled step time, compile time.

    python benchmarks/scripts/compile_trial.py [--threads 2] [--json FILE]

One transformer layer of the lean forward, written as a pure function of tensors (so one compiled
graph with dynamic shapes serves all 30 layers and every cache length), is compiled once; a
step then calls it per layer, plus the final norm and the int8 LM head. Times eager and compiled
steps of 1 / 4 / 16 rows at 256 cached tokens, interleaved, and checks they pick the same tokens.
(Compiling ``LeanDecoder.__call__`` whole breaks the graph at every cache write and recompiles per
layer index: measured slower than eager, 34.4 against 24.9 ms for one row.)
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from ppd_core.decoding import forward_hidden
from ppd_core.lean.quant import INT4_GROUP
from ppd_core.loading import load_model
from measurement import report


CONTEXT = 256


def int4_mm(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return torch.ops.aten._weight_int4pack_mm_for_cpu(x.to(torch.bfloat16), packed, INT4_GROUP, scales).float()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    decoder = load_model(quant="int4", device="cpu").decoder
    H, Hkv, D, eps, hidden = decoder.heads, decoder.kv_heads, decoder.head_dim, decoder.eps, decoder.hidden

    def layer(x, attn_norm, qkv, qkv_scales, wo, wo_scales, mlp_norm, w13, w13_scales, w2, w2_scales, cos, sin, keys, values,
              start: int, mask):
        T = x.shape[0]
        end = start + T
        h = F.rms_norm(x, (hidden,), attn_norm, eps)
        qk, v = int4_mm(h, qkv, qkv_scales).split([(H + Hkv) * D, Hkv * D], dim=-1)
        qk = qk.view(T, H + Hkv, D)
        qk = qk * cos + qk.roll(D // 2, dims=-1) * sin
        q, k = qk.split([H, Hkv], dim=1)
        keys[:, start:end] = k.transpose(0, 1)
        values[:, start:end] = v.view(T, Hkv, D).transpose(0, 1)
        attended = F.scaled_dot_product_attention(q.transpose(0, 1)[None], keys[None, :, :end], values[None, :, :end],
                                                  attn_mask=mask, enable_gqa=True)
        x = x + int4_mm(attended[0].transpose(0, 1).reshape(T, H * D), wo, wo_scales)
        h = F.rms_norm(x, (hidden,), mlp_norm, eps)
        gate, up = int4_mm(h, w13, w13_scales).chunk(2, dim=-1)
        return x + int4_mm(F.silu(gate) * up, w2, w2_scales)

    compiled = torch.compile(layer, dynamic=True)
    cache = decoder.new_cache()
    embedding = decoder.get_input_embeddings()
    forward_hidden(decoder, cache, embedding(torch.arange(CONTEXT)), torch.arange(CONTEXT), None)

    @torch.inference_mode()
    def step(fn, rows: int) -> list[int]:
        x = embedding(torch.arange(rows) + 7)
        positions = torch.arange(CONTEXT, CONTEXT + rows)
        mask = torch.ones(rows, CONTEXT + rows, dtype=torch.bool).tril(CONTEXT)[None, None] if rows > 1 else None
        cos, sin = decoder.cos[positions][:, None], decoder.sin[positions][:, None]
        for index, L in enumerate(decoder.layers):
            x = fn(x, L.attn_norm, L.wqkv.qweight, L.wqkv.scales, L.wo.qweight, L.wo.scales, L.mlp_norm, L.w13.qweight,
                   L.w13.scales, L.w2.qweight, L.w2.scales, cos, sin, cache.keys[index], cache.values[index], CONTEXT, mask)
        return decoder.head(F.rms_norm(x, (hidden,), decoder.norm, eps)).argmax(-1).tolist()

    def median_ms(fn, rows: int, repeats: int = 20) -> float:
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            step(fn, rows)
            times.append((time.perf_counter() - start) * 1000)
        return statistics.median(times[3:])

    result = {"quant": "int4", "threads": torch.get_num_threads(), "torch": torch.__version__, "rows": {}}
    for rows in (1, 4, 16):
        start = time.perf_counter()
        step(compiled, rows)  # compiles (or reuses the dynamic graph)
        compile_s = time.perf_counter() - start
        eager_ms = [median_ms(layer, rows) for _ in range(3)]
        compiled_ms = [median_ms(compiled, rows) for _ in range(3)]
        result["rows"][rows] = {"eager_ms": round(min(eager_ms), 2), "compiled_ms": round(min(compiled_ms), 2),
                                "first_call_s": round(compile_s, 1), "same_tokens": step(layer, rows) == step(compiled, rows)}
    report(result, args.json)


if __name__ == "__main__":
    main()
