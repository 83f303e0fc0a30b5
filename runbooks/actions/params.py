"""Parameter rules several actions share: label templates and stepwise shift schedules.

One implementation each, so that a target URL or a route's name is filled from an alert's
labels the same way by every action, and a traffic shift (HAProxy weights or an HTTPRoute's
backendRefs) moves through the same validated fractions.
"""

from __future__ import annotations

import itertools
import string
from collections.abc import Mapping
from typing import Any

from inferwatch.runbooks.actions.base import ActionError

#: fractions of the whole shift taken one after another, and the seconds between them
DEFAULT_STEPS = (0.25, 0.5, 1.0)
DEFAULT_INTERVAL = 5.0

_URL_SAFE = frozenset(string.ascii_letters + string.digits + ".-_:[]")


def fill(template: str, labels: Mapping[str, str], *, url_safe: bool) -> str:
    """``template`` with ``{label}`` fields replaced by the alert's label values.

    With ``url_safe`` a value may hold only host:port characters, so that no label can
    smuggle a path, userinfo or a second URL into a target.
    """
    values: dict[str, str] = {}
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as exc:
        raise ActionError(f"bad template {template!r}: {exc}") from None
    for field in fields:
        value = labels.get(field)
        if not field.isidentifier() or not value:
            raise ActionError(f"the alert has no {field!r} label (template {template!r})")
        if url_safe and not set(value) <= _URL_SAFE:
            raise ActionError(f"label {field}={value[:64]!r} is not a host:port")
        values[field] = value
    return template.format_map(values)


def shift_steps(value: Any) -> tuple[float, ...]:
    """A shift schedule: 1 to 20 increasing fractions above 0, ending at 1."""
    if not isinstance(value, list | tuple) or not value or len(value) > 20:
        raise ActionError("steps must be a list of 1 to 20 fractions")
    fractions = tuple(value)
    if not all(isinstance(f, int | float) and not isinstance(f, bool) for f in fractions):
        raise ActionError(f"steps must be numbers, not {list(fractions)!r}")
    if any(b <= a for a, b in itertools.pairwise(fractions)) or fractions[0] <= 0:
        raise ActionError(f"steps must increase from above 0, not {list(fractions)!r}")
    if fractions[-1] != 1:
        raise ActionError(f"steps must end at 1 (the whole shift), not {fractions[-1]!r}")
    return tuple(float(f) for f in fractions)
