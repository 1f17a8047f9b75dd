"""torchcam's automatic layer choice, on camkit's hook scope."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ....hooks import HookScope

__all__ = ["locate_candidate_layer"]


def locate_candidate_layer(mod: nn.Module, input_shape: tuple[int, ...] = (3, 224, 224)) -> str | None:
    """The last module whose output keeps a spatial grid larger than one position for an input of ``input_shape``.

    torchcam 0.5.0's rule: a dry run on zeros records every module's output shape; the last
    one with as many axes as the input batch and a spatial axis longer than 1 wins.
    """
    shapes: list[tuple[str, tuple[int, ...]]] = []
    device = next(mod.parameters()).device
    modes = [(module, module.training) for module in mod.modules()]
    try:
        mod.eval()
        with HookScope() as hooks, torch.no_grad():
            for name, module in mod.named_modules():

                def record(_: nn.Module, _input: object, output: object, name: str = name) -> None:
                    if isinstance(output, Tensor):
                        shapes.append((name, tuple(output.shape)))

                hooks.forward(module, record)
            mod(torch.zeros((1, *input_shape), device=device))
    finally:  # every module's own flag back, also when eval() or the forward fails
        for module, training in modes:
            module.training = training
    for name, shape in reversed(shapes):
        if len(shape) == len(input_shape) + 1 and any(v != 1 for v in shape[2:]):
            return name
    return None
