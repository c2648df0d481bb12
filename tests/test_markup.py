"""Inline markup carried across translations (``seq2seq.decoding.markup``, ``translate --markup``): tags
round-trip, nesting and attributes survive, every output is well formed (a property test over random
nestings and alignments, broken input included), and the text is translated as it would be without tags."""
from __future__ import annotations

import random
import re
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from seq2seq.alignment.links import agreement_matrix, extract_links, parse_pharaoh
from seq2seq.alignment.records import AlignmentRecord
from seq2seq.cli.translate import main as translate_main
from seq2seq.config import AlignConfig
from seq2seq.decoding.forced_alignment import BackwardAligner
from seq2seq.decoding import markup
from seq2seq.decoding.markup import (TargetRequirements, parse, record_links, render, sentence_links, transfer,
                                     translate_markup)
from seq2seq.decoding.translator import Translator
from seq2seq.errors import UserError
from test_align_cli import checkpoint, reversed_checkpoint  # noqa: F401  (the tiny trained checkpoint)

TAG = re.compile(r"<[^>]*>")


def carry(line: str, target: str, links: set, mode: str = "xml") -> str:
    """``line``'s tags carried onto ``target`` by ``links`` (``markup.carry``: transfer, then render)."""
    text, elements = parse(line, mode)
    return markup.carry(elements, links, len(text.split()), target.split())


def well_formed(text: str) -> ET.Element:
    return ET.fromstring(f"<root>{text}</root>")


def test_tags_round_trip_around_words_and_untranslatable_content():
    line = 'Call <b>112</b> or see <a href="https://x.org/?a=1&amp;b=2" class=\'y\'>the page</a>.'
    identity = {(i, i) for i in range(7)}
    out = carry(line, "Call 112 or see the page.", identity)
    assert out == 'Call <b>112</b> or see <a href="https://x.org/?a=1&amp;b=2" class=\'y\'>the page.</a>'
    assert carry("<i>Hallo</i> Welt", "Hello world", {(0, 0), (1, 1)}) == "<i>Hello</i> world"


def test_nesting_attributes_and_reordering_follow_the_links():
    line = 'Ein <b id="1">großer <i>Hund</i></b><br/> läuft &amp; bellt.'
    text, elements = parse(line, "html")
    assert text == "Ein großer Hund läuft & bellt."
    assert [(e.open_tag, e.start, e.end) for e in elements] == [('<b id="1">', 1, 3), ("<br/>", 3, 3)]
    links = {(0, 0), (1, 2), (2, 1), (3, 3), (4, 4), (5, 5)}  # "Hund großer" -> "dog big"
    out = carry(line, "A dog big runs & barks.", links, "html")
    assert out == 'A <b id="1"><i>dog</i> big</b><br/> runs &amp; barks.'
    assert TAG.sub("", out) == "A dog big runs &amp; barks."


def test_elements_around_nothing_keep_their_relative_position_and_crossings_are_repaired():
    assert carry("eins <x/>zwei drei vier", "one two three four", set()) == "one<x/> two three four"
    # <a> and <b> would overlap in the target (crossing links): <b> starts after <a> ends
    out = carry("<a>eins zwei</a> <b>drei vier</b>", "w0 w1 w2 w3", {(0, 0), (1, 2), (2, 1), (3, 3)})
    assert out == "<a>w0 w1 w2</a> <b>w3</b>"
    well_formed(out)
    # the smallest covering span; a child placed outside its parent (here by relative position) is cut
    assert carry("<p>eins <q>zwei</q></p> drei", "w0 w1 w2", {(0, 0), (1, 2), (2, 1)}) == "<p>w0 w1 <q>w2</q></p>"
    assert carry("<p>eins <q>zwei</q></p> drei", "w0 w1 w2", {(0, 0), (2, 1)}) == "<p>w0<q></q></p> w1 w2"


def test_broken_markup_is_a_named_error_in_xml_and_repaired_in_html():
    for line, words in (("a <b>c", "is never closed"), ("a </b> c", "closes no open element"),
                        ("<b>a <i>c</b></i>", "while <i> inside it is still open")):
        with pytest.raises(UserError, match=words):
            parse(line, "xml", "input line 7")
        out = carry(line, "x y z", {(0, 0), (1, 1)}, "html")
        well_formed(out)
        assert TAG.sub("", out) == "x y z"
    with pytest.raises(UserError, match="--markup must be one of"):
        parse("a", "sgml")


