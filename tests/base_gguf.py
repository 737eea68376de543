"""A tiny base GGUF (no chat template) that writes a chat marker as text, as a base model does when chats reach it as
ChatML: "Hello from Paris.<assistant>" over and over, whatever it is asked.

Its layers add nothing to the residual stream (their output matrices are zero), so each logit reads only the last
token's embedding: a bigram model. Every token's embedding is random but for a constant first dimension; the output row
of each answer token after the first holds the embedding of the token before it (the chain), and the first answer
token's output row reads the constant dimension (the default next token, for any token off the chain: the prompt's).
On a 256-wide embedding the chain's logit is about twice the default's and a random overlap's is a fraction of either,
so greedy decoding writes the chain exactly, on any backend.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tiny_gguf import CONTEXT, FFN, HEAD_SIZE, HEADS, HIDDEN, KV_HEADS, LAYERS, Vocabulary, add_vocabulary

ANSWER = ("Hello", "Ġfrom", "ĠParis", ".", "<", "ass", "istant", ">")  # byte-level BPE pieces: "Hello from Paris.<assistant>"
SHOWN = "Hello from Paris."  # what the answer is, the marker cut


def write_base_gguf(path: Path, vocabulary: Vocabulary, seed: int = 0) -> Path:
    """The base model at ``path``, with the default model's vocabulary (the chain's pieces must be its tokens)."""
    from gguf import GGUFWriter, LlamaFileType  # noqa: PLC0415

    index = {token: number for number, token in enumerate(vocabulary.tokens)}
    chain = [index[piece] for piece in ANSWER]
    generator = np.random.default_rng(seed)
    vocab = len(vocabulary.tokens)
    embedding = generator.standard_normal((vocab, HIDDEN), dtype=np.float32)
    embedding[:, 0] = 1.0  # the constant dimension: after the norm, a bias every token shares
    output = np.zeros((vocab, HIDDEN), dtype=np.float32)
    output[chain[0], 0] = HIDDEN / 2  # the default next token
    for before, after in zip(chain, chain[1:]):
        output[after, 1:] = embedding[before, 1:]  # the chain: about HIDDEN against a random overlap's ~16
    scale = 1.0 / 16  # logits of about 16 and 8: greedy and sampling alike follow the chain
    writer = GGUFWriter(path, "llama")
    writer.add_name("tiny base model")
    for add, value in ((writer.add_context_length, CONTEXT), (writer.add_embedding_length, HIDDEN),
                       (writer.add_feed_forward_length, FFN), (writer.add_block_count, LAYERS),
                       (writer.add_head_count, HEADS), (writer.add_head_count_kv, KV_HEADS),
                       (writer.add_key_length, HEAD_SIZE), (writer.add_value_length, HEAD_SIZE),
                       (writer.add_rope_dimension_count, HEAD_SIZE), (writer.add_rope_freq_base, 10000.0),
                       (writer.add_layer_norm_rms_eps, 1e-5)):
        add(value)
    writer.add_file_type(LlamaFileType.MOSTLY_F16)
    add_vocabulary(writer, vocabulary, vocabulary.tokens, vocabulary.token_types, chat_template=False)
    writer.add_tensor("token_embd.weight", embedding.astype(np.float16))
    writer.add_tensor("output_norm.weight", np.ones(HIDDEN, dtype=np.float32))
    writer.add_tensor("output.weight", (output * scale).astype(np.float16))
    q_size, kv_size = HEADS * HEAD_SIZE, KV_HEADS * HEAD_SIZE
    for layer in range(LAYERS):
        block = f"blk.{layer}"
        weights = {"attn_q": (q_size, HIDDEN), "attn_k": (kv_size, HIDDEN), "attn_v": (kv_size, HIDDEN),
                   "ffn_gate": (FFN, HIDDEN), "ffn_up": (FFN, HIDDEN)}
        for name, shape in weights.items():
            writer.add_tensor(f"{block}.{name}.weight", (generator.standard_normal(shape) * 0.08).astype(np.float16))
        writer.add_tensor(f"{block}.attn_norm.weight", np.ones(HIDDEN, dtype=np.float32))
        writer.add_tensor(f"{block}.ffn_norm.weight", np.ones(HIDDEN, dtype=np.float32))
        writer.add_tensor(f"{block}.attn_output.weight", np.zeros((HIDDEN, q_size), dtype=np.float16))  # adds nothing
        writer.add_tensor(f"{block}.ffn_down.weight", np.zeros((HIDDEN, FFN), dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
