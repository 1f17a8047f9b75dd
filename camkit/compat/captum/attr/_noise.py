"""captum's ``NoiseTunnel`` on :class:`camkit.SmoothGrad` around the translated method's camkit explainer."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ....methods import Explainer, SmoothGrad
from ._base import Attribution, NotComputedError

__all__ = ["SUPPORTED_NOISE_TUNNEL_TYPES", "NoiseTunnel"]

SUPPORTED_NOISE_TUNNEL_TYPES = ["smoothgrad", "smoothgrad_sq", "vargrad"]


class NoiseTunnel(Attribution):
    """captum's ``NoiseTunnel``: the wrapped method averaged over noisy copies, computed by camkit.SmoothGrad.

    ``stdevs`` is an absolute standard deviation, as in captum; camkit's SmoothGrad takes a fraction
    of each example's value range, so each example runs on its own with ``sigma = stdevs / range``.
    The noise is camkit's draw, not captum's.
    """

    def __init__(self, attribution_method: Attribution) -> None:
        if not isinstance(attribution_method, Attribution):
            raise NotComputedError(
                f"NoiseTunnel around {type(attribution_method).__name__}: camkit wraps its own translated methods only"
            )
        super().__init__(attribution_method.forward_func)
        self.attribution_method = attribution_method
        self.is_delta_supported = attribution_method.has_convergence_delta()

    @property
    def multiplies_by_inputs(self) -> bool:
        return self.attribution_method.multiplies_by_inputs

    def has_convergence_delta(self) -> bool:
        return self.is_delta_supported

    def attribute(
        self,
        inputs: Any,
        nt_type: str = "smoothgrad",
        nt_samples: int = 5,
        nt_samples_batch_size: int | None = None,
        stdevs: float | tuple[float, ...] = 1.0,
        draw_baseline_from_distrib: bool = False,
        **kwargs: Any,
    ) -> Any:
        if nt_type not in SUPPORTED_NOISE_TUNNEL_TYPES:
            raise AssertionError(f"Noise types must be either `smoothgrad`, `smoothgrad_sq` or `vargrad`. Given {nt_type}")
        if draw_baseline_from_distrib:
            raise NotComputedError("NoiseTunnel(draw_baseline_from_distrib=True): camkit keeps the baselines given")
        if kwargs.get("return_convergence_delta") and not self.is_delta_supported:
            raise NotComputedError(f"{type(self.attribution_method).__name__} has no convergence delta")
        if isinstance(stdevs, tuple):
            if len(set(stdevs)) != 1:
                raise NotComputedError("NoiseTunnel with a different stdev per input: camkit adds one noise level")
            stdevs = stdevs[0]
        seed = int(torch.randint(0, 2**31 - 1, ()).item())
        chunk = nt_samples_batch_size or nt_samples

        def wrap(explainer: Explainer, x: Tensor) -> Explainer:
            spread = float((x.max() - x.min()).item())
            if stdevs and spread == 0.0:
                raise NotComputedError(
                    "NoiseTunnel on an example whose values are all equal: camkit scales the noise by the example's range"
                )
            sigma = float(stdevs) / spread if spread else 0.0
            return SmoothGrad(explainer, samples=nt_samples, sigma=sigma, kind=nt_type, max_batch=chunk, seed=seed)  # type: ignore[arg-type]

        method = self.attribution_method
        method._wrap = wrap  # type: ignore[attr-defined]
        try:
            return method.attribute(inputs, **kwargs)
        finally:
            del method._wrap  # type: ignore[attr-defined]