def _random_line(rng: random.Random, words: list[str], depth: int = 0) -> str:
    parts = []
    for _ in range(rng.randint(0, 3)):
        kind = rng.random()
        if kind < 0.5 or depth > 2:
            parts.append(rng.choice(words))
        elif kind < 0.65:
            parts.append(f"<v{rng.randint(0, 3)}/>")
        else:
            name = f"t{rng.randint(0, 3)}"
            attrs = rng.choice(["", ' k="a&amp;b"', " k='1'"])
            parts.append(f"<{name}{attrs}>{_random_line(rng, words, depth + 1)}</{name}>")
    return rng.choice([" ", ""]).join(parts)


def test_every_output_is_well_formed_whatever_the_nesting_and_the_alignment():
    """Property test: random nestings, random target lengths, random (crossing, partial) links: the
    output parses as XML, keeps every tag once, and its text is the target's words in order."""
    rng = random.Random(0)
    for _ in range(500):
        line = _random_line(rng, ["w", "x&amp;y", "z&lt;", "q"])
        text, elements = parse(line, "xml")
        n_source, n_target = len(text.split()), rng.randint(0, 6)
        links = {(rng.randrange(n_source), rng.randrange(n_target)) for _ in range(rng.randint(0, 8))
                 if n_source and n_target}
        target = [f"t{j}&" for j in range(n_target)]
        transfer(elements, links, n_source, n_target)
        out = render(target, elements)
        root = well_formed(out)
        assert sorted(TAG.findall(out)) == sorted(TAG.findall(line)), (line, out)
        assert " ".join("".join(root.itertext()).split()) == " ".join(target), (line, out)
        closing = [m.start() for m in re.finditer(r"</t\d>", line)]
        if closing:  # broken: an end tag dropped, a stray one added; html repairs both
            cut = rng.choice(closing)
            broken = line[:cut] + line[cut:].split(">", 1)[1] + rng.choice(["", "</t9>"])
            text, elements = parse(broken, "html")
            transfer(elements, links, n_source, n_target)
            well_formed(render(target, elements))


def test_translate_with_markup_translates_the_text_as_without_tags(checkpoint, tmp_path, capsys):  # noqa: F811
    translator = Translator.from_checkpoint(checkpoint, device="cpu")
    lines = ["<b>twenty-one</b> and <i>three</i>", "seven <br/>thousand", "", "plain words"]
    out = translate_markup(translator, lines, "html")
    plain = [t.text for t in translator.translate([TAG.sub("", line) for line in lines])]
    assert [" ".join(TAG.sub("", o).split()) for o in out] == [" ".join(p.split()) for p in plain]
    for line, result in zip(lines, out):
        assert sorted(TAG.findall(result)) == sorted(TAG.findall(line))
        well_formed(result)
    source = tmp_path / "in.html"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    target = tmp_path / "out.html"
    assert translate_main(["--checkpoint", str(checkpoint), "--input", str(source), "--output", str(target),
                           "--markup", "html", "--device", "cpu", "--quiet"]) == 0
    assert target.read_text(encoding="utf-8").splitlines() == out
    source.write_text("fine\n<b>broken\n", encoding="utf-8")
    assert translate_main(["--checkpoint", str(checkpoint), "--input", str(source), "--output", str(target),
                           "--markup", "xml", "--device", "cpu", "--quiet"]) == 2
    assert "input line 2: <b> is never closed" in capsys.readouterr().err


