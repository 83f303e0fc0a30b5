"""Reading a user's YAML file, with the one-line errors every config loader gives."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


def load(path: str | Path, error: type[Exception]) -> Any:
    """The parsed document of ``path``; ``error("<path>: cannot read: ...")`` or
    ``error("<path>: line N: invalid YAML: ...")`` when it cannot be read or parsed."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise error(f"{source}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise error(f"{source}: not UTF-8 text") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "(parse)"
        problem = getattr(exc, "problem", None) or str(exc)
        raise error(f"{source}: {where}: invalid YAML: {problem}") from None
