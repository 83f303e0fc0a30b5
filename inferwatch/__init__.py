"""inferwatch: observability and SRE toolkit for LLM inference fleets."""

import importlib
import json
from importlib.metadata import PackageNotFoundError, distribution, version

try:
    __version__ = version("inferwatch")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"


def build_commit() -> str:
    """The commit this copy was built from, which the build records in ``inferwatch._build``
    (``setup.py``). An editable install runs the checkout's files as they are now, so it says
    which checkout instead, from the install's metadata."""
    try:
        return str(importlib.import_module("inferwatch._build").COMMIT)
    except ImportError:
        pass
    try:
        origin = json.loads(distribution("inferwatch").read_text("direct_url.json") or "{}")
    except (PackageNotFoundError, ValueError):
        origin = {}
    if origin.get("dir_info", {}).get("editable"):
        return f"none: editable install of {origin.get('url', 'a checkout')}"
    return "unknown"
