"""Declaring a config's schema: typed reads of one mapping, each failing with its field path.

A loader walks its document with a :class:`Fields` per mapping and reads each field as the
type it is (``fields.integer("max_tenants", 100)``), so that the schema, its defaults and its
checks between fields are one piece of plain code, and every mistake is one line,
``<file>: <field path>: <reason>``.

Why not pydantic v2 (msgspec was not measured: it is not installed here and reads no YAML
positions either). ``bench/config_schema.py`` on this machine (2 shared cores), a proxy config
of 2,000 tenants (338 KiB): parsing the YAML takes 114-138 ms; validating it takes 18-19 ms
with this reader (every field and check of the proxy) and 7-8 ms with a pydantic model of the
tenants alone; importing ``pydantic.main`` costs 38 ms in every process that loads a config.
So pydantic would save about 11 ms on the largest config and cost 38 ms on every start, and
load time is the YAML's either way. Its error for a bad window spans four lines
(``tenant-0.budget.window\n  Value error, expected ... [type=value_error, input_value=...]``
and a URL) and would need a formatter of its own to give ``<file>: <field>: <reason>``, which
this reader gives as ``bench.yaml: tenants.tenant-0.budget.window: expected a duration such as
30s, 5m, 1h30m or 2d, got '1.5m'``. The figures favour keeping the schema ours, in one place.
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any, TypeVar

from inferwatch.config.duration import Duration
from inferwatch.config.loader import ConfigError

__all__ = [
    "ZERO",
    "Fail",
    "Fields",
    "address_of",
    "choice_of",
    "duration_of",
    "flag_of",
    "host_port",
    "integer_of",
    "kind",
    "matching_of",
    "number_of",
    "text_of",
]

T = TypeVar("T")
#: builds the error of one field from its reason
Fail = Callable[[str], ConfigError]


def kind(value: Any) -> str:
    """How a wrong value is shown in an error: its YAML spelling, or what it is."""
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return f"{str(value).lower()} (a boolean)"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return repr(value)


ZERO = Duration(0)


class Fields:
    """One mapping of a config document, read field by field; ``error`` is the class raised.

    Each typed read is one of the ``*_of`` checks below applied to one field, so that a list's
    items (:meth:`each`) are checked by the same rule as a field of the same type."""

    def __init__(
        self, source: str, raw: Any, path: str = "", error: type[ConfigError] = ConfigError
    ) -> None:
        self.source, self.path, self.error_class = source, path, error
        if raw is None:
            raw = {}
        if not isinstance(raw, Mapping):
            raise self.error("", f"expected a mapping, got {kind(raw)}")
        self.raw: Mapping[Any, Any] = raw

    def where(self, key: str) -> str:
        return ".".join(part for part in (self.path, key) if part) or "top level"

    def error(self, key: str, reason: str) -> ConfigError:
        return self.error_class(f"{self.source}: {self.where(key)}: {reason}")

    def error_at(self, key: str) -> Fail:
        return lambda reason: self.error(key, reason)

    def check_keys(
        self, allowed: AbstractSet[str], required: AbstractSet[str] = frozenset()
    ) -> None:
        unknown = sorted(str(k) for k in self.raw if k not in allowed)
        if unknown:
            raise self.error(unknown[0], f"unknown field (expected one of {sorted(allowed)})")
        for key in sorted(required - set(self.raw)):
            raise self.error(key, "is required")

    def child(self, key: str) -> Fields:
        return Fields(self.source, self.raw.get(key), self.where(key), self.error_class)

    def entries(self) -> Iterator[tuple[str, Fields]]:
        """Each ``name: mapping`` entry of an open mapping (tenants, models)."""
        for name in self.raw:
            yield str(name), self.child(str(name))

    def items(self, key: str) -> list[Any]:
        value = self.raw.get(key, [])
        if not isinstance(value, list):
            raise self.error(key, f"expected a list, got {kind(value)}")
        return value

    def each(
        self, key: str, check: Callable[[Any, Fail], T], max_items: int | None = None
    ) -> list[T]:
        """A list (empty when absent), each item read by ``check`` as ``key[index]``."""
        values = self.items(key)
        if max_items is not None and len(values) > max_items:
            raise self.error(key, f"expected at most {max_items} items, got {len(values)}")
        return [check(value, self.error_at(f"{key}[{i}]")) for i, value in enumerate(values)]

    def records(self, key: str) -> list[Fields]:
        """A list of mappings (empty when absent), each read as ``key[index]``."""
        return [
            Fields(self.source, value, self.where(f"{key}[{i}]"), self.error_class)
            if isinstance(value, Mapping)
            else _not_a_mapping(value, self.error_at(f"{key}[{i}]"))
            for i, value in enumerate(self.items(key))
        ]

    def number(
        self, key: str, default: float, minimum: float = 0.0, maximum: float = math.inf
    ) -> float:
        return number_of(self.raw.get(key, default), self.error_at(key), minimum, maximum)

    def integer(self, key: str, default: int, minimum: int = 0, maximum: int | None = None) -> int:
        return integer_of(self.raw.get(key, default), self.error_at(key), minimum, maximum)

    def text(self, key: str, default: str | None = None, numbers: bool = True) -> str:
        """A string; without a default, a required non-empty one."""
        return text_of(self.raw.get(key, default), self.error_at(key), default is None, numbers)

    def matching(
        self, key: str, default: str, pattern: re.Pattern[str], what: str, max_length: int
    ) -> str:
        """A string that ``pattern`` matches whole, of at most ``max_length`` characters."""
        value = self.raw.get(key, default)
        return matching_of(value, self.error_at(key), pattern, what, max_length)

    def choice(self, key: str, default: str, choices: Sequence[str]) -> str:
        return choice_of(self.raw.get(key, default), self.error_at(key), choices)

    def flag(self, key: str, default: bool) -> bool:
        return flag_of(self.raw.get(key, default), self.error_at(key))

    def duration(
        self, key: str, default: Duration | str, minimum: Duration = ZERO, seconds_int: bool = False
    ) -> Duration:
        """A Prometheus duration; with ``seconds_int``, a whole number of seconds as well."""
        return duration_of(self.raw.get(key, default), self.error_at(key), minimum, seconds_int)


def _not_a_mapping(value: Any, fail: Fail) -> Fields:
    raise fail(f"expected a mapping, got {kind(value)}")


def number_of(
    value: Any, fail: Fail, minimum: float = -math.inf, maximum: float = math.inf
) -> float:
    """A finite number from ``minimum`` to ``maximum``."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or not minimum <= value <= maximum
    ):
        if maximum == math.inf:
            expected = "a number" if minimum == -math.inf else f"a number >= {minimum:g}"
        elif minimum == -math.inf:
            expected = f"a number <= {maximum:g}"
        else:
            expected = f"a number from {minimum:g} to {maximum:g}"
        raise fail(f"expected {expected}, got {kind(value)}")
    return float(value)


