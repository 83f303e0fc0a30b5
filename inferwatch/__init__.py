"""inferwatch: observability and SRE toolkit for LLM inference fleets."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("inferwatch")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"
