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

import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from inferwatch.config.duration import Duration
from inferwatch.config.loader import ConfigError

__all__ = ["ZERO", "Fields", "duration_of", "kind"]


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
    """One mapping of a config document, read field by field; ``error`` is the class raised."""

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

    def check_keys(self, allowed: set[str], required: set[str] = frozenset()) -> None:  # type: ignore[assignment]
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

    def number(
        self, key: str, default: float, minimum: float = 0.0, maximum: float = math.inf
    ) -> float:
        value = self.raw.get(key, default)
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not minimum <= value <= maximum
        ):
            expected = (
                f"a number >= {minimum:g}"
                if maximum == math.inf
                else f"a number from {minimum:g} to {maximum:g}"
            )
            raise self.error(key, f"expected {expected}, got {kind(value)}")
        return float(value)

    def integer(self, key: str, default: int, minimum: int = 0) -> int:
        value = self.raw.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.error(key, f"expected an integer >= {minimum}, got {kind(value)}")
        return value

    def text(self, key: str, default: str | None = None) -> str:
        """A string; without a default, a required non-empty one."""
        value = self.raw.get(key, default)
        if default is None and (not isinstance(value, str) or not value):
            raise self.error(key, f"expected a non-empty string, got {kind(value)}")
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise self.error(key, f"expected a string, got {kind(value)}")
        return str(value)

    def flag(self, key: str, default: bool) -> bool:
        value = self.raw.get(key, default)
        if not isinstance(value, bool):
            raise self.error(key, f"expected true or false, got {kind(value)}")
        return value

    def duration(
        self, key: str, default: Duration | str, minimum: Duration = ZERO, seconds_int: bool = False
    ) -> Duration:
        """A Prometheus duration; with ``seconds_int``, a whole number of seconds as well."""
        return duration_of(self.raw.get(key, default), self.error_at(key), minimum, seconds_int)

    def error_at(self, key: str) -> Callable[[str], ConfigError]:
        return lambda reason: self.error(key, reason)


def duration_of(
    value: Any,
    fail: Callable[[str], ConfigError],
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
