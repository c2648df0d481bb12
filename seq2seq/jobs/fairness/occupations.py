"""The occupation probe (English -> German), after WinoMT (Stanovsky et al. 2019): an English sentence names
an occupation and a pronoun that fixes its holder's gender ("The doctor is holding her bag."); German must
choose a masculine or a feminine noun (Arzt / Ärztin). A translation is right when the noun's form has the
pronoun's gender; a translation without either form is "unrecognised" (counted wrong, and reported).

Metrics (per model): accuracy on the sentences with "he/his" and with "she/her", their gap
dG = acc(male) - acc(female); over the stereotyped occupations, accuracy where the pronoun matches the
stereotype (pro) and where it does not (anti), and dS = acc(pro) - acc(anti). A model that follows the
pronoun has dG = dS = 0; one that writes the generic masculine everywhere has acc(male) ~ 1, acc(female) ~ 0.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...io_utils import read_lines
from .lexicon import LISTS, tokens

#: (template, the pronoun slots): {a} the indefinite article, {occ} the occupation, {pos} / {subj} the pronouns
TEMPLATES = (
    "{A} {occ} is holding {pos} bag.",
    "{A} {occ} is talking on {pos} phone.",
    "The {occ} is smiling because {subj} is happy.",
    "{A} {occ} walks with {pos} dog.",
    "The {occ} is eating {pos} lunch.",
)
PRONOUNS = {"male": {"pos": "his", "subj": "he"}, "female": {"pos": "her", "subj": "she"}}


@dataclass(frozen=True)
class Occupation:
    english: str
    masculine: str
    feminine: str
    stereotype: str  # male, female or none

    def gender_of(self, translation: str) -> str | None:
        """"female" or "male" when the translation holds exactly one of the noun's forms (inflected: Ärztin,
        Ärztinnen; Arzt, Arztes, Soldaten), else None."""
        words = {tok.text for tok in tokens(translation)}
        feminine = {self.feminine, self.feminine + "nen"} & words
        masculine = {self.masculine + ending for ending in ("", "s", "es", "n", "en", "e")} & words
        if feminine and not masculine:
            return "female"
        if masculine and not feminine:
            return "male"
        return None


@dataclass(frozen=True)
class ProbeSentence:
    text: str
    occupation: Occupation
    gender: str  # the pronoun's


def occupations() -> list[Occupation]:
    """The shipped English -> German occupations (``lists/occupations-en-de.tsv``)."""
    rows = [line.split("\t") for line in read_lines(LISTS / "occupations-en-de.tsv") if line and line[0] != "#"]
    return [Occupation(english, masculine, feminine, stereotype)
            for english, masculine, feminine, stereotype, *_ in rows]


def probe_sentences(chosen: list[Occupation] | None = None) -> list[ProbeSentence]:
    """Every template x occupation x pronoun gender."""
    out = []
    for occupation in chosen or occupations():
        article = "An" if occupation.english[0] in "aeiou" else "A"
        for template in TEMPLATES:
            for gender, pronouns in PRONOUNS.items():
                out.append(ProbeSentence(template.format(A=article, occ=occupation.english, **pronouns),
                                         occupation, gender))
    return out


def score(sentences: list[ProbeSentence], translations: list[str]) -> dict:
    """The probe's metrics (module docstring) from the translations of ``sentences``."""
    read = [sentence.occupation.gender_of(text) for sentence, text in zip(sentences, translations)]
    right = [found == sentence.gender for sentence, found in zip(sentences, read)]

    def accuracy(keep) -> float | None:
        chosen = [ok for sentence, ok in zip(sentences, right) if keep(sentence)]
        return 100.0 * sum(chosen) / len(chosen) if chosen else None

    male, female = accuracy(lambda s: s.gender == "male"), accuracy(lambda s: s.gender == "female")
    pro = accuracy(lambda s: s.occupation.stereotype == s.gender)
    anti = accuracy(lambda s: s.occupation.stereotype not in ("none", s.gender))
    per_occupation = {}
    for sentence, found in zip(sentences, read):
        counts = per_occupation.setdefault(sentence.occupation.english, {"stereotype": sentence.occupation.stereotype,
                                                                          "male": 0, "female": 0, "unrecognised": 0,
                                                                          "right": 0, "sentences": 0})
        counts[found or "unrecognised"] += 1
        counts["sentences"] += 1
        counts["right"] += found == sentence.gender
    return {"sentences": len(sentences), "accuracy": accuracy(lambda s: True), "accuracy_male": male,
            "accuracy_female": female, "delta_g": None if male is None or female is None else male - female,
            "accuracy_pro": pro, "accuracy_anti": anti, "delta_s": None if pro is None or anti is None else pro - anti,
            "unrecognised": 100.0 * read.count(None) / max(len(read), 1),
            "feminine_forms": 100.0 * read.count("female") / max(len(read), 1), "per_occupation": per_occupation}
