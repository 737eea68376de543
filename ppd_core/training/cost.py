"""What a `ppd train` run will cost before it starts: its size, its time at this device's measured speed, its memory
and its disk. No torch here: the chat page asks before a training starts.

The time is the run's forward rows priced by a measured step cost of the model on this device (``StepCost``: its
calibration's latency curve, or its last answer's steps and prompt processing), fitted as a line over rows:

* answers: ``ceil(samples / generation_batch) x max_new_tokens`` steps of ``generation_batch`` rows each (a batch
  runs until its longest answer ends), the held-out questions likewise;
* training: ``samples x epochs`` passes, each a teacher forward over a typical conversation (half the prompt limit
  plus the answer limit) and the student's ``cuts x prompt tokens x ensemble`` rows, forward and backward (about 2
  forwards: the weights are frozen, so the backward computes no weight gradients);
* the acceptance measurement: ``acceptance_prompts x max_new_tokens`` 1-row steps.

The chat decodes on its own backend while training runs the model through transformers, so this is an estimate of
the right size, not a promise: the page shows the training's own rate once it runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

PROMPT_TOKENS = 3  # prompt tokens a training learns (``TrainConfig.num_prompt_tokens``; tests/test_training_cost.py)
BACKWARD = 2  # a forward and its backward: the weights are frozen, so no weight gradients (about one forward)
FLOAT32 = 4
MIN_PREFILL_ROWS = 16  # an answer's prompt processing this long at least times many rows at once
ANSWER_ID_BYTES = 7  # an answer cache's token id as JSON text ("12345, "), about


@dataclass(frozen=True)
class TrainSize:
    """The `ppd train` options that set a run's size (its defaults are ``ppd train``'s)."""

    samples: int = 2000
    epochs: float = 2.0
    cuts: int = 32
    ensemble: int = 2
    max_prompt_tokens: int = 384
    max_new_tokens: int = 192
    generation_batch: int = 16
    eval_limit: int = 20
    acceptance_prompts: int = 12

    @property
    def conversation_tokens(self) -> int:
        """A typical conversation's length in the answer cache: half the prompt limit plus the answer limit."""
        return self.max_prompt_tokens // 2 + self.max_new_tokens


@dataclass(frozen=True)
class ModelShape:
    """What the cost reads of a model: its parameters and the sizes of its KV cache and logits."""

    parameters: int
    vocab_size: int
    hidden_size: int
    layers: int
    heads: int
    kv_heads: int
    gguf: bool  # training first makes (and keeps on disk) a float32 copy of a GGUF's weights


@dataclass(frozen=True)
class StepCost:
    """A measured step cost of the model on this device: milliseconds against rows, and where it was measured."""

    points: dict[int, float]  # rows -> ms
    source: str  # "its calibration", "its last answer"

    def ms(self, rows: int) -> float:
        """A step of ``rows`` rows: the least-squares line through the points, never below the cheapest point."""
        sizes = sorted(self.points)
        if len(sizes) == 1:
            return self.points[sizes[0]] * rows / sizes[0]
        mean_x = sum(sizes) / len(sizes)
        mean_y = sum(self.points[s] for s in sizes) / len(sizes)
        spread = sum((s - mean_x) ** 2 for s in sizes)
        slope = max(0.0, sum((s - mean_x) * (self.points[s] - mean_y) for s in sizes) / spread)
        return max(min(self.points.values()), mean_y + slope * (rows - mean_x))


@dataclass(frozen=True)
class TrainingCost:
    conversations: int
    seconds: float | None  # None: no measurement of this model's speed on this device yet
    memory_bytes: int
    disk_bytes: int
    source: str  # where the speed was measured ("" without one)


def training_seconds(size: TrainSize, step: StepCost) -> float:
    """The run's time at ``step``'s measured cost (the module's docstring says how it is counted)."""
    batches = math.ceil(size.samples / size.generation_batch) + math.ceil(size.eval_limit / size.generation_batch)
    answers = batches * size.max_new_tokens * step.ms(size.generation_batch)
    student_rows = size.cuts * PROMPT_TOKENS * size.ensemble
    pass_ms = step.ms(size.conversation_tokens) + BACKWARD * step.ms(student_rows)
    training = size.samples * size.epochs * pass_ms
    acceptance = size.acceptance_prompts * size.max_new_tokens * step.ms(1)
    return (answers + training + acceptance) / 1000


