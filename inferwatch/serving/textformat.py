"""Fast, tolerant parser for the Prometheus text exposition formats.

Reads Prometheus text 0.0.4, the ``text/plain; version=1.0.0`` text that prometheus_client 0.26
serves (which may quote UTF-8 names), and OpenMetrics 1.0 text. One bad line must never cost a
whole scrape: a line that cannot be read is skipped and counted in
``Exposition.malformed_lines``, and the rest of the page is kept.

Speed comes from two tiers. The fast path reads the shape nearly every engine line has
(``name value`` or ``name{labels} value`` without escapes) with a few str methods, and memoises
what the text before the value means (sample name and labels) across calls, because a sidecar
parses the same series every scrape; names and label values are interned so that a scrape
touches little memory. Everything else (escapes, quoted names, timestamps, exemplars, odd
spacing) goes to a careful parser. The fast path only accepts lines that the careful parser
would read the same way.

Families are keyed by the name declared in ``# TYPE`` (or ``# HELP``): a counter from a 0.0.4
page is ``x_total`` and its ``x_created`` is a gauge family of its own, while in OpenMetrics
the counter family is ``x`` holding ``x_total`` and ``x_created``. A sample with no declared
family becomes an untyped family named after the sample.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Container, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

from inferwatch.serving.fastpath import remember

__all__ = [
    "Exposition",
    "Family",
    "PageSample",
    "Wanted",
    "clear_caches",
    "parse",
]

Wanted = Callable[[str], bool] | Container[str]
"""Family-name filter: a predicate, or a container of the family names to keep."""

# Samples with these suffixes belong to a declared family of the given type (OpenMetrics rules;
# prometheus_client's 0.0.4 output declares its counter and _created families by full name).
_GROUPED_SUFFIXES: dict[str, frozenset[str]] = {
    "counter": frozenset(("_total", "_created")),
    "summary": frozenset(("_sum", "_count", "_created")),
    "histogram": frozenset(("_bucket", "_sum", "_count", "_created")),
    "gaugehistogram": frozenset(("_bucket", "_gsum", "_gcount")),
    "info": frozenset(("_info",)),
}
_TYPES = frozenset(
    {"counter", "gauge", "histogram", "summary", "untyped", "unknown"}
    | {"gaugehistogram", "info", "stateset"}
)
_METADATA_KEYWORDS = frozenset(("HELP", "TYPE", "UNIT"))

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL_NAME = r"[a-zA-Z_][a-zA-Z0-9_]*"
_QUOTED = r'"((?:[^"\\]|\\.)*)"'
_LEGACY_NAME = re.compile(_NAME)
# One label term: a name (bare or quoted) with a quoted value, or a lone quoted metric name,
# then the separator that follows it.
_LABEL_TERM = re.compile(
    rf"[ \t]*(?:({_LABEL_NAME})|{_QUOTED})[ \t]*(?:=[ \t]*{_QUOTED})?[ \t]*([,}}])"
)
_LABELS_CLOSE = re.compile(r"[ \t]*,?[ \t]*\}")
_LABELS_END = re.compile(r"[ \t]*\}")
# A label name as it sits between quotes in a label set: "engine=" first, ",le=" after.
_LABEL_PIECE = re.compile(rf"[ \t]*(,?)[ \t]*({_LABEL_NAME})[ \t]*=[ \t]*")
_METADATA = re.compile(rf"#[ \t]+(HELP|TYPE|UNIT)(?:[ \t]+(?:({_NAME})|{_QUOTED}))?(?:[ \t](.*))?")
_METADATA_START = re.compile(r"#[ \t]+(?:HELP|TYPE|UNIT)(?:[ \t]|$)")
_ESCAPE = re.compile(r'\\[\\n"]')
_HELP_ESCAPE_004 = re.compile(r"\\[\\n]")
_UNESCAPED = {"\\\\": "\\", "\\n": "\n", '\\"': '"'}

# Memos shared by all calls; pure functions of their keys, cleared when they reach the limit.
_MEMO_LIMIT = 1 << 15
_series: dict[str, tuple[str, dict[str, str]]] = {}
_label_pieces: dict[str, tuple[str, bool] | None] = {}
_legacy_names: dict[str, bool] = {}
#: (keyword, family name, text, grouped sample names, their line starts): see _learn_comment
_Comment = tuple[str, str, str, tuple[str, ...], tuple[str, ...]]
_comments: dict[bool, dict[str, _Comment]] = {False: {}, True: {}}
_line_starts: dict[str, tuple[str, str]] = {}


class PageSample(NamedTuple):
    """One sample line. ``timestamp`` is in seconds (0.0.4 milliseconds are converted).

    A named tuple: a scrape builds one per sample it keeps (straight from a tuple, without
    the Python-level constructor) and readers take them apart by unpacking. Immutable: the
    labels dict is the sample's own, but the fields cannot be reassigned.
    """

    name: str
    labels: dict[str, str]
    value: float
    timestamp: float | None = None


@dataclass(slots=True)
class Family:
    """Samples under one ``# TYPE`` declaration (or one bare sample name when untyped)."""

    name: str
    type: str
    help: str = ""
    unit: str = ""
    samples: list[PageSample] = field(default_factory=list)


