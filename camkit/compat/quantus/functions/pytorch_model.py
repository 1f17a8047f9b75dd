"""Quantus's model wrapper ``PyTorchModel`` (``quantus.helpers.model.pytorch_model`` after ``install()``).

camkit's metric classes take the ``nn.Module`` itself and never build this wrapper; it is here for
scripts that use Quantus's wrapper directly: ``predict`` (numpy in, numpy out, with or without a
softmax output), ``shape_input``, the layer-randomising generator of the randomisation metrics,
``sample``, ``add_mean_shift_to_first_layer`` and ``get_hidden_representations``, with Quantus's
signatures. The caller's model is never changed: every altered model is a copy. Two differences:

* ``add_mean_shift_to_first_layer`` moves each output channel's bias by ``shift`` times the sum of
  its weights (``w^T m`` for a constant input ``m``); Quantus reads the smallest value of the first
  layer's response to a constant input, which a padded convolution lowers at the border. They are
  equal for a layer without padding.
* ``get_hidden_representations(layer_indices=[-1])`` counts from the end of the hidden layers, as
  Python's indices do; Quantus counts negative indices from the end of every module, the model
  itself included, so ``-1`` selects no layer there.
"""

from __future__ import annotations

import copy
import sys
import warnings
from collections.abc import Generator, Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from camkit.errors import InvalidInputError
from camkit.hooks import HookScope

from .model_interface import ModelInterface

__all__ = ["PyTorchModel"]


def _is_hf_model(model: Any) -> bool:
    """Whether ``model`` is a Hugging Face ``PreTrainedModel`` (without importing transformers)."""
    module = sys.modules.get("transformers.modeling_utils")
    cls = getattr(module, "PreTrainedModel", None) if module is not None else None
    return cls is not None and isinstance(model, cls)


def _softmax_positions(model: nn.Module) -> tuple[bool, str | None]:
    """(is the last module a softmax, the name of the last softmax module or None)."""
    named = list(model.named_modules())
    last = next((name for name, module in reversed(named) if isinstance(module, nn.Softmax)), None)
    return bool(named) and isinstance(named[-1][1], nn.Softmax) and len(named) > 1, last


def _without(model: nn.Module, name: str) -> nn.Module:
    """A copy of ``model`` with its submodule ``name`` replaced by ``nn.Identity``."""
    linear = copy.deepcopy(model)
    parent_name, _, child = name.rpartition(".")
    setattr(linear.get_submodule(parent_name), child, nn.Identity())
    return linear


