"""torchcam 0.5.0's activation-based extractors on camkit: CAM, ScoreCAM, SSCAM, ISCAM."""

from __future__ import annotations

from functools import partial
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from .... import methods as _methods
from ....methods import CAMExplainer
from .core import _CAM, OutputTarget, _target_scores

__all__ = ["CAM", "ISCAM", "SSCAM", "ScoreCAM"]


def _one_column(raw: Any, fn: OutputTarget) -> Tensor:
    """A model output (a batched tensor or a per-sample list) scored by one per-sample target: [n, 1]."""
    rows = len(raw) if isinstance(raw, list) else raw.shape[0]
    return _target_scores(raw, [fn] * rows)[:, None]


def _first_column(out: Tensor) -> Tensor:
    return out[:, 0]


class CAM(_CAM):
    """CAM (Zhou et al. 2016) on :class:`camkit.CAM`: the linear head's weights of the class times the activations.

    Args:
        model: input model
        target_layer: the target layer or its name (one layer)
        fc_layer: the fully connected layer or its name; ``None``: the model's only ``nn.Linear``
        input_shape: shape of the expected input tensor excluding the batch dimension
    """

    _method: ClassVar[type[CAMExplainer] | None] = _methods.CAM

    def __init__(
        self,
        model: nn.Module,
        target_layer: nn.Module | str | list[nn.Module | str] | None = None,
        fc_layer: nn.Module | str | None = None,
        input_shape: tuple[int, ...] = (3, 224, 224),
        **kwargs: Any,
    ) -> None:
        if isinstance(target_layer, list) and len(target_layer) > 1:
            raise ValueError("base CAM does not support multiple target layers")
        super().__init__(model, target_layer, input_shape, **kwargs)
        if isinstance(fc_layer, str):
            fc_name = fc_layer
        elif isinstance(fc_layer, nn.Module):
            fc_name = self._resolve_layer_name(fc_layer)
        elif fc_layer is None:
            linear = [name for name, m in model.named_modules() if isinstance(m, nn.Linear)]
            if len(linear) == 0:
                raise ValueError("unable to resolve `fc_layer` automatically, please specify its value.")
            if len(linear) > 1:
                raise ValueError("This CAM method does not support multiple fully connected layers.")
            fc_name = linear[0]
        else:
            raise TypeError("invalid argument type for `fc_layer`")
        self.fc_name = fc_name
        self._fc_weights = self.submodule_dict[fc_name].weight.data
        if self._fc_weights.ndim > 2:
            self._fc_weights = self._fc_weights.view(*self._fc_weights.shape[:2])
        self._relu = False
        self._targets_supported = False

    def _options(self) -> dict[str, Any]:
        return {"fc": self.fc_name}


class ScoreCAM(_CAM):
    """torchcam's Score-CAM: channel weights from the softmax over channels of the score gains, on :class:`camkit.ISCAM` with one step.

    Args:
        model: input model
        target_layer: the target layer(s)
        batch_size: masked inputs per forward pass
        input_shape: shape of the expected input tensor excluding the batch dimension
    """

    _method: ClassVar[type[CAMExplainer] | None] = _methods.ISCAM
    _keep_mode: ClassVar[bool] = False  # torchcam scores the masked inputs in eval mode
    _lists_input_hook: ClassVar[bool] = True

    def __init__(
        self,
        model: nn.Module,
        target_layer: nn.Module | str | list[nn.Module | str] | None = None,
        batch_size: int = 32,
        input_shape: tuple[int, ...] = (3, 224, 224),
        **kwargs: Any,
    ) -> None:
        super().__init__(model, target_layer, input_shape, **kwargs)
        self.bs = batch_size
        self._targets_supported = True

    def _options(self) -> dict[str, Any]:
        return {"samples": 1, "batch_size": self.bs}

    def _raw_maps(self, x: Tensor, target: Any) -> list[Tensor]:
        fns = getattr(target, "per_sample", None)
        if fns is None:
            return super()._raw_maps(x, target)
        # Masked rows of several samples share a forward pass and a callable target sees no owner:
        # with torchcam's per-sample targets each sample is explained on its own, its target
        # turned into a one-column output (which also reads outputs that are not tensors).
        maps: list[list[Tensor]] = []
        for i, fn in enumerate(fns):
            explainer = self._explainer()
            explainer.output = partial(_one_column, fn=fn)
            raw = explainer.explain(x[i : i + 1], _first_column).raw
            maps.append(list(raw) if isinstance(raw, tuple) else [raw])
        return [torch.cat(layer) for layer in zip(*maps, strict=True)]

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}(batch_size={self.bs})"


class SSCAM(ScoreCAM):
    """SS-CAM on :class:`camkit.SSCAM`, drawing its noise from torch's global generator as torchcam does.

    Args:
        model: input model
        target_layer: the target layer(s)
        batch_size: masked inputs per forward pass
        num_samples: noisy samples per channel
        std: standard deviation of the noise added to the normalised activation
        input_shape: shape of the expected input tensor excluding the batch dimension
    """

    _method: ClassVar[type[CAMExplainer] | None] = _methods.SSCAM

    def __init__(
        self,
        model: nn.Module,
        target_layer: nn.Module | str | list[nn.Module | str] | None = None,
        batch_size: int = 32,
        num_samples: int = 35,
        std: float = 2.0,
        input_shape: tuple[int, ...] = (3, 224, 224),
        **kwargs: Any,
    ) -> None:
        super().__init__(model, target_layer, batch_size, input_shape, **kwargs)
        self.num_samples = num_samples
        self.std = std

    def _options(self) -> dict[str, Any]:
        return {"samples": self.num_samples, "std": self.std, "shared_noise": False, "batch_size": self.bs}

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}(batch_size={self.bs}, num_samples={self.num_samples}, std={self.std})"


class ISCAM(ScoreCAM):
    """IS-CAM on :class:`camkit.ISCAM`.

    Args:
        model: input model
        target_layer: the target layer(s)
        batch_size: masked inputs per forward pass
        num_samples: integration steps per channel
        input_shape: shape of the expected input tensor excluding the batch dimension
    """

    def __init__(
        self,
        model: nn.Module,
        target_layer: nn.Module | str | list[nn.Module | str] | None = None,
        batch_size: int = 32,
        num_samples: int = 10,
        input_shape: tuple[int, ...] = (3, 224, 224),
        **kwargs: Any,
    ) -> None:
        super().__init__(model, target_layer, batch_size, input_shape, **kwargs)
        self.num_samples = num_samples

    def _options(self) -> dict[str, Any]:
        return {"samples": self.num_samples, "batch_size": self.bs}
