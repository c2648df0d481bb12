"""Whole HTML documents (``seq2seq.decoding.document``, ``translate --markup html`` on a page): the page
splits into verbatim pieces and segments that put it back together exactly; scripts, styles, code,
preformatted text, comments and ``translate="no"`` come out byte for byte; the translated blocks are
well formed and the text is translated as it would be alone."""
from __future__ import annotations

import random
import sys
from html.parser import HTMLParser
from types import SimpleNamespace

import pytest

from seq2seq.cli.translate import main as translate_main
from seq2seq.decoding.document import (
    Segment, attribute_values, is_document, restore, segment_translation, sentences_of, spacing_of, split_document,
    translate_document, with_attribute_values,
)
from seq2seq.config import DecodeConfig
from seq2seq.decoding.markup import VOID, parse
from seq2seq.decoding.translator import Translator
from seq2seq.errors import UserError
from test_align_cli import checkpoint  # noqa: F401  (the tiny trained checkpoint, built once per run)

PAGE = """<!DOCTYPE html>\r
<html lang="en">
<head>
  <meta charset="utf-8">
  <title>twenty-one</title>
  <style>p { color: red; } /* three hundred */</style>
  <script>var s = "<b>seven</b> & five";</script>
</head>
<body>
  <h1>three <em>hundred</em> and five</h1>
  <p>twenty-one. seven thousand and twelve &amp; <b>five</b>.</p>
  <p translate="no">seven  thousand <i>and</i> twelve</p>
  <ul>
    <li>nine <a href="/x?a=1&amp;b=2" class='k'>hundred</a> and one</li>
    <li>forty <code>print("one two")</code> two</li>
  </ul>
  <pre>  one  two
   three </pre>
  <!-- twenty <b> -->
  eleven<br>twelve
</body>
</html>
"""
KEPT = ['<style>p { color: red; } /* three hundred */</style>', '<script>var s = "<b>seven</b> & five";</script>',
        '<p translate="no">seven  thousand <i>and</i> twelve</p>', '<code>print("one two")</code>',
        '<pre>  one  two\n   three </pre>', '<!-- twenty <b> -->', '<!DOCTYPE html>\r\n<html lang="en">\n<head>\n',
        '<meta charset="utf-8">', '<a href="/x?a=1&amp;b=2" class=\'k\'>']


def joined(parts) -> str:
    return "".join(restore(p.raw, p.kept) if isinstance(p, Segment) else p for p in parts)


def test_a_page_splits_into_pieces_that_put_it_back_exactly():
    parts = split_document(PAGE)
    assert joined(parts) == PAGE
    segments = [p.raw.strip() for p in parts if isinstance(p, Segment)]
    assert segments == ["twenty-one", "three <em>hundred</em> and five",
                        "twenty-one. seven thousand and twelve &amp; <b>five</b>.",
                        "nine <a href=\"/x?a=1&amp;b=2\" class='k'>hundred</a> and one",
                        'forty <seq2seq-keep n="0"/> two', "eleven<br>twelve"]
    rng = random.Random(0)  # broken pages too: whatever the parser reads, nothing is lost
    pieces = ["<p>", "</p>", "<b>", "</b>", "<div class=x>", "</div>", "one two", "&amp;", "&#38;", " ", "\n",
              "<br>", "<!-- c -->", "<code>", "</code>", "<script>x<y</script>", "<span translate=no>", "</span>",
              "<", "a > b", "<p", "&bogus;"]
    for _ in range(300):
        page = "<html>" + "".join(rng.choice(pieces) for _ in range(rng.randint(0, 25)))
        assert joined(split_document(page)) == page, page


def test_documents_are_told_from_lines_with_inline_markup():
    assert is_document(PAGE) and is_document("  <!-- x -->\n<html><body>one</body></html>")
    assert is_document("<!doctype html><p>one") and is_document("<HTML lang=en>")
    assert not is_document("one <b>two</b>\nthree") and not is_document("<htmlfoo>") and not is_document("")


def test_sentences_keep_their_words_or_the_segment_is_one_sentence():
    assert sentences_of("One dog. Two cats!  Three.", lambda t: ["One dog. ", "Two cats!  ", "Three."]) == \
        ["One dog.", "Two cats!", "Three."]
    assert sentences_of("One dog. Two", lambda t: ["One do", "g. Two"]) == ["One dog. Two"]  # cut inside a word
    assert spacing_of('a <seq2seq-keep n="0"/>b <seq2seq-keep n="1"/> c') == {0: (True, False), 1: (True, True)}
    assert restore('x<seq2seq-keep n="0"/>y', ["<code>k</code>"], {0: (True, True)}) == "x <code>k</code> y"


