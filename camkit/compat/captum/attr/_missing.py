"""captum's classes that camkit does not compute: each is present by name and refuses to be built."""

from __future__ import annotations

from functools import cache
from typing import Any

from ._base import Attribution, NotComputedError

__all__ = ["MISSING", "missing_class"]

_LAYER = "this layer attribution"
#: captum's names -> what camkit does not compute
MISSING = {
    "LLMAttribution": "LLM attribution",
    "LLMGradientAttribution": "LLM attribution",
    "LLMAttributionResult": "LLM attribution",
    "TextTemplateInput": "text inputs for LLM attribution",
    "TextTokenInput": "text inputs for LLM attribution",
    "InterpretableEmbeddingBase": "interpretable embeddings for text models",
    "TokenReferenceBase": "token references for text models",
    "DataLoaderAttribution": "attribution over a DataLoader",
    "ClassSummarizer": "summarizers",
    "Summarizer": "summarizers",
    "CommonStats": "summarizers",
    "ProductBaselines": "baseline products",
}


@cache
def missing_class(name: str) -> type:
    """A class named ``name`` whose construction raises :class:`NotComputedError` naming what is missing."""
    what = MISSING[name]

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        raise NotComputedError(
            f"captum.attr.{name}: camkit does not compute {what}; camkit.compat.captum translates the methods listed "
            "in docs/migration/captum.md. Run this code on the original captum."
        )

    return type(name, (Attribution,), {"__init__": __init__, "__doc__": f"Not computed by camkit: {what}."})