class PyTorchModel(ModelInterface):
    """Quantus's ``PyTorchModel(model, channel_first=True, softmax=False, model_predict_kwargs=None, device=None)``.

    Example:
        >>> import numpy as np, torch
        >>> net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3)).eval()
        >>> wrapped = PyTorchModel(net, softmax=True)
        >>> probabilities = wrapped.predict(np.ones((2, 1, 2, 2), dtype=np.float32))
        >>> probabilities.shape, bool(np.allclose(probabilities.sum(axis=1), 1))
        ((2, 3), True)
    """

    def __init__(
        self,
        model: nn.Module,
        channel_first: bool = True,
        softmax: bool = False,
        model_predict_kwargs: dict[str, Any] | None = None,
        device: Any = None,
    ) -> None:
        self.model = model
        self.channel_first = channel_first
        self.softmax = softmax
        self.model_predict_kwargs = dict(model_predict_kwargs or {})
        self.device = device

    def get_softmax_arg_model(self) -> nn.Module:
        """The model whose output is softmax probabilities (``softmax=True``) or the scores before them.

        A softmax module that is the last module is removed (in a copy) for ``softmax=False``; with
        ``softmax=True`` one is appended unless the last module is one. A softmax elsewhere is kept
        as it is, with a warning, as Quantus does.
        """
        last_is_softmax, name = _softmax_positions(self.model)
        if name is not None and not (self.softmax and last_is_softmax):
            warnings.warn(
                "the model holds a torch.nn.Softmax: make sure it is the last module exactly when it is the "
                "last operation applied",
                UserWarning,
                stacklevel=2,
            )
        if self.softmax:
            return self.model if last_is_softmax else nn.Sequential(self.model, nn.Softmax(dim=-1))
        return _without(self.model, name) if last_is_softmax and name is not None else self.model

    def predict(self, x: Any, grad: bool = False, **kwargs: Any) -> np.ndarray:
        """The model's outputs on ``x`` (numpy, or a tokenizer's output for a Hugging Face model) as numpy."""
        options = {**self.model_predict_kwargs, **kwargs}
        if self.model.training:
            raise AttributeError("the torch model must be in evaluation mode (call model.eval())")
        with torch.set_grad_enabled(grad):
            if _is_hf_model(self.model):
                if not (isinstance(x, Mapping) and "input_ids" in x and "attention_mask" in x):
                    raise InvalidInputError(
                        "a Hugging Face model takes a tokenizer's output: a mapping with input_ids and attention_mask"
                    )
                batch = {k: torch.as_tensor(v, device=self.device) for k, v in x.items()}
                out = self.model(**batch, **options).logits
                out = torch.softmax(out, dim=-1) if self.softmax else out
            elif isinstance(self.model, nn.Module):
                out = self.get_softmax_arg_model()(torch.as_tensor(np.asarray(x), dtype=torch.float32).to(self.device), **options)
            else:
                raise InvalidInputError(f"PyTorchModel wraps a torch.nn.Module; got {type(self.model).__name__}")
        return out.detach().cpu().numpy()

    def shape_input(
        self, x: np.ndarray, shape: tuple[int, ...], channel_first: bool | None = None, batched: bool = False
    ) -> np.ndarray:
        """``x`` reshaped to ``(1, *shape)`` (or ``shape`` when ``batched``), channels first."""
        if not self.channel_first:
            raise InvalidInputError("a torch model takes channels first: build PyTorchModel with channel_first=True")
        shape = tuple(shape) if batched else (1, *shape)
        x = np.reshape(x, shape)
        if channel_first is False and x.ndim in (3, 4):
            x = np.moveaxis(x, -1, 1)
        return x

    def get_model(self) -> nn.Module:
        """The wrapped model itself."""
        return self.model

    def state_dict(self) -> dict[str, Any]:
        """The wrapped model's ``state_dict()``."""
        return self.model.state_dict()

    def _resettable(self, model: nn.Module) -> list[tuple[str, nn.Module]]:
        return [(name, module) for name, module in model.named_modules() if hasattr(module, "reset_parameters")]

    def get_random_layer_generator(
        self, order: str = "top_down", seed: int = 42
    ) -> Generator[tuple[str, nn.Module], None, None]:
        """Yield ``(layer name, model copy)`` with one more layer re-initialised each step.

        ``order``: ``"top_down"`` (cascading from the output), ``"bottom_up"`` (cascading from the
        input) or ``"independent"`` (one layer at a time). Each layer is re-initialised after
        ``torch.manual_seed(seed + 1)``, as Quantus does.
        """
        if order not in ("top_down", "bottom_up", "independent"):
            raise InvalidInputError(f"order must be 'top_down', 'bottom_up' or 'independent'; got {order!r}")
        original = copy.deepcopy(self.model.state_dict())
        randomised = copy.deepcopy(self.model)
        modules = self._resettable(randomised)
        for name, module in modules[::-1] if order == "top_down" else modules:
            if order == "independent":
                randomised.load_state_dict(original)
            torch.manual_seed(seed + 1)
            module.reset_parameters()  # type: ignore[operator]
            yield name, randomised

    @property
    def random_layer_generator_length(self) -> int:
        """How many layers the random layer generator re-initialises."""
        return len(self._resettable(self.model))

    def sample(self, mean: float, std: float, noise_type: str = "multiplicative") -> nn.Module:
        """A copy of the model with N(mean, std) noise multiplied into (or added to) every parameter."""
        if noise_type not in ("multiplicative", "additive"):
            raise InvalidInputError(f"noise_type must be 'multiplicative' or 'additive'; got {noise_type!r}")
        noisy = copy.deepcopy(self.model)
        if std != 0.0:
            normal = torch.distributions.Normal(loc=mean, scale=std)
            with torch.no_grad():
                for param in noisy.parameters():
                    draw = normal.sample(param.size()).to(param.device)
                    param.add_(draw) if noise_type == "additive" else param.mul_(draw)
        return noisy

    def add_mean_shift_to_first_layer(self, input_shift: float, shape: tuple[int, ...]) -> nn.Module:
        """A copy whose first layer answers ``x + input_shift`` as the original answers ``x`` (see the module docstring)."""
        shifted = copy.deepcopy(self.model)
        first = next((m for m in shifted.modules() if isinstance(m, (nn.Linear, nn.modules.conv._ConvNd))), None)
        if first is None or first.bias is None:
            raise InvalidInputError("the model's first layer must be a convolution or linear layer with a bias")
        with torch.no_grad():
            first.bias.sub_(float(input_shift) * first.weight.flatten(1).sum(dim=1))
        return shifted

    def get_hidden_representations(
        self, x: np.ndarray, layer_names: list[str] | None = None, layer_indices: list[int] | None = None
    ) -> np.ndarray:
        """The outputs of the chosen hidden layers (default: every layer), flattened per input: [B, F]."""
        hidden = [(n, m) for n, m in self.model.named_modules() if not isinstance(m, (type(self.model), nn.Sequential))]
        names, indices = set(layer_names or ()), {i % len(hidden) for i in layer_indices or () if -len(hidden) <= i < len(hidden)}
        chosen = [m for i, (n, m) in enumerate(hidden) if (not names and not indices) or n in names or i in indices]
        if not chosen:
            raise InvalidInputError("no hidden layer was selected: check layer_names and layer_indices")
        outputs: list[np.ndarray] = []
        batch = x.shape[0]
        with HookScope() as hooks, torch.no_grad():
            for module in chosen:
                hooks.forward(module, lambda m, i, o: outputs.append(o.detach().cpu().numpy().reshape(batch, -1)))
            self.model(torch.as_tensor(np.asarray(x), dtype=torch.float32).to(self.device or "cpu"))
        return np.hstack(outputs)
