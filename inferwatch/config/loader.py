"""Reading a config file: the one place YAML is parsed, with every bound a user's file meets.

The bounds hold while the file is parsed, not after: an alias bomb (a few lines whose aliases
expand to billions of nodes, or one long string repeated through an alias) is refused as its
aliases are composed, before anything walks the document; nesting is refused at the level
that crosses the limit, and an integer literal is refused by its length before Python
converts it. Parsing runs in libyaml where it is built (the C parser) under PyYAML's Python
composer, which is where the bounds are counted.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
import yaml.cyaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.events import AliasEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.resolver import Resolver

__all__ = [
    "MAX_ALIAS_EXPANSION",
    "MAX_DEPTH",
    "MAX_FILE_BYTES",
    "MAX_INTEGER",
    "ConfigError",
    "compose",
    "decode",
    "load",
    "parse",
    "parse_all",
    "read_text",
]

#: the largest config file read, in bytes
MAX_FILE_BYTES = 4 << 20
#: what aliases may add to a document, weighed as its text would be written out: each node
#: one, plus the characters of each scalar. Counted in characters, not nodes, because one
#: alias of a long string is one node yet repeats the whole string into every generated file
#: (20 KB of config made a 16 MB alertmanager.yaml); 256 KiB leaves room for merge keys in a
#: config of thousands of tenants (about 70 per tenant)
MAX_ALIAS_EXPANSION = 256 << 10
#: mappings and lists inside one another
MAX_DEPTH = 48
#: an integer is a signed 64-bit value at most, as every consumer (Prometheus, Kubernetes) has
MAX_INTEGER = (1 << 63) - 1
_MAX_INTEGER_CHARS = 32  # sign, digits, underscores of any literal that can be in range


class ConfigError(ValueError):
    """A config file that cannot be used: one line, ``<file>: <field path>: <reason>``.

    Every component's config error derives from this, so the command line maps one class to
    one exit status. Keys and values come from the user's file, so characters that would break
    the line (a newline in a key) are shown escaped."""

    def __init__(self, message: str) -> None:
        super().__init__("".join(c if c.isprintable() else repr(c)[1:-1] for c in message))


class _Bounded(Exception):
    """A bound crossed while composing; becomes a ConfigError with the file's name."""

    def __init__(self, mark: Any, reason: str) -> None:
        super().__init__(reason)
        self.line = None if mark is None else mark.line + 1
        self.reason = reason


class _PythonParser(yaml.reader.Reader, yaml.scanner.Scanner, yaml.parser.Parser):
    """PyYAML's own parser, for a PyYAML built without libyaml."""

    def __init__(self, stream: str) -> None:
        yaml.reader.Reader.__init__(self, stream)
        yaml.scanner.Scanner.__init__(self)
        yaml.parser.Parser.__init__(self)


_Parser: Any = yaml.cyaml.CParser if yaml.__with_libyaml__ else _PythonParser  # type: ignore[attr-defined]


class _Loader(Composer, _Parser, SafeConstructor, Resolver):  # type: ignore[misc]
    """libyaml's parser under PyYAML's composer, which counts the bounds, and safe constructor."""

    def __init__(self, stream: str) -> None:
        _Parser.__init__(self, stream)
        Composer.__init__(self)
        SafeConstructor.__init__(self)
        Resolver.__init__(self)
        self._expanded = 0
        self._depth = 0
        self._sizes: dict[int, int] = {}
        #: anchors whose node is still being composed: an alias of one would make a cycle
        self._open: set[str] = set()

    def _size(self, node: Node) -> int:
        """The weight of ``node`` with aliases expanded: its nodes and scalar characters
        (memoised, so a node shared through aliases is walked once)."""
        known = self._sizes.get(id(node))
        if known is None:
            if isinstance(node, SequenceNode):
                known = 1 + sum(self._size(item) for item in node.value)
            elif isinstance(node, MappingNode):
                known = 1 + sum(self._size(k) + self._size(v) for k, v in node.value)
            else:
                known = 1 + len(node.value)
            self._sizes[id(node)] = known
        return known

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        if self.check_event(AliasEvent):
            event = self.peek_event()
            if event.anchor in self._open:
                raise _Bounded(event.start_mark, f"alias *{event.anchor} is inside its own anchor")
            target = self.anchors.get(event.anchor)
            if target is not None:
                self._expanded += self._size(target)
                if self._expanded > MAX_ALIAS_EXPANSION:
                    raise _Bounded(
                        event.start_mark,
                        f"aliases expand to more than {MAX_ALIAS_EXPANSION} characters "
                        "(write the repeated values out)",
                    )
        return super().compose_node(parent, index)

    @contextlib.contextmanager
    def _nested(self, anchor: str | None) -> Iterator[None]:
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise _Bounded(self.peek_event().start_mark, f"nested deeper than {MAX_DEPTH} levels")
        if anchor is not None:
            self._open.add(anchor)
        try:
            yield
        finally:
            self._depth -= 1
            self._open.discard(anchor or "")

    def compose_sequence_node(self, anchor: Any) -> SequenceNode:
        with self._nested(anchor):
            return super().compose_sequence_node(anchor)

    def compose_mapping_node(self, anchor: Any) -> MappingNode:
        with self._nested(anchor):
            return super().compose_mapping_node(anchor)

    def construct_yaml_int(self, node: ScalarNode) -> int:
        if len(node.value) > _MAX_INTEGER_CHARS:
            raise _Bounded(node.start_mark, f"integer larger than {MAX_INTEGER}")
        value = int(SafeConstructor.construct_yaml_int(self, node))
        if abs(value) > MAX_INTEGER:
            raise _Bounded(node.start_mark, f"integer larger than {MAX_INTEGER}")
        return value


