"""Find the first module whose output (forward) or gradient (backward) stops being finite.

How the backward is watched
---------------------------
Full module backward hooks wrap a module's inputs and outputs in a custom autograd
function, which breaks as soon as a later in-place op (``ReLU(inplace=True)``,
``out += x``) touches them. :class:`NonFiniteTracer` uses plain tensor hooks instead:

* ``grad_output``: a hook on each output tensor a module returns, registered by a forward
  hook, sees the gradient that arrives at the module from later code;
* ``grad_input``: a forward-pre hook hands the module a *view* of each input that requires
  grad, and a hook on that view sees exactly the gradient the module's own backward
  produced for that input (a tensor used by several modules would otherwise show the
  sum of all of them);
* ``param``: a hook on each parameter sees its gradient.

A tensor hook registered before an in-place op sees the gradient with respect to the value
the tensor had when the hook was registered, so the in-place ops stay legal and the
gradient is attributed to the right module. The first event in backward order is where the
gradient stopped being finite: ``grad_input`` or ``param`` of a module means that module's
backward produced it; ``grad_output`` means it arrived from code that is not a module (a
functional op, or the loss).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from ..errors import CamkitError, InvalidInputError
from ..hooks import HookScope
from ..targets.classes import OutputSelector, Target, resolve_target, select_output
from ._walk import iter_tensors, module_names

__all__ = ["NonFiniteError", "NonFiniteEvent", "NonFiniteTracer", "find_nonfinite"]


class NonFiniteEvent(NamedTuple):
    """Where a NaN or an infinity first appeared, with statistics of the tensor.

    Attributes:
        phase: ``"forward"`` or ``"backward"``.
        name: the module's dotted name (``""`` is the model itself).
        type: the module's class name.
        call: which call of the module in that forward pass (0 for the first; ``-1`` for a
            parameter gradient, which sums all calls).
        step: how many forward passes of the model ran earlier inside the tracer.
        where: ``"output"`` or ``"input"`` (forward); ``"grad_output"``, ``"grad_input"`` or
            ``"param <name>"`` (backward). See the module docstring.
        shape: the tensor's shape.
        nan, posinf, neginf: how many entries are NaN, +inf, -inf.
        numel: the tensor's number of entries.
        finite_min, finite_max, finite_mean: statistics of the finite entries (NaN if none).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> from camkit.debug import find_nonfinite
        >>> class Log(nn.Module):
        ...     def forward(self, x):
        ...         return torch.log(x - 1)  # NaN below 1
        >>> net = nn.Sequential(nn.Conv2d(3, 2, 1), Log(), nn.Flatten(), nn.Linear(2 * 4 * 4, 2))
        >>> event = find_nonfinite(net, torch.rand(1, 3, 4, 4))
        >>> event.phase, event.name, event.type, event.where, event.shape
        ('forward', '1', 'Log', 'output', (1, 2, 4, 4))
    """

    phase: str
    name: str
    type: str
    call: int
    step: int
    where: str
    shape: tuple[int, ...]
    nan: int
    posinf: int
    neginf: int
    numel: int
    finite_min: float
    finite_max: float
    finite_mean: float

    def __str__(self) -> str:
        who = f"'{self.name}'" if self.name else "the model"
        call = "" if self.call < 0 else f" (call {self.call})"
        bad = f"{self.nan} NaN, {self.posinf} +inf, {self.neginf} -inf of {self.numel} entries"
        stats = f"finite min {self.finite_min:.4g}, max {self.finite_max:.4g}, mean {self.finite_mean:.4g}"
        return f"{self.phase} step {self.step}: {self.where} of {who} ({self.type}){call} {list(self.shape)}: {bad}; {stats}"


class NonFiniteError(CamkitError, FloatingPointError):
    """Raised by a raising :class:`NonFiniteTracer` at the first NaN or infinity. ``.event`` has the details.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> from camkit.debug import NonFiniteError, find_nonfinite
        >>> class Log(nn.Module):
        ...     def forward(self, x):
        ...         return torch.log(x - 1)  # NaN below 1
        >>> net = nn.Sequential(nn.Conv2d(3, 2, 1), Log(), nn.Flatten(), nn.Linear(2 * 4 * 4, 2))
        >>> try:
        ...     find_nonfinite(net, torch.rand(1, 3, 4, 4), raise_error=True)
        ... except NonFiniteError as err:
        ...     err.event.phase, err.event.name
        ('forward', '1')
    """

    def __init__(self, event: NonFiniteEvent) -> None:
        super().__init__(
            f"first non-finite value at {event}. Look at this module's inputs and weights "
            "(or, for 'grad_output', the code after it)."
        )
        self.event = event


def _event(phase: str, name: str, module: nn.Module, call: int, step: int, where: str, t: Tensor) -> NonFiniteEvent:
    t = t.detach()
    if t.is_complex():
        t = torch.view_as_real(t)
    finite = torch.isfinite(t)
    values = t[finite].double()
    has = values.numel() > 0
    return NonFiniteEvent(
        phase=phase,
        name=name,
        type=type(module).__name__,
        call=call,
        step=step,
        where=where,
        shape=tuple(t.shape),
        nan=int(torch.isnan(t).sum()),
        posinf=int(torch.isposinf(t).sum()),
        neginf=int(torch.isneginf(t).sum()),
        numel=t.numel(),
        finite_min=float(values.min()) if has else math.nan,
        finite_max=float(values.max()) if has else math.nan,
        finite_mean=float(values.mean()) if has else math.nan,
    )


def _nonfinite(t: Tensor) -> bool:
    # One reduction and one device sync per tensor: this is a debugging tool.
    if not (t.is_floating_point() or t.is_complex()) or t.numel() == 0:
        return False
    return not bool(torch.isfinite(t.detach()).all())


class NonFiniteTracer:
    """Watch every module for the first NaN/Inf in the forward and in the backward.

    Enter it around forward and backward passes (a training step, or several). It records
    the first forward event and the first backward event; with ``raise_error=True`` it
    raises :class:`NonFiniteError` right where the first one appears, so the traceback
    points into the forward (or the ``backward()`` call) at that moment. Every hook is
    removed when the block ends.

    Args:
        model: the model to watch; all its modules are hooked.
        forward: check module inputs and outputs in the forward.
        backward: check gradients (see the module docstring for how).
        parameters: also check parameter gradients (with ``backward``).
        raise_error: raise at the first event instead of recording it.

    Checking costs one reduction and one device sync per tensor until the first event of
    each phase; after it, that phase is no longer checked.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from camkit.debug import NonFiniteTracer
        >>> net = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 1))
        >>> with torch.no_grad():
        ...     _ = net[0].weight.fill_(1.0)
        >>> with NonFiniteTracer(net) as tracer:  # 3e38 + 3e38 overflows float32 in the first Linear
        ...     _ = net(torch.tensor([[3e38, 3e38]]))
        >>> tracer.forward_event.name, tracer.forward_event.where, tracer.forward_event.posinf
        ('0', 'output', 2)
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        forward: bool = True,
        backward: bool = True,
        parameters: bool = True,
        raise_error: bool = False,
    ) -> None:
        self.model = model
        self.check_forward = forward
        self.check_backward = backward
        self.check_parameters = parameters
        self.raise_error = raise_error
        self.forward_event: NonFiniteEvent | None = None
        self.backward_event: NonFiniteEvent | None = None
        self._scope = HookScope()
        self._steps = -1
        self._calls: dict[int, int] = {}
        self._current_call: dict[int, list[int]] = {}

    @property
    def event(self) -> NonFiniteEvent | None:
        """The first event: the forward one if any, else the backward one."""
        return self.forward_event or self.backward_event

    def reset(self) -> None:
        """Forget recorded events (hooks stay in place)."""
        self.forward_event = None
        self.backward_event = None

    def __enter__(self) -> NonFiniteTracer:
        try:
            self._register()
        except BaseException:
            self._scope.remove()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._scope.remove()

    def _register(self) -> None:
        names = module_names(self.model)
        self._scope.forward_pre(self.model, self._root_pre, prepend=True)
        for module in self.model.modules():
            name = names[id(module)]
            self._scope.forward_pre(module, self._make_pre(name), with_kwargs=True)
            self._scope.forward(module, self._make_post(name))
        if self.check_backward and self.check_parameters:
            for pname, param in self.model.named_parameters():
                if param.requires_grad:
                    owner_name = pname.rpartition(".")[0]
                    owner = self.model.get_submodule(owner_name) if owner_name else self.model
                    self._scope.tensor(param, self._make_grad_hook(owner_name, owner, -1, f"param {pname}"))

    def _root_pre(self, module: nn.Module, args: Any) -> None:
        self._steps += 1
        self._calls.clear()

    def _record(self, event: NonFiniteEvent) -> None:
        if event.phase == "forward":
            self.forward_event = event
        else:
            self.backward_event = event
        if self.raise_error:
            raise NonFiniteError(event)

    def _make_pre(self, name: str) -> Callable[..., Any]:
        def hook(module: nn.Module, args: Any, kwargs: Any) -> Any:
            key = id(module)
            call = self._calls.get(key, 0)
            self._calls[key] = call + 1
            self._current_call.setdefault(key, []).append(call)
            if self.check_forward and self.forward_event is None:
                for t in (*iter_tensors(args), *iter_tensors(kwargs)):
                    if _nonfinite(t):
                        self._record(_event("forward", name, module, call, self._steps, "input", t))
                        break
            if not (self.check_backward and torch.is_grad_enabled()):
                return None
            aliases: dict[int, Tensor] = {}

            def alias(value: Any) -> Any:
                if not (isinstance(value, Tensor) and value.requires_grad):
                    return value
                if id(value) not in aliases:
                    view = value.view_as(value)
                    self._scope.tensor(view, self._make_grad_hook(name, module, call, "grad_input"))
                    aliases[id(value)] = view
                return aliases[id(value)]

            new_args = tuple(alias(a) for a in args)
            new_kwargs = {k: alias(v) for k, v in kwargs.items()}
            return (new_args, new_kwargs) if aliases else None

        return hook

    def _make_post(self, name: str) -> Callable[..., Any]:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            stack = self._current_call.get(id(module))
            call = stack.pop() if stack else 0
            outputs = list(iter_tensors(output))
            if self.check_forward and self.forward_event is None:
                for t in outputs:
                    if _nonfinite(t):
                        self._record(_event("forward", name, module, call, self._steps, "output", t))
                        break
            if self.check_backward and torch.is_grad_enabled():
                for t in outputs:
                    if t.requires_grad:
                        self._scope.tensor(t, self._make_grad_hook(name, module, call, "grad_output"))

        return hook

    def _make_grad_hook(self, name: str, module: nn.Module, call: int, where: str) -> Callable[[Tensor], None]:
        step = self._steps

        def hook(grad: Tensor) -> None:
            if self.backward_event is None and _nonfinite(grad):
                self._record(_event("backward", name, module, call, self._steps if call < 0 else step, where, grad))

        return hook


