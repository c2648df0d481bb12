"""Inline markup carried across a translation by the model's own alignments (``--markup xml|html``).

A line such as ``Ein <b>großer</b> Hund<br/> läuft.`` is parsed with the standard library's HTML
parser (``html.parser``: it reads XML-style self-closing tags too), the tags are removed, the plain
text is translated as it would be without them, and each element is put back around the target
words aligned to the source words it enclosed:

1. Each element spans the source words whose characters it encloses (``parse``); an element around
   no word (``<br/>``, a void HTML element, ``<a></a>``) sits at a word position instead.
2. Its target span is the smallest run of target words covering every target word aligned
   (word-level links of ``Translation.alignment_record``) to one of its source words. An element
   whose words align to nothing, and an element at a position, keep their relative position: source
   position p of n words becomes target position round(p x m / n) of m words.
3. Repairs, so that the output is always well formed, in source order: a child's span is cut to its
   parent's; a sibling that overlaps an earlier sibling starts where the earlier one ends (nothing
   left: it becomes empty there); an empty element that falls inside a sibling moves to that
   sibling's end. Elements left open at the end of the line are closed there (html) or are an error
   (xml), as is an end tag that closes nothing in xml (html drops it).
4. Tags are written verbatim (attributes and their quoting as the source had them); the translated
   text is escaped (``&``, ``<``, ``>``). Entities in the source text are read as the characters they
   stand for, so the model translates text, not entity names. Opening tags attach to the word that
   follows, closing tags to the word before; an element at a position attaches to the word before.

The translation of the text is the one of the line without its tags; only the tags depend on the
alignments, and so improve as the alignments do (guided alignment, the model's supervised heads).
"""
from __future__ import annotations

import html
import re
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import Sequence

from ..alignment.links import extract_links
from ..alignment.matrices import Link
from ..errors import UserError

MODES = ("xml", "html")
#: HTML elements that never have content or an end tag
VOID = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track",
                  "wbr"})
WORD = re.compile(r"\S+")


@dataclass
class Element:
    """One element of a line: its opening tag verbatim, its end tag (None: a void or self-closing
    element), the source words it encloses [start, end) (start == end: at that position), its
    children; ``target_*``: where it goes in the translation."""

    open_tag: str
    close_tag: str | None
    start: int = 0
    end: int = 0
    children: list["Element"] = field(default_factory=list)
    target_start: int = 0
    target_end: int = 0


class _Reader(HTMLParser):
    def __init__(self, mode: str, where: str) -> None:
        super().__init__(convert_charrefs=True)
        self.mode, self.where = mode, where
        self.text: list[str] = []
        self.length = 0  # characters of text so far
        self.root = Element("", "")
        self.open: list[tuple[str, Element, int]] = []  # (name, element, character offset of its start)
        self.spans: dict[int, tuple[int, int]] = {}  # id(element) -> character span

    def parent(self) -> Element:
        return self.open[-1][1] if self.open else self.root

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        self.length += len(data)

    def handle_starttag(self, tag: str, attrs) -> None:
        text = self.get_starttag_text() or f"<{tag}>"
        if self.mode == "html" and tag in VOID:
            self.handle_startendtag(tag, attrs)
            return
        element = Element(text, f"</{tag}>")
        self.parent().children.append(element)
        self.open.append((tag, element, self.length))

    def handle_startendtag(self, tag: str, attrs) -> None:
        element = Element(self.get_starttag_text() or f"<{tag}/>", None)
        self.parent().children.append(element)
        self.spans[id(element)] = (self.length, self.length)

    def handle_endtag(self, tag: str) -> None:
        names = [name for name, _, _ in self.open]
        if tag not in names:
            if self.mode == "xml":
                raise UserError(f"{self.where}: </{tag}> closes no open element; fix the markup or use --markup html "
                                "(which drops such end tags)")
            return
        if self.mode == "xml" and names[-1] != tag:
            raise UserError(f"{self.where}: </{tag}> closes <{tag}> while <{names[-1]}> inside it is still open; "
                            "fix the nesting or use --markup html (which closes inner elements first)")
        while self.open:  # html: elements left open inside are closed here
            name, element, start = self.open.pop()
            self.spans[id(element)] = (start, self.length)
            if name == tag:
                break

    def finish(self) -> None:
        self.close()
        if self.open and self.mode == "xml":
            raise UserError(f"{self.where}: <{self.open[-1][0]}> is never closed; close it or use --markup html "
                            "(which closes open elements at the end of the line)")
        while self.open:
            _, element, start = self.open.pop()
            self.spans[id(element)] = (start, self.length)


