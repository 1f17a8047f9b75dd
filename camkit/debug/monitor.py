"""Activation and gradient statistics over training steps, sampled every k steps.

How the monitors stay cheap
---------------------------
* On a step that is not sampled, a hook only checks a flag and returns.
* On a sampled step each statistic is a batched reduction on the tensor's own device; the
  per-layer results are stacked on that device and moved to the CPU **once per step**, in
  :meth:`step` (one device sync per sampled step, not one per layer or statistic).
* Nothing keeps a reference to an activation or a gradient: the statistics are computed in
  the hook, under ``torch.no_grad()``, before any later in-place op can change the tensor.

Typical use::

    monitor = ActivationMonitor(model, ["layer1", "layer2"], every=50)
    with monitor:
        for x, y in loader:
            loss = criterion(model(x), y); loss.backward(); opt.step(); opt.zero_grad()
            monitor.step()
    monitor.to_csv("activations.csv"); monitor.plot("activations.png")
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ..errors import CamkitError, InvalidInputError, LayerNotFoundError
from ..hooks import HookScope
from ._walk import ModuleSelection, iter_tensors, select_modules
from .stats import activation_stats, gradient_stats

__all__ = ["ActivationMonitor", "GradientMonitor", "MissingDependencyError"]


class MissingDependencyError(CamkitError, ImportError):
    """An optional dependency needed for this feature is not installed.

    Example:
        >>> from camkit.debug import MissingDependencyError
        >>> import camkit
        >>> issubclass(MissingDependencyError, ImportError), issubclass(MissingDependencyError, camkit.CamkitError)
        (True, True)
    """


def _first_float(output: Any) -> Tensor | None:
    for t in iter_tensors(output):
        if t.is_floating_point():
            return t
    return None


class _Monitor:
    """Shared machinery: hook scope, sampling, per-step flush to the CPU, exports."""

    STATS: tuple[str, ...] = ()
    _KIND = ""
    _LOG: tuple[str, ...] = ()

    def __init__(self, model: nn.Module, layers: ModuleSelection = None, *, every: int = 10) -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise InvalidInputError(f"every must be a positive int (sample every k-th step), got {every!r}")
        self.model = model
        self.layers = select_modules(model, layers)
        self.every = every
        self.enabled = True
        self._scope = HookScope()
        self._step = 0
        self._calls: dict[str, int] = {}
        self._pending: list[tuple[str, int, Tensor]] = []
        self._keys: list[tuple[int, str, int]] = []
        self._chunks: list[Tensor] = []

    # ----------------------------------------------------------------- scope and sampling
    def __enter__(self) -> _Monitor:
        try:
            self._register()
        except BaseException:
            self._scope.remove()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Remove every hook and keep what was recorded (pending values are flushed)."""
        self._scope.remove()
        self._flush()

    def _register(self) -> None:
        raise NotImplementedError

    @property
    def current_step(self) -> int:
        """The step counter (advanced by :meth:`step`, starts at 0)."""
        return self._step

    @property
    def sampling(self) -> bool:
        """Whether the current step is recorded (every ``every``-th step, starting with step 0)."""
        return self.enabled and self._step % self.every == 0

    def step(self) -> None:
        """End the current step: move its statistics to the CPU and advance the counter."""
        self._flush()
        self._step += 1

    def _next_call(self, name: str) -> int:
        call = self._calls.get(name, 0)
        self._calls[name] = call + 1
        return call

    def _flush(self) -> None:
        self._calls.clear()
        if not self._pending:
            return
        first = self._pending[0][2]
        stacked = torch.stack([values.to(first.device, non_blocking=True) for _, _, values in self._pending])
        self._chunks.append(stacked.to("cpu", torch.float64))
        self._keys.extend((self._step, name, call) for name, call, _ in self._pending)
        self._pending = []

    # ----------------------------------------------------------------------- read back
    def values(self) -> tuple[list[tuple[int, str, int]], Tensor]:
        """Everything recorded: ``(keys, values)`` with keys ``(step, layer, call)`` and values [N, len(STATS)] float64 on the CPU."""
        self._flush_if_closed()
        values = torch.cat(self._chunks) if self._chunks else torch.empty(0, len(self.STATS), dtype=torch.float64)
        return list(self._keys), values

    def _flush_if_closed(self) -> None:
        if len(self._scope) == 0:
            self._flush()

    def rows(self) -> list[dict[str, Any]]:
        """One dict per recorded (step, layer, call): ``{"step", "layer", "call", *STATS}``."""
        keys, values = self.values()
        table = values.tolist()
        return [
            {"step": step, "layer": layer, "call": call, **dict(zip(self.STATS, row))}
            for (step, layer, call), row in zip(keys, table)
        ]

    def series(self, layer: str, stat: str, call: int = 0) -> tuple[list[int], list[float]]:
        """``(steps, values)`` of one statistic of one layer (and call) over the recorded steps."""
        if stat not in self.STATS:
            raise InvalidInputError(f"unknown statistic {stat!r}; this monitor records {list(self.STATS)}")
        if layer not in {name for name, _ in self.layers}:
            raise LayerNotFoundError(f"layer {layer!r} is not monitored; monitored: {[n for n, _ in self.layers][:10]}")
        keys, values = self.values()
        column = self.STATS.index(stat)
        picked = [i for i, (_, name, c) in enumerate(keys) if name == layer and c == call]
        return [keys[i][0] for i in picked], values[picked, column].tolist()

    # ------------------------------------------------------------------------- exports
    def to_csv(self, path: str | os.PathLike[str]) -> Path:
        """Write ``step,layer,call,<stats...>`` rows (floats at full precision; ``nan`` when not defined)."""
        keys, values = self.values()
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["step", "layer", "call", *self.STATS])
            for (step, layer, call), row in zip(keys, values.tolist()):
                writer.writerow([step, layer, call, *(repr(v) for v in row)])
        return path

    def to_tensorboard(self, writer_or_dir: Any, *, prefix: str | None = None) -> None:
        """Write every value as a TensorBoard scalar ``<prefix>/<layer>[#call]/<stat>`` at its step.

        Args:
            writer_or_dir: a ``torch.utils.tensorboard.SummaryWriter`` (left open), or a log
                directory (a writer is created there and closed).
            prefix: tag prefix; ``"activations"`` or ``"gradients"`` by default.

        Needs the optional ``tensorboard`` package (``pip install camkit[tensorboard]``).
        """
        prefix = self._KIND if prefix is None else prefix
        own = isinstance(writer_or_dir, (str, os.PathLike))
        if own:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as err:
                raise MissingDependencyError(
                    "TensorBoard export needs the tensorboard package, which is not installed "
                    f"({err}); run `pip install tensorboard` (or camkit[tensorboard]), or use to_csv()."
                ) from None
            writer = SummaryWriter(log_dir=str(writer_or_dir))
        else:
            writer = writer_or_dir
        keys, values = self.values()
        try:
            for (step, layer, call), row in zip(keys, values.tolist()):
                label = (layer or "model") + (f"#{call}" if call else "")
                for stat, value in zip(self.STATS, row):
                    if not math.isnan(value):
                        writer.add_scalar(f"{prefix}/{label}/{stat}", value, global_step=step)
            writer.flush()
        finally:
            if own:
                writer.close()

    def plot(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        stats: Sequence[str] | None = None,
        layers: Sequence[str] | None = None,
        log: Sequence[str] | None = None,
    ) -> np.ndarray:
        """Draw each statistic over the recorded steps, one panel per statistic and one line per layer.

        Drawn with OpenCV (a core dependency), so no plotting library is needed.

        Args:
            path: if given, the figure is also written there as a PNG.
            stats: which statistics (default: all of them).
            layers: which layers (default: all monitored layers).
            log: statistics drawn on a log10 axis (default: the norms, for gradients).

        Returns:
            The figure as a uint8 RGB array [H, W, 3].
        """
        from ..io import save_png
        from .plot import plot_series

        chosen_stats = list(self.STATS if stats is None else stats)
        for stat in chosen_stats:
            if stat not in self.STATS:
                raise InvalidInputError(f"unknown statistic {stat!r}; this monitor records {list(self.STATS)}")
        wanted = None if layers is None else set(layers)
        keys, values = self.values()
        panels = []
        for stat in chosen_stats:
            column = self.STATS.index(stat)
            lines: dict[str, tuple[list[int], list[float]]] = {}
            for (step, layer, call), value in zip(keys, values[:, column].tolist()):
                if wanted is not None and layer not in wanted:
                    continue
                label = (layer or "model") + (f"#{call}" if call else "")
                steps, vals = lines.setdefault(label, ([], []))
                steps.append(step)
                vals.append(value)
            panels.append((stat, lines))
        image = plot_series(
            panels, title=f"{self._KIND} (every {self.every} steps)", log=self._LOG if log is None else log
        )
        if path is not None:
            save_png(path, image)
        return image

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self.layers)} layers, every={self.every}, step={self._step}, rows={len(self._keys)})"


