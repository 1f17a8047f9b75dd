"""Find the calls that would make a CUDA device wait for the host, without a GPU.

On a GPU, ``torch.cuda.set_sync_debug_mode("error")`` is the ground truth. This module
is the CPU-side stand-in used by the tests: :func:`record_syncs` watches every aten op a
block runs (a :class:`~torch.utils._python_dispatch.TorchDispatchMode`) and every
host-read ``Tensor`` method it calls (a :class:`~torch.overrides.TorchFunctionMode`), and
records those that, on a CUDA tensor, copy a value back to the host before the next
kernel can be queued:

* ``aten._local_scalar_dense``: ``t.item()``, ``bool(t)``, ``int(t)``, ``float(t)``,
  ``if t:``, a 0-d tensor used as a Python index;
* ops whose output size depends on values: ``nonzero``, ``masked_select``, the
  ``unique`` family, ``repeat_interleave`` with tensor repeats, ``bincount``,
  boolean-mask indexing (``aten.index`` / ``aten.index_put_`` with a bool index);
* ops that return a Python value computed on the device: ``equal``, ``allclose``,
  ``is_nonzero``;
* linear-algebra ops that check their LAPACK status on the host on CUDA (``svd``,
  ``eigh``, ...);
* ``Tensor.cpu()``, ``.tolist()``, ``.numpy()`` (seen as calls, as they dispatch nothing
  on a CPU tensor).

What the CPU cannot show: a blocking host-to-device copy (``torch.tensor(..., device=d)``,
``cpu_tensor.to(d)`` without ``non_blocking=True``), which sync debug mode also flags, and a
device-to-host ``.to("cpu")`` spelled with ``.to`` rather than ``.cpu()``, because on the
CPU both are no-ops that dispatch nothing. The CUDA form of the test catches those.

Example:
    >>> import torch
    >>> from camkit._internal.syncs import record_syncs
    >>> x = torch.tensor([1.0, -2.0, 3.0])
    >>> with record_syncs() as syncs:
    ...     y = x.clamp_min(0).sum()  # no sync
    ...     _ = x[x > 0]              # boolean mask: its size depends on the values
    ...     _ = float(y)              # a scalar read
    >>> [s.op for s in syncs]
    ['aten.index.Tensor (bool mask)', 'aten._local_scalar_dense.default']
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["SyncRecord", "reads_are_free", "record_syncs", "to_device"]

_SYNC_PACKETS = {
    "_local_scalar_dense",
    "is_nonzero",
    "nonzero",
    "argwhere",
    "masked_select",
    "unique_dim",
    "_unique",
    "_unique2",
    "unique_consecutive",
    "unique_dim_consecutive",
    "equal",
    "allclose",
    "bincount",
    "_linalg_svd",
    "linalg_svd",
    "_linalg_eigh",
    "linalg_eig",
    "linalg_eigvals",
    "_linalg_det",
    "linalg_lstsq",
    "linalg_cholesky",
    "linalg_inv",
    "linalg_solve",
    "cholesky",
    "inverse",
    "_linalg_solve_ex_check",
}
_MASKED_INDEX = {"index", "index_put", "index_put_", "_index_put_impl_", "_unsafe_index_put"}
_HOST_READS: dict[Callable[..., Any], str] = {
    Tensor.cpu: "Tensor.cpu",
    Tensor.tolist: "Tensor.tolist",
    Tensor.numpy: "Tensor.numpy",
    Tensor.__array__: "Tensor.__array__",
}
_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the camkit package


def reads_are_free(tensor: Tensor) -> bool:
    """Whether reading ``tensor``'s values on the host costs no device sync (it lives in host memory).

    camkit takes value-dependent shortcuts (an eager range check, skipping repeated masks)
    only where this holds; on a device it takes the sync-free path instead. The tests
    replace this function to run the device paths on the CPU.

    Example:
        >>> import torch
        >>> from camkit._internal.syncs import reads_are_free
        >>> reads_are_free(torch.zeros(2)), reads_are_free(torch.zeros(2, device="meta"))
        (True, False)
    """
    return tensor.device.type == "cpu"


def to_device(tensor: Tensor, device: torch.device | str, dtype: torch.dtype | None = None) -> Tensor:
    """``tensor.to(device, dtype)`` without making the host wait for a CUDA device.

    A plain copy from pageable host memory to a GPU blocks the host (sync debug mode flags it);
    a host tensor bound for CUDA is therefore converted on the host, pinned and sent with
    ``non_blocking=True``. Anything else is an ordinary ``.to``.

    Example:
        >>> import torch
        >>> from camkit._internal.syncs import to_device
        >>> to_device(torch.tensor([1, 2]), "cpu", torch.float32)
        tensor([1., 2.])
    """
    device = torch.device(device)
    if tensor.device.type == "cpu" and device.type == "cuda":
        if dtype is not None:
            tensor = tensor.to(dtype)
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device=device, dtype=dtype)


@dataclass(frozen=True)
class SyncRecord:
    """One recorded sync: the op, the device of its tensor, and the innermost caller outside torch."""

    op: str
    device: str
    where: str

    def __str__(self) -> str:
        return f"{self.op} on {self.device} at {self.where}"


def _first_device(args: Any) -> str:
    stack = list(args) if isinstance(args, (tuple, list)) else [args]
    while stack:
        item = stack.pop(0)
        if isinstance(item, Tensor):
            return str(item.device)
        if isinstance(item, (tuple, list)):
            stack[:0] = list(item)
    return "?"


def _caller() -> str:
    """The innermost frame that is neither torch nor this module: where the sync was asked for."""
    torch_dir = os.path.dirname(os.path.abspath(torch.__file__))
    for frame in reversed(traceback.extract_stack()[:-1]):
        path = os.path.abspath(frame.filename)
        if path.startswith(torch_dir) or path == os.path.abspath(__file__) or frame.name == "__torch_function__":
            continue
        shown = os.path.relpath(path, os.path.dirname(_HERE)) if path.startswith(_HERE) else path
        return f"{shown}:{frame.lineno} ({frame.name})"
    return "?"


def _is_masked(args: tuple[Any, ...]) -> bool:
    indices = args[1] if len(args) > 1 else ()
    return any(isinstance(i, Tensor) and i.dtype in (torch.bool, torch.uint8) for i in (indices or ()))


def _sizes_from_values(func: Any, kwargs: dict[str, Any] | None) -> bool:
    """``repeat_interleave`` with a tensor of repeats and no ``output_size``: its size is read back."""
    return (
        func.overloadpacket.__name__ == "repeat_interleave"
        and func._overloadname in ("Tensor", "self_Tensor")
        and (kwargs or {}).get("output_size") is None
    )


class _Ops(TorchDispatchMode):
    def __init__(self, out: list[SyncRecord]) -> None:
        super().__init__()
        self.out = out

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        name = func.overloadpacket.__name__
        if name in _SYNC_PACKETS or _sizes_from_values(func, kwargs):
            self.out.append(SyncRecord(str(func), _first_device(args), _caller()))
        elif name in _MASKED_INDEX and _is_masked(args):
            self.out.append(SyncRecord(f"{func} (bool mask)", _first_device(args), _caller()))
        return func(*args, **(kwargs or {}))


class _Reads(TorchFunctionMode):
    def __init__(self, out: list[SyncRecord]) -> None:
        super().__init__()
        self.out = out

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        try:
            label = _HOST_READS.get(func)
        except TypeError:  # unhashable callables are not host reads
            label = None
        if label is not None:
            self.out.append(SyncRecord(label, _first_device(args), _caller()))
        return func(*args, **(kwargs or {}))


@contextmanager
def record_syncs() -> Iterator[list[SyncRecord]]:
    """Record, in order, the ops of the block that would wait for a CUDA device (see the module docstring).

    Yields the list the records are appended to. The modes are popped when the block ends,
    also on an exception.
    """
    records: list[SyncRecord] = []
    with _Reads(records), _Ops(records):
        yield records
