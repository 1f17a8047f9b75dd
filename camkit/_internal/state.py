"""Save and restore what an explainer may touch: the caller's model, and autograd's mode across hooks."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext

import torch
from torch import Tensor, nn
from torch.nn.modules.module import register_module_module_registration_hook
from torch.utils.hooks import RemovableHandle

__all__ = ["GradModes", "ModuleTree", "eval_mode", "module_tree_version", "preserve_running_stats"]

# Concurrent calls on one model (threads) share one saving of its flags: the first call to
# enter saves them and switches to eval mode, the last to leave restores them. Without
# this, a call that finishes first would put the model back in train mode under another
# call that is still running.
_LOCK = threading.Lock()
_ACTIVE: dict[int, tuple[int, tuple[Sequence[nn.Module], list[nn.Module]]]] = {}


def eval_mode(
    model: nn.Module, *, enabled: bool = True, modules: Sequence[nn.Module] | None = None
) -> AbstractContextManager[nn.Module]:
    """Run a block with ``model`` in eval mode, restoring every module's own flag after.

    Each module's ``training`` flag is saved separately, so a model with mixed flags
    (say a frozen backbone in eval and a head in train) gets exactly its flags back,
    also when the block raises. With ``enabled=False`` the caller's modes are kept.
    Blocks running at the same time in several threads on one model share one saving:
    the flags come back when the last of them ends. A model already in eval mode everywhere
    (the usual case) is not touched, and only flags that changed are written back.

    ``modules``: every module of ``model`` when the caller holds them already (a walk kept while
    :func:`module_tree_version` stays the same, see :class:`ModuleTree`); else the model is walked.

    Example:
        >>> from torch import nn
        >>> from camkit._internal.state import eval_mode
        >>> net = nn.Sequential(nn.Dropout(), nn.Dropout()); net[1].eval()
        Dropout(p=0.5, inplace=False)
        >>> with eval_mode(net):
        ...     print([m.training for m in net.modules()])
        [False, False, False]
        >>> [m.training for m in net.modules()]
        [True, True, False]
    """
    return _EvalMode(model, modules) if enabled else nullcontext(model)


class _EvalMode:
    """:func:`eval_mode`'s context (a class, not a generator: it is entered on every explained batch)."""

    __slots__ = ("_key", "_model", "_modules")

    def __init__(self, model: nn.Module, modules: Sequence[nn.Module] | None) -> None:
        self._model = model
        self._modules = modules
        self._key = id(model)

    def __enter__(self) -> nn.Module:
        model, key = self._model, self._key
        with _LOCK:
            count, flags = _ACTIVE.get(key, (0, ([], [])))
            if count == 0:
                every = _modules(model) if self._modules is None else self._modules
                flags = (every, [m for m in every if m.training])  # every module, and those in train mode
                if flags[1]:
                    try:
                        model.eval()  # the model's own train()/eval() overrides run, as for a plain model.eval()
                    except BaseException:
                        _restore(flags)  # an eval() override that raises part-way leaves no flag changed
                        raise
            _ACTIVE[key] = (count + 1, flags)
        return model

    def __exit__(self, *exc: object) -> None:
        key = self._key
        with _LOCK:
            count, flags = _ACTIVE[key]
            if count == 1:
                del _ACTIVE[key]
                _restore(flags)
            else:
                _ACTIVE[key] = (count - 1, flags)


def _restore(flags: tuple[Sequence[nn.Module], list[nn.Module]]) -> None:
    """Write back the saved ``training`` flags that changed: ``flags`` is every module and those that were training."""
    every, training = flags
    for module in every:
        if module.training:
            module.training = False
    for module in training:
        module.training = True


def _modules(model: nn.Module) -> list[nn.Module]:
    """Every module of ``model``, each once: what ``model.modules()`` gives, without building names.

    ``nn.Module.modules()`` walks ``named_modules()``, which builds a dotted name per module;
    this walk reads the ``_modules`` dicts directly (a few times faster on a resnet).
    """
    seen: set[int] = set()
    out: list[nn.Module] = []
    stack = [model]
    while stack:
        module = stack.pop()
        if id(module) in seen:
            continue
        seen.add(id(module))
        out.append(module)
        stack.extend(child for child in reversed(module._modules.values()) if child is not None)
    return out


_TREE_VERSION = [0]
_TREE_HOOK: list[RemovableHandle] = []


def _tree_changed(module: nn.Module, name: str, submodule: nn.Module | None) -> None:
    _TREE_VERSION[0] += 1


def module_tree_version() -> int:
    """A counter that moves whenever any module anywhere gets a submodule (assigned, added or replaced).

    It counts torch's global module-registration events (one hook, registered on the first call
    and kept: it only adds one to this counter, and returns nothing, so registrations are unchanged).
    While it stays the same, a walk of a model's modules made before is still the model's modules,
    as far as ``setattr``, ``add_module`` and ``register_module`` (and the containers built on them)
    can change it; a module deleted since is harmless to the users of the walk here.
    """
    if not _TREE_HOOK:
        with _LOCK:
            if not _TREE_HOOK:
                _TREE_HOOK.append(register_module_module_registration_hook(_tree_changed))
    return _TREE_VERSION[0]


