"""What an engine module declares: its adapter, plain data the mapping engine (``mapping``)
plans from.

An engine is described, never coded: the labels that carry our identity, the labels whose
values are replicas of one piece of work, how a signal the catalogue has no alias for is
derived from the series it does have, and the JSON endpoints that tell its version.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from inferwatch.catalog import Alias


@dataclass(frozen=True)
class LabelValue:
    """The value sits in a label of an info-style gauge (``cache_config_info{block_size}``)."""

    metric: str
    label: str


@dataclass(frozen=True)
class Total:
    """A counter or gauge that is the sum of several source series.

    Every ``required`` series must be on the page; ``optional`` ones are added where present.
    """

    required: tuple[Alias, ...]
    optional: tuple[Alias, ...] = ()


@dataclass(frozen=True)
class SumCount:
    """A histogram known only by its sum and count, written with a single ``+Inf`` bucket.

    ``sum`` series (all required) add up to the histogram's sum; ``count`` is its count.
    The result has no distribution, but rate(sum)/rate(count) gives the mean.
    """

    sum: tuple[Alias, ...]
    count: Alias


Derivation = LabelValue | Total | SumCount


@dataclass(frozen=True)
class JsonField:
    """A value in a JSON document the engine serves: ``path``, then the keys (and list
    indexes) that lead to it (``/v1/models``, ``("data", 0, "max_model_len")``)."""

    path: str
    keys: tuple[str | int, ...]


#: where an engine tells one of its own settings: a label of an info gauge on its page, or a
#: field of a JSON endpoint
SettingSource = LabelValue | JsonField


@dataclass(frozen=True)
class VersionEndpoint:
    """A JSON endpoint that tells the engine's version or model: our key -> its fields."""

    path: str
    fields: Mapping[str, tuple[str, ...]]


@dataclass(frozen=True)
class Host:
    """A server the engine runs inside, which labels the engine's families its own way
    (vLLM as a Triton backend: Triton's ``model`` and ``version``, not ``model_name``).

    A page is the host's when the engine's own samples carry the host's identity labels
    instead of the engine's: what else the page holds (the host's own families may be
    filtered out of the scrape) says nothing of how those samples are labelled.
    """

    name: str
    #: our identity label -> the host's label carrying it, replacing the adapter's own
    identity_labels: Mapping[str, str]


@dataclass(frozen=True)
class Adapter:
    """What is particular to one engine; everything it names is plain data."""

    name: str
    #: our identity label -> the engine's label carrying it (model -> model_name)
    identity_labels: Mapping[str, str] = field(default_factory=dict)
    #: labels whose values are replicas of the same work (collapsed by max, not summed)
    replica_labels: frozenset[str] = frozenset()
    #: a family every page has whose model label names the one model the server serves;
    #: series without a model label (vLLM's cache_config_info) are given that model
    served_model_family: str | None = None
    #: catalogue key -> how the signal is computed where the catalogue has no alias for it;
    #: several derivations are tried in order, the first with data wins (as aliases do)
    derived: Mapping[str, Derivation | tuple[Derivation, ...]] = field(default_factory=dict)
    #: tried in order by read_version
    version_endpoints: tuple[VersionEndpoint, ...] = ()
    #: setting (``inferwatch_engine_setting``'s label) -> where the engine tells it, tried
    #: in order; a setting the engine does not tell is not listed
    settings: Mapping[str, tuple[SettingSource, ...]] = field(default_factory=dict)
    #: servers the engine may be hosted in, checked in order; the first one found wins
    hosts: tuple[Host, ...] = ()