class ActivationMonitor(_Monitor):
    """Statistics of layer outputs over training steps.

    Per layer and call, on every ``every``-th step (step 0 included): ``mean``, ``std``
    (population, ``correction=0``), ``min``, ``max``, ``zeros`` (share of exact zeros),
    ``dead`` (share of units, i.e. channels along dim 1, that are zero for every sample and
    position of the batch; NaN for outputs with fewer than 2 dims) and ``saturation`` (for
    ``nn.Sigmoid``: share of outputs below ``eps`` or above ``1 - eps``; for ``nn.Tanh``: share
    with ``|y| > 1 - eps``; NaN for other layers). Outputs that are tuples use their first
    floating-point tensor. Values are computed in float32 (float64 stays float64).

    Args:
        model: the model.
        layers: names or modules to monitor; ``None`` for every leaf module, ``"all"`` for
            every submodule.
        every: sample every k-th step (call :meth:`step` once per training step).
        eps: saturation margin.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from camkit.debug import ActivationMonitor
        >>> net = nn.Sequential(nn.Linear(2, 3), nn.ReLU())
        >>> with ActivationMonitor(net, ["1"], every=2) as monitor:
        ...     for step in range(4):
        ...         _ = net(torch.full((1, 2), -1.0 + step))
        ...         monitor.step()
        >>> [row["step"] for row in monitor.rows()]
        [0, 2]
    """

    STATS = ("mean", "std", "min", "max", "zeros", "dead", "saturation")
    _KIND = "activations"

    def __init__(self, model: nn.Module, layers: ModuleSelection = None, *, every: int = 10, eps: float = 0.01) -> None:
        super().__init__(model, layers, every=every)
        self.eps = eps

    def _register(self) -> None:
        for name, module in self.layers:
            kind = "sigmoid" if isinstance(module, nn.Sigmoid) else "tanh" if isinstance(module, nn.Tanh) else None
            self._scope.forward(module, self._make_hook(name, kind))

    def _make_hook(self, name: str, kind: str | None) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if not self.sampling:
                return
            y = _first_float(output)
            if y is None:
                return
            with torch.no_grad():
                values = activation_stats(y.detach(), kind, self.eps)
            self._pending.append((name, self._next_call(name), values))

        return hook


