"""Match classes: a copied chain's or a suffix match's length, in the classes the drafters learn by and say."""

from __future__ import annotations

MATCH_CLASSES = (1, 2, 3, 4, 8, 16)  # the shortest match length of each class: 1, 2, 3, 4-7, 8-15, 16+


def match_class(length: int) -> int:
    """The index in ``MATCH_CLASSES`` of a match of ``length`` >= 1 tokens."""
    return next(i for i in range(len(MATCH_CLASSES) - 1, -1, -1) if length >= MATCH_CLASSES[i])


def class_label(index: int) -> str:
    """"4-7", "16+": the match lengths of a class."""
    low = MATCH_CLASSES[index]
    if index + 1 == len(MATCH_CLASSES):
        return f"{low}+"
    high = MATCH_CLASSES[index + 1] - 1
    return str(low) if high == low else f"{low}-{high}"
