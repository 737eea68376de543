"""The llama.cpp wing: GGUF files decoded by llama.cpp (decoder, rows, metadata and text, loading, quantize,
perplexity). No torch here."""
