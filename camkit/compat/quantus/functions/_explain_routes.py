"""The two branches of Quantus's ``explain`` that camkit computes through other translations.

* Quantus's captum branch for the methods camkit's own ``explain`` table does not hold: each is
  built and called as Quantus builds and calls captum's class, on :mod:`camkit.compat.captum.attr`
  (camkit's explainers behind captum's contract). ``LayerConductance`` is the one change: captum's
  default Gauss-Legendre quadrature is not computed by camkit, so its trapezoid over the same 50
  points is used (the same integral, another quadrature).
* Quantus's zennit branch (``xai_lib="zennit"``): the ``IntegratedGradients`` attributor without a
  composite (camkit's right Riemann sum, zennit's points), and the ``Gradient`` attributor with no composite
  (the signed gradient), ``GuidedBackprop`` and ``DeconvNet``, and the LRP composites
  ``EpsilonPlus``, ``EpsilonAlpha2Beta1`` and ``EpsilonGammaBox`` on :class:`camkit.LRP`, equal to
  zennit's (camkit's relevance starts from the target's score, zennit's from 1: the map is divided
  by the score, exact as every rule is linear in the relevance it receives). Batch norms are merged
  by camkit itself, so zennit's canonizers are accepted and not needed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

import camkit
from camkit.errors import InvalidInputError

__all__ = ["CAPTUM_ROUTED", "captum_route", "zennit_maps"]

_PLAIN = ("FeatureAblation", "Deconvolution", "FeaturePermutation", "Lime", "KernelShap", "LRP")
_BASELINE = ("DeepLift", "DeepLiftShap")
_LAYER = ("GuidedGradCam", "LayerConductance", "LayerActivation", "InternalInfluence", "LayerGradientXActivation")
#: the captum-branch methods computed through camkit.compat.captum's classes
CAPTUM_ROUTED = (*_PLAIN, *_BASELINE, "Occlusion", *_LAYER)


def captum_route(
    method: str, model: nn.Module, x: Tensor, y: Tensor, kwargs: dict[str, Any], layer_of: Callable[..., nn.Module]
) -> Tensor:
    """``method``'s map [B, ...] as Quantus's captum branch asks captum for it, computed by camkit."""
    from camkit.compat.captum import attr as captum_attr

    options = dict(kwargs.get("xai_lib_kwargs") or {})
    if method in _BASELINE:
        base = kwargs.get("baseline")
        base = torch.zeros_like(x) if base is None else torch.as_tensor(base, dtype=x.dtype, device=x.device)
        cls = getattr(captum_attr, method)
        return cls(model, **options).attribute(inputs=x, target=y, baselines=base)
    if method == "Occlusion":
        window = kwargs.get("window", (1, *([4] * (x.dim() - 2))))
        return captum_attr.Occlusion(model).attribute(inputs=x, target=y, sliding_window_shapes=window)
    if method in _PLAIN:
        return getattr(captum_attr, method)(model, **options).attribute(inputs=x, target=y)
    options["layer"] = layer_of(model, kwargs)
    explainer = getattr(captum_attr, method)(model, **options)
    if method == "LayerActivation":
        out = explainer.attribute(inputs=x)
    elif method == "LayerConductance":
        out = explainer.attribute(inputs=x, target=y, method="riemann_trapezoid")
    else:
        out = explainer.attribute(inputs=x, target=y)
    size = kwargs.get("interpolate")
    if isinstance(size, tuple):
        out = captum_attr.LayerAttribution.interpolate(out, size, interpolate_mode=kwargs.get("interpolate_mode", "nearest"))
    return out


def _zennit_classes(kwargs: dict[str, Any]) -> tuple[Any, Any]:
    """The attributor and composite classes, checked as Quantus checks them."""
    from zennit import attribution as zattr
    from zennit import canonizers as zcanon
    from zennit import composites as zcomp
    from zennit import core as zcore

    canonizer = kwargs.get("canonizer")
    if canonizer is not None and not (isinstance(canonizer, type) and issubclass(canonizer, zcanon.Canonizer)):
        raise InvalidInputError(f"canonizer must be None or a zennit Canonizer class; got {canonizer!r}")
    attributor = kwargs.get("attributor", zattr.Gradient)
    if not (isinstance(attributor, type) and issubclass(attributor, zattr.Attributor)):
        raise InvalidInputError(f"attributor must be a zennit Attributor class; got {attributor!r}")
    if attributor not in (zattr.Gradient, zattr.IntegratedGradients):
        raise InvalidInputError(
            "camkit.compat.quantus's zennit branch computes the Gradient and IntegratedGradients attributors; "
            f"got {attributor.__name__}. Use camkit's own explainers (camkit.SmoothGrad, camkit.Occlusion)"
        )
    composite = kwargs.get("composite")
    if isinstance(composite, str):
        if composite not in zcomp.COMPOSITES:
            raise InvalidInputError(f"no zennit composite {composite!r}; zennit has {sorted(zcomp.COMPOSITES)}")
        composite = zcomp.COMPOSITES[composite]
    if composite is not None and not (isinstance(composite, type) and issubclass(composite, zcore.Composite)):
        raise InvalidInputError(f"composite must be None, a zennit Composite class or its name; got {composite!r}")
    return attributor, composite


def _zennit_integrated(model: nn.Module, x: Tensor, y: Tensor, composite: Any, options: dict[str, Any]) -> Tensor:
    """zennit's IntegratedGradients: the right Riemann sum over ``n_iter`` points (``k / n_iter``, k = 1..n_iter)."""
    if composite is not None:
        raise InvalidInputError("zennit's IntegratedGradients with a composite is not translated: pass composite=None")
    unknown = sorted(set(options) - {"baseline_fn", "n_iter"})
    if unknown:
        raise InvalidInputError(f"attributor_kwargs {unknown} are not translated; camkit takes baseline_fn and n_iter")
    baseline = options.get("baseline_fn", torch.zeros_like)(x)
    ig = camkit.IntegratedGradients(model, steps=int(options.get("n_iter", 20)), rule="right", baseline=baseline)
    return ig.explain(x, y).raw  # type: ignore[return-value]


