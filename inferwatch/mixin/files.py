"""Generated files as text: deterministic YAML, and writing or checking a set of files.

Every generator (rules, dashboards, the Kubernetes kit, the gateway config, the docs) returns
its files as ``relative path -> text`` and hands them to ``write`` or ``stale``, so a committed
copy is regenerated, and checked fresh, the same way everywhere. ``write`` validates the whole
set first (:mod:`inferwatch.mixin.validate`) and writes nothing when one file fails; each file
is written beside its place and renamed over it, so a reader never sees half a file.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import yaml

from inferwatch.mixin import validate

__all__ = ["Written", "dump", "stale", "write"]


class _Dumper(yaml.SafeDumper):
    """Block style; multi-line strings (expressions) as literal blocks."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump(document: Any) -> str:
    """Block-style YAML in the given key order: the same data gives the same bytes."""
    return yaml.dump(document, Dumper=_Dumper, sort_keys=False, width=100, allow_unicode=True)


def stale(out: Path, files: Mapping[str, str]) -> list[str]:
    """Files under ``out`` that differ from ``files`` or are missing."""
    return [
        name
        for name, text in files.items()
        if not (out / name).is_file() or (out / name).read_text(encoding="utf-8") != text
    ]


class Written(NamedTuple):
    #: the files that changed
    changed: list[str]
    #: the external checks that did not run (their tool is not on PATH)
    unchecked: list[str]


def write(out: Path, files: Mapping[str, str], kinds: Mapping[str, validate.Kind]) -> Written:
    """Validate ``files`` (each of the kind its pattern in ``kinds`` gives), then write the
    ones that changed under ``out``; :class:`validate.Invalid` and nothing written when one
    fails."""
    unchecked = validate.check(files, kinds)
    changed = stale(out, files)
    for name in changed:
        path = out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.partial")
        partial.write_text(files[name], encoding="utf-8")
        os.replace(partial, path)
    return Written(changed, unchecked)
