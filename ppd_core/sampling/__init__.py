"""Sampling: its settings and defaults (``params``, plain data the command line reads before any model), llama.cpp's
repetition penalties (``penalties``), a step's logits and log-probabilities (``logits``), and verification of a
step's guesses (``verify``)."""
