"""Whole HTML documents (``translate --markup html`` on a page): the structure kept byte for byte, the
text of every block translated sentence by sentence with its inline markup carried across.

1. **Events**: the document is read with the standard library's HTML parser (entities left as
   written), each tag, text run, comment and declaration with its exact source text, so that what is
   not translated is written back unchanged.
2. **Blocks**: a block element (anything not in ``INLINE``: ``p``, ``li``, ``td``, ``h1``, ``div``,
   ``title``, ...), a comment or a declaration ends the text run before it; the runs between them
   (text with inline elements) are the segments that are translated. Whitespace before and after a
   segment is kept as it is; inside, the translation's words are separated by single spaces.
3. **Left alone**: ``script``, ``style``, ``code``, ``pre``, ``textarea``, ``template`` and every
   element with ``translate="no"`` (and all inside them). Inside a segment such an element is one
   opaque piece carried across like an empty inline element (at the position of the words around
   it), its text unchanged.
4. **Attributes** that people read (``TRANSLATED_ATTRIBUTES``: ``alt``, ``title``, ``placeholder``,
   ``aria-label``, ``label``, and ``content`` of a text ``<meta>``: ``TRANSLATED_META``) are translated
   as plain text, in one batch before the blocks, and written back escaped, quoted as they were; the
   rest of the tag is kept as written. Not inside the elements left alone.
5. **Sentences**: each segment's text is split into sentences (``sentencex``, a maintained rule-based
   splitter for the source language), all sentences of the document are translated in batches, and
   the segment's markup is carried across by the word links of its sentences, offset into the
   segment (``markup.carry``): a tag may span a sentence boundary.

Why not a library for this: translation systems that keep HTML (Bergamot, CTranslate2's users) do this
step themselves; an HTML parser and a sentence splitter are the libraries, this module is the glue
that decides what is a segment.
"""
from __future__ import annotations

import html
import re
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import Iterator, Sequence

from ..alignment.matrices import Link
from ..errors import UserError
from ..io_utils import iter_lines
from .markup import VOID, WORD, Element, carry, element_links, parse

#: elements that are part of a line of text; every other element starts or ends a block
INLINE = frozenset({"a", "abbr", "b", "bdi", "bdo", "big", "br", "cite", "data", "del", "dfn", "em", "font", "i",
                    "img", "ins", "kbd", "label", "mark", "q", "s", "samp", "small", "span", "strike", "strong",
                    "sub", "sup", "time", "tt", "u", "var", "wbr"})
#: elements whose content is never translated (with any element marked translate="no")
KEEP = frozenset({"script", "style", "code", "pre", "textarea", "template"})
#: the void element that stands for an opaque piece inside a segment while it is translated
PLACEHOLDER = "seq2seq-keep"
#: attributes whose values are text for a reader, translated wherever the element is not left alone
TRANSLATED_ATTRIBUTES = frozenset({"alt", "title", "placeholder", "aria-label", "label"})
#: ``<meta name=...>`` (or ``property=...``) whose ``content`` is text for a reader
TRANSLATED_META = frozenset({"description", "keywords", "og:title", "og:description", "twitter:title",
                             "twitter:description"})
SPLITTER_MISSING = "translating HTML documents splits sentences with sentencex: pip install 'seq2seq[markup]'"


def is_document(text: str) -> bool:
    """Whether ``text`` is a whole HTML document (it starts with a doctype or an ``<html>`` element),
    rather than lines of text with inline markup."""
    return re.match(r"\s*(<!--.*?-->\s*)*<(!doctype\s+html|html[\s>])", text, re.IGNORECASE | re.DOTALL) is not None


def page_or_lines(path: str | None, flag: str, pages: bool) -> tuple[str | None, Iterator[str]]:
    """The input at ``path`` (``iter_lines``; ``flag`` names it in errors) as (the whole page, no lines)
    when ``pages`` and it is an HTML document (``is_document``), else as (None, its lines)."""
    if not pages:
        return None, iter_lines(path, flag)
    raw = list(iter_lines(path, flag, keep_ends=True))
    if is_document("".join(raw[:50])):
        return "".join(raw), iter(())
    return None, (line.removesuffix("\n").removesuffix("\r") for line in raw)


