"""captum's interpretable embedding layer: an embedding module swapped for a pass-through while embeddings are explained.

``configure_interpretable_embedding_layer(model, "embedding")`` puts an
:class:`InterpretableEmbeddingBase` in the module's place: the model then takes embeddings
(``indices_to_embeddings`` computes them with the original module) where it took indices, so
that an input attribution (:class:`IntegratedGradients` and the rest) attributes to the
embedding vectors. ``remove_interpretable_embedding_layer`` puts the original back. Nothing is
computed here.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ....errors import CamkitError

__all__ = [
    "InterpretableEmbeddingBase",
    "configure_interpretable_embedding_layer",
    "remove_interpretable_embedding_layer",
]


class EmbeddingAlreadyConfiguredError(CamkitError, AssertionError):
    """The layer is an interpretable embedding already (captum raises AssertionError here too)."""


class InterpretableEmbeddingBase(nn.Module):
    """A pass-through in an embedding module's place: its input is already the embedding.

    Args:
        embedding: the original module (kept, and used by :meth:`indices_to_embeddings`).
        full_name: its dotted name in the model.
    """

    def __init__(self, embedding: nn.Module, full_name: str) -> None:
        super().__init__()
        self.embedding = embedding
        self.full_name = full_name
        self.embedding_dim = getattr(embedding, "embedding_dim", None)
        self.num_embeddings = getattr(embedding, "num_embeddings", None)

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        """The embedding given (the first positional input, else the first keyword one), unchanged."""
        if inputs:
            return inputs[0]
        if kwargs:
            return next(iter(kwargs.values()))
        raise TypeError("InterpretableEmbeddingBase needs the embedding as an input")

    def indices_to_embeddings(self, *inputs: Any, **kwargs: Any) -> Any:
        """The original module's output for its usual inputs (the embeddings to feed the model)."""
        return self.embedding(*inputs, **kwargs)


def _parent(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    path, _, leaf = name.rpartition(".")
    return (model.get_submodule(path) if path else model), leaf


def configure_interpretable_embedding_layer(model: nn.Module, embedding_layer_name: str = "embedding") -> InterpretableEmbeddingBase:
    """Swap the module ``embedding_layer_name`` of ``model`` for an :class:`InterpretableEmbeddingBase` (returned).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> model = nn.Sequential(nn.Embedding(5, 3), nn.Flatten(), nn.Linear(6, 1))
        >>> ids = torch.tensor([[1, 4]])
        >>> layer = configure_interpretable_embedding_layer(model, "0")
        >>> torch.equal(model(layer.indices_to_embeddings(ids)), nn.Sequential(layer.embedding, *model[1:])(ids))
        True
        >>> remove_interpretable_embedding_layer(model, layer)
        >>> type(model[0]).__name__
        'Embedding'
    """
    parent, leaf = _parent(model, embedding_layer_name)
    embedding = getattr(parent, leaf)
    if isinstance(embedding, InterpretableEmbeddingBase):
        raise EmbeddingAlreadyConfiguredError(
            f"{embedding_layer_name!r} is an interpretable embedding already; remove it first "
            "(remove_interpretable_embedding_layer)"
        )
    wrapped = InterpretableEmbeddingBase(embedding, embedding_layer_name)
    setattr(parent, leaf, wrapped)
    return wrapped


def remove_interpretable_embedding_layer(model: nn.Module, interpretable_emb: InterpretableEmbeddingBase) -> None:
    """Put the original embedding module back in the place ``interpretable_emb`` holds."""
    parent, leaf = _parent(model, interpretable_emb.full_name)
    setattr(parent, leaf, interpretable_emb.embedding)
