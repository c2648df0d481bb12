"""English swap rules: "her" is a possessive ("her bag" -> "his bag") before the word it determines, else an
object ("with her" -> "with him"). English has no agreement to make."""
from __future__ import annotations

from .lexicon import Row, SwapList, Token

#: words that do not start the noun phrase a possessive determines: after "her" they make it an object
NOT_A_NOUN_PHRASE = frozenset(
    "a an the and or but to as while with without in on at up down out off back for from into onto over under "
    "through near behind beside by around across along is are was were has have had who that which while "
    "when where after before".split())


def choose(toks: list[Token], i: int, candidates: list[tuple[Row, int]], swap_list: SwapList) -> tuple[Row, int]:
    """The counterpart of ``toks[i]`` among ``candidates``: for "her", "his" when a word of its noun phrase
    follows, else "him"; otherwise the first row's."""
    if len(candidates) > 1 and toks[i].text.lower() == "her":
        follows = toks[i + 1].text.lower() if i + 1 < len(toks) else ""
        possessive = follows.isalpha() and follows not in NOT_A_NOUN_PHRASE
        for row, side in candidates:
            if (row.forms[1 - side].word.lower() == "his") == possessive:
                return row, side
    return candidates[0]