def training_memory(size: TrainSize, shape: ModelShape) -> int:
    """Bytes the trainer holds at its peak: the float32 weights, and the larger of the answers' KV cache and a
    training pass's logits (the teacher's, the student's and their gradient)."""
    weights = shape.parameters * FLOAT32
    head = shape.hidden_size // max(shape.heads, 1)
    kv = (size.generation_batch * (size.max_prompt_tokens + size.max_new_tokens) * shape.layers * 2
          * shape.kv_heads * head * FLOAT32)
    logits = (size.conversation_tokens + size.cuts * PROMPT_TOKENS * size.ensemble) * shape.vocab_size * FLOAT32 * 3
    return weights + max(kv, logits)


def training_disk(size: TrainSize, shape: ModelShape) -> int:
    """Bytes written: the answer cache, and a GGUF's float32 copy (kept for later trainings)."""
    answers = (size.samples + size.eval_limit) * size.conversation_tokens * ANSWER_ID_BYTES
    return answers + (shape.parameters * FLOAT32 if shape.gguf else 0)


def training_cost(size: TrainSize, shape: ModelShape, step: StepCost | None) -> TrainingCost:
    """A `ppd train` run of ``size`` on a model of ``shape``; its time where ``step`` measured the model here."""
    return TrainingCost(size.samples, training_seconds(size, step) if step is not None else None,
                        training_memory(size, shape), training_disk(size, shape), step.source if step else "")


def calibrated_step(profile, size: TrainSize) -> StepCost | None:
    """The step cost a calibration profile measured (``DeviceProfile.latency_ms``), at the context length nearest a
    training conversation's; None without one."""
    curves = getattr(profile, "latency_ms", None) or {}
    if not curves:
        return None
    context = min(curves, key=lambda length: abs(length - size.conversation_tokens))
    points = {int(rows): float(ms) for rows, ms in curves[context].items() if ms > 0}
    return StepCost(points, "its calibration") if points else None


def answered_step(stats) -> StepCost | None:
    """The step cost an answer's ``GenerationStats`` measured: its prompt processing (many rows at once) and its mean
    step (taken as one row: a tree step's extra rows make it an upper bound); None where its prompt processing had
    fewer than ``MIN_PREFILL_ROWS`` new rows (a step alone says nothing of what many rows at once cost)."""
    rows = stats.prompt_tokens - stats.reused_tokens if stats is not None else 0
    if rows < MIN_PREFILL_ROWS or stats.prefill_seconds <= 0:
        return None
    points = {rows: stats.prefill_seconds * 1000}
    if stats.steps and stats.decode_seconds > 0:
        points[1] = stats.decode_seconds * 1000 / stats.steps
    return StepCost(points, "its last answer")


def model_shape(loaded) -> ModelShape:
    """``loaded``'s (a ``LoadedModel``) parameters and sizes, from its config and its weights."""
    config = loaded.config
    heads = _most(config.num_attention_heads)
    kv_heads = _most(getattr(config, "num_key_value_heads", None) or heads)
    if loaded.gguf_file is not None and loaded.quant == "gguf":
        from ppd_core.backends.llamacpp.info import read_gguf_info

        kv_heads = _most(read_gguf_info(loaded.gguf_file).head_count_kv) or kv_heads
        decoder = loaded.backend  # ``LlamaCppDecoder``: llama.cpp counts the weights
        parameters = decoder.llama.llama_model_n_params(decoder.model)
    else:
        parameters = sum(p.numel() for p in loaded.model.parameters())
    return ModelShape(int(parameters), int(config.vocab_size), int(config.hidden_size), int(config.num_hidden_layers),
                      heads, kv_heads, gguf=loaded.gguf_file is not None)


def _most(value) -> int:
    """A per-layer count's largest (a GGUF can give one per layer)."""
    return int(max(value)) if isinstance(value, (tuple, list)) else int(value or 0)
