"""The one config layer: the bounded YAML loader, the Duration type and the field reader.

The loader's face is this package's as it stands: its ``__all__`` is the one list of what
reading a file offers, and the package adds only the Duration type and the field reader.
"""

from inferwatch.config import loader
from inferwatch.config.duration import Duration, DurationParam
from inferwatch.config.loader import *  # noqa: F403
from inferwatch.config.schema import Fields

__all__ = ["Duration", "DurationParam", "Fields"]
__all__ += loader.__all__
