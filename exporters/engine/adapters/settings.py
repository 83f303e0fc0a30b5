"""The settings an engine runs with, as it tells them itself (``inferwatch_engine_setting``).

Each adapter declares where its engine tells a setting (``Adapter.settings``): a label of an
info gauge on its page, or a field of a JSON endpoint. Both are the engine's to write, so
they are read strictly: a plain decimal number (no ``nan``, ``inf``, ``0x10`` or ``1_000``,
which Python's ``float`` would take), finite, in the setting's range (a count is a whole
number, a memory share at most 1). ``None`` or null (vLLM's and SGLang's "not set") and a
value of 0 or less (SGLang's ``-1``: disabled) mean the engine has no such limit: the setting
is absent. Anything else is garbage: left out, and counted for the caller to report.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from inferwatch.exporters.engine.adapters.adapter import Adapter, JsonField, LabelValue
from inferwatch.exporters.engine.adapters.mapping import fold
from inferwatch.serving.textformat import Exposition

#: the settings, named as ``inferwatch advise`` names them
SETTINGS = ("max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization", "max_model_len")
#: settings that are shares of GPU memory, (0, 1]; the others are whole counts
SHARES = frozenset({"gpu_memory_utilization"})
_DECIMAL = re.compile(r"[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?")
_UNSET = frozenset({"", "None", "none", "null"})


class Garbage(ValueError):
    """A value that is neither a setting nor "not set"."""


def value(raw: object, setting: str) -> float | None:
    """The setting's value from a label value (str) or JSON value; None when not set; raises
    Garbage for anything else."""
    if raw is None or (isinstance(raw, str) and raw.strip() in _UNSET):
        return None
    if isinstance(raw, bool):
        raise Garbage(raw)
    if isinstance(raw, str):
        if not _DECIMAL.fullmatch(raw):
            if raw.startswith("-") and _DECIMAL.fullmatch(raw[1:]):
                return None  # a negative limit: disabled
            raise Garbage(raw)
        number = float(raw)
    elif isinstance(raw, (int, float)):
        number = float(raw)
    else:
        raise Garbage(raw)
    if not math.isfinite(number):
        raise Garbage(raw)
    if number <= 0:
        return None
    if setting in SHARES:
        if number > 1:
            raise Garbage(raw)
    elif number != int(number):
        raise Garbage(raw)
    return number


def page_families(adapter: Adapter) -> frozenset[str]:
    """The folded names of the page families the adapter's settings are read from."""
    return frozenset(
        fold(source.metric)
        for sources in adapter.settings.values()
        for source in sources
        if isinstance(source, LabelValue)
    )


def endpoints(adapter: Adapter) -> tuple[str, ...]:
    """The JSON endpoints the adapter's settings are read from, each once, in order."""
    paths = (
        source.path
        for sources in adapter.settings.values()
        for source in sources
        if isinstance(source, JsonField)
    )
    return tuple(dict.fromkeys(paths))


def from_page(exposition: Exposition, adapter: Adapter) -> tuple[dict[str, float], int]:
    """The settings the page's info gauges tell (the largest over data-parallel ranks), and
    how many label values were garbage."""
    families = {fold(name): family for name, family in exposition.families.items()}
    found: dict[str, float] = {}
    bad = 0
    for setting, sources in adapter.settings.items():
        for source in sources:
            if not isinstance(source, LabelValue):
                continue
            family = families.get(fold(source.metric))
            values = []
            for sample in family.samples if family is not None else ():
                try:
                    number = value(sample.labels.get(source.label), setting)
                except Garbage:
                    bad += 1
                    continue
                if number is not None:
                    values.append(number)
            if values:
                found[setting] = max(values)
                break
    return found, bad


def from_documents(
    documents: Mapping[str, object], adapter: Adapter
) -> tuple[dict[str, float], int]:
    """The settings the JSON documents (by endpoint path) tell, and how many fields were
    garbage; an endpoint that did not answer is not in ``documents``."""
    found: dict[str, float] = {}
    bad = 0
    for setting, sources in adapter.settings.items():
        for source in sources:
            if not isinstance(source, JsonField) or source.path not in documents:
                continue
            try:
                number = value(_field(documents[source.path], source.keys), setting)
            except Garbage:
                bad += 1
                continue
            if number is not None:
                found[setting] = number
                break
    return found, bad


def _field(document: object, keys: tuple[str | int, ...]) -> object:
    """The value at ``keys`` in the document, or None where the path leads nowhere."""
    for key in keys:
        if isinstance(key, int):
            if not isinstance(document, list) or len(document) <= key:
                return None
            document = document[key]
        elif isinstance(document, dict):
            document = document.get(key)
        else:
            return None
    return document
