"""The runbook pages (``<AlertName>.md``, shipped in the package) served at
``/runbooks/<AlertName>``, so that an alert's ``runbook_url`` can point at the receiver.

HTML for a browser, the Markdown source for ``Accept: text/markdown`` (or ``.md`` on the
path). The pages are the package's own, read once at start; an unknown name is a 404.
"""

from __future__ import annotations

import html
import re
from importlib import resources

import markdown
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, Response
from starlette.routing import Route

PATH = "/runbooks/{name}"
#: an alert name as the rules spell them, so no path ever leaves the package
NAME = re.compile(r"[A-Za-z][A-Za-z0-9]{0,127}")
MARKDOWN = "text/markdown"
HTML = "text/html"


def load() -> dict[str, str]:
    """Alert name -> its page's Markdown, for every page the package ships."""
    folder = resources.files("inferwatch.runbooks")
    return {
        entry.name.removesuffix(".md"): entry.read_text(encoding="utf-8")
        for entry in folder.iterdir()
        if entry.name.endswith(".md") and NAME.fullmatch(entry.name.removesuffix(".md"))
    }


def preferred(accept: str) -> str:
    """``text/markdown`` or ``text/html``, whichever the Accept header ranks higher: HTML on
    a tie, on ``*/*`` and without a header (a person clicked a link)."""
    qualities: dict[str, float] = {}
    for part in accept.split(",")[:64]:
        media, _, params = part.partition(";")
        quality = 1.0
        for param in params.split(";"):
            key, _, value = param.partition("=")
            if key.strip() == "q":
                try:
                    quality = float(value)
                except ValueError:
                    quality = 0.0
        qualities.setdefault(media.strip().lower(), quality)

    def rank(offered: str) -> float:
        for media in (offered, "text/*", "*/*"):
            if media in qualities:
                return qualities[media]
        return 0.0

    return MARKDOWN if rank(MARKDOWN) > rank(HTML) else HTML


def render_html(name: str, text: str) -> str:
    body = markdown.markdown(text, extensions=["fenced_code", "tables"])
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(name)} - inferwatch runbook</title></head>\n"
        f"<body>\n{body}\n</body></html>\n"
    )


def route(pages: dict[str, str]) -> Route:
    """The ``/runbooks/<AlertName>`` route over ``pages`` (see :func:`load`)."""
    rendered = {name: render_html(name, text) for name, text in pages.items()}

    async def page(request: Request) -> Response:
        name = request.path_params["name"]
        source = name.endswith(".md")
        name = name.removesuffix(".md")
        if name not in pages:
            return PlainTextResponse(f"no runbook page for {name[:128]!r}\n", status_code=404)
        headers = {"vary": "accept"}
        if source or preferred(request.headers.get("accept", "")) == MARKDOWN:
            return Response(pages[name], media_type=f"{MARKDOWN}; charset=utf-8", headers=headers)
        return HTMLResponse(rendered[name], headers=headers)

    return Route(PATH, page, methods=["GET", "HEAD"])
