"""captum's ``LimeBase``, ``Lime`` and ``KernelShap``: a linear model fitted to the scores of perturbed inputs.

Each sample is drawn in the interpretable space (which features are kept) and mapped to the
inputs (``from_interp_rep_transform``; by default kept features keep their values, the others
take the baseline), or drawn in the input space and mapped back (``to_interp_rep_transform``).
The samples' scores, weighted by ``similarity_func``, train the interpretable model, whose
coefficients are the attributions. The defaults draw as captum draws (``torch.bernoulli`` of
one half per feature for Lime; for KernelShap the full and the empty coalition, then a size from
the Shapley kernel's distribution and a random subset of it), from torch's generator, so a
seeded call reproduces captum's samples; the models are fitted by camkit
(:mod:`camkit.compat.captum._models`).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset

from .._models import SkLearnLasso, SkLearnLinearRegression
from .._pack import CaptumInputError, as_tuple, forward_args
from ._engine import Perturbation, Progress, default_masks, expand_args, expand_target, format_baselines

__all__ = [
    "KernelShap",
    "Lime",
    "LimeBase",
    "construct_feature_mask",
    "default_from_interp_rep_transform",
    "default_perturb_func",
    "get_exp_kernel_similarity_function",
]


def _flat(inputs: Any) -> Tensor:
    return torch.cat([t.reshape(-1) for t in as_tuple(inputs)]).float()


def get_exp_kernel_similarity_function(distance_mode: str = "cosine", kernel_width: float = 1.0) -> Callable[..., float]:
    """Lime's similarity ``exp(-d^2 / (2 width^2))``, ``d`` the cosine or Euclidean distance of the flattened inputs.

    Example:
        >>> import torch
        >>> kernel = get_exp_kernel_similarity_function("euclidean", 1.0)
        >>> round(kernel(torch.zeros(1, 2), torch.ones(1, 2), None), 4)
        0.3679
    """
    if distance_mode not in ("cosine", "euclidean"):
        raise ValueError("distance_mode must be either cosine or euclidean.")

    def similarity(original: Any, perturbed: Any, _: Any, **kwargs: Any) -> float:
        a, b = _flat(original), _flat(perturbed)
        if distance_mode == "cosine":
            distance = 1 - torch.nn.functional.cosine_similarity(a, b, dim=0)
        else:
            distance = torch.linalg.vector_norm(a - b)
        return math.exp(-float(distance) ** 2 / (2 * kernel_width**2))

    return similarity


def default_perturb_func(original_inp: Any, **kwargs: Any) -> Tensor:
    """One interpretable sample [1, M]: each feature kept with probability one half."""
    device = as_tuple(original_inp)[0].device
    return torch.bernoulli(torch.ones(1, int(kwargs["num_interp_features"])) * 0.5).to(device=device).long()


def default_from_interp_rep_transform(curr_sample: Tensor, original_inputs: Any, **kwargs: Any) -> Any:
    """The inputs with the features ``curr_sample`` drops set to their baselines."""
    masks, bases = kwargs["feature_mask"], kwargs["baselines"]
    if isinstance(original_inputs, Tensor):
        keep = curr_sample[0][masks].bool()
        return keep.to(original_inputs.dtype) * original_inputs + (~keep).to(original_inputs.dtype) * bases
    out = []
    for x, m, base in zip(original_inputs, masks, bases):
        keep = curr_sample[0][m].bool()
        out.append(keep.to(x.dtype) * x + (~keep).to(x.dtype) * base)
    return tuple(out)


def construct_feature_mask(feature_mask: Any, inputs: tuple[Tensor, ...]) -> tuple[tuple[Tensor, ...], int]:
    """Feature masks starting at id 0 (the default: every element its own feature) and the feature count."""
    if feature_mask is None:
        return default_masks(inputs)
    masks: tuple[Tensor, ...] = as_tuple(feature_mask)
    low = min(int(m.min()) for m in masks if m.numel())
    if low != 0:
        masks = tuple(m - low for m in masks)
    return masks, max(int(m.max()) for m in masks if m.numel()) + 1


class LimeBase(Perturbation):
    """captum's ``LimeBase``: samples, their scores and similarities, and the interpretable model fitted to them."""

    def __init__(self, forward_func: Callable[..., Any], interpretable_model: Any, similarity_func: Callable[..., Any],
                 perturb_func: Callable[..., Any], perturb_interpretable_space: bool,
                 from_interp_rep_transform: Callable[..., Any] | None,
                 to_interp_rep_transform: Callable[..., Any] | None) -> None:
        super().__init__(forward_func)
        self.interpretable_model = interpretable_model
        self.similarity_func = similarity_func
        self.perturb_func = perturb_func
        self.perturb_interpretable_space = perturb_interpretable_space
        self.from_interp_rep_transform = from_interp_rep_transform
        self.to_interp_rep_transform = to_interp_rep_transform
        if perturb_interpretable_space and from_interp_rep_transform is None:
            raise CaptumInputError("perturb_interpretable_space=True needs a from_interp_rep_transform")
        if not perturb_interpretable_space and to_interp_rep_transform is None:
            raise CaptumInputError("perturb_interpretable_space=False needs a to_interp_rep_transform")

    def attribute(self, inputs: Any, target: Any = None, additional_forward_args: Any = None, n_samples: int = 50,
                  perturbations_per_eval: int = 1, show_progress: bool = False, **kwargs: Any) -> Tensor:
        extra = forward_args(additional_forward_args)
        draw = self._sampler(inputs, kwargs)
        progress = Progress(self.get_name(), math.ceil(n_samples / perturbations_per_eval), show_progress)
        interps, sims, outputs, pending = [], [], [], []
        with torch.no_grad():
            for i in range(n_samples):
                try:
                    interp, model_input = draw()
                except StopIteration:
                    break
                interps.append(interp)
                sim = self.similarity_func(inputs, model_input, interp, **kwargs)
                sims.append(sim.flatten() if isinstance(sim, Tensor) else torch.tensor([sim]))
                pending.append(model_input)
                if len(pending) == perturbations_per_eval or i == n_samples - 1:
                    outputs.append(self._scores(pending, target, extra))
                    pending = []
                    progress.update()
            if pending:
                outputs.append(self._scores(pending, target, extra))
        progress.close()
        dtype = torch.float64 if any(t.dtype == torch.float64 for t in as_tuple(inputs)) else torch.float32
        data = TensorDataset(torch.cat(interps).to(dtype), torch.cat(outputs).to(dtype), torch.cat(sims).to(dtype))
        self.interpretable_model.fit(DataLoader(data, batch_size=len(interps)))
        return self.interpretable_model.representation()

    def _sampler(self, inputs: Any, kwargs: dict[str, Any]) -> Callable[[], tuple[Any, Any]]:
        generator = self.perturb_func(inputs, **kwargs) if inspect.isgeneratorfunction(self.perturb_func) else None

        def draw() -> tuple[Any, Any]:
            sample = next(generator) if generator is not None else self.perturb_func(inputs, **kwargs)
            if self.perturb_interpretable_space:
                return sample, self.from_interp_rep_transform(sample, inputs, **kwargs)  # type: ignore[misc]
            return self.to_interp_rep_transform(sample, inputs, **kwargs), sample  # type: ignore[misc]

        return draw

    def _scores(self, model_inputs: list[Any], target: Any, extra: tuple[Any, ...]) -> Tensor:
        """One score per perturbed input, evaluated together."""
        k = len(model_inputs)
        batch = tuple(torch.cat(parts) for parts in zip(*(as_tuple(m) for m in model_inputs)))
        out = self.evaluate(batch, expand_target(target, k), expand_args(extra, k))
        if out.numel() != k:
            raise CaptumInputError(f"Number of outputs is not appropriate, must return one output per perturbed input: {k} inputs, {list(out.shape)}")
        return out.reshape(-1)

    def attribute_future(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"attribute_future is not implemented for {type(self).__name__}")

    _multiply = False


