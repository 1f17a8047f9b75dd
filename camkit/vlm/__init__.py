"""Vision-language models: what in the image made the model write this word.

* :func:`explain_generation` generates (or takes) an answer and explains each of its tokens with a
  map on the image; :class:`GenerationExplanation` holds the result;
* :mod:`camkit.vlm.families`: each supported family (LLaVA, LLaVA-NeXT, PaliGemma...) says where
  its image tokens are in the sequence and what part of the image each covers;
* :mod:`camkit.vlm.paint`: per-unit scores painted into their boxes on the original image;
* :mod:`camkit.vlm.methods`: the methods that score the image units for each token, by key;
* :mod:`camkit.vlm.prompts` and :mod:`camkit.vlm.generate`: the processor, the chat template,
  the teacher-forced batch and the greedy answer.

transformers is imported only inside functions of this wing, never by ``import camkit``.
"""

from .explain import explain_generation
from .families import Family, ImageTokens, family_of, list_families
from .methods import list_vlm_methods
from .paint import paint
from .result import GenerationExplanation

__all__ = [
    "Family", "GenerationExplanation", "ImageTokens", "explain_generation", "family_of", "list_families",
    "list_vlm_methods", "paint",
]  # fmt: skip
