"""captum's interpretable embedding layer, and layer integrated gradients on an embedding of integer indices."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from camkit.compat.captum import attr as ours

ca = pytest.importorskip("captum.attr")


class _Text(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(10, 3)
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(12, 4), nn.Tanh(), nn.Linear(4, 2))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.embedding(ids))


@pytest.fixture
def model() -> nn.Module:
    torch.manual_seed(0)
    return _Text().double().eval()


def test_configure_and_remove_swap_the_module_back(model):
    ids = torch.tensor([[1, 4, 0, 9], [2, 2, 3, 7]])
    before = model(ids)
    original = model.embedding
    layer = ours.configure_interpretable_embedding_layer(model, "embedding")
    assert model.embedding is layer and layer.embedding is original
    assert (layer.embedding_dim, layer.num_embeddings) == (3, 10)
    torch.testing.assert_close(model(layer.indices_to_embeddings(ids)), before)  # the model now takes embeddings
    with pytest.raises(AssertionError, match="already"):
        ours.configure_interpretable_embedding_layer(model, "embedding")
    ours.remove_interpretable_embedding_layer(model, layer)
    assert model.embedding is original


def test_layer_integrated_gradients_on_integer_indices_equal_captum(model):
    ids = torch.tensor([[1, 4, 0, 9], [2, 2, 3, 7]])
    mine, my_delta = ours.LayerIntegratedGradients(model, model.embedding).attribute(
        ids, baselines=torch.zeros_like(ids), target=1, return_convergence_delta=True)
    theirs, their_delta = ca.LayerIntegratedGradients(model, model.embedding).attribute(
        ids, baselines=torch.zeros_like(ids), target=1, return_convergence_delta=True)
    assert mine.dtype == theirs.dtype == torch.float64 and my_delta.dtype.is_floating_point
    torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(my_delta.double(), their_delta.double(), rtol=0, atol=1e-5)