class Lime(LimeBase):
    """captum's ``Lime``: features kept or set to the baseline, an interpretable model fitted to the scores.

    Defaults as captum's: a Lasso (``alpha=0.01``), the exponential cosine kernel of width 1 and
    each feature kept with probability one half. With one score per example for several
    examples, each example gets its own model.

    Example:
        >>> import torch
        >>> from camkit.compat.captum.attr import Lime
        >>> net = torch.nn.Linear(3, 2)
        >>> Lime(net).attribute(torch.ones(1, 3), target=0, n_samples=20).shape
        torch.Size([1, 3])
    """

    def __init__(self, forward_func: Callable[..., Any], interpretable_model: Any = None,
                 similarity_func: Callable[..., Any] | None = None, perturb_func: Callable[..., Any] | None = None) -> None:
        super().__init__(forward_func, interpretable_model if interpretable_model is not None else SkLearnLasso(alpha=0.01),
                         similarity_func or get_exp_kernel_similarity_function(), perturb_func or default_perturb_func,
                         True, default_from_interp_rep_transform, None)

    def attribute(self, inputs: Any, baselines: Any = None, target: Any = None,  # type: ignore[override]
                  additional_forward_args: Any = None, feature_mask: Any = None, n_samples: int = 25,
                  perturbations_per_eval: int = 1, return_input_shape: bool = True, show_progress: bool = False) -> Any:
        return self._fitted(inputs, baselines, target, additional_forward_args, feature_mask, n_samples,
                            perturbations_per_eval, return_input_shape, show_progress, {})

    def _fitted(self, inputs: Any, baselines: Any, target: Any, additional_forward_args: Any, feature_mask: Any,
                n_samples: int, per_eval: int, input_shape: bool, show: bool, options: dict[str, Any]) -> Any:
        xs = as_tuple(inputs)
        bases = format_baselines(baselines, xs)
        masks, count = construct_feature_mask(feature_mask, xs)
        batch = xs[0].shape[0]
        one = isinstance(inputs, tuple)

        def fit(x: tuple[Tensor, ...], t: Any, extra: Any, b: tuple[Any, ...], m: tuple[Tensor, ...]) -> Tensor:
            return LimeBase.attribute(self, x if one else x[0], target=t, additional_forward_args=extra,
                                      n_samples=n_samples, perturbations_per_eval=per_eval, show_progress=show,
                                      baselines=b if one else b[0], feature_mask=m if one else m[0],
                                      num_interp_features=count, **options)

        if batch > 1:
            with torch.no_grad():
                test = self.evaluate(xs, target, forward_args(additional_forward_args))
            if test.numel() > 1:
                if test.numel() != batch:
                    raise CaptumInputError("Invalid number of outputs, forward function should return a scalar per "
                                           "example or a scalar per input batch.")
                parts = []
                for i in range(batch):
                    x, t, extra, b, m = (_example(a, i, batch) for a in (xs, target, additional_forward_args, bases, masks))
                    coefs = fit(x, t, extra, b, m)
                    parts.append(_spread(x, m, coefs, count, one) if input_shape else coefs.reshape(1, -1))
                if not input_shape:
                    return torch.cat(parts)
                return tuple(torch.cat(p) for p in zip(*parts)) if one else torch.cat(parts)
            if per_eval != 1:
                raise CaptumInputError("Perturbations per eval must be 1 when forward function returns single value per batch!")
        coefs = fit(xs, target, additional_forward_args, bases, masks)
        if not input_shape:
            return coefs
        out = _spread(xs, masks, coefs, count, True)
        out = tuple(o[0:1] for o in out) if batch > 1 else out
        return out if one else out[0]


