"""German swap rules: articles and adjectives that agree with a swapped noun, and the words that also mean
something outside the groups.

A noun phrase is read leftwards from its noun: adjectives (lower-case words with a declension ending), then
a determiner (der/die/das..., ein/eine..., kein..., or a preposition fused with the article: im, zum, zur...).
Its case is what the determiner and the noun's tag allow; where several remain (die Frau: nominative or
accusative), a preposition before the phrase decides (dative after mit, von, bei, ... and, in captions of
where things are, after in, auf, an, neben, ...; accusative after für, durch, gegen, ohne, um), else a phrase
that starts the sentence or follows "und" / "oder" / a comma is the subject (nominative) and any other an
object (accusative). The swapped noun's determiner and adjectives are then declined for its gender in that
case: weak endings after der-words, mixed after ein-words, strong without a determiner.

"sie" and the ihr- possessives also mean "they" / "their" (and "Sie" inside a sentence is the polite "you"):
they become er / sein- only in a sentence with a singular noun of that group and no plural one.
"""
from __future__ import annotations

from .lexicon import CASES, Edit, Form, Row, SwapList, Token

DEFINITE = {"m": ("der", "den", "dem", "des"), "f": ("die", "die", "der", "der"),
            "n": ("das", "das", "dem", "des"), "pl": ("die", "die", "den", "der")}
INDEFINITE = {"m": ("ein", "einen", "einem", "eines"), "f": ("eine", "eine", "einer", "einer"),
              "n": ("ein", "ein", "einem", "eines")}
NEGATIVE = {tag: tuple("k" + form for form in forms) for tag, forms in INDEFINITE.items()}
NEGATIVE["pl"] = ("keine", "keine", "keinen", "keiner")
WEAK = {"m": ("e", "en", "en", "en"), "f": ("e", "e", "en", "en"), "n": ("e", "e", "en", "en"),
        "pl": ("en", "en", "en", "en")}
MIXED = {"m": ("er", "en", "en", "en"), "f": ("e", "e", "en", "en"), "n": ("es", "es", "en", "en"),
         "pl": ("en", "en", "en", "en")}
STRONG = {"m": ("er", "en", "em", "en"), "f": ("e", "e", "er", "er"), "n": ("es", "es", "em", "en"),
          "pl": ("e", "e", "en", "er")}
FUSED = {"im": ("in", "dem"), "am": ("an", "dem"), "zum": ("zu", "dem"), "zur": ("zu", "der"), "vom": ("von", "dem"),
         "beim": ("bei", "dem"), "ins": ("in", "das"), "ans": ("an", "das")}
FUSE = {parts: fused for fused, parts in FUSED.items()}
DATIVE_AFTER = frozenset("mit von bei zu aus nach seit gegenüber in auf an neben unter über vor hinter zwischen"
                         .split())
ACCUSATIVE_AFTER = frozenset("für durch gegen ohne um".split())
SUBJECT_AFTER = frozenset(["und", "oder", ",", "während", "weil", "als", "wenn", "dass", "ob", "obwohl", "da", "bevor",
                           "nachdem", "wo", "wie", "aber", "denn", "sondern"])
ENDINGS = ("em", "en", "er", "es", "e")
POSSESSIVE_STEMS = ("mein", "dein", "sein", "ihr", "unser", "euer")
AMBIGUOUS = frozenset(["sie", "ihr", "ihre", "ihren", "ihrem", "ihrer", "ihres"])


def choose(toks: list[Token], i: int, candidates: list[tuple[Row, int]], swap_list: SwapList) -> tuple[Row, int] | None:
    """The counterpart of ``toks[i]``: None for a word that here means something outside the groups; for a noun,
    the row whose form fits its determiner and the case of its phrase; else the first row."""
    word = toks[i].text
    if i == 0 and len(toks) > 1 and toks[1].text[:1].isupper() and toks[1].text.isalpha():
        return None  # "Junge Erwachsene": a capitalized adjective opening the sentence, not a noun
    if word == "Sie" and i > 0 or word.lower() in AMBIGUOUS and not _singular_group(toks, swap_list, candidates[0][1]):
        return None
    tagged = [(row, side) for row, side in candidates if row.forms[side].tag]
    if not tagged:
        return candidates[0]
    fitting = [(row, side) for row, side in tagged if _readings(toks, i, row.forms[side])]
    if not fitting:
        return candidates[0]
    case = _case(toks, i, fitting[0][0].forms[fitting[0][1]])
    for row, side in fitting:
        if row.forms[1 - side].allows(case) and case in _readings(toks, i, row.forms[side]):
            return row, side
    return fitting[0]


def agreement(toks: list[Token], i: int, old: Form, new: Form) -> list[Edit]:
    """The edits that make the determiner and adjectives before ``toks[i]`` agree with ``new`` (the noun that
    replaces ``old``); none where the gender stays or the case cannot be read."""
    if old.tag == new.tag or old.tag is None or new.tag is None:
        return []
    case = _case(toks, i, old)
    if case is None:
        return []
    c = CASES.index(case)
    det, adjectives = _phrase(toks, i)
    edits = []
    table = STRONG
    if det is not None:
        word = toks[det].text.lower()
        article_table = _article_table(word)
        if article_table is not None:
            table = WEAK if article_table is DEFINITE else MIXED  # ein-words: mixed
            replacement = article_table.get(new.tag, (None,) * 4)[c]
            if replacement is not None:
                edits.extend(_article_edits(toks, det, word, replacement))
        elif word in FUSED:
            table = WEAK
            preposition, _ = FUSED[word]
            article = DEFINITE[new.tag][c]
            edits.append(_edit(toks[det], FUSE.get((preposition, article), f"{preposition} {article}")))
    for j in adjectives:
        ending = table[old.tag][c]
        if toks[j].text.endswith(ending):
            edits.append(_edit(toks[j], toks[j].text[: -len(ending)] + table[new.tag][c]))
    return [edit for edit in edits if edit.new != edit.old]


