"""``inferwatch drill``: a timed fault drill of the whole stack, with the runbooks acting."""

from inferwatch.drill.cli import drill

__all__ = ["drill"]
