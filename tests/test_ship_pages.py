"""The runbook pages the receiver serves at ``/runbooks/<AlertName>``: every alert's page from
the package, HTML for a browser and Markdown when asked, nothing outside the package."""

from __future__ import annotations

import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient

from inferwatch.runbooks import pages
from support.shared import REPO

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def client() -> TestClient:
    return TestClient(Starlette(routes=[pages.route(pages.load())]))


def test_every_shipped_page_is_served() -> None:
    assert set(pages.load()) == {p.stem for p in (REPO / "runbooks").glob("*.md")}


@pytest.mark.parametrize(
    ("accept", "chosen"),
    [
        ("", pages.HTML),
        ("*/*", pages.HTML),
        ("text/markdown", pages.MARKDOWN),
        ("text/html,application/xhtml+xml,*/*;q=0.8", pages.HTML),
        ("text/markdown;q=0.9, text/html;q=0.5", pages.MARKDOWN),
        ("text/html;q=0.1, text/*", pages.MARKDOWN),  # text/* ranks markdown at 1
        ("text/markdown;q=0, */*", pages.HTML),
        ("text/markdown;q=oops", pages.HTML),
    ],
)
def test_the_accept_header_chooses_the_form(accept: str, chosen: str) -> None:
    assert pages.preferred(accept) == chosen


def test_a_browser_gets_html(client: TestClient) -> None:
    reply = client.get("/runbooks/InferwatchEngineDown", headers={"accept": "text/html"})
    assert reply.status_code == 200
    assert reply.headers["content-type"] == "text/html; charset=utf-8"
    assert reply.headers["vary"] == "accept"
    assert "<h1>InferwatchEngineDown</h1>" in reply.text
    assert "<pre><code" in reply.text  # fenced PromQL stays a code block


def test_markdown_when_asked_or_by_suffix(client: TestClient) -> None:
    source = (REPO / "runbooks" / "InferwatchEngineDown.md").read_text(encoding="utf-8")
    asked = client.get("/runbooks/InferwatchEngineDown", headers={"accept": "text/markdown"})
    assert asked.headers["content-type"].startswith("text/markdown")
    assert asked.text == source
    assert client.get("/runbooks/InferwatchEngineDown.md").text == source


@pytest.mark.parametrize("name", ["NoSuchAlert", "..%2Factions.yaml", "actions", "__init__"])
def test_anything_else_is_not_found(client: TestClient, name: str) -> None:
    reply = client.get(f"/runbooks/{name}")
    assert reply.status_code == 404