@dataclass
class Event:
    kind: str  # "start", "end", "startend", "text", "other" (comment, declaration, processing instruction)
    raw: str
    tag: str = ""
    keep: bool = False  # a start tag whose element is left alone (KEEP or translate="no")
    readable: tuple[str, ...] = ()  # its attributes that are text for a reader (``readable_attributes``)


class _Events(HTMLParser):
    """The document as ``Event`` objects whose ``raw`` texts concatenate to the document."""

    def __init__(self, document: str) -> None:
        super().__init__(convert_charrefs=False)
        self.document = document
        starts = [0] + [m.end() for m in re.finditer("\n", document)]
        self.line_starts = starts
        self.events: list[Event] = []
        self.marks: list[int] = []  # offset where each event starts

    def _mark(self, kind: str, tag: str = "", keep: bool = False, attrs=()) -> None:
        line, column = self.getpos()
        self.marks.append(self.line_starts[line - 1] + column)
        self.events.append(Event(kind, "", tag, keep, readable_attributes(tag, attrs)))

    def handle_starttag(self, tag: str, attrs) -> None:
        keep = tag in KEEP or any(k == "translate" and (v or "").strip().lower() == "no" for k, v in attrs)
        self._mark("startend" if tag in VOID else "start", tag, keep, attrs)

    def handle_startendtag(self, tag: str, attrs) -> None:
        self._mark("startend", tag, attrs=attrs)

    def handle_endtag(self, tag: str) -> None:
        self._mark("end", tag)

    def handle_data(self, data: str) -> None:  # also an entity or character reference, left as written
        self._mark("text")

    def handle_comment(self, data: str) -> None:  # also a declaration or processing instruction
        self._mark("other")

    handle_entityref = handle_charref = handle_data
    handle_decl = handle_pi = unknown_decl = handle_comment

    def read(self) -> list[Event]:
        self.feed(self.document)
        self.close()
        ends = self.marks[1:] + [len(self.document)]
        for event, start, end in zip(self.events, self.marks, ends):
            event.raw = self.document[start:end]
        if self.marks and self.marks[0] > 0:  # text before the first event (never in practice)
            self.events.insert(0, Event("other", self.document[:self.marks[0]]))
        return self.events


def readable_attributes(tag: str, attrs) -> tuple[str, ...]:
    """The names of ``attrs`` ((name, value) pairs of a start tag) whose values are text for a reader:
    ``TRANSLATED_ATTRIBUTES`` with a value that has a word, and a text ``<meta>``'s ``content``."""
    values = dict(attrs)
    names = [name for name, value in attrs if name in TRANSLATED_ATTRIBUTES and value and WORD.search(value)]
    if tag == "meta" and (values.get("name") or values.get("property") or "").lower() in TRANSLATED_META \
            and WORD.search(values.get("content") or ""):
        names.append("content")
    return tuple(dict.fromkeys(names))


#: one attribute of a start tag, scanned in order (so that a quoted value is never read as attributes):
#: leading space, name, and optionally "=" with its spacing and the value as written
ATTRIBUTE = re.compile(r"""(\s+)([^\s"'>/=]+)(?:(\s*=\s*)("[^"]*"|'[^']*'|[^\s"'=<>`]+))?""")


def _attributes(raw: str) -> Iterator[re.Match]:
    """The attributes of the start tag ``raw`` (``<name ...>``), in order."""
    position = re.match(r"<[^\s/>]*", raw).end()
    while (match := ATTRIBUTE.match(raw, position)) is not None:
        yield match
        position = match.end()


def attribute_values(raw: str, names: Sequence[str]) -> dict[str, str]:
    """The values (entities decoded) of the attributes ``names`` in the start tag ``raw``."""
    values = {}
    for match in _attributes(raw):
        name = match.group(2).lower()
        if name in names and match.group(4) is not None and name not in values:
            value = match.group(4)
            values[name] = html.unescape(value[1:-1] if value[0] in "\"'" else value)
    return values


