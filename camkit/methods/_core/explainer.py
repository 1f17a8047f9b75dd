"""The base class of every explainer: input checks, model-state hygiene, the output contract.

The math lives in :mod:`camkit.functional`; hook handling in :mod:`camkit.hooks`.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ..._internal import syncs as _syncs
from ..._internal.checks import check_finite, check_input_batch, check_model_takes, first_convolution
from ..._internal.state import ModuleTree, eval_mode, preserve_running_stats
from ...detection import default_output
from ...errors import CamkitWarning, InferenceModeError
from ...explanation import Explanation
from ...layers.defaults import unwrap_model
from ...layers.families import check_frames_order
from ...targets.classes import OutputSelector, Target, resolve_target, select_output
from ...targets.neuron import bind_target
from .binding import Call, InputIndex, bind_inputs, bound, check_rows, current_call, run_model, select_rows
from .placement import Placement

__all__ = ["Explainer"]


def _dtype_slot(modules: Sequence[nn.Module]) -> tuple[dict[str, Any], str] | None:
    """Where the model's first floating parameter lies (else its first floating buffer): ``(table, key)``.

    The order is ``model.parameters()``'s, then ``model.buffers()``'s: ``modules`` in
    ``named_modules()`` order, each one's own tensors in theirs; a tensor shared by two modules
    counts where it first appears, as there.
    """
    for group in ("_parameters", "_buffers"):
        for module in modules:
            table = getattr(module, group)
            for key, tensor in table.items():
                if tensor is not None and tensor.is_floating_point():
                    return table, key
    return None


class Explainer:
    """Base class of every camkit explainer.

    Args:
        model: any ``nn.Module``; it is never modified. Each call runs it in eval mode and
            restores every module's ``training`` flag afterwards. ``DataParallel`` /
            ``DistributedDataParallel`` and ``torch.compile`` wrappers are looked through:
            the eager module inside is run (hooks added after compiling are not traced by
            the compiled graph); ``self.model`` is that module, ``self.wrapped_model`` what
            was passed.
        output: what to score when the model does not return a tensor: a tuple index, a
            dict key or attribute name (``"logits"``), or a callable.
        keep_mode: run the model in the caller's modes instead of eval mode. A model in
            ``train()`` then uses batch statistics in its BatchNorm layers, as in training, but
            their running statistics are put back after the call: explaining never changes
            the model.
        input_index: for models that take several inputs, where the explained image goes:
            a position in ``explain(..., inputs=...)`` or a keyword name (the image is then
            passed as ``model(*inputs, **{input_index: x}, **kwargs)``). Methods that rerun the
            model on batches of changed copies of ``x`` (perturbations, noise) give each copy the
            rows of its own sample of every other input whose first dimension is ``B``; inputs of
            first dimension 1, 0-dim tensors and non-tensors are shared as they are; any other
            tensor is refused with :class:`~camkit.errors.InvalidInputError`.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> class Brightness(camkit.Explainer):  # a toy method: the map is the image's mean channel
        ...     needs_grad = False
        ...     def _explain(self, x, target):
        ...         raw = x.mean(dim=1)
        ...         maps, flat = camkit.methods._core.output.finish_maps([raw], tuple(x.shape[-2:]))
        ...         return camkit.Explanation(maps, raw, None, x.new_zeros(len(x)), flat, "brightness")
        >>> net = nn.Conv2d(3, 2, 3)
        >>> Brightness(net)(torch.rand(2, 3, 4, 4)).shape
        torch.Size([2, 4, 4])
    """

    key: ClassVar[str] = ""
    needs_grad: ClassVar[bool] = True
    #: Method metadata for ``camkit.list_methods(details=True)``: passes per call, and when to use the method.
    cost: ClassVar[str] = ""
    use_when: ClassVar[str] = ""
    #: The kind shown by ``list_methods(details=True)``; ``None``: "attribution" when the method
    #: needs gradients, else "perturbation". Base classes set theirs, so the registry imports none.
    family: ClassVar[str | None] = None
    #: whether the method reruns the model on batches of changed copies of x (perturbations, noise,
    #: paths): each row then gets its own sample's other inputs, so they are checked for a batch axis first
    reruns_rows: ClassVar[bool] = False

    def __init__(
        self,
        model: nn.Module,
        *,
        output: OutputSelector = None,
        keep_mode: bool = False,
        input_index: InputIndex = 0,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if isinstance(model, torch.jit.ScriptModule):
            raise TypeError(
                "hooks cannot attach to TorchScript modules; explain the eager nn.Module the script was made from"
            )
        if isinstance(input_index, bool) or not isinstance(input_index, (int, str)):
            raise TypeError(f"input_index must be a position (int) or a keyword name (str), got {input_index!r}")
        self.wrapped_model = model
        self.model = unwrap_model(model)
        check_frames_order(self.model)  # a bare [B, T, C, H, W] video model would read frames as channels
        self.output = output if output is not None else default_output(self.model)  # ultralytics' tuples
        self.keep_mode = keep_mode
        self.input_index = input_index
        # What a call reads of the model's structure, kept while no module anywhere gains a submodule.
        self._tree = ModuleTree(self.model)
        self._facts: tuple[list[nn.Module], tuple[str, nn.Module] | None, tuple[dict[str, Any], str] | None] | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(model={type(self.model).__name__})"

    def __call__(
        self,
        x: Tensor,
        target: Target = None,
        *,
        inputs: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
    ) -> Tensor:
        """Maps [B, *S] (or [B, K, *S]) in [0, 1] at the input's spatial size; see :meth:`explain`."""
        return self.explain(x, target, inputs=inputs, kwargs=kwargs).maps

    def explain(
        self,
        x: Tensor,
        target: Target = None,
        *,
        inputs: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
    ) -> Explanation:
        """Explain a batch.

        Args:
            x: float input on the model's device: a signal [B, C, T], an image [B, C, H, W], or a
                volume or video [B, C, D, H, W]. Every method takes every rank (or says it
                does not); maps come back [B, T], [B, H, W] or [B, D, H, W].
            target: ``None`` (top-1), an int, B ints, a [B, K] LongTensor, or a callable
                ``f(output) -> Tensor[B]``; see :mod:`camkit.targets` and :mod:`camkit.targets.tasks`.
            inputs: for a model taking several positional inputs, all of them, with ``x``
                itself at position ``input_index`` (or a list of ``x``'s images there, for
                models that take a list of images). The model runs as ``model(*inputs, **kwargs)``.
            kwargs: extra keyword inputs of the model. Tensors whose first dimension is ``B``
                are per sample: a method that reruns the model on changed copies of ``x``
                passes each copy its sample's rows (the same rule holds for ``inputs``).

        Returns:
            An :class:`~camkit.Explanation`.

        Example:
            >>> import torch
            >>> from torch import nn
            >>> import camkit
            >>> class Masked(nn.Module):
            ...     def __init__(self):
            ...         super().__init__()
            ...         self.conv = nn.Conv2d(3, 4, 3, padding=1)
            ...         self.fc = nn.Linear(4, 2)
            ...     def forward(self, image, mask):
            ...         return self.fc((self.conv(image) * mask).mean(dim=(2, 3)))
            >>> x, mask = torch.rand(2, 3, 8, 8), torch.ones(2, 1, 8, 8)
            >>> camkit.GradCAM(Masked(), "conv").explain(x, 0, inputs=(x, mask)).maps.shape
            torch.Size([2, 8, 8])
        """
        self._check_input(x)
        placement = Placement.of(self.wrapped_model, x)  # DataParallel/DDP: run on the module's device
        if placement is not None:
            x, inputs, kwargs = placement.inputs(x, inputs, kwargs)
        call = self._bind_inputs(x, inputs, kwargs)
        if self.reruns_rows:
            check_rows(call)
        x = self._match_dtype(x)
        with (
            bound([self], call),
            eval_mode(self.model, enabled=not self.keep_mode, modules=self._structure()[0]),
            bind_target(target, self.model),
        ):
            if self.keep_mode:
                with preserve_running_stats(self.model):
                    explanation = self._explain(x, target)
            else:
                explanation = self._explain(x, target)
        _warn_if_not_finite(explanation)
        return explanation if placement is None else placement.back(explanation)

    @property
    def _call(self) -> Call | None:
        """The running call's binding in this thread (``None``: the model runs as ``model(x)``)."""
        return current_call(self)

    def _rows_can_join(self) -> bool:
        """Whether rows of other images may share this call's batch without changing any image's result.

        Not with per-call model inputs (they have the images' rows) or with a module in training
        mode (batch statistics would mix the rows).
        """
        return self._call is None and not any(m.training for m in self.model.modules())

    @contextmanager
    def _lend_call(self, *others: Explainer) -> Iterator[None]:
        """Run explainers this one wraps with this call's model inputs (same thread, same call)."""
        with bound(others, self._call):
            yield

    def _bind_inputs(self, x: Tensor, inputs: Sequence[Any] | None, kwargs: Mapping[str, Any] | None) -> Call | None:
        return bind_inputs(x, inputs, kwargs, self.input_index)

    def _match_dtype(self, x: Tensor) -> Tensor:
        """``x`` in the model's floating dtype (a float64 or half batch for a float32 model, say).

        Maps always come back as float32 whatever the dtype the model runs in.
        """
        slot = self._structure()[2]
        tensor = None if slot is None else slot[0].get(slot[1])
        if tensor is None or not tensor.is_floating_point():  # replaced without a new submodule: look again
            self._facts = None
            slot = self._structure()[2]
            tensor = None if slot is None else slot[0].get(slot[1])
        if tensor is None or tensor.dtype == x.dtype:
            return x
        return x.to(tensor.dtype)

    def _structure(
        self,
    ) -> tuple[list[nn.Module], tuple[str, nn.Module] | None, tuple[dict[str, Any], str] | None]:
        """The model's modules, its first convolution and where its dtype is read, walked again only when
        a module anywhere gained a submodule since (:func:`camkit._internal.state.module_tree_version`)."""
        modules = self._tree.modules()
        facts = self._facts
        if facts is None or facts[0] is not modules:
            facts = self._facts = (modules, first_convolution(self.model), _dtype_slot(modules))
        return facts

    def _call_model(self, x: Tensor) -> Any:
        """Run the model on the image batch ``x`` (with the call's other inputs); the raw output.

        Methods that re-run the model on changed images (perturbations, noise) should use
        this rather than ``self.model(x)``, so that multi-input and keyword-input models work.
        """
        return run_model(self.model, x, self._call)

    def _call_model_rows(self, batch: Tensor, rows: Tensor) -> Any:
        """Run the model on a batch of changed images whose row ``i`` was made from sample ``rows[i]``.

        The call's other inputs follow the rows: those with one row per sample are indexed by
        ``rows``, shared ones go in as they are (the rule is in :mod:`camkit.methods._core.binding`).
        Methods that rerun the model on perturbed, noisy or interpolated copies use this.
        """
        return run_model(self.model, batch, select_rows(self._call, rows))

    def _forward_rows(self, batch: Tensor, rows: Tensor) -> Tensor:
        """The selected output of :meth:`_call_model_rows`."""
        return select_output(self._call_model_rows(batch, rows), self.output)

    def _check_input(self, x: Tensor) -> None:
        check_input_batch(x)
        check_model_takes(self.model, x, first=self._structure()[1])
        check_finite(x)
        if self.needs_grad and torch.is_inference_mode_enabled():
            raise InferenceModeError(
                f"{type(self).__name__} needs autograd, which torch.inference_mode() turns off; call it "
                "outside inference_mode (an outer torch.no_grad() is fine: camkit enables only what it needs)."
            )

    def _forward(self, x: Tensor) -> Tensor:
        return select_output(self._call_model(x), self.output)

    def _target_scores(self, x: Tensor, target: Target) -> tuple[Tensor | None, Tensor]:
        """Run the model on ``x`` and resolve ``target``: ``(classes, scores)``, scores attached.

        A target object with ``takes_model_output = True`` (detection targets, say) gets
        the model's raw output when no ``output=`` selector is set.
        """
        raw = self._call_model(x)
        if self.output is None and getattr(target, "takes_model_output", False) and not isinstance(raw, Tensor):
            return resolve_target(target, raw, batch=x.shape[0])
        return resolve_target(target, select_output(raw, self.output), batch=x.shape[0])

    def _explain(self, x: Tensor, target: Target) -> Explanation:
        raise NotImplementedError


def _warn_if_not_finite(explanation: Explanation) -> None:
    """On the host, warn of maps that came out NaN or infinite (the input was checked finite before the call).

    Such maps are the model's own values overflowing, or a ``0 * inf`` in its backward (the gradient
    of a square root or a log at 0): they are returned as they are, never replaced by zeros, which
    would look like a map. On an accelerator nothing is read (the call does not wait for the device).
    """
    maps = explanation.maps
    if maps.numel() == 0 or not _syncs.reads_are_free(maps):
        return
    # One reduction first: a NaN or an infinity among the maps would carry into their sum (the exact
    # test runs only when the sum is not finite, which an overflow of finite values could also make).
    if math.isfinite(maps.sum().item()) or bool(torch.isfinite(maps).all()):
        return
    # one text per method, so that Python's filter shows it once per calling line, not once per batch of an audit
    warnings.warn(
        f"{explanation.method}: some maps are NaN or infinite although the input is finite (torch.isnan(maps) "
        "says which): the model's activations or gradients stopped being finite (an overflow, or 0 * inf such as "
        "the gradient of a square root or a log at 0). camkit.debug.find_nonfinite(model, x, target) names the "
        "first module where they do.",
        CamkitWarning,
        stacklevel=3,
    )