@dataclass(slots=True)
class Exposition:
    """A parsed page.

    ``lines`` counts non-empty lines; ``malformed_lines`` those skipped because they could
    not be read (lines of families filtered out by ``wanted`` are not checked).
    ``openmetrics`` says which format the page was read as.
    """

    families: dict[str, Family]
    malformed_lines: int = 0
    lines: int = 0
    openmetrics: bool = False


class _Malformed(ValueError):
    """A line that cannot be read; it is skipped and counted."""


def _discard(sample: PageSample) -> None:
    """Where samples of families the caller did not ask for go."""


def parse(
    text: str | bytes, *, wanted: Wanted | None = None, openmetrics: bool | None = None
) -> Exposition:
    """Parse an exposition page; never raises on bad input.

    ``wanted`` limits the result to the named families (declared names, or the sample name
    of an undeclared one); samples of other families are dropped without building them or
    reading their values (the lines of a dropped sample name that follow it are passed over
    with one string comparison each). ``openmetrics`` selects the format (timestamps in
    seconds rather than milliseconds, ``# EOF`` ends the page, ``\"`` in help); by default a
    page whose last line is ``# EOF`` is read as OpenMetrics.
    """
    if isinstance(text, bytes):
        text = text.decode("utf-8-sig", errors="replace")
    elif text.startswith("\ufeff"):
        text = text[1:]
    if "\r" in text:
        text = text.replace("\r\n", "\n")
    if openmetrics is None:
        openmetrics = _ends_with_eof(text)
    page = _Page(wanted, openmetrics)
    lines = text.split("\n")
    malformed = page.read(filter(None, lines), openmetrics)
    return Exposition(page.families, malformed, len(lines) - lines.count(""), openmetrics)


def clear_caches() -> None:
    """Forget memoised names and label sets (memory, or a first-scrape measurement)."""
    _series.clear()
    _label_pieces.clear()
    _legacy_names.clear()
    _line_starts.clear()
    for memo in _comments.values():
        memo.clear()


def _ends_with_eof(text: str) -> bool:
    tail = text[-64:].rstrip()
    return tail == "# EOF" or tail.endswith("\n# EOF")