class GradientMonitor(_Monitor):
    """Gradient statistics per layer over training steps, with vanishing/exploding flags.

    Per layer and call, on every ``every``-th step, from the gradient ``g`` that reaches the
    layer's output in the backward: ``norm`` (L2 norm of ``g`` over the whole batch),
    ``mean``, ``std`` (population), ``max_abs``; ``param_norm``, the L2 norm of the gradients
    of the layer's parameters (submodules included; summed over calls, so it is given on the
    row of call 0 and NaN on the others; NaN for a layer without trainable parameters);
    ``vanishing`` (1.0 when ``norm < vanishing_below``) and ``exploding`` (1.0 when ``norm >
    exploding_above`` or not finite). The thresholds are heuristics: tune them to your model.

    Gradients are read by tensor hooks registered in the forward of a sampled step (legal
    with later in-place ops), so the monitor works with ``loss.backward()`` and with
    ``torch.autograd.grad``, and never touches ``param.grad``.

    Args:
        model: the model.
        layers: names or modules; ``None`` for every leaf module, ``"all"`` for every submodule.
        every: sample every k-th step (call :meth:`step` once per training step).
        vanishing_below, exploding_above: flag thresholds on ``norm``.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from camkit.debug import GradientMonitor
        >>> net = nn.Sequential(nn.Linear(2, 1))
        >>> with GradientMonitor(net, ["0"], every=1) as monitor:
        ...     net(torch.ones(3, 2)).sum().backward()
        ...     monitor.step()
        >>> row = monitor.rows()[0]
        >>> round(row["norm"], 4), round(row["param_norm"], 4)  # g = ones(3, 1); dW = [3, 3], db = [3]
        (1.7321, 5.1962)
    """

    STATS = ("norm", "mean", "std", "max_abs", "param_norm", "vanishing", "exploding")
    _KIND = "gradients"
    _LOG = ("norm", "max_abs", "param_norm")

    def __init__(
        self,
        model: nn.Module,
        layers: ModuleSelection = None,
        *,
        every: int = 10,
        vanishing_below: float = 1e-6,
        exploding_above: float = 1e3,
    ) -> None:
        super().__init__(model, layers, every=every)
        self.vanishing_below = vanishing_below
        self.exploding_above = exploding_above
        self._tensor_scope = HookScope()
        self._param_sq: dict[str, Tensor] = {}

    def close(self) -> None:
        self._tensor_scope.remove()
        super().close()

    def _register(self) -> None:
        for name, module in self.layers:
            self._scope.forward(module, self._make_forward_hook(name))
            for param in module.parameters():
                if param.requires_grad:
                    self._scope.tensor(param, self._make_param_hook(name))

    def _make_forward_hook(self, name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if not self.sampling or not torch.is_grad_enabled():
                return
            y = _first_float(output)
            if y is None or not y.requires_grad:
                return
            self._tensor_scope.tensor(y, self._make_grad_hook(name, self._next_call(name)))

        return hook

    def _make_grad_hook(self, name: str, call: int) -> Callable[[Tensor], None]:
        def hook(grad: Tensor) -> None:
            if not self.enabled:
                return
            with torch.no_grad():
                values = gradient_stats(grad, self.vanishing_below, self.exploding_above)
            self._pending.append((name, call, values))

        return hook

    def _make_param_hook(self, name: str) -> Callable[[Tensor], None]:
        def hook(grad: Tensor) -> None:
            if not self.sampling:
                return
            with torch.no_grad():
                sq = grad.double().pow(2).sum() if grad.dtype == torch.float64 else grad.float().pow(2).sum()
                previous = self._param_sq.get(name)
                self._param_sq[name] = sq if previous is None else previous + sq.to(previous.device)

        return hook

    def _flush(self) -> None:
        if self._param_sq:
            column = self.STATS.index("param_norm")
            for name, sq in self._param_sq.items():
                row = next((i for i, (n, call, _) in enumerate(self._pending) if n == name and call == 0), None)
                if row is None:
                    values = torch.full((len(self.STATS),), math.nan, dtype=sq.dtype, device=sq.device)
                    self._pending.append((name, 0, values))
                    row = len(self._pending) - 1
                n, call, values = self._pending[row]
                values = values.clone()
                values[column] = sq.to(values.device, values.dtype).sqrt()
                self._pending[row] = (n, call, values)
            self._param_sq = {}
        self._tensor_scope.remove()
        super()._flush()
