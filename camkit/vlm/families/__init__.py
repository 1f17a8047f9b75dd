"""Vision-language model families: each module recognises one kind of model and lays out its image tokens.

:mod:`camkit.vlm.families.base` holds the protocol (:class:`~camkit.vlm.families.base.Family`,
:class:`~camkit.vlm.families.base.ImageTokens`) and the registry; importing this package imports
every family module, each of which registers its families.
"""

from . import llava, paligemma  # noqa: F401  (each family module registers its families)
from .base import FAMILIES, Family, ImageTokens, family_of, list_families, register_family

__all__ = ["FAMILIES", "Family", "ImageTokens", "family_of", "list_families", "register_family"]