class _Page:
    """Families of one page, and where each sample name's samples go."""

    __slots__ = ("declared", "default_type", "families", "keep", "route", "types")

    def __init__(self, wanted: Wanted | None, openmetrics: bool) -> None:
        self.keep: Callable[[str], bool] | None = (
            None if wanted is None else wanted if callable(wanted) else wanted.__contains__
        )
        self.default_type = "unknown" if openmetrics else "untyped"
        self.families: dict[str, Family] = {}  # what the caller gets: wanted families only
        # Every family seen; None for one the caller did not ask for (never built).
        self.declared: dict[str, Family | None] = {}
        self.types: dict[str, str] = {}  # the explicit # TYPE of each family that has one
        # Sample name -> the append of its family's sample list, or _discard when unwanted.
        # A family's own name always routes to it; suffixed names only when nothing else
        # claimed them, so an exact declaration beats a grouping suffix.
        self.route: dict[str, Callable[[PageSample], object]] = {}

    def read(self, lines: Iterator[str], openmetrics: bool) -> int:
        """Consume the lines (up to ``# EOF`` in OpenMetrics); returns the malformed count."""
        malformed = 0
        route = self.route
        series_memo = _series
        comments = _comments[openmetrics]
        declared = self.declared
        discard = _discard
        new_sample = tuple.__new__  # a PageSample without its Python-level __new__
        # How the lines of sample names known to be dropped begin: those of the last sample
        # dropped, or of an unwanted family just declared. Only a comment line can change
        # where an existing sample name goes, so until the next one, a line that begins so is
        # a sample that would be dropped too (or a malformed line, unchecked when unwanted).
        dropping: tuple[str, ...] = ()
        for line in lines:
            if dropping and line.startswith(dropping):
                continue
            if line[0] == "#":
                dropping = ()
                comment = comments.get(line) or _learn_comment(line, openmetrics)
                keyword, name, text, grouped, starts = comment
                if keyword == "TYPE":
                    malformed += self.declare_type(name, text, grouped)
                    if route[name] is discard:
                        dropping = self.dropped(grouped, starts)
                elif keyword == "HELP":
                    family = declared[name] if name in declared else self.family(name)
                    if family is not None:
                        family.help = text
                elif keyword == "UNIT":
                    family = declared[name] if name in declared else self.family(name)
                    if family is not None:
                        family.unit = text
                elif keyword == "EOF":
                    break
                elif keyword:
                    malformed += 1
                continue
            # Fast path: "name{labels} value" or "name value", nothing after the value.
            head, _, value = line.rpartition(" ")
            series = series_memo.get(head) or _learn_series(head)
            if series is None or "_" in value:
                malformed += self.careful(line, openmetrics)
                continue
            name, labels = series
            add = route.get(name) or self.untyped(name)
            if add is discard:
                dropping = _line_starts.get(name) or _learn_line_starts(name)
                continue
            try:
                add(new_sample(PageSample, (name, labels.copy(), float(value), None)))
            except ValueError:
                malformed += self.careful(line, openmetrics)
        for line in lines:  # only left over after # EOF
            if line.strip():
                malformed += 1
        return malformed

    def family(self, name: str) -> Family | None:
        """The family declared as ``name``, created untyped on first mention; None when the
        caller does not want it (its samples are routed to nowhere)."""
        if name in self.declared:
            return self.declared[name]
        if self.keep is None or self.keep(name):
            family = Family(name, self.default_type)
            self.families[name] = family
            self.route[name] = family.samples.append
        else:
            family = None
            self.route[name] = _discard
        self.declared[name] = family
        return family

    def untyped(self, sample_name: str) -> Callable[[PageSample], object]:
        """Route for a sample that no declaration covers: a family of its own."""
        self.family(sample_name)
        return self.route[sample_name]

    def declare_type(self, name: str, type_: str, grouped: tuple[str, ...]) -> int:
        """Apply ``# TYPE`` (``grouped``: the sample names the type groups under the family);
        returns 1 when it contradicts an earlier one (malformed)."""
        declared = self.types.get(name)
        if declared is not None:
            return int(declared != type_)
        self.types[name] = type_
        family = self.declared[name] if name in self.declared else self.family(name)
        if family is not None:
            family.type = type_
        route = self.route
        add = route[name]
        for sample_name in grouped:
            route.setdefault(sample_name, add)
        return 0

    def dropped(self, grouped: tuple[str, ...], starts: tuple[str, ...]) -> tuple[str, ...]:
        """Line starts of sample names an unwanted family's ``# TYPE`` routes nowhere:
        ``starts`` (those of its own name, then of each grouped name), or only its own when
        another family claimed a grouped name first (rare: found by its first line then)."""
        route = self.route
        for sample_name in grouped:
            if route.get(sample_name) is not _discard:
                return starts[:2]
        return starts

    def careful(self, line: str, openmetrics: bool) -> int:
        """Read a line the fast path declined; returns 1 when it is malformed, else 0."""
        if line.isspace():
            return 0
        try:
            name, labels, value, timestamp = _careful_sample(line, openmetrics)
        except _Malformed:
            return 1
        add = self.route.get(name) or self.untyped(name)
        add(PageSample(name, labels, value, timestamp))
        return 0