def parse(line: str, mode: str, where: str = "input") -> tuple[str, list[Element]]:
    """The plain text of ``line`` and its elements (a forest, in source order) with their source
    word spans (module docstring). ``where`` names the line in errors."""
    if mode not in MODES:
        raise UserError(f"--markup must be one of {', '.join(MODES)}, got {mode!r}")
    reader = _Reader(mode, where)
    reader.feed(line)
    reader.finish()
    text = "".join(reader.text)
    words = [m.span() for m in WORD.finditer(text)]

    def place(element: Element) -> None:
        first, last = reader.spans[id(element)]
        inside = [i for i, (s, e) in enumerate(words) if s < last and e > first] if last > first else []
        if inside:
            element.start, element.end = inside[0], inside[-1] + 1
        else:
            element.start = element.end = sum(1 for _, e in words if e <= first)
        for child in element.children:
            place(child)

    for element in reader.root.children:
        place(element)
    return text, reader.root.children


def transfer(elements: list[Element], links: set[Link], n_source: int, n_target: int) -> None:
    """Set each element's target span from word ``links`` (source i, target j), then repair the
    nesting (module docstring, steps 2-3)."""
    def relative(p: int) -> int:
        return round(p * n_target / n_source) if n_source else 0

    def project(element: Element) -> None:
        aligned = sorted({j for i, j in links if element.start <= i < element.end})
        if element.end > element.start and aligned:
            element.target_start, element.target_end = aligned[0], aligned[-1] + 1
        else:
            element.target_start = element.target_end = relative(element.start)
        for child in element.children:
            project(child)

    def repair(siblings: list[Element], lo: int, hi: int) -> None:
        placed: list[Element] = []
        for element in siblings:
            start, end = min(max(element.target_start, lo), hi), min(max(element.target_end, lo), hi)
            for other in placed:
                if other.target_end > other.target_start and start < other.target_end and end > other.target_start:
                    start = max(start, other.target_end)  # overlaps an earlier sibling: after it
                    end = max(end, start)
            if end == start:
                for other in placed:  # an empty element inside a sibling: at its end
                    if other.target_start < start < other.target_end:
                        start = end = other.target_end
            element.target_start, element.target_end = start, end
            placed.append(element)
            repair(element.children, start, end)

    for element in elements:
        project(element)
    repair(elements, 0, n_target)


def render(words: Sequence[str], elements: list[Element]) -> str:
    """The target words with the elements around their target spans (escaped text, verbatim tags)."""
    words = [html.escape(w, quote=False) for w in words]

    def items(nodes: list[Element], lo: int, hi: int) -> list[str]:
        out: list[str] = []
        pending = ""  # tags waiting for the next word
        position = lo
        order = sorted(range(len(nodes)),
                       key=lambda k: (nodes[k].target_start, nodes[k].target_end > nodes[k].target_start, k))
        for node in (nodes[k] for k in order):
            for word in words[position:node.target_start]:
                out.append(pending + word)
                pending = ""
            position = max(position, node.target_start)
            if node.close_tag is None or node.target_end == node.target_start:
                inner = "".join(items(node.children, position, position)) if node.close_tag is not None else ""
                tag = node.open_tag + inner + (node.close_tag or "")
                if out:
                    out[-1] += tag
                else:
                    pending += tag
                continue
            inside = items(node.children, node.target_start, node.target_end)
            inside[0] = node.open_tag + inside[0]
            inside[-1] += node.close_tag
            inside[0] = pending + inside[0]
            pending = ""
            out.extend(inside)
            position = node.target_end
        for word in words[position:hi]:
            out.append(pending + word)
            pending = ""
        if pending:
            out.append(pending)
        return out

    return " ".join(items(elements, 0, len(words)))