_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int)


def _error(source: str, exc: Exception, error: type[ConfigError]) -> ConfigError:
    if isinstance(exc, _Bounded):
        where = "top level" if exc.line is None else f"line {exc.line}"
        return error(f"{source}: {where}: {exc.reason}")
    mark = getattr(exc, "problem_mark", None)
    where = f"line {mark.line + 1}" if mark is not None else "top level"
    problem = getattr(exc, "problem", None) or str(exc)
    return error(f"{source}: {where}: invalid YAML: {problem}")


@contextlib.contextmanager
def _loader(text: str, source: str, error: type[ConfigError]) -> Iterator[_Loader]:
    try:
        loader = _Loader(text)
        try:
            yield loader
        finally:
            loader.dispose()
    except (yaml.YAMLError, _Bounded) as exc:
        raise _error(source, exc, error) from None


def read_text(
    path: str | Path, source: str | None = None, error: type[ConfigError] = ConfigError
) -> str:
    """The UTF-8 text of a config file of at most MAX_FILE_BYTES; ConfigError otherwise."""
    source = str(path) if source is None else source
    try:
        with Path(path).open("rb") as stream:
            data = stream.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise error(f"{source}: top level: cannot read: {exc.strerror}") from None
    if len(data) > MAX_FILE_BYTES:
        raise error(f"{source}: top level: larger than {MAX_FILE_BYTES} bytes")
    return decode(data, source, error)


def decode(data: bytes, source: str, error: type[ConfigError] = ConfigError) -> str:
    """``data`` as UTF-8 text (a leading byte-order mark dropped); ConfigError otherwise."""
    if len(data) > MAX_FILE_BYTES:
        raise error(f"{source}: top level: larger than {MAX_FILE_BYTES} bytes")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise error(f"{source}: line {line}: not UTF-8 text") from None


def parse(text: str, source: str, error: type[ConfigError] = ConfigError) -> Any:
    """The one document in ``text`` (None when empty); ConfigError naming ``source``."""
    if len(text) > MAX_FILE_BYTES:
        raise error(f"{source}: top level: larger than {MAX_FILE_BYTES} bytes")
    with _loader(text, source, error) as loader:
        return loader.get_single_data()


def parse_all(text: str, source: str, error: type[ConfigError] = ConfigError) -> list[Any]:
    """Every document in ``text`` (a multi-document stream such as CRDs), empty ones left out."""
    documents = []
    with _loader(text, source, error) as loader:
        while loader.check_data():  # type: ignore[no-untyped-call]
            document = loader.get_data()
            if document is not None:
                documents.append(document)
    return documents


def compose(text: str, source: str, error: type[ConfigError] = ConfigError) -> Node | None:
    """The node tree of ``text``, for a reader that reports the line of each field."""
    with _loader(text, source, error) as loader:
        node: Node | None = loader.get_single_node()
        return node


def load(
    path: str | Path, source: str | None = None, error: type[ConfigError] = ConfigError
) -> Any:
    """The parsed document of the config file at ``path``; ConfigError when it is unusable."""
    source = str(path) if source is None else source
    return parse(read_text(path, source, error), source, error)