def _starts(sample_name: str) -> tuple[str, str]:
    """The beginnings a line of this sample name can have: "name{" or "name ". A line that
    begins with either is a sample of that name or malformed."""
    return (sample_name + "{", sample_name + " ")


def _learn_line_starts(sample_name: str) -> tuple[str, str]:
    return remember(_line_starts, sample_name, _starts(sample_name), _MEMO_LIMIT)


def _learn_comment(line: str, openmetrics: bool) -> _Comment:
    """What a ``#`` line says, as (keyword, family name, text, grouped, starts), memoised
    per format.

    The keyword is HELP, TYPE or UNIT (with the help unescaped and the type checked), EOF,
    "" for a plain comment, or "malformed" for a HELP/TYPE/UNIT line that cannot be read.
    For a TYPE line, ``grouped`` are the suffixed sample names its type puts under the
    family (``x_bucket`` for a histogram ``x``) and ``starts`` how lines of the family's own
    name and then of each grouped name begin; both are empty for other lines.
    """
    parts = line.split(" ", 3)
    if (
        len(parts) > 2
        and parts[0] == "#"
        and parts[1] in _METADATA_KEYWORDS
        and _is_legacy_name(parts[2])
    ):
        keyword, name = parts[1], parts[2]
        text = parts[3] if len(parts) == 4 else ""
    else:
        match = _METADATA.fullmatch(line)
        if match is not None and (match[2] or match[3]):
            keyword = match[1]
            name = match[2] if match[3] is None else _unescape(match[3])
            text = match[4] or ""
        elif openmetrics and line == "# EOF":
            keyword, name, text = "EOF", "", ""
        elif _METADATA_START.match(line) is None:
            keyword, name, text = "", "", ""
        else:
            keyword, name, text = "malformed", "", ""
    if keyword == "HELP":
        text = _help_text(text, openmetrics)
    elif keyword in ("TYPE", "UNIT"):
        text = text.strip()
        if keyword == "TYPE" and text not in _TYPES:
            keyword = "malformed"
    grouped: tuple[str, ...] = ()
    starts: tuple[str, ...] = ()
    if keyword == "TYPE":
        grouped = tuple(sys.intern(name + suffix) for suffix in _GROUPED_SUFFIXES.get(text, ()))
        starts = tuple(start for sample_name in (name, *grouped) for start in _starts(sample_name))
    comment = (keyword, name, text, grouped, starts)
    return remember(_comments[openmetrics], line, comment, _MEMO_LIMIT)


def _help_text(text: str, openmetrics: bool) -> str:
    if openmetrics:
        return _ESCAPE.sub(_unescape_match, text) if "\\" in text else text
    text = text.strip()
    return _HELP_ESCAPE_004.sub(_unescape_match, text) if "\\" in text else text


def _is_legacy_name(name: str) -> bool:
    if name in _legacy_names:
        return True
    if _LEGACY_NAME.fullmatch(name) is None:
        return False
    return remember(_legacy_names, name, True, _MEMO_LIMIT)


def _learn_series(head: str) -> tuple[str, dict[str, str]] | None:
    """Name and labels of the text before a sample's value, memoised; None when that text
    is not a plain ``name`` or ``name{labels}`` (the careful parser then reads the line)."""
    brace = head.find("{")
    if brace < 0:
        name = head
        labels: dict[str, str] | None = {}
    else:
        name = head[:brace]
        labels = _fast_labels(head[brace + 1 : -1]) if head[-1:] == "}" else None
    # Interned names and values are shared by many series, so a scrape touches less memory.
    series = None if labels is None or not _is_legacy_name(name) else (sys.intern(name), labels)
    if series is not None:
        remember(_series, head, series, _MEMO_LIMIT)
    return series


