"""Channel-scoring CAMs without gradients: Score-CAM and Ablation-CAM."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, ClassVar, Literal, Union

import torch
from torch import Tensor, nn

from ..._internal import syncs as _syncs
from ...errors import CamkitWarning, InvalidInputError
from ...functional.cam import weighted_maps
from ...functional.maps import normalize_maps
from ...functional.perturbation import channel_masks, unique_rows
from ...hooks import HookScope
from ...layers.names import LayerSpec
from ...targets.classes import OutputSelector, Target, select_output
from .._core.binding import InputIndex
from .._core.forward import Captured, ForwardCAM, RowScorer, check_positive, chunks, expand_targets
from .._core.output import crop_window
from ..registry import register_method

__all__ = ["AblationCAM", "ScoreCAM"]

Tail = Union[Callable[[Tensor], Any], bool, None]


def _combine(weights: Tensor, act: Tensor, multi: bool, eigen_smooth: bool = False) -> Tensor:
    """``relu(sum_c w[b, c, k] A[b, c])``: [B, C, K] and [B, C, *s] to [B, K, *s] (or [B, *s])."""
    raw = weighted_maps(weights, act, eigen_smooth=eigen_smooth, exact=_syncs.reads_are_free(act))
    return raw if multi else raw[:, 0]


@register_method("scorecam")
class ScoreCAM(ForwardCAM):
    """Score-CAM (Wang et al. 2020): channels weighted by the score of the input they mask.

    For channel ``k`` the activation is upsampled to the input size and min-max normalised
    into a mask ``M_k`` (a constant channel gives a zero mask); its weight is the softmax
    probability of the target class for ``x * M_k``, with no baseline subtracted; the map is
    ``relu(sum_k w_k A_k)``. (torchcam instead passes the scores through a softmax over the
    channels, so its maps differ.) A callable target is applied to the masked inputs'
    outputs and its value used as the weight. Any rank: a signal's, image's or volume's
    channels are upsampled (linear, bilinear, trilinear) to the input's size and mask it
    over all its channels.

    Detectors (torchvision, ultralytics, DETR) with a :class:`~camkit.DetectionTarget`: each
    masked copy goes through the whole detector and its detection is matched again by IoU to
    the reference box (:meth:`~camkit.DetectionTarget.for_rows`); a copy where nothing matches
    any more weighs 0. For a detector that resizes and pads the image inside (torchvision's),
    ``M_k`` is made from the part of the channel's map that covers the image, upsampled to the
    padded size, cropped, then resized to the input's size.

    Cost and memory: one forward pass per mask, run without autograd in chunks of
    ``batch_size`` masked inputs that reuse one input buffer, so peak memory grows with
    ``batch_size`` and not with the channel count. On the CPU, channels whose normalised
    activations are identical (all-zero channels, for one) share one mask and are scored
    once; on a GPU every channel is scored, as counting the distinct masks would make the
    host wait for the device (the maps are the same either way).

    Args:
        model: the model to explain.
        layer: the target layer (see :class:`CAMExplainer`).
        batch_size: masked inputs per forward pass.
        top_k: score only the ``top_k`` channels per sample with the largest activation mass
            (``rank_by="mass"``: the sum over positions) or spatial variance
            (``rank_by="variance"``). The other channels get weight zero, so the map becomes the
            Score-CAM map restricted to those channels; time falls in proportion to
            ``top_k / C``. ``None`` (default) scores every channel. Measured on trained models
            (``benchmarks/RESULTS.md``): ``top_k=16`` of 64 channels ran 3.8x faster with a mean
            Spearman rank correlation of 0.956 to the full map on a CIFAR ResNet-20 (``layer3``)
            and 0.819 on the demo CNN.
        rank_by: ``"mass"`` or ``"variance"``, see ``top_k``.
        progress: show a tqdm progress bar over the masked inputs.
        call, output, keep_mode, eigen_smooth, input_index: see :class:`CAMExplainer`.

    ``explanation.extras["scored"]`` is the number of masked inputs that were run.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        ...                     nn.Flatten(), nn.Linear(4, 2))
        >>> explanation = camkit.ScoreCAM(net, "1", batch_size=8).explain(torch.rand(2, 3, 8, 8))
        >>> tuple(explanation.maps.shape), explanation.extras["scored"] <= 8
        ((2, 8, 8), True)
    """

    cost: ClassVar[str] = "1 forward + 1 forward per distinct channel mask (C per image; top_k= fewer)"
    use_when: ClassVar[str] = (
        "You distrust gradients (saturated or noisy) and can afford one forward per channel."
    )

    perturbs = True
    reruns_rows = True

    def __init__(
        self,
        model: nn.Module,
        layer: LayerSpec = None,
        *,
        batch_size: int = 32,
        top_k: int | None = None,
        rank_by: Literal["mass", "variance"] = "mass",
        progress: bool = False,
        call: int = -1,
        output: OutputSelector = None,
        keep_mode: bool = False,
        input_index: InputIndex = 0,
        eigen_smooth: bool = False,
    ) -> None:
        super().__init__(model, layer, call=call, output=output, keep_mode=keep_mode, input_index=input_index, eigen_smooth=eigen_smooth)
        self.batch_size = check_positive("batch_size", batch_size)
        self.top_k = None if top_k is None else check_positive("top_k", top_k)
        if rank_by not in ("mass", "variance"):
            raise InvalidInputError(f"rank_by must be 'mass' or 'variance', got {rank_by!r}")
        self.rank_by = rank_by
        self.progress = progress

    def _rows(self, act: Tensor) -> tuple[Tensor, Tensor]:
        """The (sample, channel) pairs to score, [R] each."""
        b, c = act.shape[:2]
        device = act.device
        if self.top_k is None or self.top_k >= c:
            channels = torch.arange(c, device=device).expand(b, c)
        else:
            flat = act.flatten(2).float()
            rank = flat.sum(dim=2) if self.rank_by == "mass" else flat.var(dim=2, unbiased=False)
            channels = rank.topk(self.top_k, dim=1).indices
        samples = torch.arange(b, device=device)[:, None].expand_as(channels)
        return samples.reshape(-1), channels.reshape(-1)

    def _raw(self, x: Tensor, act: Tensor, index: int, cap: Captured, target: Target, extras: dict[str, Any]) -> Tensor:
        size = tuple(x.shape[2:])
        b_idx, c_idx = self._rows(act)
        if _syncs.reads_are_free(act):
            # One row per distinct (sample, normalised activation): identical masks are scored
            # once. Only where counting them is free: on a device the count would be a host sync.
            low = normalize_maps(act[b_idx, c_idx].float(), spatial_dims=len(size))[0].flatten(1)
            first, inverse = unique_rows(torch.cat([b_idx[:, None].to(low.dtype), low], dim=1))
        else:
            first = inverse = torch.arange(len(b_idx), device=act.device)
        ub, uc = b_idx[first], c_idx[first]
        scorer = RowScorer(target, expand_targets(cap.classes), softmax=True, output=self.output)
        window = self._window(x)  # a detector that resizes and pads inside: masks cover the image's part
        on_image = (lambda a: a) if window is None else (lambda a: crop_window(a, window))
        k = cap.scores.shape[1] if cap.multi else 1
        scored = torch.empty(len(first), k, device=act.device, dtype=torch.float32)
        buffer = torch.empty((min(self.batch_size, len(first)), *x.shape[1:]), dtype=x.dtype, device=x.device)
        with torch.inference_mode():
            for part in chunks(len(first), self.batch_size, progress=self.progress, desc="Score-CAM"):
                rows = buffer[: part.stop - part.start]
                torch.index_select(x, 0, ub[part], out=rows)
                rows.mul_(channel_masks(on_image(act[ub[part], uc[part]]), size).to(x.dtype)[:, None])
                scored[part] = scorer(self._call_model_rows(rows, ub[part]), ub[part]).float()
        weights = torch.zeros(act.shape[0], act.shape[1], k, device=act.device)
        weights[b_idx, c_idx] = scored[inverse]
        extras["scored"] = extras.get("scored", 0) + len(first)
        return _combine(weights, act.float(), cap.multi, self.eigen_smooth)


def _sequential_tail(model: nn.Module, name: str) -> Callable[[Tensor], Any] | None:
    """The modules after ``name`` when every container on its path is a plain ``nn.Sequential``."""
    path = name.split(".")
    levels: list[list[nn.Module]] = []
    parent = model
    for step in path:
        if not isinstance(parent, nn.Sequential) or type(parent).forward is not nn.Sequential.forward:
            return None
        keys = list(parent._modules)
        if step not in keys:
            return None
        levels.append([m for m in list(parent._modules.values())[keys.index(step) + 1 :] if m is not None])
        parent = parent._modules[step]
    rest = [m for level in reversed(levels) for m in level]

    def tail(t: Tensor) -> Any:
        for module in rest:
            t = module(t)
        return t

    return tail


@register_method("ablationcam")
class AblationCAM(ForwardCAM):
    """Ablation-CAM (Ramaswamy et al. 2020): channels weighted by the score lost when each is zeroed.

    ``w_k = y - y_k``, where ``y`` is the target score (the model's output, before softmax) and
    ``y_k`` the score with channel ``k`` of the target layer set to zero; the map is
    ``relu(sum_k w_k A_k)`` (any rank: the layer's output is [B, C, *s]). The paper divides by ``y``; that only rescales each map when
    ``y > 0`` (normalisation removes it) and flips or blows it up when ``y <= 0``, so it is
    left out. Channels that are already all zero get weight 0 (on the CPU they are not
    rerun; on a GPU they are, as counting them would make the host wait for the device).

    Only the network *after* the layer changes, so where it can be run on its own camkit
    reruns just that part on the cached activation: automatically when the layer sits in a
    chain of plain ``nn.Sequential`` containers, or through ``tail=``. Otherwise every
    ablation costs a full forward pass (with one warning per explainer).

    Detectors with a :class:`~camkit.DetectionTarget`: each ablated copy's output is matched
    again by IoU to the reference box (:meth:`~camkit.DetectionTarget.for_rows`), and ``y_k``
    is 0 where nothing matches any more.

    Args:
        model: the model to explain.
        layer: the target layer (one layer).
        batch_size: ablated copies per forward pass.
        tail: ``None`` (default): detect an ``nn.Sequential`` tail, else run full forwards;
            a callable mapping the layer's output [n, C, *s] to the model's output (checked
            once per call against the real output); ``False``: always run full forwards.
        progress: show a tqdm progress bar.
        call, output, keep_mode, eigen_smooth, input_index: see :class:`CAMExplainer`.

    ``explanation.extras["tail"]`` tells whether the tail-only path was used.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        ...                     nn.Flatten(), nn.Linear(4, 2))
        >>> explanation = camkit.AblationCAM(net, "1").explain(torch.rand(2, 3, 8, 8))
        >>> tuple(explanation.maps.shape), explanation.extras["tail"]
        ((2, 8, 8), True)
    """

    cost: ClassVar[str] = "1 forward + C reruns of the network after the layer (full forwards without a tail)"
    use_when: ClassVar[str] = (
        "You want gradient-free channel weights from what each channel adds to the score."
    )

    perturbs = True
    reruns_rows = True
    reads_grids = False

    def __init__(
        self,
        model: nn.Module,
        layer: LayerSpec = None,
        *,
        batch_size: int = 32,
        tail: Tail = None,
        progress: bool = False,
        call: int = -1,
        output: OutputSelector = None,
        keep_mode: bool = False,
        input_index: InputIndex = 0,
        eigen_smooth: bool = False,
    ) -> None:
        super().__init__(model, layer, call=call, output=output, keep_mode=keep_mode, input_index=input_index, eigen_smooth=eigen_smooth)
        self.batch_size = check_positive("batch_size", batch_size)
        if not (tail is None or tail is False or callable(tail)):
            raise InvalidInputError(f"tail must be None, False or a callable, got {type(tail).__name__}")
        self.tail = tail
        self.progress = progress
        self._warned = False
        self._tails_checked: set[tuple[Any, ...]] = set()

    def _find_tail(self, name: str, calls: int) -> tuple[Callable[[Tensor], Any] | None, bool]:
        """``(tail, user_given)``."""
        if self.tail is False:
            return None, False
        if callable(self.tail):
            if len(self.layers()) != 1:
                raise InvalidInputError("tail= needs exactly one target layer")
            return self.tail, True
        return (_sequential_tail(self.model, name) if calls == 1 else None), False

    def _raw(self, x: Tensor, act: Tensor, index: int, cap: Captured, target: Target, extras: dict[str, Any]) -> Tensor:
        name, module = self.layers()[index]
        tail, user_given = self._find_tail(name, cap.calls[index])
        if tail is not None and user_given and self._tail_unchecked(act, x):
            with torch.no_grad():
                rerun = select_output(tail(act.clone()), self.output)
            expected = cap.output
            if rerun.shape != expected.shape or not torch.allclose(rerun, expected, rtol=1e-4, atol=1e-4):
                raise InvalidInputError(
                    f"tail(output of '{name}') does not reproduce the model's output (shape "
                    f"{list(rerun.shape)}, expected {list(expected.shape)} with the same values); pass a tail "
                    "that runs exactly the network after the layer, or tail=False for full forward passes."
                )
        if tail is None and self.tail is not False and not self._warned:
            self._warned = True
            warnings.warn(
                f"AblationCAM: the network after layer '{name}' cannot be rerun on its own (it is not a "
                "chain of plain nn.Sequential containers), so each ablated channel costs a full forward "
                "pass. Pass tail=f, with f(layer output) = model output, to rerun only the tail.",
                CamkitWarning,
                stacklevel=4,
            )
        extras["tail"] = tail is not None
        # Channels that are all zero already: ablating them changes nothing (weight 0). They
        # are skipped where counting them is free; on a device they run and get weight 0.
        alive = act.flatten(2).ne(0).any(dim=2)  # [B, C]
        if _syncs.reads_are_free(alive):
            live = alive.nonzero()
            b_idx, c_idx = live[:, 0], live[:, 1]
        else:
            every = torch.arange(alive.numel(), device=act.device)
            b_idx, c_idx = every // act.shape[1], every % act.shape[1]
        scorer = RowScorer(target, expand_targets(cap.classes), softmax=False, output=self.output)
        base = cap.scores if cap.multi else cap.scores[:, None]
        ablated = base.float()[b_idx].clone()
        source = act if tail is not None else x
        buffer = torch.empty((min(self.batch_size, len(b_idx)), *source.shape[1:]), dtype=source.dtype, device=x.device)
        drop = {"channels": c_idx[:0]}
        ordinal = cap.calls[index] + self.call if self.call < 0 else self.call

        def zero_channel(mod: nn.Module, args: Any, out: Tensor) -> Tensor | None:
            seen["n"] += 1
            if seen["n"] - 1 != ordinal:
                return None
            out = out.clone()
            out[torch.arange(out.shape[0], device=out.device), drop["channels"]] = 0
            return out

        seen = {"n": 0}
        with torch.inference_mode(), HookScope() as hooks:
            if tail is None:
                hooks.forward(module, zero_channel)
            for part in chunks(len(b_idx), self.batch_size, progress=self.progress, desc="Ablation-CAM"):
                rows = buffer[: part.stop - part.start]
                torch.index_select(source, 0, b_idx[part], out=rows)
                if tail is not None:
                    rows.index_put_((torch.arange(rows.shape[0], device=rows.device), c_idx[part]), rows.new_zeros(()))
                    ablated[part] = scorer(tail(rows), b_idx[part]).float()
                else:
                    drop["channels"], seen["n"] = c_idx[part], 0
                    ablated[part] = scorer(self._call_model_rows(rows, b_idx[part]), b_idx[part]).float()
        weights = torch.zeros(act.shape[0], act.shape[1], base.shape[1], device=act.device)
        weights[b_idx, c_idx] = base.float()[b_idx] - ablated
        weights = torch.where(alive[:, :, None], weights, 0.0)
        return _combine(weights, act.float(), cap.multi, self.eigen_smooth)

    def _tail_unchecked(self, act: Tensor, x: Tensor) -> bool:
        """Whether the user's tail still needs its check against the model's output.

        The check reads a comparison back to the host: it runs on every call where that is
        free, and on a device once per input shape (a tail that reproduces the model once
        does so for every input of that shape).
        """
        key = (id(self.tail), tuple(x.shape), str(x.device), x.dtype)
        if _syncs.reads_are_free(act):
            return True
        if key in self._tails_checked:
            return False
        self._tails_checked.add(key)
        return True
