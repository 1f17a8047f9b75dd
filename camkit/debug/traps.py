"""``inspect(model, x)``: find the traps that make hooks record something else than you think."""

from __future__ import annotations

import warnings
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from .._internal.state import eval_mode
from ..errors import CamkitWarning
from ..hooks import HookScope
from ._walk import iter_tensors, module_names

__all__ = ["Finding", "InspectWarning", "inspect"]


class InspectWarning(CamkitWarning):
    """A trap found by :func:`camkit.debug.inspect`.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> import warnings
        >>> from camkit.debug import InspectWarning, inspect
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(inplace=True))
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     _ = inspect(net, torch.rand(1, 3, 8, 8))
        >>> {w.category for w in caught} == {InspectWarning}
        True
    """


class Finding(NamedTuple):
    """One trap.

    Attributes:
        kind: ``"inplace"``, ``"reused"``, ``"functional"`` or ``"training"``.
        layer: the dotted module name it is about (``""``: the model itself).
        message: what was found and what to do.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> from camkit.debug import inspect
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(inplace=True))
        >>> finding = inspect(net, torch.rand(1, 3, 8, 8), warn=False)[0]
        >>> finding.kind, finding.layer
        ('inplace', '0')
    """

    kind: str
    layer: str
    message: str

    def __str__(self) -> str:
        return f"[{self.kind}] {self.message}"


# Activations a module hook cannot see when they are called as functions.
_ACTIVATIONS = {
    F.relu, F.relu_, torch.relu, torch.relu_, Tensor.relu, Tensor.relu_,
    F.relu6, F.elu, F.elu_, F.selu, F.celu, F.leaky_relu, F.leaky_relu_, F.prelu, F.rrelu,
    F.gelu, F.silu, F.mish, F.hardswish, F.hardsigmoid, F.hardtanh, F.hardtanh_, F.softplus,
    F.sigmoid, F.tanh, torch.sigmoid, torch.sigmoid_, torch.tanh, torch.tanh_,
    Tensor.sigmoid, Tensor.sigmoid_, Tensor.tanh, Tensor.tanh_,
}  # fmt: skip
_ACTIVATION_MODULES = (
    nn.ReLU, nn.ReLU6, nn.ELU, nn.SELU, nn.CELU, nn.LeakyReLU, nn.PReLU, nn.RReLU, nn.GELU, nn.SiLU,
    nn.Mish, nn.Hardswish, nn.Hardsigmoid, nn.Hardtanh, nn.Softplus, nn.Sigmoid, nn.Tanh,
)  # fmt: skip
# Modules whose forward differs between training and eval mode.
_MODE_DEPENDENT = (nn.modules.batchnorm._BatchNorm, nn.modules.dropout._DropoutNd, nn.AlphaDropout, nn.RReLU)


class _FunctionWatch(TorchFunctionMode):
    def __init__(self, stack: list[nn.Module], seen: dict[tuple[int, str], int]) -> None:
        super().__init__()
        self.stack = stack
        self.seen = seen

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func in _ACTIVATIONS and self.stack and not isinstance(self.stack[-1], _ACTIVATION_MODULES):
            key = (id(self.stack[-1]), getattr(func, "__name__", str(func)))
            self.seen[key] = self.seen.get(key, 0) + 1
        return func(*args, **(kwargs or {}))


def _who(name: str) -> str:
    return f"'{name}'" if name else "the model"


