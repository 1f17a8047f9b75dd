"""GradientShap (Lundberg & Lee 2017; expected gradients, Erion et al. 2021), batched under a memory bound."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ..._internal.syncs import to_device
from ...errors import InvalidInputError, InvalidTargetError
from ...explanation import Explanation
from ...targets.classes import OutputSelector, Target
from ...targets.tokens import TokenTarget
from .._core.binding import InputIndex
from ..registry import register_method
from ._baselines import baselines_for, check_baselines
from .pixel import GradientAttribution, score_gradients

__all__ = ["GradientShap"]


@register_method("gradientshap")
class GradientShap(GradientAttribution):
    """GradientShap: the expectation of ``(x' - b) * dS/dx(b + a (x' - b))`` over baselines, paths and noise.

    Each of ``samples`` draws picks a baseline ``b`` uniformly from ``baselines``, a point
    ``a ~ U(0, 1)`` on the straight path and Gaussian noise of standard deviation ``stdev``
    added to the image (``x' = x + noise``); ``raw`` is the mean over draws. Its expectation
    is the mean over baselines of the integrated gradients to each (for ``stdev=0``), so it
    sums per image to ``score(x) - mean_b score(b)`` on average, not draw by draw.

    The draws come from a generator seeded with ``seed`` and are shared by every image of
    the batch and every target column, so an image's result does not depend on the batch it
    is in. All ``B * samples`` points run through the model ``max_batch`` at a time.

    Any rank: ``x`` is a signal [B, C, T], an image [B, C, H, W] or a volume or a video
    [B, C, D, H, W] (written [B, C, *S]); ``raw`` is [B, C, *S] ([B, K, C, *S] for [B, K]
    targets) and ``maps`` [B, *S].

    Args:
        model: the model to explain.
        baselines: [N, C, *S] (or one baseline [C, *S]) with the input's rank, read when
            the input arrives; ``None`` (default) is one all-zero input.
        samples: draws per image (default 16).
        stdev: standard deviation of the noise added to the image (default 0).
        seed: the draws' seed; ``None`` draws one from torch's global generator (so
            ``torch.manual_seed`` fixes it too). ``extras["seed"]`` says which was used.
        max_batch: the most points run through the model at once (default 32).
        multiply_by_inputs: ``False`` leaves out the factor ``x' - b``: ``raw`` is then the mean
            gradient over the draws (captum's ``multiply_by_inputs=False``).
        draw_gaps: also return ``extras["draw_gaps"]`` [B, samples] ([B, samples, K] for [B, K]
            targets): each draw's ``sum((x' - b) * dS/dx) - (score(x') - score(b))`` (captum's
            convergence delta per draw). Costs one forward of the baselines, and with noise one
            forward of each noisy image, without gradients.
        output, keep_mode, input_index: see :class:`~camkit.Explainer` (keyword inputs only).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Flatten(), nn.Linear(2, 1, bias=False))  # linear: every draw is exact
        >>> with torch.no_grad():
        ...     _ = net[1].weight.copy_(torch.tensor([[1.0, -3.0]]))
        >>> baselines = torch.tensor([[[[0.0, 0.0]]], [[[1.0, 1.0]]]])
        >>> e = camkit.GradientShap(net, baselines, samples=64, seed=0).explain(torch.tensor([[[[2.0, 1.0]]]]), 0)
        >>> 1.0 < e.raw[0, 0, 0, 0].item() < 2.0  # (x - b) * w averaged over b: between 1 and 2
        True
    """

    reruns_rows = True

    cost: ClassVar[str] = "samples x (1 forward + 1 backward), in batches of max_batch"
    use_when: ClassVar[str] = (
        "You want SHAP-style attributions against a distribution of reference images, at a few dozen passes."
    )

    def __init__(
        self,
        model: nn.Module,
        baselines: Tensor | None = None,
        *,
        samples: int = 16,
        stdev: float = 0.0,
        seed: int | None = None,
        max_batch: int = 32,
        multiply_by_inputs: bool = True,
        draw_gaps: bool = False,
        output: OutputSelector = None,
        keep_mode: bool = False,
        input_index: InputIndex = 0,
    ) -> None:
        super().__init__(model, output=output, keep_mode=keep_mode, input_index=input_index)
        check_baselines(baselines)
        for name, value in (("samples", samples), ("max_batch", max_batch)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidInputError(f"{name} must be a positive int, got {value!r}")
        if not (isinstance(stdev, (int, float)) and math.isfinite(stdev) and stdev >= 0):
            raise InvalidInputError(f"stdev must be a finite number >= 0, got {stdev!r}")
        self.baselines = None if baselines is None else baselines.detach()
        self.samples, self.stdev, self.seed, self.max_batch = samples, float(stdev), seed, max_batch
        self.multiply_by_inputs = bool(multiply_by_inputs)
        self.draw_gaps = bool(draw_gaps)

    def _bind_inputs(self, x: Tensor, inputs: Sequence[Any] | None, kwargs: Mapping[str, Any] | None) -> Any:
        if inputs is not None:
            raise InvalidInputError(
                f"{type(self).__name__} runs the model on batches of sampled points, which other positional inputs "
                "cannot follow; pass per-call keyword inputs with kwargs= or wrap the model so x is its only "
                "positional input."
            )
        return super()._bind_inputs(x, inputs, kwargs)

    def draws(self, x: Tensor, seed: int) -> tuple[Tensor, Tensor, Tensor]:
        """The shared draws for input shape ``x``: baseline indices [S], path points [S], noise [S, C, *S].

        The noise is drawn last, so ``stdev`` does not change the other draws; with ``stdev=0``
        none is drawn and the noise is a zero tensor expanded to [S, C, *S] (no memory).
        """
        generator = torch.Generator(device="cpu").manual_seed(seed)
        index = torch.randint(0, baselines_for(self.baselines, x).shape[0], (self.samples,), generator=generator)
        alpha = torch.rand(self.samples, generator=generator, dtype=torch.float64)
        if self.stdev == 0:
            noise = torch.zeros((), device=x.device, dtype=x.dtype).expand(self.samples, *x.shape[1:])
        else:
            drawn = torch.randn(self.samples, *x.shape[1:], generator=generator, dtype=torch.float64) * self.stdev
            noise = to_device(drawn, x.device, x.dtype)
        return to_device(index, x.device), to_device(alpha, x.device, x.dtype), noise

    def _scores(self, output: Tensor, classes: Tensor | None, target: Target, rows: Tensor) -> Tensor:
        if classes is None:
            if not callable(target):
                raise InvalidTargetError(f"no classes were resolved for target {target!r}")
            scores = (target.for_rows(rows) if isinstance(target, TokenTarget) else target)(output)
            if not isinstance(scores, Tensor) or scores.shape[0] != output.shape[0]:
                raise InvalidTargetError(f"a callable target must return a tensor [N] or [N, K] for N={output.shape[0]} images")
            return scores
        chosen = classes[rows]
        return output.gather(1, chosen) if chosen.dim() == 2 else output.gather(1, chosen[:, None])[:, 0]

    def _explain(self, x: Tensor, target: Target) -> Explanation:
        x = x.detach()
        bases = baselines_for(self.baselines, x)
        seed = self.seed if self.seed is not None else int(torch.randint(0, 2**62, (1,)))
        index, alphas, noise = self.draws(x, seed)
        with torch.no_grad():
            classes, scores = self._target_scores(x, target)
        batch, samples = x.shape[0], self.samples
        total = torch.zeros((batch, *scores.shape[1:], *x.shape[1:]), dtype=torch.float32, device=x.device)
        gaps = torch.zeros((batch * samples, *scores.shape[1:]), dtype=torch.float32, device=x.device)
        if self.draw_gaps:
            with torch.no_grad():
                base_out = self._forward(bases)
        for start in range(0, batch * samples, self.max_batch):
            rows = torch.arange(start, min(start + self.max_batch, batch * samples), device=x.device)
            image, draw = rows // samples, rows % samples
            noisy = x[image] if self.stdev == 0 else x[image] + noise[draw]
            base = bases[index[draw]]
            step = noisy - base
            point = (base + alphas[draw].view(-1, *([1] * (x.dim() - 1))) * step).requires_grad_(True)
            with torch.enable_grad():
                chunk_scores = self._scores(self._forward_rows(point.clone(), image), classes, target, image)
                grads = score_gradients(chunk_scores, point).float()
            part = (step.unsqueeze(1) if grads.dim() == step.dim() + 1 else step).float() * grads
            if self.draw_gaps:
                with torch.no_grad():
                    ends = scores[image] if self.stdev == 0 else self._scores(self._forward(noisy), classes, target, image)
                    starts = self._scores(base_out[index[draw]], classes, target, image)
                gaps[rows] = part.flatten(part.dim() - x.dim() + 1).sum(dim=-1) - (ends - starts).float()
            total.index_add_(0, image, part if self.multiply_by_inputs else grads)
        raw = total / samples
        maps, flat = self.maps_from_raw(raw, tuple(x.shape[2:]))
        return Explanation(
            maps=maps, raw=raw, target=classes, scores=scores.detach(), flat=flat, method=self.key,
            extras={"samples": samples, "stdev": self.stdev, "seed": seed,
                    **({"draw_gaps": gaps.unflatten(0, (batch, samples))} if self.draw_gaps else {})},
        )