class _Balance(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.open: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag not in VOID:
            self.open.append(tag)

    def handle_endtag(self, tag):
        assert self.open and self.open[-1] == tag, (tag, self.open)
        self.open.pop()


def test_a_segments_markup_follows_its_sentences_links_offset_into_the_segment():
    """``segment_translation`` (``markup.carry`` over the segment's joined words): each sentence's links are offset
    by the source and target words of the sentences before it, so a tag across a sentence boundary spans the
    translations of its words (without the offset, the second sentence's links would land on the first's words);
    the whitespace around the segment is kept."""
    raw = "  <b>eins zwei. drei</b> vier.\n"

    def segment() -> Segment:
        text, elements = parse(raw.strip(), "html")
        return Segment(raw, text=text, elements=elements, sentences=["eins zwei.", "drei vier."])

    results = [SimpleNamespace(text="one two."), SimpleNamespace(text="three four.")]
    straight = [{(0, 0), (1, 1)}, {(0, 0), (1, 1)}]
    assert segment_translation(segment(), results, straight) == "  <b>one two. three</b> four.\n"
    crossed = [{(0, 0), (1, 1)}, {(0, 1), (1, 0)}]  # drei -> four., vier. -> three
    assert segment_translation(segment(), results, crossed) == "  <b>one two. three four.</b>\n"


def test_a_page_is_translated_block_by_block_and_keeps_what_is_not_text(checkpoint, tmp_path, capsys):  # noqa: F811
    pytest.importorskip("sentencex")
    page = tmp_path / "page.html"
    page.write_bytes(PAGE.encode("utf-8"))
    out = tmp_path / "page.de.html"
    assert translate_main(["--checkpoint", str(checkpoint), "--input", str(page), "--output", str(out),
                           "--markup", "html", "--device", "cpu", "--beam-size", "1"]) == 0
    translated = out.read_bytes().decode("utf-8")
    for kept in KEPT:
        assert kept in translated, kept
    assert translated.endswith("</body>\n</html>\n") and "\r\n" in translated
    checker = _Balance()
    checker.feed(translated)
    assert checker.open == []  # every element closed, in order
    translator = Translator.from_checkpoint(checkpoint, device="cpu")
    alone = translator.translate(["twenty-one", "three hundred and five"], beam_size=1, need_attention=False)
    assert f"<title>{alone[0].text}</title>" in translated  # the text as it is translated without markup
    h1 = translated.split("<h1>")[1].split("</h1>")[0]
    assert h1.replace("<em>", "").replace("</em>", "") == alone[1].text and h1.count("<em>") == 1

    assert translate_document(translator, "<html><body>\n  \n</body></html>") == "<html><body>\n  \n</body></html>"
    lines = tmp_path / "lines.txt"
    lines.write_text("twenty-one <b>five</b>\n", encoding="utf-8")  # not a page: line by line, as before
    assert translate_main(["--checkpoint", str(checkpoint), "--input", str(lines), "--output", str(tmp_path / "o"),
                           "--markup", "html", "--device", "cpu", "--beam-size", "1"]) == 0
    assert (tmp_path / "o").read_text(encoding="utf-8").count("\n") == 1


def test_attributes_read_as_text_are_rewritten_in_their_quotes_and_nothing_else():
    tag = """<a data-x=' title=no' href=x TITLE="a &quot;b&quot;" alt=one class='k'>"""
    assert attribute_values(tag, ["title", "alt", "class"]) == {"title": 'a "b"', "alt": "one", "class": "k"}
    assert with_attribute_values(tag, {"title": "x < 'y' & \"z\"", "alt": "two", "class": "it's"}) == \
        """<a data-x=' title=no' href=x TITLE="x &lt; 'y' &amp; &quot;z&quot;" alt="two" class='it&#x27;s'>"""
    assert with_attribute_values("<input disabled placeholder=a />", {"placeholder": "b"}) == \
        '<input disabled placeholder="b" />'
    assert with_attribute_values("<img alt>", {"alt": "b"}) == "<img alt>"  # no value: nothing to translate


def test_a_page_translates_the_attributes_people_read(checkpoint):  # noqa: F811
    pytest.importorskip("sentencex")
    translator = Translator.from_checkpoint(checkpoint, device="cpu")
    page = ("<html><head><meta name='description' content='twenty-one'><meta name=viewport content='width=5'>"
            '</head><body><p>seven <img src="a.png" alt="three hundred"> <a href="/x" title="five">nine</a></p>'
            '<input placeholder="twelve"><code title="seven">one</code><p translate="no" title="seven">two</p>'
            '<p aria-label="forty" data-title="eleven">one</p></body></html>')
    out = translate_document(translator, page, DecodeConfig(beam_size=1))
    alone = {text: t.text for text, t in zip(["twenty-one", "three hundred", "five", "twelve", "forty"],
                                               translator.translate(["twenty-one", "three hundred", "five", "twelve",
                                                                     "forty"], beam_size=1))}
    assert f"<meta name='description' content='{alone['twenty-one']}'>" in out
    assert f'<img src="a.png" alt="{alone["three hundred"]}">' in out  # inside a translated paragraph
    assert f'<a href="/x" title="{alone["five"]}">' in out and f'<input placeholder="{alone["twelve"]}">' in out
    assert f'aria-label="{alone["forty"]}" data-title="eleven">' in out
    for kept in ("<meta name=viewport content='width=5'>", '<code title="seven">one</code>',
                 '<p translate="no" title="seven">two</p>'):
        assert kept in out, kept


def test_without_the_sentence_splitter_a_page_is_a_named_error(checkpoint, monkeypatch):  # noqa: F811
    monkeypatch.setitem(sys.modules, "sentencex", None)
    translator = Translator.from_checkpoint(checkpoint, device="cpu")
    with pytest.raises(UserError, match=r"pip install 'seq2seq\[markup\]'"):
        translate_document(translator, "<html><p>one</p></html>")
