"""Quantus 0.6.0's region-based faithfulness metrics (and Sufficiency, ROAD) on :mod:`camkit.metrics`."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from camkit import metrics
from camkit._internal.state import eval_mode
from camkit.errors import InvalidInputError

from ._base import Metric, Result, is_default
from ._patches import patch_scores
from ._perturbation import NumpyMaskPerturbation
from .functions.perturb_func import baseline_replacement_by_mask, batch_baseline_replacement_by_indices

__all__ = ["IROF", "ROAD", "RegionPerturbation", "Selectivity", "Sufficiency"]


def _curves(values: Tensor) -> Result:
    return [[float(v) for v in row] for row in values.double().cpu().tolist()]


class _Patches(Metric):
    def step_fill(self, x: Tensor, regions: int) -> Tensor | None:
        """``"uniform"``: Quantus's draws, one call of size B per removed patch, as a fill [B, regions]."""
        if not self.uniform:
            return None
        return torch.as_tensor(np.random.uniform(*self.uniform_bounds, size=(regions, x.shape[0])), device=x.device).T


class RegionPerturbation(_Patches):
    """Quantus's ``RegionPerturbation`` on :func:`camkit.metrics.region_perturbation`: each sample's drops.

    Equal to Quantus when ``patch_size`` divides the input's sides (Quantus pads the input to
    a multiple of it and shifts its grid by half the padding; camkit's grid starts at the first
    pixel and ends in shorter patches). ``perturb_baseline="uniform"`` draws one value per sample
    and step from numpy in Quantus's order; ``order="random"`` draws its order from a torch
    generator seeded from numpy (not Quantus's permutation). A ``perturb_func`` (images and signals)
    runs Quantus's own loop (:mod:`._patches`): called as Quantus calls it on the padded images,
    for any ``patch_size``, patches of equal sums and ``order="random"`` in numpy's order; equal to Quantus.
    """

    softmax_default = True
    takes_predict_kwargs = True
    uniform_order = "fill"  # "uniform": one value per sample and step, as a fill
    perturb_default = staticmethod(batch_baseline_replacement_by_indices)

    def __init__(
        self, patch_size: int = 8, order: str = "morf", regions_evaluation: int = 100, abs: bool = False,
        normalise: bool = True, perturb_baseline: Any = "black", **kwargs: Any,
    ) -> None:  # fmt: skip
        super().__init__(abs=abs, normalise=normalise, perturb_baseline=perturb_baseline, **kwargs)
        self.patch_size = patch_size
        self.order = order.lower()
        self.regions_evaluation = regions_evaluation

    def evaluate(
        self, model: nn.Module, x: Tensor, y: Tensor, a: Tensor, s: Tensor | None, *, softmax: bool, chunk_size: int
    ) -> Result:
        if self.perturb_func is not None and x.dim() in (3, 4):
            return _curves(patch_scores(
                model, x, y, a, self.perturb_func, patch_size=self.patch_size, order=self.order,
                regions=self.regions_evaluation, softmax=softmax, chunk_size=chunk_size, drops=True,
            ))  # fmt: skip
        generator = None
        if self.order == "random":
            generator = torch.Generator().manual_seed(int(np.random.randint(0, 2**31 - 1)))
        regions = min(self.regions_evaluation, int(np.prod([-(-n // self.patch_size) for n in x.shape[2:]])))
        drops = metrics.region_perturbation(
            model, x, a.expand_as(x), y, patch_size=self.patch_size, order=self.order, regions=regions,
            baseline=self.baseline, fill=self.step_fill(x, regions), generator=generator, softmax=softmax,
            chunk_size=chunk_size, perturb=self.perturb_hook(),
        )  # fmt: skip
        return _curves(drops)


class Selectivity(_Patches):
    """Quantus's ``Selectivity`` on :func:`camkit.metrics.selectivity`: each sample's scores.

    Equal to Quantus when ``patch_size`` divides the input's sides (see :class:`RegionPerturbation`),
    ``perturb_baseline="uniform"`` included (one draw per sample and patch, as Quantus). A
    ``perturb_func`` is called as Quantus calls it (the padded images [B, F] and the patch's
    elements [B, C * patch_size ** 2], each step on the previous step's array; see
    :class:`RegionPerturbation`), for any ``patch_size``; equal to Quantus.
    """

    softmax_default = True
    takes_predict_kwargs = True
    uniform_order = "fill"  # "uniform": one value per sample and step, as a fill
    perturb_default = staticmethod(batch_baseline_replacement_by_indices)

    def __init__(
        self, patch_size: int = 8, abs: bool = False, normalise: bool = True, perturb_baseline: Any = "black",
        **kwargs: Any,
    ) -> None:  # fmt: skip
        super().__init__(abs=abs, normalise=normalise, perturb_baseline=perturb_baseline, **kwargs)
        self.patch_size = patch_size

    def evaluate(
        self, model: nn.Module, x: Tensor, y: Tensor, a: Tensor, s: Tensor | None, *, softmax: bool, chunk_size: int
    ) -> Result:
        if self.perturb_func is not None and x.dim() in (3, 4):
            return _curves(patch_scores(
                model, x, y, a, self.perturb_func, patch_size=self.patch_size, softmax=softmax, chunk_size=chunk_size,
            ))  # fmt: skip
        regions = int(np.prod([-(-n // self.patch_size) for n in x.shape[2:]]))
        scores = metrics.selectivity(
            model, x, a.expand_as(x), y, patch_size=self.patch_size, baseline=self.baseline,
            fill=self.step_fill(x, regions), softmax=softmax, chunk_size=chunk_size, perturb=self.perturb_hook(),
        )  # fmt: skip
        return _curves(scores)


class IROF(Metric):
    """Quantus's ``IROF`` on :func:`camkit.metrics.irof` (SLIC or Felzenszwalb superpixels of each image, as Quantus).

    Differs from Quantus: Quantus returns ``K - area`` of the relative-score curve over unit
    steps without its starting point, a number that grows with the image's segment count
    ``K``; camkit returns the paper's area over the curve on removed shares ``0..1``, from the
    unperturbed point. Quantus's ``"mean"`` baseline is the mean of the whole batch, recomputed
    after every removal; here it is each sample's mean over all its values. A ``perturb_func`` is
    called as Quantus calls it: ``f(arr=images [B, C, H, W], mask=[B, 1, H, W])`` once per removed
    segment, on the previous step's images.
    """

    softmax_default = True
    perturb_default = staticmethod(baseline_replacement_by_mask)
    takes_predict_kwargs = True

    def __init__(
        self, segmentation_method: str = "slic", abs: bool = False, normalise: bool = True,
        perturb_baseline: Any = "mean", **kwargs: Any,
    ) -> None:  # fmt: skip
        if segmentation_method not in ("slic", "felzenszwalb"):
            raise InvalidInputError(f"IROF's segmentation_method is 'slic' or 'felzenszwalb', got {segmentation_method!r}")
        super().__init__(abs=abs, normalise=normalise, perturb_baseline=perturb_baseline, **kwargs)
        self.segmentation_method = segmentation_method

    def evaluate(
        self, model: nn.Module, x: Tensor, y: Tensor, a: Tensor, s: Tensor | None, *, softmax: bool, chunk_size: int
    ) -> Result:
        segments = None  # SLIC: the native default
        if self.segmentation_method == "felzenszwalb":
            from skimage.segmentation import felzenszwalb  # only this option needs it

            # as Quantus calls it: scikit-image's defaults on each image as [H, W, C] doubles
            images = x.detach().cpu().double().movedim(1, -1).numpy()
            segments = torch.stack([torch.from_numpy(felzenszwalb(image)) for image in images]).to(x.device)
        perturb = None if self.perturb_func is None else NumpyMaskPerturbation(self.perturb_func)
        values = metrics.irof(
            model, x, a, y, segments=segments, baseline=self.baseline, softmax=softmax, chunk_size=chunk_size,
            perturb=perturb,
        )
        return [float(v) for v in values.tolist()]


class Sufficiency(Metric):
    """Quantus's ``Sufficiency`` on :func:`camkit.metrics.sufficiency`, within each batch of ``batch_size``
    as Quantus, with distances divided by the batch's largest (``relative=True``, as Quantus
    always does); equal to Quantus."""

    softmax_default = True
    takes_predict_kwargs = True

    def __init__(
        self, threshold: float = 0.6, distance_func: str = "seuclidean", abs: bool = True, normalise: bool = True,
        **kwargs: Any,
    ) -> None:  # fmt: skip
        super().__init__(abs=abs, normalise=normalise, perturb_baseline=0.0, **kwargs)
        self.threshold = threshold
        self.distance_func = distance_func

    def evaluate(
        self, model: nn.Module, x: Tensor, y: Tensor, a: Tensor, s: Tensor | None, *, softmax: bool, chunk_size: int
    ) -> Result:
        values = metrics.sufficiency(
            model, x, a, threshold=self.threshold, distance=self.distance_func, relative=True,
            chunk_size=chunk_size,
        )
        return [float(v) for v in values.tolist()]


class ROAD(Metric):
    """Quantus's ``ROAD`` on :func:`camkit.metrics.road_curve` (``hits=True``, MoRF): ``{percentage: accuracy}``.

    Differs from Quantus: Quantus's imputation reads the flattened channels as positions, so it
    fails on inputs with more than one channel, and it averages the first batch only; camkit
    imputes every channel and averages every sample. camkit removes ``ceil(p * N / 100)`` of
    the ``N`` positions (Quantus: ``int(p * C * N / 100)`` elements, the same on one channel
    where ``p * N / 100`` is whole). The imputation noise is drawn from a torch generator seeded
    from numpy (equal to Quantus for ``noise=0``).

    A ``perturb_func`` other than Quantus's ``noisy_linear_imputation`` is called as Quantus calls
    it: ``perturb_func(arr=x_i [C, *S], indices=..., noise=noise, **perturb_func_kwargs)`` for each
    input and percentage, the indices the first ``int(p * a_i.size / 100)`` of
    ``argsort(-a_i)`` (numpy's order, the map broadcast to the input's shape and flattened); equal
    to Quantus on each sample (Quantus still averages the first batch only).
    ``perturb_func_kwargs["noise"]`` sets the noise, as in Quantus.
    """

    softmax_default = True
    takes_predict_kwargs = True

    def __init__(
        self, percentages: list[float] | None = None, noise: float = 0.01, abs: bool = False, normalise: bool = True,
        perturb_func: Any = None, perturb_func_kwargs: dict[str, Any] | None = None, **kwargs: Any,
    ) -> None:  # fmt: skip
        super().__init__(abs=abs, normalise=normalise, perturb_baseline=0.0, **kwargs)
        self.percentages = list(percentages) if percentages is not None else list(range(1, 100, 2))
        options = {"noise": noise, **(perturb_func_kwargs or {})}
        self.noise = options["noise"]
        if not is_default("ROAD", "perturb_func", perturb_func):
            self.perturb_func = functools.partial(perturb_func, **options)

    def evaluate(
        self, model: nn.Module, x: Tensor, y: Tensor, a: Tensor, s: Tensor | None, *, softmax: bool, chunk_size: int
    ) -> Result:
        if self.perturb_func is not None:
            return self._called(model, x, y, a, chunk_size)
        generator = torch.Generator().manual_seed(int(np.random.randint(0, 2**31 - 1)))
        maps = a.flatten(1).view(a.shape[0], a.shape[1], -1).sum(dim=1).view(a.shape[0], *a.shape[2:])
        _, hits = metrics.road_curve(
            model, x, maps, y, fractions=[p / 100 for p in self.percentages], noise=self.noise, softmax=softmax,
            chunk_size=chunk_size, generator=generator, hits=True,
        )  # fmt: skip
        return _curves(hits)

    def _called(self, model: nn.Module, x: Tensor, y: Tensor, a: Tensor, chunk_size: int) -> Result:
        """Quantus's loop over the percentages with the caller's ``perturb_func``: hits [B, P]."""
        assert self.perturb_func is not None
        inputs = (x[:, 0] if getattr(self, "_tabular", False) else x).detach().cpu().numpy().copy()
        order = np.argsort(-a.expand_as(x).flatten(1).cpu().numpy(), axis=1)
        hits = []
        with torch.no_grad(), eval_mode(model):
            for p in self.percentages:
                top = order[:, : int(a[0].numel() * p / 100)]
                arr = np.stack([np.asarray(self.perturb_func(arr=xi, indices=k)) for xi, k in zip(inputs, top)])
                perturbed = torch.as_tensor(arr.reshape(x.shape), dtype=x.dtype, device=x.device)
                predicted = torch.cat([model(chunk).argmax(dim=-1) for chunk in perturbed.split(chunk_size)])
                hits.append(predicted == y)
        return _curves(torch.stack(hits, dim=1))

    def combine(self, scores: Result) -> Result:
        means = np.mean(np.array(scores, dtype=float), axis=0)
        return dict(zip(self.percentages, (float(m) for m in means)))  # type: ignore[return-value]
