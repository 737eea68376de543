"""Bounds a GBNF grammar must keep before llama.cpp's parser sees it: that parser is the oracle for what is valid, not a
sandbox. An inverted repetition (``"a"{5,1}``) made it generate 2**64 rules, allocating until the process aborted; a
long item repeated a thousand times is copied a thousand times; thousands of alternatives cost minutes per token;
a token id past the vocabulary (``<[99999999]>``)
compiles but never matches. ``gbnf_problem`` reads the text once, in linear time, and says what is wrong in one line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_REPEAT = 1000  # a repetition's bound (llama.cpp refuses a least count over 2000 and reads a larger most as none)
MAX_ELEMENTS = 1_000_000  # grammar elements the repetitions may spell out (about 8 bytes each in llama.cpp)
# alternatives (``|``): each may be a stack llama.cpp matches every token of the vocabulary against; 5,000 of them
# (an enum) took minutes per token
MAX_ALTERNATIVES = 1000

PIECE = re.compile(r"""
    (?P<space>\s+|\#[^\n]*)
  | (?P<literal>"(?:\\.|[^"\\])*")
  | (?P<chars>\[(?:\\.|[^\]\\])*\])
  | (?P<token>!?<\[(?P<id>\d+)\]>|!?<[^>]*>)
  | (?P<name>[A-Za-z0-9_-]+)
  | (?P<repeat>\{\s*(?P<least>\d+)\s*(?P<comma>,\s*(?P<most>\d*)\s*)?\})
  | (?P<quantifier>[*+?])
  | (?P<other>.)
""", re.VERBOSE | re.DOTALL)
QUANTIFIERS = {"*": (0, None), "+": (1, None), "?": (0, 1)}  # as least and most counts (None: no most)


@dataclass
class Spelled:
    """What the scan has seen: the elements repetitions spell out, and the size of the item a repetition would copy."""

    elements: int = 0
    item: int = 1


def repeat_problem(least: int, most: int | None, shown: str) -> str | None:
    if least > MAX_REPEAT or (most is not None and most > MAX_REPEAT):
        return f"the grammar's repetition {shown} is over {MAX_REPEAT}, the most an item may repeat"
    if most is not None and most < least:
        return f"the grammar's repetition {shown} has its most below its least"
    return None


def spell(state: Spelled, least: int, most: int | None) -> None:
    """Count what llama.cpp writes for the item repeated ``least`` to ``most`` times: ``least`` copies of it and one
    rule (a copy and three elements) per optional one."""
    optional = 1 if most is None else most - least
    state.elements += state.item * (least + optional) + 3 * optional
    state.item = state.item * max(least, 1) + 1  # a chained repetition repeats all of it


def gbnf_problem(text: str, vocab_size: int) -> str | None:
    """What keeps llama.cpp from taking GBNF ``text`` safely on a vocabulary of ``vocab_size`` tokens, or None."""
    state, alternatives = Spelled(), 0
    for piece in PIECE.finditer(text):
        kind = piece.lastgroup  # the outermost group: it closes last
        if kind == "space":
            continue
        if kind == "repeat":
            least = int(piece.group("least"))
            most = least if piece.group("comma") is None else int(piece.group("most")) if piece.group("most") else None
            if problem := repeat_problem(least, most, piece.group("repeat")):
                return problem
            spell(state, least, most)
        elif kind == "quantifier":
            spell(state, *QUANTIFIERS[piece.group()])
        elif kind == "token" and piece.group("id") is not None and int(piece.group("id")) >= vocab_size:
            return (f"the grammar's token id {piece.group('id')} is beyond this model's vocabulary of {vocab_size} "
                    "tokens")
        else:
            state.item = max(len(piece.group()) - 2, 1) if kind in ("literal", "chars") else 1
            alternatives += piece.group() == "|"
            if alternatives > MAX_ALTERNATIVES:
                return f"the grammar has more than {MAX_ALTERNATIVES} alternatives (|): too costly to follow"
        if state.elements > MAX_ELEMENTS:
            return f"the grammar's repetitions spell out more than {MAX_ELEMENTS:,} elements"
    return None