def _example(arg: Any, i: int, batch: int) -> Any:
    """Example ``i`` of an argument: tensors and lists with one entry per example sliced, the rest as they are."""
    if arg is None:
        return None
    items = arg if isinstance(arg, tuple) else (arg,)
    picked = tuple(a[i : i + 1] if isinstance(a, (Tensor, list)) and len(a) == batch else a for a in items)
    return picked if isinstance(arg, tuple) else picked[0]


def _spread(xs: tuple[Tensor, ...], masks: tuple[Tensor, ...], coefs: Tensor, count: int, one: bool) -> Any:
    """The coefficients [1, M] laid on every position of their feature (inputs' shapes)."""
    flat = coefs.reshape(-1)
    dtype = flat.dtype if flat.is_floating_point() else torch.float32
    table = torch.cat([flat.to(dtype), torch.zeros(1, dtype=dtype, device=flat.device)])
    out = []
    for x, m in zip(xs, masks):
        ids = torch.where((m >= 0) & (m < count), m, torch.full_like(m, count)).long()
        out.append(table[ids.to(table.device)].expand(x.shape).clone() if x.numel() else torch.zeros(x.shape, dtype=dtype))
    return tuple(out) if one else out[0]


class KernelShap(Lime):
    """captum's ``KernelShap``: Lime with the Shapley kernel's coalitions and weighted least squares.

    Example:
        >>> import torch
        >>> from camkit.compat.captum.attr import KernelShap
        >>> net = torch.nn.Linear(3, 2)
        >>> x = torch.tensor([[1.0, 2.0, 3.0]])
        >>> torch.allclose(KernelShap(net).attribute(x, target=0, n_samples=50), x * net.weight[0], atol=1e-4)
        True
    """

    inf_weight = 1000000.0

    def __init__(self, forward_func: Callable[..., Any]) -> None:
        super().__init__(forward_func, SkLearnLinearRegression(), self._kernel, self._coalitions)

    def attribute(self, inputs: Any, baselines: Any = None, target: Any = None,  # type: ignore[override]
                  additional_forward_args: Any = None, feature_mask: Any = None, n_samples: int = 25,
                  perturbations_per_eval: int = 1, return_input_shape: bool = True, show_progress: bool = False) -> Any:
        _, count = construct_feature_mask(feature_mask, as_tuple(inputs))
        sizes = torch.arange(count, dtype=torch.float)
        probs = torch.tensor(count - 1) / (sizes * (count - sizes))
        probs[0] = 0.0
        return self._fitted(inputs, baselines, target, additional_forward_args, feature_mask, n_samples,
                            perturbations_per_eval, return_input_shape, show_progress,
                            {"num_select_distribution": torch.distributions.Categorical(probs)})

    def _kernel(self, _: Any, __: Any, sample: Tensor, **kwargs: Any) -> Tensor:
        kept = int(sample.sum(dim=1).item())
        return torch.tensor([self.inf_weight if kept in (0, kwargs["num_interp_features"]) else 1.0])

    @staticmethod
    def _coalitions(original_inp: Any, **kwargs: Any) -> Any:
        """The full and the empty coalition, then for each sample a size from the kernel and a random subset."""
        device = as_tuple(original_inp)[0].device
        count = int(kwargs["num_interp_features"])
        yield torch.ones(1, count, device=device, dtype=torch.long)
        yield torch.zeros(1, count, device=device, dtype=torch.long)
        while True:
            size = int(kwargs["num_select_distribution"].sample())
            noise = torch.randn(1, count)
            threshold = torch.kthvalue(noise, count - size).values.item()
            yield (noise > threshold).to(device=device).long()
