"""The decode stage of a run: a ``DataLoader`` over the dataset, with worker processes reading ahead of the model.

Shared by ``camkit audit`` and ``camkit.evaluate``.
"""

from __future__ import annotations

from typing import Any

import torch

from .data import AuditDataset

__all__ = ["make_loader"]


def make_loader(items: AuditDataset, batch_size: int, workers: int, device: torch.device) -> Any:
    """The decode stage: a ``DataLoader`` over ``items`` with ``workers`` processes (0: in this one)."""
    from torch.utils.data import DataLoader

    return DataLoader(
        items, batch_size=batch_size, shuffle=False, num_workers=workers, pin_memory=device.type == "cuda",
        persistent_workers=False, prefetch_factor=2 if workers > 0 else None,
    )  # fmt: skip
