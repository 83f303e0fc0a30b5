"""The ``shared_state`` section of the proxy config: where the fleet's Redis is, and how to
behave without it.

URL forms (the password never sits in the URL; it comes from ``password_file`` or
``password_env``):

- ``redis://host:port/db``, ``rediss://host:port/db`` (TLS), ``unix:///path/redis.sock?db=0``
- ``redis+sentinel://sentinel1:26379,sentinel2:26379/service-name/db`` (Sentinel's master)
- ``redis+cluster://node1:6379,node2:6379`` (Redis Cluster; keys are hash-tagged by tenant)
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from inferwatch import config as layer

FailurePolicy = Literal["fail_open", "fail_closed"]
FAILURE_POLICIES = ("fail_open", "fail_closed")
#: a password file is a secret mounted from a Secret: a few bytes, never megabytes
MAX_PASSWORD_BYTES = 4096
_HOST = r"[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\]"
_NODES = rf"(?:{_HOST})(?::\d{{1,5}})?(?:,(?:{_HOST})(?::\d{{1,5}})?)*"
_URLS = {
    "redis": re.compile(rf"^rediss?://(?:{_HOST})(?::\d{{1,5}})?(?:/\d{{1,2}})?$"),
    "unix": re.compile(r"^unix:///\S+$"),
    "sentinel": re.compile(rf"^redis\+sentinel://{_NODES}/[A-Za-z0-9._-]+(?:/\d{{1,2}})?$"),
    "cluster": re.compile(rf"^redis\+cluster://{_NODES}$"),
}


@dataclass(frozen=True)
class SharedState:
    url: str
    password: str | None = None
    #: live proxies assumed while Redis is down and none reported (0: from heartbeats only)
    expected_replicas: int = 0
    #: how long a reservation holds without renewal (a dead proxy's holds return after this)
    lease_s: float = 15.0
    #: longest wait for one Redis reply: past it Redis counts as down for the request
    timeout_s: float = 0.25
    #: where usage charged while Redis is down is journaled until replayed ("" : nowhere)
    journal_dir: str = ""
    failure_policy: FailurePolicy = "fail_open"
    #: first part of every key, so that several fleets can share one Redis
    key_prefix: str = "inferwatch"

    @property
    def kind(self) -> str:
        """redis, unix, sentinel or cluster."""
        return next(kind for kind, pattern in _URLS.items() if pattern.match(self.url))


def _password(reader: layer.Fields) -> str | None:
    if "password_file" in reader.raw and "password_env" in reader.raw:
        raise reader.error("password_file", "give password_file or password_env, not both")
    if "password_file" in reader.raw:
        path = Path(reader.text("password_file"))
        try:
            with path.open("rb") as handle:
                data = handle.read(MAX_PASSWORD_BYTES + 1)
        except OSError as exc:
            raise reader.error("password_file", f"cannot read {path}: {exc.strerror}") from None
        if len(data) > MAX_PASSWORD_BYTES:
            raise reader.error("password_file", f"{path} is over {MAX_PASSWORD_BYTES} bytes")
        return data.decode("utf-8", errors="replace").strip("\r\n")
    if "password_env" in reader.raw:
        name = reader.text("password_env")
        value = os.environ.get(name)
        if not value:
            raise reader.error("password_env", f"environment variable {name} is not set")
        return value
    return None


def parse(reader: layer.Fields) -> SharedState:
    """The ``shared_state`` mapping; every mistake names its field."""
    reader.check_keys(
        {
            "url",
            "password_file",
            "password_env",
            "expected_replicas",
            "lease",
            "timeout",
            "journal_dir",
            "failure_policy",
            "key_prefix",
        },
        required={"url"},
    )
    url = reader.text("url")
    if "@" in url:
        raise reader.error("url", "no password in the URL: use password_file or password_env")
    if not any(pattern.match(url) for pattern in _URLS.values()):
        raise reader.error(
            "url",
            "expected redis://host:port/db, rediss://..., unix:///path, "
            f"redis+sentinel://host:port[,host:port]/service[/db] or "
            f"redis+cluster://host:port[,host:port], got {url!r}",
        )
    lease = reader.duration("lease", layer.Duration(15_000), layer.Duration(1000), True)
    timeout = reader.duration("timeout", layer.Duration(250), layer.Duration(1), True)
    if timeout.seconds * 6 > lease.seconds:  # a renewal that takes its longest still lands
        raise reader.error("timeout", f"must be at most a sixth of the lease ({lease})")
    journal_dir = reader.text("journal_dir", "")
    if journal_dir and not os.access(journal_dir, os.W_OK):
        raise reader.error("journal_dir", f"{journal_dir} is not a writable directory")
    return SharedState(
        url=url,
        password=_password(reader),
        expected_replicas=reader.integer("expected_replicas", 0, maximum=10_000),
        lease_s=lease.seconds,
        timeout_s=timeout.seconds,
        journal_dir=journal_dir,
        failure_policy="fail_closed"
        if reader.choice("failure_policy", "fail_open", FAILURE_POLICIES) == "fail_closed"
        else "fail_open",
        key_prefix=reader.matching(
            "key_prefix", "inferwatch", re.compile(r"[A-Za-z0-9._-]+"), "a key prefix", 64
        ),
    )
