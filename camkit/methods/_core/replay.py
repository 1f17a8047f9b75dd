"""A step of fixed-shape tensors captured once as a CUDA graph and replayed after (private).

The step is any function of a few static input tensors that returns tensors and makes no host
sync: its kernels (a forward, ``torch.autograd.grad``, the map's arithmetic) are recorded once
and replayed with new values copied into the static inputs. Nothing here knows explainers:
:class:`StepGraphs` keeps one captured step per key (an input's shape, dtype and device, say),
at most a few, and remembers the keys whose capture failed so that they are not tried again.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch
from torch import Tensor

__all__ = ["Captured", "StepGraphs", "can_capture", "capture_graph"]

Step = Callable[..., Sequence[Tensor]]


class Captured:
    """A captured step: :meth:`run` copies new inputs into the static ones and replays its kernels."""

    def __init__(self, inputs: Sequence[Tensor], outputs: Sequence[Tensor], replay: Callable[[], None], keep: Any) -> None:
        self.inputs = tuple(inputs)
        self.outputs = tuple(outputs)
        self._replay = replay
        self._keep = keep  # the graph object: its memory pool holds the outputs
        self._lock = threading.Lock()  # replays share the static inputs: one at a time

    def run(self, *inputs: Tensor) -> tuple[Tensor, ...]:
        """The step's outputs for ``inputs`` (same shapes as the captured ones), as new tensors."""
        with self._lock:
            for static, value in zip(self.inputs, inputs):
                static.copy_(value, non_blocking=True)
            self._replay()
            return tuple(out.clone() for out in self.outputs)


def can_capture(device: torch.device) -> bool:
    """Whether steps on ``device`` can be captured: CUDA devices (graphs of other devices are not used)."""
    return device.type == "cuda" and torch.cuda.is_available()


def capture_graph(step: Step, inputs: Sequence[Tensor], *, warmup: int = 2) -> Captured:
    """Capture ``step(*static inputs)`` as a CUDA graph, after ``warmup`` runs on a side stream.

    The warm-up lets autograd, cuDNN and cuBLAS make their one-time allocations outside the
    capture, as PyTorch's guide to CUDA graphs prescribes. Any host sync in the step (a value read
    back, a size that depends on values) makes the capture raise.
    """
    static = [t.detach().clone() for t in inputs]
    device = static[0].device
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(warmup):
            step(*static)
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = [out.detach() for out in step(*static)]
    return Captured(static, outputs, graph.replay, graph)


class StepGraphs:
    """Captured steps of one owner, by key: at most ``size`` kept (the oldest dropped), failures remembered."""

    def __init__(self, size: int = 4) -> None:
        self.size = size
        self._graphs: OrderedDict[Hashable, Captured] = OrderedDict()
        self._failed: dict[Hashable, str] = {}
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {"size": self.size}  # a copy (of an explainer, say) starts without captures: they hold the original's

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["size"])  # type: ignore[misc]

    def failed(self, key: Hashable) -> str | None:
        """Why ``key``'s capture failed, or ``None`` if it did not (or was not tried)."""
        return self._failed.get(key)

    def __len__(self) -> int:
        return len(self._graphs)

    def clear(self) -> None:
        """Drop every captured step (their memory is freed) and forget the failures."""
        with self._lock:
            self._graphs.clear()
            self._failed.clear()

    def get(self, key: Hashable, step: Step, inputs: Sequence[Tensor], capture: Callable[..., Captured] | None = None
            ) -> Captured | None:
        """The step captured for ``key``, captured now (with ``capture``, :func:`capture_graph` by default) if new.

        ``None`` when the capture fails (the reason is kept: :meth:`failed`), now or on an earlier call.
        """
        if key in self._failed:
            return None
        with self._lock:
            captured = self._graphs.get(key)
            if captured is not None:
                self._graphs.move_to_end(key)
                return captured
            try:
                captured = (capture or capture_graph)(step, inputs)
            except Exception as exc:  # any reason a step cannot be captured sends it to the eager path
                self._failed[key] = f"{type(exc).__name__}: {exc}".strip().splitlines()[0]
                return None
            self._graphs[key] = captured
            while len(self._graphs) > self.size:
                self._graphs.popitem(last=False)
            return captured
