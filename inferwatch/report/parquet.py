"""The usage report as a Parquet file, for the finance team's warehouse.

One row per report row, with fixed column types (a period, tenant, model and version as
strings, counts as 64-bit integers, costs as doubles) so that an empty report and a full
one load into the same table; the totals, the skipped lines and the reconciliation travel in
the file's key-value metadata (``inferwatch.totals`` and so on, JSON).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from inferwatch.clikit import missing_extra

#: the columns that are not counts
_TEXT = ("period", "tenant", "model", "model_version")
_MONEY = ("cost", "idle_gpu_cost")


def write(
    path: Path,
    columns: Sequence[str],
    rows: Sequence[Mapping[str, Any]],
    metadata: Mapping[str, Any],
) -> None:
    """Write ``rows`` (each with every one of ``columns``) to ``path``."""
    try:
        import pyarrow as pa  # type: ignore[import-untyped]
        import pyarrow.parquet as pq  # type: ignore[import-untyped]
    except ImportError:
        raise missing_extra("inferwatch report usage --format parquet", "parquet") from None

    def kind(column: str) -> Any:
        return pa.string() if column in _TEXT else pa.float64() if column in _MONEY else pa.int64()

    schema = pa.schema(
        [pa.field(column, kind(column)) for column in columns],
        metadata={f"inferwatch.{key}": json.dumps(value) for key, value in metadata.items()},
    )
    pq.write_table(pa.Table.from_pylist([dict(row) for row in rows], schema=schema), path)