def with_attribute_values(raw: str, values: dict[str, str]) -> str:
    """The start tag ``raw`` with each attribute of ``values`` set to that text (escaped, in the quotes it
    had; an unquoted value gets double quotes); every other byte of the tag as it was."""
    pieces, done, position = [], set(), 0
    for match in _attributes(raw):
        name = match.group(2).lower()
        if name in values and match.group(4) is not None and name not in done:
            quote = "'" if match.group(4)[0] == "'" else '"'
            escaped = html.escape(values[name], quote=False).replace(quote, "&quot;" if quote == '"' else "&#x27;")
            pieces += [raw[position:match.start(4)], f"{quote}{escaped}{quote}"]
            position = match.end(4)
            done.add(name)
    return "".join(pieces) + raw[position:]


def readable_events(events: list[Event]) -> list[Event]:
    """The start tags of ``events`` with readable attributes, outside the elements left alone."""
    found, index = [], 0
    while index < len(events):
        event = events[index]
        if event.kind == "start" and event.keep:
            index = _matching_end(events, index)
            continue
        if event.readable:
            found.append(event)
        index += 1
    return found


def translate_attributes(translator, readable: list[Event], decode=None) -> None:
    """Each event of ``readable`` (``readable_events``) with its readable attributes' values translated
    as plain text (one batch), written into its ``raw``: before the document is split, so that a tag
    inside a segment is carried across with its new values."""
    values = [attribute_values(event.raw, event.readable) for event in readable]
    texts = [" ".join(text.split()) for found in values for text in found.values()]
    if not texts:
        return
    translated = iter(result.text for result in translator.translate(texts, decode))
    for event, found in zip(readable, values):
        event.raw = with_attribute_values(event.raw, {name: next(translated) for name in found})


@dataclass
class Segment:
    """A run of text with inline markup: ``raw`` as written (opaque pieces replaced by placeholders,
    ``kept`` holds them in order), and what translating it needs."""

    raw: str
    kept: list[str] = field(default_factory=list)
    text: str = ""
    elements: list[Element] = field(default_factory=list)
    sentences: list[str] = field(default_factory=list)


def split_document(document: str | list[Event]) -> list[str | Segment]:
    """The document (or its ``_Events``) as verbatim pieces (str) and ``Segment`` objects to translate, in
    order; their raw texts concatenate to the document (placeholders put back)."""
    events = _Events(document).read() if isinstance(document, str) else document
    out: list[str | Segment] = []
    pieces: list[str] = []  # the open segment's raw text
    kept: list[str] = []

    def flush() -> None:
        raw = "".join(pieces)
        if raw:
            text = WORD.search(html.unescape(re.sub(r"<[^>]*>", " ", raw)))
            out.append(Segment(raw, list(kept)) if text else restore(raw, kept))
        pieces.clear()
        kept.clear()

    index = 0
    while index < len(events):
        event = events[index]
        if event.kind == "start" and event.keep:
            end = _matching_end(events, index)
            whole = "".join(e.raw for e in events[index:end])
            if event.tag in INLINE or event.tag == "code":  # inline and opaque: one piece of the segment
                pieces.append(f'<{PLACEHOLDER} n="{len(kept)}"/>')
                kept.append(whole)
            else:
                flush()
                out.append(whole)
            index = end
            continue
        inline = event.kind == "text" or (event.kind in ("start", "end", "startend") and event.tag in INLINE)
        if inline and (pieces or event.kind != "text" or event.raw.strip()):
            pieces.append(event.raw)
        else:
            flush()
            out.append(event.raw)
        index += 1
    flush()
    return out


def _matching_end(events: list[Event], start: int) -> int:
    """The index after the end tag that closes the element started at ``start`` (the end of the
    document if none does)."""
    tag, depth = events[start].tag, 0
    for index in range(start, len(events)):
        event = events[index]
        if event.kind == "start" and event.tag == tag:
            depth += 1
        elif event.kind == "end" and event.tag == tag:
            depth -= 1
            if depth == 0:
                return index + 1
    return len(events)


PLACEHOLDERS = re.compile(f'<{PLACEHOLDER} n="(\\d+)"/>')