def _article_edits(toks: list[Token], det: int, word: str, replacement: str) -> list[Edit]:
    """The determiner replaced; a preposition and a definite article that fuse are written fused ("bei der
    Frau" -> "beim Mann")."""
    if det > 0 and (toks[det - 1].text.lower(), replacement) in FUSE:
        before = toks[det - 1]
        fused = FUSE[(before.text.lower(), replacement)]
        fused = fused[:1].upper() + fused[1:] if before.text[:1].isupper() else fused
        return [Edit(before.start, toks[det].end, f"{before.text} {toks[det].text}", fused, None)]
    return [_edit(toks[det], replacement)]


def _edit(tok: Token, word: str) -> Edit:
    word = word[:1].upper() + word[1:] if tok.text[:1].isupper() else word
    return Edit(tok.start, tok.end, tok.text, word, None)


def _article_table(word: str) -> dict | None:
    """The declension table of a determiner: DEFINITE, INDEFINITE, NEGATIVE or a possessive's (declined as
    ein: sein, seine, seinen ...); None for another word."""
    for table in (DEFINITE, INDEFINITE, NEGATIVE):
        if any(word in forms for forms in table.values()):
            return table
    for stem in POSSESSIVE_STEMS:
        if word.startswith(stem) and word[len(stem):] in ("", "e", "en", "em", "er", "es"):
            return {tag: tuple(stem + form[len("kein"):] for form in forms) for tag, forms in NEGATIVE.items()}
    return None


def _phrase(toks: list[Token], i: int) -> tuple[int | None, list[int]]:
    """(index of the determiner or None, indices of the adjectives) of the noun phrase ending at ``toks[i]``."""
    j, adjectives = i - 1, []
    while j >= 0 and len(adjectives) < 3:
        if toks[j].text in (",", "und") and adjectives and j > 0 and _adjective(toks[j - 1].text):
            j -= 1  # "ein älterer, übergewichtiger Mann"
        elif _adjective(toks[j].text):
            adjectives.append(j)
            j -= 1
        else:
            break
    if j >= 0 and (_article_table(toks[j].text.lower()) is not None or toks[j].text.lower() in FUSED):
        return j, adjectives
    return None, adjectives


def _adjective(word: str) -> bool:
    return word.isalpha() and word.islower() and word.endswith(ENDINGS) and _article_table(word) is None \
        and word not in FUSED and word not in SUBJECT_AFTER


def _readings(toks: list[Token], i: int, form: Form) -> set[str]:
    """The cases the noun ``toks[i]`` (as ``form``) can be in, given its determiner."""
    cases = {case for case in CASES if form.allows(case)}
    det, adjectives = _phrase(toks, i)
    if det is None or form.tag is None:
        return cases
    word = toks[det].text.lower()
    if word in FUSED:
        return cases & {"dat"} if form.tag != "pl" or FUSED[word][1] == "den" else set()
    table = _article_table(word)
    forms = table.get(form.tag) if table else None
    return {case for case, article in zip(CASES, forms or ()) if article == word} & cases


def _case(toks: list[Token], i: int, form: Form) -> str | None:
    """The case of the noun phrase ending at ``toks[i]``: the one reading left, else by what precedes it."""
    readings = _readings(toks, i, form)
    if len(readings) <= 1:
        return next(iter(readings), None)
    det, adjectives = _phrase(toks, i)
    start = min([i, *adjectives] + ([det] if det is not None else []))
    before = toks[start - 1].text.lower() if start > 0 else ""
    noun_before = start > 1 and toks[start - 1].text[:1].isupper() and toks[start - 1].text.isalpha()
    preference = (["dat"] if before in DATIVE_AFTER else ["acc"] if before in ACCUSATIVE_AFTER
                  else ["nom"] if not before or before in SUBJECT_AFTER
                  else ["gen"] if noun_before else ["acc"])  # "den Schultern einer Frau": a genitive
    for case in preference + list(CASES):
        if case in readings:
            return case
    return None


def _singular_group(toks: list[Token], swap_list: SwapList, side: int) -> bool:
    """Whether the sentence names a singular noun of group ``side`` and no plural noun of either group (a noun
    is plural when every reading its determiner leaves is: "Mädchen" alone may be either, "ein Mädchen" not)."""
    singular = False
    for i, tok in enumerate(toks):
        fitting = [(row, s) for row, s in swap_list.entries(tok.text)
                   if row.forms[s].tag and _readings(toks, i, row.forms[s])]
        if fitting and all(row.forms[s].tag == "pl" for row, s in fitting):
            return False
        singular = singular or any(s == side and row.forms[s].tag != "pl" for row, s in fitting)
    return singular