def _fast_labels(text: str) -> dict[str, str] | None:
    """Labels of a set without escapes or quoted names; None when it has either.

    Without backslashes every quote opens or closes a value, so splitting on quotes leaves
    the label names (with their ``=`` and separating commas) at even positions.
    """
    if "\\" in text:
        return None
    parts = text.split('"')
    if len(parts) % 2 == 0 or parts[-1].strip(" \t") not in ("", ","):
        return None
    names = []
    for position, piece in enumerate(parts[0:-1:2]):
        known = _label_pieces[piece] if piece in _label_pieces else _learn_label_piece(piece)
        if known is None or (position and not known[1]):
            return None
        names.append(known[0])
    labels = dict(zip(names, map(sys.intern, parts[1::2]), strict=True))
    if len(labels) != len(names) or "__name__" in labels:
        return None
    return labels


def _learn_label_piece(piece: str) -> tuple[str, bool] | None:
    match = _LABEL_PIECE.fullmatch(piece)
    known = None if match is None else (sys.intern(match[2]), bool(match[1]))
    remember(_label_pieces, piece, known, _MEMO_LIMIT)
    return known


def _careful_sample(
    line: str, openmetrics: bool
) -> tuple[str, dict[str, str], float, float | None]:
    """Read any well-formed sample line, or raise _Malformed."""
    position = len(line) - len(line.lstrip(" \t"))
    match = _LEGACY_NAME.match(line, position)
    name = "" if match is None else match[0]
    position += len(name)
    labels: dict[str, str] = {}
    after_name = line[position:].lstrip(" \t")
    if after_name.startswith("{"):
        position = len(line) - len(after_name) + 1
        labels, quoted_name, position = _careful_labels(line, position)
        if "__name__" in labels:
            quoted_name = labels.pop("__name__") if quoted_name is None else ""
        if quoted_name is not None:
            if name or not quoted_name:
                raise _Malformed(line)
            name = quoted_name
    elif not after_name or after_name == line[position:]:
        raise _Malformed(line)  # no blank between name and value
    if not name:
        raise _Malformed(line)
    tokens = line[position:].split()
    for index, token in enumerate(tokens):
        if token.startswith("#"):  # OpenMetrics exemplar: ignored
            tokens = tokens[:index]
            break
    if not 1 <= len(tokens) <= 2:
        raise _Malformed(line)
    value = _number(tokens[0], line)
    if len(tokens) == 1:
        return name, labels, value, None
    timestamp = _number(tokens[1], line)
    return name, labels, value, timestamp if openmetrics else timestamp / 1000


def _careful_labels(line: str, position: int) -> tuple[dict[str, str], str | None, int]:
    """Labels from just after ``{``; also a lone quoted metric name and the end position."""
    labels: dict[str, str] = {}
    quoted_name = None
    close = _LABELS_CLOSE.match(line, position)  # {} or a lone comma
    if close is not None:
        return labels, None, close.end()
    if line[position : position + 1] == ",":
        position += 1  # leading comma, tolerated as prometheus_client does
    while True:
        term = _LABEL_TERM.match(line, position)
        if term is None:
            raise _Malformed(line)
        label_name = term[1] if term[1] is not None else _unescape(term[2])
        if term[3] is None:
            if term[2] is None or quoted_name is not None or labels:
                raise _Malformed(line)
            quoted_name = label_name
        elif label_name in labels:
            raise _Malformed(line)
        else:
            labels[label_name] = _unescape(term[3])
        position = term.end()
        if term[4] == "}":
            return labels, quoted_name, position
        close = _LABELS_END.match(line, position)
        if close is not None:  # trailing comma
            return labels, quoted_name, close.end()


def _number(token: str, line: str) -> float:
    if "_" in token:
        raise _Malformed(line)
    try:
        return float(token)
    except ValueError:
        raise _Malformed(line) from None


def _unescape(text: str) -> str:
    return _ESCAPE.sub(_unescape_match, text) if "\\" in text else text


def _unescape_match(match: re.Match[str]) -> str:
    return _UNESCAPED[match[0]]
