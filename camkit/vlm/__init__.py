"""Vision-language models: what in the image made the model write this word.

* :mod:`camkit.vlm.families`: each supported family (LLaVA, LLaVA-NeXT, PaliGemma...) says where
  its image tokens are in the sequence and what part of the image each covers;
* :mod:`camkit.vlm.paint`: per-unit scores painted into their boxes on the original image;
* :mod:`camkit.vlm.methods`: the methods that score the image units for each generated token.

transformers is imported only inside functions of this wing, never by ``import camkit``.
"""

from .families import Family, ImageTokens, family_of, list_families
from .paint import paint

__all__ = ["Family", "ImageTokens", "family_of", "list_families", "paint"]
