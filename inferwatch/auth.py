"""Bearer tokens for admin and webhook endpoints: where they come from, and one way to check them.

A token is read from a file (a mounted Secret) or from the environment, never from a flag's
value on a command line that ``ps`` shows. Requests are checked with ``hmac.compare_digest``
so that the time a wrong token takes does not tell an attacker how much of it was right.
"""

from __future__ import annotations

import hmac
from pathlib import Path

__all__ = ["MIN_TOKEN_LENGTH", "TokenError", "bearer_ok", "load_token"]

#: a token shorter than this is refused at start-up: it can be guessed
MIN_TOKEN_LENGTH = 16


class TokenError(ValueError):
    """A token source that cannot be used; the message says which and why."""


def load_token(value: str | None, path: Path | None, *, what: str) -> str | None:
    """The token from ``value`` (an environment variable) or the file at ``path``; None if neither.

    Surrounding whitespace (a file's trailing newline) is dropped.
    """
    if value and path:
        raise TokenError(f"{what}: give the token or a token file, not both")
    if path is not None:
        try:
            value = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise TokenError(f"{what}: cannot read {path}: {exc.strerror}") from None
    if value is None or value == "":
        return None
    token = value.strip()
    if len(token) < MIN_TOKEN_LENGTH:
        raise TokenError(f"{what}: the token must be at least {MIN_TOKEN_LENGTH} characters")
    return token


def bearer_ok(authorization: str | None, token: str) -> bool:
    """Whether an ``Authorization`` header carries ``Bearer <token>`` (constant-time compare)."""
    scheme, _, presented = (authorization or "").partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(presented.strip().encode(), token.encode())
