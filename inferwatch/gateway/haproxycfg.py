"""The haproxy.cfg grammar the gateway generator writes, checked line by line.

HAProxy reads its config a line at a time, splitting words on blanks, so one newline or
blank in a name the topology supplied starts a directive of its own, and a ``#`` starts a
comment. This checks what HAProxy's own parser would refuse in the files we write: only
printable characters; sections ``global``, ``defaults``, ``frontend NAME``, ``backend
NAME`` with names of HAProxy's identifier characters; directives indented inside them;
balanced quotes and condition braces; ``server NAME ADDRESS`` with a unique name and an
address that is one; ``use_backend``, ``default_backend`` and ``track`` naming what exists.
"""

from __future__ import annotations

import re
import shlex

from inferwatch.config.schema import host_port
from inferwatch.mixin import validate

__all__ = ["KIND", "error", "resolvable"]

#: HAProxy's identifier characters (proxies, servers)
_IDENTIFIER = re.compile(r"[A-Za-z0-9._:-]+")
_SECTIONS = {"global": 0, "defaults": 0, "frontend": 1, "backend": 1}
_INDENT = "    "


def _words(line: str) -> list[str]:
    lexer = shlex.shlex(line, posix=True)
    lexer.whitespace_split = True
    lexer.commenters = ""
    return list(lexer)


def error(text: str) -> tuple[str, str] | None:
    """(where, why) for the first line HAProxy would refuse; None when all parse."""
    backends: set[str] = set()
    servers: dict[str, set[str]] = {}
    references: list[tuple[str, str]] = []
    section = ""
    for number, line in enumerate(text.split("\n"), 1):
        where = f"line {number}"
        if not line.isprintable():
            return where, f"control character in {line!r}"
        if not line.strip() or line.startswith("#"):
            continue
        try:
            words = _words(line)
        except ValueError:
            return where, "unclosed quote"
        if not line.startswith(" "):
            arity = _SECTIONS.get(words[0])
            if arity is None or len(words) != 1 + arity:
                return where, f"not a section header: {line!r}"
            if arity and not _IDENTIFIER.fullmatch(words[1]):
                return where, f"{words[1]!r} has characters HAProxy refuses in a name"
            section = f"{words[0]} {words[-1]}"
            if words[0] == "backend":
                if words[1] in backends:
                    return where, f"backend {words[1]} is defined twice"
                backends.add(words[1])
                servers[words[1]] = set()
            continue
        if not section or not line.startswith(_INDENT) or line[4] == " ":
            return where, "a directive is indented by four spaces inside a section"
        if words.count("{") != words.count("}"):
            return where, "unbalanced { } in a condition"
        reason = _directive(words, section, servers, references, number)
        if reason is not None:
            return where, reason
    for where, reference in references:
        backend, _, server = reference.partition("/")
        if backend not in backends or (server and server not in servers[backend]):
            return where, f"{reference} is not defined"
    return None


def _directive(
    words: list[str],
    section: str,
    servers: dict[str, set[str]],
    references: list[tuple[str, str]],
    number: int,
) -> str | None:
    keyword = words[0]
    where = f"line {number}"
    if keyword == "server":
        if not section.startswith("backend "):
            return "a server belongs in a backend"
        if len(words) < 3:
            return f"expected server NAME ADDRESS, got {' '.join(words)!r}"
        name, address = words[1], words[2]
        if not _IDENTIFIER.fullmatch(name):
            return f"server name {name!r} has characters HAProxy refuses"
        own = servers[section.split()[1]]
        if name in own:
            return f"server {name} is defined twice in {section}"
        own.add(name)
        try:
            host_port(address)
        except ValueError as exc:
            return str(exc)
        if "track" in words[3:]:
            references.append((where, words[words.index("track") + 1]))
    elif keyword == "bind":
        try:
            host_port(words[1] if len(words) > 1 else "")
        except ValueError as exc:
            return str(exc)
    elif keyword in ("use_backend", "default_backend"):
        if len(words) < 2:
            return f"{keyword} needs a backend"
        references.append((where, words[1]))
    return None


def resolvable(text: str) -> str:
    """``text`` with the host names of ``server``, ``bind`` and ``stats socket`` lines
    replaced by 127.0.0.1: HAProxy resolves names while checking, and they resolve where it
    runs, not here."""
    lines = []
    for line in text.split("\n"):
        words = line.split() if line[:1] == " " else []
        at = {"server": 2, "bind": 1, "stats": 2}.get(words[0] if words else "", 0)
        if at and len(words) > at:
            address = words[at].removeprefix("ipv4@")
            try:
                host, port = host_port(address)
            except ValueError:
                address = ""  # a unix socket path
            if address and not (host.startswith("[") or re.fullmatch(r"[0-9.]+", host)):
                word = re.compile(rf"(?<=[\s@]){re.escape(address)}(?=\s|$)")
                line = word.sub(f"127.0.0.1:{port}", line, count=1)
        lines.append(line)
    return "\n".join(lines)


def _check(text: str) -> None:
    reason = error(text)
    if reason is not None:
        raise validate.Problem(*reason)


#: an HAProxy config (haproxy -c -f; host names become 127.0.0.1 in its copy, since
#: they resolve where HAProxy runs, not where the config is written)
KIND = validate.Kind(_check, validate.Tool(("haproxy", "-c", "-f"), resolvable))
