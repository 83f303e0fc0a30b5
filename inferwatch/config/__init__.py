"""The one config layer: the bounded YAML loader, the Duration type and the field reader."""

from inferwatch.config.duration import Duration, DurationParam
from inferwatch.config.loader import (
    ConfigError,
    compose,
    decode,
    load,
    parse,
    parse_all,
    read_text,
)
from inferwatch.config.schema import Fields

__all__ = [
    "ConfigError",
    "Duration",
    "DurationParam",
    "Fields",
    "compose",
    "decode",
    "load",
    "parse",
    "parse_all",
    "read_text",
]