def word_links(links: set[Link], n_source: int, n_target: int, record_source: int, record_target: int
               ) -> set[Link]:
    """Word links over the alignment record's words, mapped onto the line's whitespace words (the same words
    in practice; proportionally where SentencePiece's normalization made the counts differ), without EOS."""
    mapped = set()
    for i, j in links:
        if i < record_source and j < record_target:
            if record_source != n_source:
                i = min(n_source - 1, i * n_source // record_source)
            if record_target != n_target:
                j = min(n_target - 1, j * n_target // record_target)
            mapped.add((i, j))
    return mapped


@dataclass
class TargetRequirements:
    """What the translation of each line must start with (``prefix``, one string per line, "" = none) and
    contain (``constraints``, one list of target phrases per line, [] = none): ``Translator.translate``'s
    keywords of the same names, as plain target text (with markup: ``plain_prefixes``)."""

    prefix: Sequence[str] | None = None
    constraints: Sequence[Sequence[str]] | None = None


def translate_markup(translator, lines: Sequence[str], mode: str, decode=None, align=None,
                     first_line: int = 1, backward=None, requirements: TargetRequirements | None = None
                     ) -> list[str]:
    """Translate ``lines`` of text with inline markup (``mode`` "xml" or "html") with ``translator``
    (a ``Translator``; ``decode`` a ``DecodeConfig``), each element carried across by the word links
    of ``align`` (an ``AlignConfig``; default: the model's supervised heads where it was trained
    with guided alignment, else ``seq2seq translate``'s default layer), symmetrized with a target->source
    model's where ``backward`` (a ``BackwardAligner``) is given; the best translation of each line.
    ``requirements``: each line's prefix and constraints (``TargetRequirements``). Errors name the line."""
    from ..config import AlignConfig

    parsed = parse_lines(lines, mode, first_line)
    align = (align or AlignConfig()).for_model(translator.supervised_attention)
    prefix, constraints = (requirements.prefix, requirements.constraints) if requirements else (None, None)
    results = translator.translate([text for text, _ in parsed], decode, need_attention=True, first_line=first_line,
                                   prefix=None if prefix is None else plain_prefixes(prefix, mode, first_line),
                                   constraints=constraints)
    return [hypotheses[0] for hypotheses in mark_translations(results, parsed, align, backward)]


def parse_lines(lines: Sequence[str], mode: str, first_line: int = 1) -> list[tuple[str, list[Element]]]:
    """``parse`` of each input line, errors naming it (``first_line``: the number of ``lines[0]``)."""
    return [parse(line, mode, f"input line {first_line + k}") for k, line in enumerate(lines)]


def mark_translations(results: Sequence, parsed: Sequence[tuple[str, list[Element]]], align, backward=None
                      ) -> list[list[str]]:
    """Per translation ``results[k]`` (a ``Translation`` with its attention) of the text of ``parsed[k]``
    (``parse``), each of its hypotheses (best first: ``Translation.alternatives``, an n-best list) with
    ``parsed[k]``'s elements carried across by its own word links (``element_links``: ``align``, and
    ``backward`` where given)."""
    hypotheses = [(k, h) for k, result in enumerate(results) for h in (result.alternatives or [result])]
    links = element_links([h for _, h in hypotheses], [parsed[k][0] for k, _ in hypotheses],
                          [bool(parsed[k][1]) for k, _ in hypotheses], align, backward)
    marked: list[list[str]] = [[] for _ in results]
    for (k, hypothesis), own in zip(hypotheses, links):  # transfer sets every element's span anew each time
        text, elements = parsed[k]
        marked[k].append(carry(elements, own, len(text.split()), hypothesis.text.split()))
    return marked


def plain_prefixes(prefixes: Sequence[str], mode: str, first_line: int = 1, flag: str = "--prefix") -> list[str]:
    """Target prefixes for sentences with markup: their text (entities read as the characters they stand
    for, as in the source); a prefix with tags is an error naming its line (the source's tags are placed by
    the alignments, after the search)."""
    texts = []
    for k, prefix in enumerate(prefixes):
        text, elements = parse(prefix, mode, f"{flag} line {first_line + k}")
        if elements:
            raise UserError(f"{flag} line {first_line + k} has tags ({prefix!r}); with --markup a prefix is the "
                            "plain text the translation starts with: the source's tags are carried across after "
                            "the search")
        texts.append(text)
    return texts


def sentence_record(result, text: str, align, index: int = 0):
    """The alignment record of ``result`` (a ``Translation`` of ``text`` with its attention) read as ``align``
    says for placing tags (``AlignConfig.for_markup``); None where either side has no words or there is no
    attention."""
    if not result.text.split() or not text.split() or result.attention is None:
        return None
    align = align.for_markup()
    return result.alignment_record(index, layer=align.layer, heads=align.heads, include_eos=False,
                                   method=align.method, threshold=align.threshold)


def record_links(record) -> set[Link]:
    """The word links (source word, target word) of ``record`` (``sentence_record``) as pairs: its word matrix
    read as it was read for its ``pharaoh_word`` (its method and share), never parsed back from that text."""
    return extract_links(record.words, record.method, record.threshold)


def line_links(record, links: set[Link], text: str, translation: str) -> set[Link]:
    """``links`` over ``record``'s words mapped onto the whitespace words of ``text`` and ``translation``."""
    return word_links(links, len(text.split()), len(translation.split()), len(record.src_words),
                      len(record.tgt_words))


def sentence_links(result, text: str, align, index: int = 0) -> set[Link]:
    """The word links of ``result`` (a ``Translation`` of ``text`` with its attention) read as ``align``
    says for placing tags (``sentence_record``), over the whitespace words of ``text`` and of the
    translation."""
    record = sentence_record(result, text, align, index)
    return set() if record is None else line_links(record, record_links(record), text, result.text)


def element_links(results: Sequence, texts: Sequence[str], marked: Sequence[bool], align, backward=None
                  ) -> list[set[Link]]:
    """The word links (``sentence_links``) of each translation ``results[k]`` of ``texts[k]`` that carries
    elements (``marked[k]``; the others need none and get an empty set), symmetrized with ``backward``'s (a
    ``BackwardAligner``) word attention of the pair as its ``markup_symmetrize`` says, where given (in one
    forced pass of the backward model)."""
    records = [sentence_record(result, text, align, k) if mark else None
               for k, (result, text, mark) in enumerate(zip(results, texts, marked))]
    chosen = [k for k, record in enumerate(records) if record is not None]
    links = {k: record_links(records[k]) for k in chosen}
    if backward is not None and chosen:
        back = backward.backward_words([texts[k] for k in chosen], [results[k].text for k in chosen])
        for k, words in zip(chosen, back):
            links[k] = backward.combined(links[k], records[k].words, words, markup=True)
    return [line_links(records[k], links[k], texts[k], results[k].text) if k in links else set()
            for k in range(len(results))]


def carry(elements: list[Element], links: set[Link], n_source: int, words: Sequence[str]) -> str:
    """The target ``words`` with ``elements`` (``parse``'s, over ``n_source`` source words) carried across by the
    word ``links`` (source word i, target word j): ``transfer``, then ``render`` (a line's translation, or a
    document segment's sentences with their links offset into it)."""
    transfer(elements, links, n_source, len(words))
    return render(words, elements)
