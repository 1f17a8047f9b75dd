"""Score-CAMs whose channel weights average several masked inputs: SS-CAM and IS-CAM.

Both follow torchcam 0.5.0's definitions: each channel of the layer is min-max normalised at
the layer's resolution and upsampled into a mask (:func:`camkit.functional.score_masks`); a
channel's weight is the softmax over the channels of the mean score gain
``S(step mask * x) - S(x)`` over ``samples`` steps (the raw score, before any softmax over
classes); the map is ``relu(sum_k w_k A_k)`` on the layer's activations. They differ in the
steps: SS-CAM adds Gaussian noise to the mask, IS-CAM scales the masked input by growing
coefficients (:func:`camkit.functional.integration_coefficients`). With one IS-CAM step (or
SS-CAM with ``std=0``) this is torchcam's Score-CAM, which differs from camkit's
:class:`ScoreCAM` (that one weights by the class probability of the masked input, as the paper
and pytorch-grad-cam do).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ..._internal.syncs import to_device
from ...errors import InvalidInputError
from ...explanation import Explanation
from ...functional.cam import weighted_maps
from ...functional.score import integration_coefficients, score_masks
from ...layers.names import LayerSpec
from ...targets.classes import OutputSelector, Target
from .._core.binding import InputIndex
from .._core.cam_base import Reshape
from .._core.forward import Captured, ForwardCAM, RowScorer, check_positive, expand_targets, masked_forwards
from ..registry import register_method

__all__ = ["ISCAM", "SSCAM"]


class _AveragedScoreCAM(ForwardCAM):
    """Shared loop: for each step, score every (sample, channel) mask of the step; average the gains."""

    perturbs = True
    reruns_rows = True
    _desc: ClassVar[str] = ""

    def __init__(
        self,
        model: nn.Module,
        layer: LayerSpec = None,
        *,
        samples: int,
        batch_size: int = 32,
        progress: bool = False,
        call: int = -1,
        output: OutputSelector = None,
        keep_mode: bool = False,
        input_index: InputIndex = 0,
        reshape: Reshape | None = None,
    ) -> None:
        super().__init__(model, layer, call=call, output=output, keep_mode=keep_mode, input_index=input_index, reshape=reshape)
        self.samples = check_positive("samples", samples)
        self.batch_size = check_positive("batch_size", batch_size)
        self.progress = progress

    def _steps(self, masks: Tensor) -> Iterator[Tensor]:
        """The masks [B, C, *S] scored at each step, from the clean masks [B, C, *S]."""
        raise NotImplementedError

    def _raw(self, x: Tensor, act: Tensor, index: int, cap: Captured, target: Target, extras: dict[str, Any]) -> Tensor:
        size = tuple(x.shape[2:])
        b, c = act.shape[:2]
        masks = score_masks(act.float(), size)
        scorer = RowScorer(target, expand_targets(cap.classes), softmax=False, output=self.output)
        base = (cap.scores if cap.multi else cap.scores[:, None]).float()
        b_idx = torch.arange(b, device=x.device).repeat_interleave(c)
        gains = torch.zeros(b * c, base.shape[1], device=x.device)
        for step in self._steps(masks):
            rows = step.reshape(b * c, *size)
            for part, _, scores in masked_forwards(
                self, x, b_idx, rows.__getitem__, scorer,
                batch_size=self.batch_size, progress=self.progress, desc=self._desc,
            ):
                gains[part] += scores - base[b_idx[part]]
        weights = (gains / self.samples).view(b, c, -1).softmax(dim=1)
        extras["scored"] = extras.get("scored", 0) + b * c * self.samples
        raw = weighted_maps(weights, act.float())
        return raw if cap.multi else raw[:, 0]


@register_method("sscam")
class SSCAM(_AveragedScoreCAM):
    """SS-CAM (Wang et al. 2020, "Smoothed Score-CAM"), as torchcam 0.5.0 computes it.

    Each channel mask ``M_k`` (normalised at the layer, then upsampled) is scored
    ``samples`` times with Gaussian noise added, ``(M_k + delta) * x`` with
    ``delta ~ N(0, std^2)`` drawn at the input's resolution; the weights are the softmax over
    channels of the mean gain ``S((M_k + delta) * x) - S(x)``, and the map is
    ``relu(sum_k w_k A_k)`` (see :mod:`camkit.methods.cam.score_averaged`). Any rank.

    Noise: one draw [1, C, *S] per step, shared by the samples of the batch
    (``shared_noise=True``, the default), so a batch gives the same maps as its images one by
    one; ``shared_noise=False`` draws [B, C, *S] per step, as torchcam does (torchcam's draws
    come from torch's global generator: ``torch.manual_seed(s)`` there and ``seed=s`` here give
    the same noise and the same maps).

    Args:
        model: the model to explain.
        layer: the target layer(s) (see :class:`CAMExplainer`).
        samples: noisy steps per channel (torchcam's ``num_samples``, default 35).
        std: standard deviation of the noise added to the masks (in [0, 1]; default 2.0).
        seed: seed of a CPU generator made for each call (the same maps on every call);
            ``None``: ``generator``, else torch's global generator.
        generator: a CPU ``torch.Generator`` to draw from (its state advances).
        shared_noise: one noise draw for the whole batch per step (see above).
        batch_size: masked inputs per forward pass.
        progress: a tqdm bar per step.
        call, output, keep_mode, reshape, input_index: see :class:`CAMExplainer`.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        ...                     nn.Flatten(), nn.Linear(4, 2))
        >>> e = camkit.SSCAM(net, "1", samples=3, seed=0).explain(torch.rand(2, 3, 8, 8), target=1)
        >>> tuple(e.maps.shape), e.extras["scored"]  # 2 images x 4 channels x 3 steps
        ((2, 8, 8), 24)
    """

    cost: ClassVar[str] = "1 forward + samples x C forwards per image (torchcam's default: 35 x C)"
    use_when: ClassVar[str] = (
        "You want Score-CAM's gradient-free weights made steadier by averaging over noisy masks."
    )
    _desc = "SS-CAM"

    def __init__(
        self,
        model: nn.Module,
        layer: LayerSpec = None,
        *,
        samples: int = 35,
        std: float = 2.0,
        seed: int | None = None,
        generator: torch.Generator | None = None,
        shared_noise: bool = True,
        batch_size: int = 32,
        progress: bool = False,
        call: int = -1,
        output: OutputSelector = None,
        keep_mode: bool = False,
        input_index: InputIndex = 0,
        reshape: Reshape | None = None,
    ) -> None:
        super().__init__(
            model, layer, samples=samples, batch_size=batch_size, progress=progress, call=call, output=output,
            keep_mode=keep_mode, input_index=input_index, reshape=reshape,
        )
        if isinstance(std, bool) or not isinstance(std, (int, float)) or not std >= 0:
            raise InvalidInputError(f"std must be a number >= 0, got {std!r}")
        if seed is not None and generator is not None:
            raise InvalidInputError("pass seed= or generator=, not both (seed makes a fresh generator per call)")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise InvalidInputError(f"generator must be a torch.Generator, got {type(generator).__name__}")
        self.std = float(std)
        self.seed = seed
        self.generator = generator
        self.shared_noise = bool(shared_noise)
        self._drawing: torch.Generator | None = None

    def _explain(self, x: Tensor, target: Target) -> Explanation:
        # One generator for the whole call: several layers draw in turn, as torchcam's do.
        if self.seed is not None:
            self._drawing = torch.Generator().manual_seed(self.seed)
        else:
            self._drawing = self.generator if self.generator is not None else torch.default_generator
        try:
            return super()._explain(x, target)
        finally:
            self._drawing = None

    def _steps(self, masks: Tensor) -> Iterator[Tensor]:
        generator = self._drawing if self._drawing is not None else torch.default_generator
        shape = (1, *masks.shape[1:]) if self.shared_noise else tuple(masks.shape)
        for _ in range(self.samples):
            noise = torch.randn(shape, generator=generator, device=generator.device, dtype=torch.float32)
            yield masks + to_device(noise * self.std, masks.device)


@register_method("iscam")
class ISCAM(_AveragedScoreCAM):
    """IS-CAM (Naidu et al. 2020, "Integrated Score-CAM"), as torchcam 0.5.0 computes it.

    Each channel mask ``M_k`` (normalised at the layer, then upsampled) is scored at
    ``samples`` scales, ``c_i * (M_k * x)`` with ``c_i = sum_{j <= i} j / N``
    (:func:`camkit.functional.integration_coefficients`: 0.1, 0.3, ... 5.5 for ``N = 10``);
    the weights are the softmax over channels of the mean gain ``S(c_i M_k x) - S(x)``, and
    the map is ``relu(sum_k w_k A_k)`` (see :mod:`camkit.methods.cam.score_averaged`). No random
    draws: the result is deterministic. With ``samples=1`` it is torchcam's Score-CAM. Any rank.

    Args:
        model: the model to explain.
        layer: the target layer(s) (see :class:`CAMExplainer`).
        samples: integration steps per channel (torchcam's ``num_samples``, default 10).
        batch_size: masked inputs per forward pass.
        progress: a tqdm bar per step.
        call, output, keep_mode, reshape, input_index: see :class:`CAMExplainer`.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        ...                     nn.Flatten(), nn.Linear(4, 2))
        >>> e = camkit.ISCAM(net, "1", samples=2).explain(torch.rand(2, 3, 8, 8), target=1)
        >>> tuple(e.maps.shape), e.extras["scored"]
        ((2, 8, 8), 16)
    """

    cost: ClassVar[str] = "1 forward + samples x C forwards per image (torchcam's default: 10 x C)"
    use_when: ClassVar[str] = (
        "You want Score-CAM weights integrated over input scales (deterministic, no noise)."
    )
    _desc = "IS-CAM"

    def __init__(
        self,
        model: nn.Module,
        layer: LayerSpec = None,
        *,
        samples: int = 10,
        batch_size: int = 32,
        progress: bool = False,
        call: int = -1,
        output: OutputSelector = None,
        keep_mode: bool = False,
        input_index: InputIndex = 0,
        reshape: Reshape | None = None,
    ) -> None:
        super().__init__(
            model, layer, samples=samples, batch_size=batch_size, progress=progress, call=call, output=output,
            keep_mode=keep_mode, input_index=input_index, reshape=reshape,
        )

    def _steps(self, masks: Tensor) -> Iterator[Tensor]:
        coefficients = to_device(integration_coefficients(self.samples, dtype=masks.dtype), masks.device)
        for i in range(self.samples):
            yield masks * coefficients[i]