def integer_of(value: Any, fail: Fail, minimum: int = 0, maximum: int | None = None) -> int:
    """An integer from ``minimum`` to ``maximum`` (no upper bound when None)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < minimum
        or (maximum is not None and value > maximum)
    ):
        expected = f">= {minimum}" if maximum is None else f"from {minimum} to {maximum}"
        raise fail(f"expected an integer {expected}, got {kind(value)}")
    return value


def text_of(value: Any, fail: Fail, non_empty: bool = False, numbers: bool = True) -> str:
    """A string; with ``numbers``, a number is taken as its spelling (a version such as
    ``1.0``)."""
    if non_empty and (not isinstance(value, str) or not value):
        raise fail(f"expected a non-empty string, got {kind(value)}")
    accepted = (str, int, float) if numbers else str
    if not isinstance(value, accepted) or isinstance(value, bool):
        raise fail(f"expected a string, got {kind(value)}")
    return str(value)


def matching_of(
    value: Any, fail: Fail, pattern: re.Pattern[str], what: str, max_length: int
) -> str:
    """A string ``pattern`` matches whole: a name that lands in a manifest or a config line,
    so a number is not taken for its spelling (``1.10`` would become ``1.1``)."""
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise fail(f"expected {what}, got {kind(value)}")
    if len(value) > max_length:
        raise fail(f"expected {what} of at most {max_length} characters, got {len(value)}")
    return value


def choice_of(value: Any, fail: Fail, choices: Sequence[str]) -> str:
    """One of ``choices``, spelled exactly."""
    if not isinstance(value, str) or value not in choices:
        raise fail(f"expected one of {', '.join(choices)}, got {kind(value)}")
    return value


def flag_of(value: Any, fail: Fail) -> bool:
    if not isinstance(value, bool):
        raise fail(f"expected true or false, got {kind(value)}")
    return value


def duration_of(
    value: Any,
    fail: Fail,
    minimum: Duration = ZERO,
    seconds_int: bool = False,
) -> Duration:
    """``value`` as a duration of at least ``minimum``; ``fail(reason)`` builds the error."""
    if isinstance(value, Duration):
        duration = value
    elif seconds_int and isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        duration = Duration.of_seconds(value)
    elif isinstance(value, str):
        try:
            duration = Duration.parse(value)
        except ValueError as exc:
            raise fail(str(exc)) from None
    else:
        raise fail(f"expected a duration such as 30s, 5m, 1h30m or 2d, got {kind(value)}")
    if duration < minimum:
        raise fail(f"must be at least {minimum}, got {duration}")
    return duration


_HOST_LABEL = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
_DOTTED_DIGITS = re.compile(r"[0-9.]+")


def host_port(text: str) -> tuple[str, int]:
    """(host, port) of ``host:port``, where host is an IPv4 address, a ``[IPv6]`` literal or
    a DNS name; ValueError with the reason otherwise. Digits and dots are an IPv4 address
    or nothing, so ``999.999.999.999`` is refused rather than looked up as a name."""
    host, colon, port = text.rpartition(":")
    if not colon or not port.isascii() or not port.isdigit() or not 0 < int(port[:6]) < 65536:
        raise ValueError(f"expected host:port, got {text!r} (a port from 1 to 65535)")
    try:
        if host.startswith("[") and host.endswith("]"):
            ipaddress.IPv6Address(host[1:-1])
        elif _DOTTED_DIGITS.fullmatch(host):
            ipaddress.IPv4Address(host)
        elif len(host) > 253 or not all(_HOST_LABEL.fullmatch(p) for p in host.split(".")):
            raise ValueError(host)
    except ValueError:
        raise ValueError(
            f"expected host:port, got {text!r} ({host!r} is not an IPv4 address, [IPv6] "
            "address or DNS name)"
        ) from None
    return host, int(port)


def address_of(value: Any, fail: Fail) -> str:
    """``value`` as a ``host:port`` address (see :func:`host_port`)."""
    if not isinstance(value, str):
        raise fail(f"expected host:port, got {kind(value)}")
    try:
        host_port(value)
    except ValueError as exc:
        raise fail(str(exc)) from None
    return value
