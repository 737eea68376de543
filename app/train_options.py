"""`ppd train`'s own options (its model options apart): read by the command and by the page's training job, which
sizes a run by them (``training_job.train_size``)."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_training_options(train: argparse.ArgumentParser) -> None:
    """Add what `ppd train` learns from and how long to ``train`` (a parser)."""
    train.add_argument("--samples", type=int, default=2000, help="conversations the model answers and trains on")
    train.add_argument("--out", type=Path, default=None, help="output prompt-token file")
    train.add_argument("--data", type=Path, default=None, help="your conversations (JSON or JSONL); default ShareGPT")
    train.add_argument("--eval-questions", type=Path, default=None, help="held-out MT-Bench style JSONL (default: the shipped MT-Bench questions)")
    train.add_argument("--eval-limit", type=int, default=20, help="held-out questions to evaluate on; 0 skips the evaluation")
    train.add_argument("--epochs", type=float, default=2.0)
    train.add_argument("--cuts", type=int, default=32, help="cuts per conversation per step")
    train.add_argument("--accumulate", type=int, default=4, help="conversations per optimizer step")
    train.add_argument("--ensemble", type=int, default=2, help="ensemble members per prompt token")
    train.add_argument("--lr", type=float, default=1e-2)
    train.add_argument("--loss", choices=("kl", "top20", "hard"), default="kl",
                       help="kl: forward KL to the model's whole distribution (default); top20: cross-entropy on its 20 "
                            "likeliest tokens; hard: cross-entropy on its own next token")
    train.add_argument("--curriculum", type=float, default=0.0, metavar="FRACTION",
                       help="train depth 1 alone for this fraction of the steps first (default 0)")
    train.add_argument("--max-prompt-tokens", type=int, default=384)
    train.add_argument("--max-new-tokens", type=int, default=192, help="length of the model's teacher answers")
    train.add_argument("--generation-batch", type=int, default=16)
    train.add_argument("--work-dir", type=Path, default=None, help="answers and checkpoints (resumed if present)")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--status", type=Path, default=None, metavar="FILE",
                       help="keep a JSON status here (phase, progress, seconds): how the chat app follows a training")
    train.add_argument("--acceptance-prompts", type=int, default=12, metavar="N",
                       help="afterwards, measure how often the new tokens' guesses are right on N calibration "
                       "conversations, with the decoding backend, and keep it beside the file (calibrations then "
                       "measure only their latency curve); 0 skips it")
    train.add_argument("--init", type=Path, default=None, help="start from this prompt-token file (e.g. distil an ensemble into --ensemble 1)")
