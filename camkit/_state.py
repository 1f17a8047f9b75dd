"""Save and restore what an explainer may touch on the caller's model."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn

__all__ = ["eval_mode"]


@contextmanager
def eval_mode(model: nn.Module, *, enabled: bool = True) -> Iterator[nn.Module]:
    """Run a block with ``model`` in eval mode, restoring every module's own flag after.

    Each module's ``training`` flag is saved separately, so a model with mixed flags
    (say a frozen backbone in eval and a head in train) gets exactly its flags back,
    also when the block raises. With ``enabled=False`` the caller's modes are kept.

    Example:
        >>> from torch import nn
        >>> from camkit._state import eval_mode
        >>> net = nn.Sequential(nn.Dropout(), nn.Dropout()); net[1].eval()
        Dropout(p=0.5, inplace=False)
        >>> with eval_mode(net):
        ...     print([m.training for m in net.modules()])
        [False, False, False]
        >>> [m.training for m in net.modules()]
        [True, True, False]
    """
    flags = [(m, m.training) for m in model.modules()]
    try:
        if enabled:
            model.eval()
        yield model
    finally:
        for module, flag in flags:
            module.training = flag
