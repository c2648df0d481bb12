"""The fairness probe: swaps that round-trip and agree, the metrics on hand-made cases, the occupation probe's
scoring, counterfactual augmentation, and the command end to end on two tiny models (both architectures)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_main
from seq2seq.errors import UserError
from seq2seq.jobs.fairness import occupations as occ
from seq2seq.jobs.fairness import AugmentJob, augment
from seq2seq.jobs.fairness.lexicon import SwapList
from seq2seq.jobs.fairness.probe import changed_words, measure, stability, summary, verdict
from seq2seq.jobs.fairness.swaps import swapper_for

DATA = Path(__file__).parent / "data" / "pre-tiers"

ENGLISH = [
    ("A man is playing his guitar.", "A woman is playing her guitar."),
    ("A woman talks to her friend and smiles at her.", "A man talks to his friend and smiles at him."),
    ("The boys and a girl.", "The girls and a boy."),
    ("Two MEN sit with their dog.", "Two WOMEN sit with their dog."),
    ("A dog runs on the beach.", "A dog runs on the beach."),
]
GERMAN = [
    ("Ein alter Mann sitzt auf einer Bank.", "Eine alte Frau sitzt auf einer Bank."),
    ("Eine junge Frau hält einen kleinen Jungen.", "Ein junger Mann hält ein kleines Mädchen."),
    ("Ein Mann mit seinem Hund.", "Eine Frau mit ihrem Hund."),
    ("Zwei Männer und eine Frau stehen vor einem Gebäude.", "Zwei Frauen und ein Mann stehen vor einem Gebäude."),
    ("Ein Junge spielt mit einem Mädchen.", "Ein Mädchen spielt mit einem Jungen."),
    ("Eine Frau spricht mit einem älteren Mann.", "Ein Mann spricht mit einer älteren Frau."),
    ("Ein Hund läuft zum Mann.", "Ein Hund läuft zur Frau."),
    ("Der Mann gibt der Frau einen Ball.", "Die Frau gibt dem Mann einen Ball."),
    ("Zwei Frauen sprechen mit den Männern.", "Zwei Männer sprechen mit den Frauen."),
    ("Ein älterer, übergewichtiger Mann kocht, während er singt.",
     "Eine ältere, übergewichtige Frau kocht, während sie singt."),
    ("Ein Mädchen mit ihrer Mutter.", "Ein Junge mit seinem Vater."),
]


@pytest.mark.parametrize("language, cases", [("en", ENGLISH), ("de", GERMAN)])
def test_swaps_agree_and_round_trip(language, cases):
    swapper = swapper_for(language)
    for sentence, expected in cases:
        swapped = swapper.swap(sentence)
        assert swapped.text == expected
        assert swapper.swap(swapped.text).text == sentence  # a swap that round-trips
        assert bool(swapped.terms) == (expected != sentence)


def test_words_outside_the_groups_stay():
    de = swapper_for("de")
    assert de.swap("Sie gehen mit ihren Kindern.").text == "Sie gehen mit ihren Kindern."  # they, their
    assert de.swap("Eine Frau grüßt Sie.").text == "Ein Mann grüßt Sie."  # the polite "you"
    assert de.swap("Junge Erwachsene tanzen.").text == "Junge Erwachsene tanzen."  # young, not the boy
    assert de.swap("Zwei junge Männer.").text == "Zwei junge Frauen."


def test_one_way_swaps_put_both_genders_on_one_footing():
    de, en = swapper_for("de"), swapper_for("en")
    assert de.swap("Eine junge Frau und ein Mann.", only=0).text == "Ein junger Mann und ein Mann."
    assert en.swap("A woman and her son.", only=0).text == "A man and his son."


@pytest.mark.parametrize("text, message", [
    ("man\twoman\tperson\n", "line 1: expected two tab-separated columns"),
    ("# groups: a b\nman woman\n", "line 2: expected two tab-separated columns"),
    ("Mann/x\tFrau/f\n", "line 1: tag 'x'"),
    ("two words\tFrau\n", "is not one word"),
    ("# only a comment\n", "no word pairs"),
])
def test_a_bad_swap_list_is_named(tmp_path, text, message):
    path = tmp_path / "list.tsv"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(UserError, match=message) as caught:
        SwapList.read(path, "en")
    assert str(path) in str(caught.value)


def test_a_language_without_a_list_is_named():
    with pytest.raises(UserError, match=r"--src fr: no swap list is shipped.*shipped: de, en.*--swap-list"):
        swapper_for("fr")


def test_a_users_list_is_read_with_its_groups(tmp_path):
    path = tmp_path / "list.tsv"
    path.write_text("# groups: old young\nold\tyoung\nelderly\tyouthful\n", encoding="utf-8")
    swapper = swapper_for("en", str(path))
    assert swapper.swap_list.groups == ("old", "young")
    assert swapper.swap("An Old man and a youthful woman.").text == "An Young man and a elderly woman."


def test_verdicts():
    assert verdict([0], [1]) == "faithful"
    assert verdict([0, 1], [1, 0]) == "faithful"
    assert verdict([0], [0]) == "ignored"
    assert verdict([0, 0], [1]) == "partial"
    assert verdict([], []) == "no term"


def test_a_translation_that_changes_only_the_group_terms_is_fully_stable():
    en = swapper_for("en")
    source = swapper_for("de").swap("Ein Mann spielt mit seinem Hund.")
    pair = measure(1, source, ("A man plays with his dog.", "A woman plays with her dog."), en, ("male", "female"))
    assert (pair.verdict, pair.chrf, pair.changed) == ("faithful", 100.0, [])
    assert pair.group_words == [1, 4]
    other = measure(2, source, ("A man plays with his dog.", "A woman sings to her cat."), en, ("male", "female"))
    assert other.chrf < 100.0
    assert [other.swapped_output.split()[i] for i in other.changed] == ["sings", "to", "cat."]
    ignored = measure(3, source, ("A man plays.", "A man plays."), en, ("male", "female"))
    assert ignored.verdict == "ignored"
    numbers = summary([pair, other, ignored], ("male", "female"))
    assert numbers["faithfulness"]["male -> female"]["faithful"] == pytest.approx(200 / 3)
    assert numbers["stability"]["changed_elsewhere"] == pytest.approx(100 / 3)


def test_evidence_is_the_share_of_each_target_words_row_on_the_swapped_source_words():
    import numpy as np

    from seq2seq.jobs.fairness.probe import add_evidence, uniform_share

    source = swapper_for("en").swap("the tall man sings")  # -> "the tall woman sings": word 2 swapped
    pair = measure(1, source, ("der große Mann singt", "die große Frau tanzt"), swapper_for("de"), ("male", "female"))
    assert (pair.group_words, pair.changed) == ([2], [3])
    # rows: die große Frau tanzt </s>; columns: the tall woman sings </s>
    words = np.array([[0.5, 0.2, 0.2, 0.0, 0.1], [0.0, 1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.8, 0.0, 0.2],
                      [0.0, 0.0, 0.6, 0.4, 0.0], [0.0, 0.0, 0.0, 0.0, 1.0]])
    add_evidence(pair, "attention", words, ["the", "tall", "woman", "sings"], ["die", "große", "Frau", "tanzt"])
    assert pair.evidence["attention"] == {"group": [0.8], "changed": [0.6], "unchanged": [pytest.approx(0.2), 0.0]}
    assert uniform_share(pair) == pytest.approx(1 / 5)
    add_evidence(pair, "gradient", words, ["the", "tall"], ["die"])  # other words than the sentences': skipped
    assert "gradient" not in pair.evidence


def test_changed_words_and_stability_identities():
    assert changed_words("a b c", "a b c") == set()
    assert changed_words("a b c", "a x c d") == {1, 3}
    assert stability("same text", "same text") == 100.0


def test_occupation_scoring_counts_a_flipped_gender():
    doctor = next(o for o in occ.occupations() if o.english == "doctor")
    assert doctor.gender_of("Eine Ärztin hält ihre Tasche.") == "female"
    assert doctor.gender_of("Ein Arzt hält seine Tasche.") == "male"
    assert doctor.gender_of("Eine Frau hält ihre Tasche.") is None
    sentences = occ.probe_sentences([doctor])
    assert len(sentences) == 2 * len(occ.TEMPLATES)
    assert sentences[1].text == "A doctor is holding her bag." and sentences[1].gender == "female"
    generic_masculine = ["Ein Arzt macht etwas." for _ in sentences]  # the pronoun ignored: the female half flips
    scores = occ.score(sentences, generic_masculine)
    assert (scores["accuracy_male"], scores["accuracy_female"], scores["delta_g"]) == (100.0, 0.0, 100.0)
    assert scores["accuracy_pro"] is None  # doctor has no stereotype
    faithful = ["Eine Ärztin." if s.gender == "female" else "Ein Arzt." for s in sentences]
    assert occ.score(sentences, faithful)["delta_g"] == 0.0


def test_every_shipped_occupation_occurs_in_multi30k():
    corpus = Path(__file__).parents[2] / "shared" / "data" / "multi30k" / "train.en"
    if not corpus.is_file():
        pytest.skip("Multi30k is not here")
    text = corpus.read_text(encoding="utf-8").lower()
    assert [o.english for o in occ.occupations() if f" {o.english}" not in text] == []


def test_augmentation_adds_swapped_pairs_only_where_both_sides_have_terms(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.en").write_text("A man walks.\nA dog runs.\nThe woman sings.\n", encoding="utf-8")
    (data / "train.de").write_text("Ein Mann geht.\nEin Hund rennt.\nDie Person singt.\n", encoding="utf-8")
    (data / "val.en").write_text("A man.\n", encoding="utf-8")
    (data / "val.de").write_text("Ein Mann.\n", encoding="utf-8")
    summary_ = augment(AugmentJob(str(data), "en", "de", str(tmp_path / "out")))
    assert summary_["added"] == 1
    out = tmp_path / "out"
    assert (out / "train.en").read_text(encoding="utf-8").splitlines()[-1] == "A woman walks."
    assert (out / "train.de").read_text(encoding="utf-8").splitlines()[-1] == "Eine Frau geht."
    assert (out / "val.de").read_text(encoding="utf-8") == "Ein Mann.\n"  # unchanged
    code, _, err = run_main(["augment", "--data-dir", str(data), "--src", "en", "--tgt", "de", "--output-dir",
                             str(out)])
    assert code == 2 and "already exists" in err


def test_the_probe_end_to_end_on_both_architectures(tmp_path):
    source = tmp_path / "input.en"
    source.write_text("A man is holding his bag.\nA dog runs.\nThe woman smiles at a boy.\n", encoding="utf-8")
    out = tmp_path / "report"
    code, _, err = run_main(["fairness", "--checkpoint", str(DATA / "transformer.pt"), str(DATA / "rnn.pt"),
                             "--names", "transformer", "rnn", "--input", str(source), "--src", "en", "--tgt", "de",
                             "--occupations", "--evidence-sentences", "1", "--beam-size", "2", "--output-dir",
                             str(out), "--quiet"])
    assert code == 0, err
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    assert report["probed"] == 2 and report["lines"] == 3
    for model in report["models"]:
        assert model["pairs"] == 2
        assert sum(model["faithfulness"]["all"][v] for v in report["verdicts"]) == pytest.approx(100.0)
        assert set(model["evidence"]) == {"attention", "gradient"}
        assert model["occupations"]["sentences"] == len(occ.probe_sentences())
        assert [p["swapped_source"] for p in model["pairs_detail"]] == [
            "A woman is holding her bag.", "The man smiles at a girl."]
    markdown = (out / "report.md").read_text(encoding="utf-8")
    assert "## Occupations" in markdown and "| transformer |" in markdown and "| rnn |" in markdown
    assert "**rnn, occupations** (wrong gender first" in markdown
    assert {p.name for p in (out / "plots").iterdir()} >= {"faithfulness.png", "occupations.png"}


@pytest.mark.parametrize("args, message", [
    (["--attribution", "magic"], "--attribution 'magic'"),
    (["--src", "fr"], "--src fr: no swap list is shipped"),
    (["--occupations", "--src", "de", "--tgt", "en"], "--occupations probes English -> German"),
])
def test_bad_flags_are_named_and_write_nothing(tmp_path, args, message):
    source = tmp_path / "input.en"
    source.write_text("A man walks.\n", encoding="utf-8")
    argv = ["fairness", "--checkpoint", str(DATA / "rnn.pt"), "--input", str(source), "--output-dir",
            str(tmp_path / "out"), "--quiet"]
    if "--src" not in args:
        argv += ["--src", "en", "--tgt", "de"]
    elif "--tgt" not in args:
        argv += ["--tgt", "de"]
    code, _, err = run_main(argv + args)
    assert code == 2 and message in err
    assert not (tmp_path / "out").exists()


def test_an_input_without_group_terms_is_named(tmp_path):
    source = tmp_path / "input.en"
    source.write_text("A dog runs.\n", encoding="utf-8")
    code, _, err = run_main(["fairness", "--checkpoint", str(DATA / "rnn.pt"), "--input", str(source), "--src", "en",
                             "--tgt", "de", "--output-dir", str(tmp_path / "out"), "--quiet"])
    assert code == 2 and "no line holds a word of the en swap list" in err