class ModuleTree:
    """Every module of one model (:func:`_modules`' walk), walked again only when :func:`module_tree_version` moved.

    Example:
        >>> from torch import nn
        >>> from camkit._internal.state import ModuleTree
        >>> net = nn.Sequential(nn.Linear(2, 2))
        >>> tree = ModuleTree(net)
        >>> len(tree.modules())
        2
        >>> net.append(nn.ReLU())
        Sequential(
          (0): Linear(in_features=2, out_features=2, bias=True)
          (1): ReLU()
        )
        >>> len(tree.modules())
        3
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self._version = -1
        self._modules: list[nn.Module] = []

    def modules(self) -> list[nn.Module]:
        """The model's modules, each once, the model first."""
        version = module_tree_version()
        if version != self._version:
            self._modules = _modules(self.model)
            self._version = version
        return self._modules


def _tracking_norms(model: nn.Module) -> list[nn.modules.batchnorm._NormBase]:
    return [
        m
        for m in model.modules()
        if isinstance(m, nn.modules.batchnorm._NormBase) and m.training and m.track_running_stats
    ]


@contextmanager
def preserve_running_stats(model: nn.Module) -> Iterator[None]:
    """Run a block and put back the running statistics of normalisation layers in train mode.

    A forward in train mode updates ``running_mean``, ``running_var`` and
    ``num_batches_tracked`` of every BatchNorm (and InstanceNorm with
    ``track_running_stats=True``) in train mode. Explaining is not training: with
    ``keep_mode=True`` camkit runs the caller's modes (batch statistics are used in the
    forward) but restores those buffers afterwards, also when the block raises.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from camkit._internal.state import preserve_running_stats
        >>> bn = nn.BatchNorm1d(2)
        >>> with preserve_running_stats(bn):
        ...     _ = bn(torch.randn(8, 2) + 5)
        >>> bn.running_mean.tolist(), int(bn.num_batches_tracked)
        ([0.0, 0.0], 0)
    """
    saved: list[tuple[Tensor, Tensor]] = []
    for module in _tracking_norms(model):
        for name in ("running_mean", "running_var", "num_batches_tracked"):
            buffer = getattr(module, name, None)
            if isinstance(buffer, Tensor):
                saved.append((buffer, buffer.detach().clone()))
    try:
        yield
    finally:
        with torch.no_grad():
            for buffer, value in saved:
                buffer.copy_(value)


class GradModes:
    """Autograd mode switches made in one hook and undone in another, each a context that is always exited.

    A forward-pre hook that turns autograd off for a module and the forward hook that turns it
    back on cannot share a ``with`` block. Each :meth:`enter` is a ``torch.set_grad_enabled(mode)``
    context, opened at once and kept on a stack; :meth:`leave` exits the newest one (the mode
    before it comes back); :meth:`close` exits every one still open, newest first, then puts back
    the mode autograd had when the ``GradModes`` was made: a hook pair that an error cut in two, a
    switch meant to last to the end of the block, or a block that changed the mode itself leave
    nothing behind. Use it as a ``with`` block (made where the block starts), or call
    :meth:`close` in a ``finally``. Autograd's mode is per thread: make, switch and close in one.

    Example:
        >>> import torch
        >>> from camkit._internal.state import GradModes
        >>> with GradModes() as modes:
        ...     modes.enter(False)  # a module's pre-hook
        ...     modes.enter(True)  # an inner one's
        ...     modes.leave()  # its forward hook
        ...     print(torch.is_grad_enabled())
        ...     modes.enter(True)  # left open: the end of the block puts the mode back
        False
        >>> torch.is_grad_enabled()
        True
    """

    def __init__(self) -> None:
        # Each switch is a ``set_grad_enabled`` context: made, it sets its mode; exited, it puts back
        # the mode it found (no ExitStack per switch: a gradient capture makes three switches per call).
        self._start = torch.set_grad_enabled(torch.is_grad_enabled())
        self._open: list[torch.set_grad_enabled] = []

    def enter(self, mode: bool) -> None:
        """Switch autograd to ``mode`` until the matching :meth:`leave` (or :meth:`close`)."""
        self._open.append(torch.set_grad_enabled(mode))

    def leave(self) -> None:
        """Undo the newest switch still open: the mode before it comes back. ``IndexError`` when none is open."""
        self._open.pop().__exit__(None, None, None)

    def close(self) -> None:
        """Undo every switch still open, newest first, then put back the mode of the start."""
        try:
            while self._open:
                self._open.pop().__exit__(None, None, None)
        finally:
            self._start.__exit__(None, None, None)

    def __enter__(self) -> GradModes:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
