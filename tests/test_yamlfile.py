"""Config files a user gives: the same one-line errors from every loader."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from inferwatch.proxy import config as proxy_config
from inferwatch.runbooks import config as runbooks_config

pytestmark = pytest.mark.unit

LOADERS: dict[str, tuple[Callable[[Path], Any], type[Exception]]] = {
    "proxy": (proxy_config.load, proxy_config.ConfigError),
    "runbooks": (runbooks_config.load, runbooks_config.ConfigError),
}


@pytest.mark.parametrize("loader", sorted(LOADERS))
@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read"),
        (b"a: 1\nb: [\n", "line 3: invalid YAML"),
        (b"a: \xff\xfe\n", "not UTF-8 text"),
    ],
)
def test_a_file_that_cannot_be_read_or_parsed_is_one_clear_line(
    tmp_path: Path, loader: str, content: bytes | None, message: str
) -> None:
    load, error = LOADERS[loader]
    path = tmp_path / "config.yaml"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(error) as raised:
        load(path)
    text = str(raised.value)
    assert text.startswith(f"{path}: ") and message in text and "\n" not in text
