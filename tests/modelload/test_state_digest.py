"""The state dict's SHA-256: the same digest as one host copy per tensor gave, with device tensors copied in chunks."""

from __future__ import annotations

import hashlib

import pytest
import torch

from camkit.modelload import digest as digest_module
from camkit.modelload import load_model
from camkit.modelload.digest import state_sha256


def _one_by_one(state: dict[str, torch.Tensor]) -> str:
    # The digest as it was computed before: each tensor copied to the host alone.
    digest = hashlib.sha256()
    for key, value in sorted(state.items()):
        tensor = value.detach().to("cpu").contiguous()
        digest.update(f"{key}|{tensor.dtype}|{list(tensor.shape)}|".encode())
        if tensor.numel():
            digest.update(tensor.view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "b.weight": torch.randn(4, 3, generator=g),
        "a.half": torch.randn(5, generator=g).half(),
        "c.count": torch.tensor(7),  # 0-dim
        "d.mask": torch.tensor([True, False, True]),
        "e.empty": torch.zeros(0, 3),
        "f.transposed": torch.randn(3, 4, generator=g).t(),  # not contiguous
        "g.index": torch.arange(6, dtype=torch.int64),
    }


def test_digest_unchanged_on_the_host():
    state = _state()
    assert state_sha256(state) == _one_by_one(state)


@pytest.mark.parametrize("chunk", [1, 16, 1 << 20])
def test_digest_unchanged_through_the_chunked_device_path(monkeypatch, chunk):
    state = _state()
    monkeypatch.setattr(digest_module, "_on_host", lambda tensor: False)  # every tensor takes the device path
    monkeypatch.setattr(digest_module, "CHUNK_BYTES", chunk)
    copies = []
    cpu = torch.Tensor.cpu
    monkeypatch.setattr(torch.Tensor, "cpu", lambda self, *a, **k: copies.append(self.numel()) or cpu(self, *a, **k))
    assert state_sha256(state) == _one_by_one(state)
    tensors = sum(1 for t in state.values() if t.numel())
    if chunk == 1 << 20:
        assert len(copies) == 1  # one copy for the whole state
    else:
        assert 1 < len(copies) <= tensors


def test_loaded_model_digest_is_the_state_digest():
    loaded = load_model(torch.nn.Linear(3, 2), size=4, device="cpu")
    assert loaded.weights_sha256() == _one_by_one(loaded.model.state_dict())