def _short(names: list[str], limit: int = 8) -> str:
    shown = ", ".join(repr(n) for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def inspect(model: nn.Module, x: Any, *, warn: bool = True) -> list[Finding]:
    """Run one forward pass and report the common hook traps.

    * ``inplace``: a module's output is changed in place after the module returned
      (``ReLU(inplace=True)``, ``out += shortcut``): a hook that keeps the tensor sees the
      changed values, and full backward hooks fail on it. Clone in your hook, or use
      :class:`camkit.hooks.LayerCapture`, which hands the network a copy.
    * ``reused``: a module called more than once in one forward (a shared ``ReLU``): a hook on
      it fires once per call.
    * ``functional``: activations called as functions (``F.relu``, ``torch.sigmoid``) inside a
      module's forward: module hooks cannot see or replace them.
    * ``training``: modules in training mode whose forward depends on it (BatchNorm, Dropout).

    The forward runs under ``torch.no_grad()`` and in eval mode (flags restored, so BatchNorm
    statistics are not updated); hooks are removed afterwards.

    Args:
        model: the model.
        x: an example input, passed as ``model(x)``.
        warn: also issue each finding as an :class:`InspectWarning`.

    Returns:
        The findings, in the order above (an empty list when nothing was found).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from camkit.debug import inspect
        >>> relu = nn.ReLU(inplace=True)
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3), relu, nn.Conv2d(4, 4, 3), relu)
        >>> [(f.kind, f.layer) for f in inspect(net, torch.randn(1, 3, 8, 8), warn=False)]
        [('inplace', '0'), ('inplace', '2'), ('reused', '1')]
    """
    names = module_names(model)
    training = [names[id(m)] for m in model.modules() if m.training and isinstance(m, _MODE_DEPENDENT)]
    record = _ForwardRecord(names)
    record.run(model, x)
    findings = [*record.inplace(), *record.reused(model), *record.functional_calls()]
    if training:
        findings.append(_training_finding(training))
    if warn:
        for finding in findings:
            warnings.warn(str(finding), InspectWarning, stacklevel=2)
    return findings


class _ForwardRecord:
    """What one forward pass shows: calls per module, outputs changed in place, activations called as functions."""

    def __init__(self, names: dict[int, str]) -> None:
        self.names = names
        self.stack: list[nn.Module] = []
        self.calls: dict[int, int] = {}
        self.outputs: list[tuple[str, Tensor, int]] = []  # (module name, output, version right after the call)
        self.modified: dict[str, str] = {}  # module name -> who changed its output
        self.functional: dict[tuple[int, str], int] = {}

    def run(self, model: nn.Module, x: Any) -> None:
        """``model(x)`` without gradients, in eval mode, every module hooked before and after its call."""
        with HookScope() as hooks, torch.no_grad(), eval_mode(model):
            for module in model.modules():
                hooks.forward_pre(module, self.pre)
                hooks.forward(module, self.post)
            with _FunctionWatch(self.stack, self.functional):
                model(x)
        self.check("code after the model")

    def check(self, by: str) -> None:
        for name, out, version in self.outputs:
            if name not in self.modified and out._version != version:
                self.modified[name] = by

    def pre(self, module: nn.Module, args: Any) -> None:
        stack = self.stack
        self.check(f"code in the forward of {_who(self.names[id(stack[-1])])}" if stack else "the caller")
        self.calls[id(module)] = self.calls.get(id(module), 0) + 1
        stack.append(module)

    def post(self, module: nn.Module, args: Any, output: Any) -> None:
        self.stack.pop()
        leaf = next(module.children(), None) is None
        name = self.names[id(module)]
        self.check(f"{_who(name)} ({module!r})" if leaf else f"code in the forward of {_who(name)}")
        for t in iter_tensors(output):
            if any(t is o for _, o, _ in self.outputs):
                continue  # the same tensor passed through (Identity, an in-place module): keep the first owner
            self.outputs.append((name, t, t._version))

    def inplace(self) -> list[Finding]:
        return [
            Finding(
                "inplace",
                name,
                f"the output of {_who(name)} is changed in place after it returns, by {self.modified[name]}; "
                "a hook that stores it sees the changed values. Clone it in the hook, or use camkit.hooks.LayerCapture.",
            )
            for name in dict.fromkeys(name for name, _, _ in self.outputs)
            if name in self.modified
        ]

    def reused(self, model: nn.Module) -> list[Finding]:
        findings = []
        for module in model.modules():
            count = self.calls.get(id(module), 0)
            if count > 1:
                name = self.names[id(module)]
                findings.append(
                    Finding(
                        "reused",
                        name,
                        f"{_who(name)} ({type(module).__name__}) runs {count} times in one forward; a hook on it "
                        "fires once per call (camkit's LayerCapture uses the last call unless call= says otherwise).",
                    )
                )
        return findings

    def functional_calls(self) -> list[Finding]:
        findings = []
        for (module_id, fn), count in self.functional.items():
            name = self.names.get(module_id, "?")
            findings.append(
                Finding(
                    "functional",
                    name,
                    f"the forward of {_who(name)} calls {fn}() {count} time(s) as a function: module hooks cannot "
                    "see or replace it (e.g. guided backprop, activation monitors). Use an nn module for it, or hook its input.",
                )
            )
        return findings


def _training_finding(training: list[str]) -> Finding:
    return Finding(
        "training",
        "",
        f"{len(training)} module(s) whose forward depends on the mode are in training mode ({_short(training)}): "
        "BatchNorm uses batch statistics and updates its running ones, Dropout drops units. Call model.eval() "
        "for inference (camkit's explainers switch to eval and restore your flags).",
    )
