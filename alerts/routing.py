"""The ``alertmanager`` section of the alerts config: where notifications go, and how often.

Its defaults are declared here, beside the checks that the defaults-as-schema merge cannot
make, so that a config the loader accepts always gives a file Alertmanager accepts: http(s)
URLs its Go parser takes, durations that parse, intervals above zero. :mod:`.alertmanager`
builds the routing from it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from inferwatch.config import ConfigError, Duration
from inferwatch.config.schema import host_port

#: The section's defaults (alerts/generated/alertmanager/alertmanager.yaml): webhook URLs per
#: receiver (page: critical, ticket: warning, automation: the runbook automation, which sees
#: both; an empty list keeps a receiver but sends nothing: give your pager's and tracker's
#: webhooks) and the notification timing.
DEFAULTS: Mapping[str, Any] = {
    "receivers": {
        "page": [],
        "ticket": [],
        "automation": ["http://127.0.0.1:9405/webhook"],  # inferwatch runbooks serve
    },
    # per receiver, an absolute path of the file with the bearer token its webhooks send ("":
    # none); inferwatch runbooks serve refuses requests without its token
    "bearer_token_file": {
        "page": "",
        "ticket": "",
        "automation": "/etc/alertmanager/inferwatch-runbooks.token",
    },
    "group_wait": "30s",
    "group_interval": "5m",
    # how often a notification is repeated while its alerts keep firing
    "repeat_interval": {"page": "4h", "ticket": "24h", "automation": "1h"},
}

#: the webhook URLs Alertmanager's (Go) URL parser takes: a host name or [IPv6] literal, a
#: numeric port, and a path and query of URL characters with well-formed %-escapes
_URL_CHARS = r"(?:[A-Za-z0-9._~!$&'()*+,;=:@/-]|%[0-9A-Fa-f]{2})"
_URL = re.compile(
    r"\A(?:http|https)://"
    r"(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?)"
    r"(?::(?P<port>[0-9]{1,5}))?"
    rf"(?:/{_URL_CHARS}*)?(?:\?(?:{_URL_CHARS}|\?)*)?\Z"
)


@dataclass(frozen=True)
class Settings:
    """What the alerts config chooses; everything else in the file is the recommendation."""

    #: webhook URLs per receiver name (page, ticket, automation); empty: the receiver drops
    receivers: Mapping[str, tuple[str, ...]]
    #: per receiver, the file with the bearer token its webhooks send ("": none)
    token_files: Mapping[str, str]
    group_wait: str
    group_interval: str
    #: per receiver: pages are repeated sooner than tickets
    repeat_interval: Mapping[str, str]

    def silent(self) -> Settings:
        """The same routing with receivers that send nothing (the demo's, and tests')."""
        return replace(self, receivers={name: () for name in self.receivers})


def settings(
    section: Mapping[str, Any], source: str, error: type[ConfigError] = ConfigError
) -> Settings:
    """The ``alertmanager`` section of an alerts config; raises ConfigError.

    The config loader has checked the section's shape against the shipped defaults and calls
    this for what the shape cannot say, so that a config it accepts always gives a file
    Alertmanager accepts: http(s) URLs, durations that parse, intervals above zero.
    """
    where = f"{source}: alertmanager"
    receivers = {
        name: tuple(
            _url(error, url, f"{where}.receivers.{name}[{i}]") for i, url in enumerate(urls)
        )
        for name, urls in section["receivers"].items()
    }
    return Settings(
        receivers=receivers,
        token_files={
            name: _token_file(error, path, f"{where}.bearer_token_file.{name}")
            for name, path in section["bearer_token_file"].items()
        },
        group_wait=_duration(error, section["group_wait"], f"{where}.group_wait", zero=True),
        group_interval=_duration(error, section["group_interval"], f"{where}.group_interval"),
        repeat_interval={
            name: _duration(error, value, f"{where}.repeat_interval.{name}")
            for name, value in section["repeat_interval"].items()
        },
    )


def _url(error: type[ConfigError], url: str, where: str) -> str:
    match = _URL.match(url)
    if not match or int(match["port"] or 0) > 65535:
        raise error(
            f"{where}: expected an http(s) URL (scheme://host[:port][/path][?query]), got {url!r}"
        )
    try:
        host_port(f"{match['host']}:{match['port'] or 80}")
    except ValueError as exc:
        raise error(f"{where}: {exc}") from None
    return url


def _token_file(error: type[ConfigError], path: str, where: str) -> str:
    if path and (not path.startswith("/") or not path.isprintable()):
        raise error(f'{where}: expected an absolute path or "", got {path!r}')
    return path


def _duration(error: type[ConfigError], value: str, where: str, zero: bool = False) -> str:
    """A Prometheus duration; only ``zero`` allows 0s (Alertmanager refuses zero intervals)."""
    try:
        duration = Duration.parse(value)
    except ValueError as exc:
        raise error(f"{where}: {exc}") from None
    if not zero and duration.milliseconds == 0:
        raise error(f"{where}: must be longer than 0s")
    return value
