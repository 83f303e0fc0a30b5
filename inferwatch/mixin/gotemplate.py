"""Go ``text/template`` syntax, as Prometheus parses an alert's labels and annotations.

Prometheus refuses a rule file whose annotation does not parse as a template (``promtool
check rules`` says so), so an annotation from a user's config is checked here before any
file is written, where promtool may not be installed. This is the parser's syntax, not its
evaluation: delimited actions, closed strings and parentheses, ``if``/``range``/``with``/
``define``/``block`` closed by ``end``, ``else`` only inside them, and every function named
in an action one that Prometheus' template engine defines.
"""

from __future__ import annotations

import re

__all__ = ["FUNCTIONS", "VARIABLES", "error"]

#: Go's builtins and Prometheus' template functions (Prometheus 2.42, template/template.go)
FUNCTIONS = frozenset({
    "and", "call", "html", "index", "slice", "js", "len", "not", "or", "print", "printf",
    "println", "urlquery", "eq", "ge", "gt", "le", "lt", "ne",
    "query", "first", "label", "value", "strvalue", "args", "reReplaceAll", "safeHtml",
    "match", "title", "toUpper", "toLower", "graphLink", "tableLink", "sortByLabel",
    "humanize", "humanize1024", "humanizeDuration", "humanizePercentage",
    "humanizeTimestamp", "toTime", "pathPrefix", "externalURL", "parseDuration",
    "stripPort", "stripDomain",
})  # fmt: skip
_OPENERS = frozenset({"if", "range", "with", "define", "block"})
_WORDS = frozenset({"true", "false", "nil", "template", "break", "continue"})
#: the variables Prometheus defines for an alert's templates
VARIABLES = frozenset({"$", "$labels", "$value", "$externalLabels", "$externalURL"})
_TOKEN = re.compile(
    r"""\s+|"(?:[^"\\\n]|\\.)*"|`[^`]*`|'(?:[^'\\\n]|\\.)+'"""
    r"""|\$[A-Za-z0-9_]*|\.[A-Za-z_][A-Za-z0-9_]*|\.|[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_]\w*)*"""
    r"""|[-+]?(?:0[xX][0-9a-fA-F_]+|[0-9][0-9_]*(?:\.[0-9_]*)?(?:[eE][-+]?[0-9]+)?)"""
    r"""|:=|=|\||\(|\)|,"""
)


def error(text: str) -> str | None:
    """Why ``text`` does not parse as a Go template; None when it does."""
    stack: list[str] = []
    variables = set(VARIABLES)
    at = 0
    while (start := text.find("{{", at)) != -1:
        inner = start + 2
        if text.startswith("- ", inner) or text.startswith("-\n", inner):
            inner += 2
        if text.startswith("/*", inner):
            close = text.find("*/", inner + 2)
            rest = re.match(r"(?: -)?}}", text[close + 2 :]) if close != -1 else None
            if rest is None:
                return "unclosed comment"
            at = close + 2 + rest.end()
            continue
        body, end = _action(text, start + 2)
        if end == -1:
            return "unclosed action (a {{ without }})"
        reason = _check_action(body, stack, variables)
        if reason is not None:
            return reason
        at = end + 2
    if stack:
        return f"unexpected EOF: {{{{{stack[-1]}}}}} has no {{{{end}}}}"
    return None


def _action(text: str, start: int) -> tuple[str, int]:
    """The action's body from ``start`` and the index of its closing ``}}`` (-1: none)."""
    at = start
    while at < len(text):
        if text.startswith("}}", at):
            body = text[start:at]
            body = body[1:] if body[:1] == "-" and body[1:2].isspace() else body
            body = body[:-1] if body[-1:] == "-" and body[-2:-1].isspace() else body
            return body, at
        quote = text[at]
        if quote in "\"'`":
            close = _string_end(text, at)
            if close == -1:
                return "", -1
            at = close + 1
            continue
        at += 1
    return "", -1


def _string_end(text: str, start: int) -> int:
    quote, at = text[start], start + 1
    while at < len(text):
        char = text[at]
        if char == "\\" and quote != "`":
            at += 2
            continue
        if char == quote:
            return at
        if char == "\n" and quote != "`":
            return -1
        at += 1
    return -1


def _check_action(body: str, stack: list[str], variables: set[str]) -> str | None:
    """Checks one action; ``stack`` holds the open control structures, ``variables`` the
    names declared so far (Go scopes them per structure; one set is close enough)."""
    tokens: list[str] = []
    at = 0
    while at < len(body):
        match = _TOKEN.match(body, at)
        if match is None:
            return f"unexpected {body[at]!r} in action"
        if not match[0].isspace():
            tokens.append(match[0])
        at = match.end()
    if not tokens:
        return "missing value for command"
    depth = 0
    for token in tokens:
        depth += {"(": 1, ")": -1}.get(token, 0)
        if depth < 0:
            return "unexpected right paren"
    if depth:
        return "unclosed left paren"
    keyword = tokens[0]
    if keyword in ("break", "continue"):
        return None if "range" in stack and len(tokens) == 1 else f"{{{{{keyword}}}}} outside range"
    if keyword == "end":
        if not stack:
            return "unexpected {{end}}"
        stack.pop()
        return None if len(tokens) == 1 else "unexpected words after {{end}}"
    if keyword == "else":
        if not stack or stack[-1] not in ("if", "range", "with"):
            return "unexpected {{else}}"
        tokens = tokens[2:] if tokens[1:2] in (["if"], ["with"]) else tokens[1:]
        if not tokens:
            return None
    elif keyword in _OPENERS:
        stack.append(keyword)
        if len(tokens) == 1:
            return f"missing value for {keyword}"
        if keyword in ("define", "block"):
            return None if tokens[1].startswith('"') else f"{keyword} needs a quoted name"
        tokens = tokens[1:]
    for previous, token, following in zip(
        ["(", *tokens[:-1]], tokens, [*tokens[1:], ")"], strict=True
    ):
        if token == "|" and (previous in ("(", "|") or following == "|"):
            return "missing command around |"
        if token in (":=", "=") and following == ")":
            return "missing value for command"
        if token.startswith("$"):
            name = token.split(".")[0]
            if following in (":=", ","):
                variables.add(name)
            elif name not in variables:
                return f"undefined variable {name!r}"
            continue
        name = token.split(".")[0]
        named = name[:1].isalpha() or name[:1] == "_"
        if named and name not in _WORDS and name not in FUNCTIONS:
            return f'function "{name}" not defined'
    return None