def restore(raw: str, kept: Sequence[str], spacing: dict[int, tuple[bool, bool]] | None = None) -> str:
    """``raw`` with each placeholder replaced by the opaque piece it stands for; with ``spacing``
    (``spacing_of`` the source) a piece that had a space before or after it gets one there again."""
    def piece(match: re.Match) -> str:
        n = int(match.group(1))
        before, after = (spacing or {}).get(n, (False, False))
        text = kept[n]
        if before and match.start() > 0 and not raw[match.start() - 1].isspace():
            text = " " + text
        if after and match.end() < len(raw) and not raw[match.end()].isspace():
            text = text + " "
        return text

    return PLACEHOLDERS.sub(piece, raw)


def spacing_of(raw: str) -> dict[int, tuple[bool, bool]]:
    """Whether each placeholder of ``raw`` has whitespace right before and right after it."""
    return {int(m.group(1)): (m.start() > 0 and raw[m.start() - 1].isspace(),
                              m.end() < len(raw) and raw[m.end()].isspace()) for m in PLACEHOLDERS.finditer(raw)}


def sentence_splitter(language: str):
    """``split(text) -> list of sentences`` (concatenating to ``text``) for ``language``."""
    try:
        from sentencex import segment
    except ImportError:
        raise UserError(SPLITTER_MISSING) from None
    return lambda text: list(segment(language, text))


def sentences_of(text: str, split) -> list[str]:
    """``text``'s sentences, each with its whitespace words intact; the whole text as one sentence when
    the splitter cut inside a word."""
    parts = [part.strip() for part in split(text) if part.strip()]
    if sum(len(part.split()) for part in parts) != len(text.split()) or not parts:
        return [" ".join(text.split())]
    return parts


def translate_document(translator, document: str, decode=None, align=None, language: str | None = None,
                       backward=None) -> str:
    """``document`` (an HTML page) translated by ``translator`` (module docstring): its markup carried
    across by the word links of ``align`` (an ``AlignConfig``; default as ``translate_markup``; with
    ``backward``, a ``BackwardAligner``, symmetrized), sentences split by the rules of ``language``
    (default: the model's source language)."""
    from ..config import AlignConfig

    events = _Events(document).read()
    translate_attributes(translator, readable_events(events), decode)
    parts = split_document(events)
    segments = [part for part in parts if isinstance(part, Segment)]
    language = language or (translator.languages[0] if translator.languages else "en")
    split = sentence_splitter(language)
    for number, segment in enumerate(segments, start=1):
        core = segment.raw.strip()
        segment.text, segment.elements = parse(core, "html", f"document segment {number}")
        segment.sentences = sentences_of(segment.text, split)
    align = (align or AlignConfig()).for_model(translator.supervised_attention)
    flat = [sentence for segment in segments for sentence in segment.sentences]
    results = translator.translate(flat, decode, need_attention=True)
    marked = [bool(segment.elements) for segment in segments for _ in segment.sentences]
    links = element_links(results, flat, marked, align, backward)
    translated, start = {}, 0
    for segment in segments:
        end = start + len(segment.sentences)
        translated[id(segment)] = segment_translation(segment, results[start:end], links[start:end])
        start = end
    return "".join(translated[id(part)] if isinstance(part, Segment) else part for part in parts)


def segment_translation(segment: Segment, results: Sequence, own_links: Sequence[set[Link]]) -> str:
    """The segment's translation (its sentences' outputs ``results`` joined) with its markup carried across
    (``markup.carry``) by the sentences' word links ``own_links``, offset into the segment; whitespace around the
    segment as it was."""
    links: set[Link] = set()
    words: list[str] = []
    source_offset = 0
    for sentence, result, own in zip(segment.sentences, results, own_links):
        links |= {(i + source_offset, j + len(words)) for i, j in own}
        source_offset += len(sentence.split())
        words += result.text.split()
    lead = segment.raw[: len(segment.raw) - len(segment.raw.lstrip())]
    trail = segment.raw[len(segment.raw.rstrip()):]
    return lead + restore(carry(segment.elements, links, source_offset, words), segment.kept,
                          spacing_of(segment.raw)) + trail