def test_markup_combines_with_n_best_jsonl_prefixes_constraints_references_and_alignments(
        checkpoint, tmp_path, capsys):  # noqa: F811
    """Every hypothesis of an n-best list carries the tags by its own links; jsonl keeps the source as given and
    adds each hypothesis's markup; a prefix is plain text (tags in it: a named error); references are scored
    without their tags; the alignments are those of the text without tags; an HTML document refuses the
    per-line options by name."""
    import json

    translator = Translator.from_checkpoint(checkpoint, device="cpu")
    lines = ["<b>twenty-one</b> and <i>three</i>", "seven <u>thousand</u>"]
    plain = [TAG.sub("", line) for line in lines]
    source = tmp_path / "in.txt"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")

    def run(*flags: str, output: str = "out.txt") -> int:
        return translate_main(["--checkpoint", str(checkpoint), "--input", str(source), "--output",
                               str(tmp_path / output), "--markup", "html", "--device", "cpu", *flags])

    assert run("--n-best", "2", "--beam-size", "3") == 0
    best = translator.translate(plain, beam_size=3, n_best=2)
    rows = [row.split(" ||| ") for row in (tmp_path / "out.txt").read_text(encoding="utf-8").splitlines()]
    expected = [(str(i), alt.text) for i, result in enumerate(best) for alt in result.alternatives]
    assert [(index, " ".join(TAG.sub("", text).split())) for index, text, _ in rows] == expected
    for (index, text, _), (i, _) in zip(rows, expected):
        assert sorted(TAG.findall(text)) == sorted(TAG.findall(lines[int(i)]))
        well_formed(text)

    assert run("--output-format", "jsonl", "--n-best", "2", "--beam-size", "3", output="out.jsonl") == 0
    records = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [r["source"] for r in records] == lines
    assert [r["markup"] for r in records] == [row[1] for row in rows[::2]]
    assert [[h["markup"] for h in r["n_best"]] for r in records] == [[row[1] for row in rows[k:k + 2]]
                                                                     for k in (0, 2)]

    prefix = tmp_path / "prefix.txt"
    prefix.write_text("drei und\nsieben\n", encoding="utf-8")
    assert run("--prefix", str(prefix), output="prefixed.txt") == 0
    prefixed = (tmp_path / "prefixed.txt").read_text(encoding="utf-8").splitlines()
    assert [TAG.sub("", line).split()[:2] for line in prefixed] == [["drei", "und"], ["sieben"]]
    # the Python API passes its requirements on (dropping them would translate without the prefix)
    assert translate_markup(translator, lines, "html",
                            requirements=TargetRequirements(prefix=["drei und", "sieben"])) == prefixed
    # the output itself as the reference, tags and all: scored without them, chrF 100
    assert run("--prefix", str(prefix), "--reference", str(tmp_path / "prefixed.txt")) == 0
    assert "chrF2 = 100.00" in capsys.readouterr().err
    prefix.write_text("<b>drei</b> und\n\n", encoding="utf-8")
    assert run("--prefix", str(prefix)) == 2
    assert "--prefix line 1 has tags" in capsys.readouterr().err
    constraints = tmp_path / "constraints.txt"
    constraints.write_text("\ntausend\n", encoding="utf-8")
    assert run("--constraints", str(constraints)) == 0
    constrained = (tmp_path / "out.txt").read_text(encoding="utf-8").splitlines()
    assert "tausend" in TAG.sub("", constrained[1])
    assert translate_markup(translator, lines, "html",
                            requirements=TargetRequirements(constraints=[[], ["tausend"]])) == constrained

    assert run(output="marked.txt") == 0
    assert run("--alignments", str(tmp_path / "align.jsonl")) == 0
    aligned = [json.loads(line) for line in (tmp_path / "align.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [r["target"] for r in aligned] == [t.text for t in translator.translate(plain)]
    assert (tmp_path / "out.txt").read_text(encoding="utf-8") == (tmp_path / "marked.txt").read_text(encoding="utf-8")

    source.write_text("<!DOCTYPE html><html><body><p>seven <b>thousand</b></p></body></html>\n", encoding="utf-8")
    assert run("--n-best", "2", "--prefix", str(prefix)) == 2
    assert "is an HTML document, translated into the same document; it does not combine with --n-best, --prefix" \
        in capsys.readouterr().err


def test_a_backward_model_places_the_tags_by_the_symmetrized_links(checkpoint, tmp_path):  # noqa: F811
    """The forward rule with a backward model is the forward model alone; intersection places every tag by
    the links both models agree on, agreement by the links of their agreement matrix (checked against the
    library's symmetrization)."""
    translator = Translator.from_checkpoint(checkpoint, device="cpu")
    backward = Translator.from_checkpoint(reversed_checkpoint(checkpoint, tmp_path / "backward.pt"), device="cpu")
    lines = ["<b>twenty-one</b> and <i>three</i> hundred", "seven <u>thousand and</u> twelve", ""]
    alone = translate_markup(translator, lines, "html")
    forward = BackwardAligner(translator, backward, AlignConfig(model_default=True), "forward")
    assert translate_markup(translator, lines, "html", backward=forward) == alone
    both = BackwardAligner(translator, backward, AlignConfig(model_default=True), "intersection")
    out = translate_markup(translator, lines, "html", backward=both)
    plain = translator.translate([TAG.sub("", line) for line in lines])
    align = AlignConfig(model_default=True).for_model(translator.supervised_attention)
    for k in (0, 1):
        text, elements = parse(lines[k], "html")
        own = sentence_links(plain[k], text, align, k)
        grown = plain[k].alignment_record(k, layer=align.layer, heads=align.heads, method="grow", threshold=0.0)
        assert own == parse_pharaoh(grown.pharaoh_word)[0]  # tags read every grown link (AlignConfig.for_markup)
        back = both.links(both.backward_words([text], [plain[k].text])[0], markup=True)
        transfer(elements, own & back, len(text.split()), len(plain[k].text.split()))
        assert out[k] == render(plain[k].text.split(), elements)
        well_formed(out[k])
    assert out[2] == ""
    agree = BackwardAligner(translator, backward, AlignConfig(model_default=True), "agreement")
    out = translate_markup(translator, lines, "html", backward=agree)
    for k in (0, 1):  # agreement: the grown links of both models' word attention at once
        text, elements = parse(lines[k], "html")
        record = plain[k].alignment_record(k, layer=align.layer, heads=align.heads)
        both_words = agreement_matrix(record.words, agree.backward_words([text], [plain[k].text])[0])
        transfer(elements, extract_links(both_words, "grow", 0.0), len(text.split()), len(plain[k].text.split()))
        assert out[k] == render(plain[k].text.split(), elements)
        well_formed(out[k])


def test_tags_take_a_records_word_links_as_pairs_read_as_its_pharaoh_line_was():
    """``record_links``: a sentence record's word links as (source word, target word) pairs, read from its word
    matrix with its own method and share, the links its ``pharaoh_word`` spells for every method (catches another
    method or share, the default share in place of the record's, or transposed pairs), with no text in between."""
    attention = np.random.default_rng(3).dirichlet(np.ones(6), size=(1, 2, 5))  # (L, H, T, S), EOS included
    src, tgt = ["▁ein", "▁groß", "er", "▁Hund", "▁läuft"], ["▁a", "▁big", "▁dog", "▁runs"]
    for method, threshold in (("argmax", None), ("grow", 0.0), ("grow", 0.3), ("soft", 0.1), ("threshold", 0.2)):
        record = AlignmentRecord.build(0, "ein großer Hund läuft", "a big dog runs", src, tgt, attention,
                                       AlignConfig(method=method, threshold=threshold))
        links = record_links(record)
        assert links == parse_pharaoh(record.pharaoh_word)[0] and links
        assert all(i < 4 and j < 4 for i, j in links)


def test_the_markup_benchmark_scores_placement_against_gold_links(checkpoint, tmp_path):  # noqa: F811
    """Smoke run of benchmarks/bench_markup.py: the tiny checkpoint's attention and eflomal's links,
    exact-span accuracy and overlap in [0, 1], every output well formed."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from seq2seq.toy import toy_corpus

    pytest.importorskip("eflomal")
    corpus = toy_corpus(n_train=40, n_valid=6, n_test=2, seed=5)
    for split, key in (("train", "train"), ("val", "validation")):
        for lang in ("src", "tgt"):
            (tmp_path / f"{split}.{'en' if lang == 'src' else 'de'}").write_text(
                "\n".join(corpus[key][lang]) + "\n", encoding="utf-8")
    pairs = zip(corpus["validation"]["src"], corpus["validation"]["tgt"])
    gold = ["0-0 " + " ".join(f"{i}?{i}" for i in range(1, min(len(s.split()), len(t.split())))) for s, t in pairs]
    (tmp_path / "gold.align").write_text("\n".join(g.strip() for g in gold) + "\n", encoding="utf-8")
    out = tmp_path / "markup.json"
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, str(root / "benchmarks" / "bench_markup.py"), "--checkpoint",
                           str(checkpoint), "--data-dir", str(tmp_path), "--src", "en", "--tgt", "de", "--gold",
                           str(tmp_path / "gold.align"), "--eflomal", "--out", str(out)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads(out.read_text())
    assert record["benchmark"] == "markup" and record["pairs"] == 6 and set(record["results"]) == {
        "gold, sure links only", "eflomal", "run"}
    for result in record["results"].values():
        assert result["spans"] > 0 and 0 <= result["exact"] <= result["overlap"] <= 1 and result["well_formed"] == 1
    assert "| eflomal |" in (tmp_path / "markup.md").read_text()