_LRP_KEYS = {"epsilon", "stabilizer", "gamma", "low", "high"}


def zennit_maps(model: nn.Module, x: Tensor, y: Tensor, kwargs: dict[str, Any]) -> Tensor:
    """The map [B, C, *S] of Quantus's zennit branch (see the module docstring), computed by camkit."""
    from zennit import composites as zcomp

    attributor, composite = _zennit_classes(kwargs)
    options = dict(kwargs.get("attributor_kwargs") or {})
    if "attr_output" in options:
        raise InvalidInputError("attributor_kwargs['attr_output'] is not translated: the map is of the targets")
    if attributor.__name__ == "IntegratedGradients":
        return _zennit_integrated(model, x, y, composite, options)
    if composite is None:
        return camkit.Saliency(model).explain(x, y).raw  # type: ignore[return-value]
    if composite is zcomp.GuidedBackprop:
        return camkit.GuidedBackprop(model).explain(x, y).raw  # type: ignore[return-value]
    if composite is zcomp.DeconvNet:
        return camkit.Deconvolution(model).explain(x, y).raw  # type: ignore[return-value]
    rules = {zcomp.EpsilonPlus: "epsilonplus", zcomp.EpsilonAlpha2Beta1: "epsilonalpha2beta1",
             zcomp.EpsilonGammaBox: "epsilongammabox"}  # fmt: skip
    if composite not in rules:
        raise InvalidInputError(
            f"camkit does not compute zennit's {composite.__name__} composite; it computes None (the gradient), "
            "GuidedBackprop, DeconvNet, EpsilonPlus, EpsilonAlpha2Beta1 and EpsilonGammaBox"
        )
    options = dict(kwargs.get("composite_kwargs") or {})
    unknown = sorted(set(options) - _LRP_KEYS)
    if unknown:
        raise InvalidInputError(f"composite_kwargs {unknown} are not translated; camkit takes {sorted(_LRP_KEYS)}")
    explanation = camkit.LRP(model, rule=rules[composite], **options).explain(x, y)  # type: ignore[arg-type]
    raw: Tensor = explanation.raw  # type: ignore[assignment]
    scores = explanation.scores.to(raw.dtype).view(-1, *(1,) * (raw.dim() - 1))
    return raw / scores
