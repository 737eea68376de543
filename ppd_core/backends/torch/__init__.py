"""The torch wing: Hugging Face models (and a GGUF, de-quantized, on request) decoded by torch (decoder, cache,
loading, the lean forward, device probes). The only ppd_core package that imports torch and transformers (with
training)."""