def find_nonfinite(
    model: nn.Module,
    x: Tensor,
    target: Target | Callable[[Tensor], Tensor] = None,
    *,
    output: OutputSelector = None,
    raise_error: bool = False,
) -> NonFiniteEvent | None:
    """Run one forward and one backward pass and report the first NaN or infinity.

    The model runs in its current mode (a NaN that only training mode produces is found);
    buffers such as BatchNorm running statistics are restored afterwards, gradients are taken
    with ``torch.autograd.grad`` so ``param.grad`` is untouched, and ``x`` is not modified.

    Args:
        model: the model.
        x: its input, e.g. [B, C, H, W].
        target: what to differentiate: ``None`` (each sample's top-1 class), a class index,
            one class per sample, or a callable ``f(output) -> Tensor`` of any shape (a loss
            works; it is summed).
        output: which part of the model's output to score (see :func:`camkit.select_output`).
        raise_error: raise :class:`NonFiniteError` at the first event instead of returning it.

    Returns:
        The first :class:`NonFiniteEvent` (forward before backward), or ``None`` when every
        value and gradient is finite. When the forward already produced one, no backward runs.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from camkit.debug import find_nonfinite
        >>> net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
        >>> print(find_nonfinite(net, torch.randn(2, 3)))
        None
        >>> event = find_nonfinite(net, torch.tensor([[0.0, float("nan"), 1.0]]))
        >>> event.name, event.where, event.nan
        ('', 'input', 1)
    """
    if not isinstance(x, Tensor):
        raise InvalidInputError(f"x must be a tensor, got {type(x).__name__}")
    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    inputs: list[Tensor] = [p for p in model.parameters() if p.requires_grad]
    xg = x.detach().clone().requires_grad_(True) if (x.is_floating_point() or x.is_complex()) else x
    try:
        with torch.enable_grad(), NonFiniteTracer(model, raise_error=raise_error) as tracer:
            out = model(xg)
            if tracer.forward_event is not None:
                return tracer.forward_event
            chosen = select_output(out, output)
            if callable(target) and not isinstance(target, Tensor):
                score = target(chosen)
            else:
                score = resolve_target(target, chosen)[1]
            if xg.requires_grad:
                inputs.append(xg)
            if not score.requires_grad or not inputs:
                raise InvalidInputError(
                    "the score does not require grad: no parameter requires grad and x is not floating "
                    "point, so there is no backward to check. Make parameters trainable or pass a float x."
                )
            torch.autograd.grad(score.sum(), inputs, allow_unused=True)
            return tracer.event
    finally:
        with torch.no_grad():
            for buffer, saved in buffers:
                buffer.copy_(saved)
