"""The SHA-256 of a state dict, with the device's tensors brought to the host in a few large copies."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

__all__ = ["state_sha256"]

#: The most bytes of device tensors joined into one copy to the host (a larger tensor goes alone).
CHUNK_BYTES = 64 << 20


def _on_host(tensor: Tensor) -> bool:
    """Whether the tensor's bytes can be read where they are (a seam for the tests)."""
    return tensor.device.type == "cpu"


def state_sha256(state: Mapping[str, Any]) -> str:
    """SHA-256 of a state dict: for each key in sorted order, ``key|dtype|shape|`` then the values' bytes.

    CPU tensors are read in place. The other devices' tensors are joined into chunks of at most
    :data:`CHUNK_BYTES` on their device and each chunk is copied to the host once, rather than one
    copy (and one wait for the device) per tensor; the bytes hashed, and so the digest, are the same.

    Example:
        >>> import torch
        >>> from camkit.modelload.digest import state_sha256
        >>> state = {"w": torch.zeros(2), "b": torch.ones(1)}
        >>> state_sha256(state) == state_sha256(dict(reversed(state.items())))
        True
        >>> state_sha256(state) == state_sha256({"w": torch.zeros(3), "b": torch.ones(1)})
        False
    """
    digest = hashlib.sha256()
    pending: list[tuple[bytes, Tensor | None]] = []  # headers and byte views of device tensors not yet copied
    size = 0
    device = None  # the pending tensors' device
    for key, value in sorted(state.items()):
        tensor = value.detach()
        header = f"{key}|{tensor.dtype}|{list(tensor.shape)}|".encode()
        data = tensor.contiguous().view(-1).view(torch.uint8) if tensor.numel() else None
        if data is None and pending:  # nothing to copy: its header waits its turn
            pending.append((header, None))
            continue
        if data is not None and not _on_host(data):
            if pending and (data.device != device or size + data.numel() > CHUNK_BYTES):
                _flush(digest, pending)
                size = 0
            device = data.device
            pending.append((header, data))
            size += data.numel()
            continue
        _flush(digest, pending)
        size = 0
        digest.update(header)
        if data is not None:
            digest.update(data.numpy().tobytes())
    _flush(digest, pending)
    return digest.hexdigest()


def _flush(digest: Any, pending: list[tuple[bytes, Tensor | None]]) -> None:
    """Hash the pending headers and bytes in order, their bytes brought to the host in one copy; empties ``pending``."""
    if not pending:
        return
    views = [data for _, data in pending if data is not None]
    host = (views[0] if len(views) == 1 else torch.cat(views)).cpu().numpy()
    start = 0
    for header, data in pending:
        digest.update(header)
        if data is not None:
            digest.update(host[start : start + data.numel()].tobytes())
            start += data.numel()
    pending.clear()
