"""``ARCC``, ``Complexity`` and ``Coherency`` (pytorch-grad-cam 1.5.7)."""

from .._missing import missing

__all__ = ["ARCC", "Coherency", "Complexity"]

ARCC = missing("ARCC")
Complexity = missing("Complexity")
Coherency = missing("Coherency")
