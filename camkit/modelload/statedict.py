"""State dicts from files, fitted to a model: safetensors or ``weights_only`` pickles, checkpoint wrappers, prefixes.

* :func:`read_state_dict` reads ``.safetensors`` files (no pickle at all) and ``.pth``/``.pt``/``.ckpt``
  files with ``torch.load(..., weights_only=True)``, unwrapping a checkpoint's ``state_dict``
  (Lightning), ``model_state_dict`` or ``model`` entry.
* :func:`fit_state_dict` loads it into a model: a prefix shared by the keys (``model.`` from a
  LightningModule holding the network as ``self.model``, ``module.`` from DataParallel) is
  stripped when the stripped keys are exactly the model's; otherwise the missing, unexpected and
  wrongly shaped keys are listed in one message.
* :func:`refusal` recognises files whose layers hooks cannot see (TorchScript, ``torch.export``
  programs, ONNX) and says what to pass instead.
"""

from __future__ import annotations

import zipfile
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import Tensor, nn

from ..errors import ModelLoadError

__all__ = ["SCRIPT_HINT", "classes_in", "fit_state_dict", "is_torchscript", "read_state_dict", "refusal"]

_INSTEAD = (
    "Pass the eager model instead: --model torchvision:NAME, timm:NAME, hf:PATH or package.module:factory, with "
    "--weights a state dict (torch.save(model.state_dict(), path) or safetensors.torch.save_file)."
)
SCRIPT_HINT = (
    "is a TorchScript file; camkit needs forward and backward hooks on the model's layers, and hooks cannot "
    f"attach to scripted modules. {_INSTEAD}"
)
_EXPORT_HINT = (
    "is a torch.export program (.pt2); its graph has no nn.Module layers for camkit's hooks to attach to. "
    f"{_INSTEAD}"
)
_ONNX_HINT = f"is an ONNX model; camkit explains PyTorch modules, and hooks cannot see inside an ONNX graph. {_INSTEAD}"


def is_torchscript(path: Path) -> bool:
    """Whether ``path`` is a TorchScript archive (``torch.jit.save``)."""
    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
    return any(n.endswith("/constants.pkl") or "/code/" in n for n in names)


def _is_export(path: Path) -> bool:
    if path.suffix == ".pt2":
        return True
    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
    return any(n.endswith(("/archive_format", "serialized_exported_program.json")) for n in names)


def _is_onnx(path: Path) -> bool:
    if path.suffix.lower() == ".onnx":
        return True
    with path.open("rb") as handle:
        head = handle.read(64)
    # an ONNX ModelProto starts with ir_version (field 1, a varint), then names its producer
    return len(head) > 4 and head[0] == 0x08 and (b"pytorch" in head or b"onnx" in head.lower())


def refusal(path: Path) -> str | None:
    """Why a file cannot be explained (TorchScript, ``torch.export``, ONNX), or ``None`` for other files.

    Example:
        >>> import os, tempfile
        >>> from pathlib import Path
        >>> from camkit.modelload.statedict import refusal
        >>> path = Path(tempfile.mkdtemp()) / "model.onnx"
        >>> _ = path.write_bytes(b"\\x08\\x07")
        >>> refusal(path)[:20]
        'is an ONNX model; ca'
    """
    if not path.is_file():
        return None
    if _is_export(path):
        return _EXPORT_HINT
    if is_torchscript(path):
        return SCRIPT_HINT
    if _is_onnx(path):
        return _ONNX_HINT
    return None


def _is_safetensors(path: Path) -> bool:
    if path.suffix == ".safetensors":
        return True
    with path.open("rb") as handle:
        head = handle.read(9)
    return len(head) == 9 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") < path.stat().st_size


def _read_safetensors(path: Path) -> dict[str, Tensor]:
    try:
        from safetensors.torch import load_file
    except ImportError:
        raise ModelLoadError(
            f"--weights {path} is a safetensors file and the safetensors package is not installed: "
            "pip install safetensors"
        ) from None
    try:
        return dict(load_file(str(path), device="cpu"))
    except Exception as err:  # safetensors raises SafetensorError (not a subclass of a built-in) on bad files
        raise ModelLoadError(f"--weights {path} is not a readable safetensors file: {str(err)[:300]}") from None


def read_state_dict(path: Path) -> dict[str, Tensor]:
    """A state dict from a file (safetensors, or a ``weights_only=True`` pickle); checkpoint wrappers unwrapped.

    Example:
        >>> import tempfile, torch
        >>> from pathlib import Path
        >>> from camkit.modelload.statedict import read_state_dict
        >>> path = Path(tempfile.mkdtemp()) / "last.ckpt"
        >>> torch.save({"epoch": 3, "state_dict": {"model.weight": torch.ones(2)}}, path)
        >>> list(read_state_dict(path))
        ['model.weight']
    """
    if not path.is_file():
        raise ModelLoadError(f"no weights file at {path}")
    hint = refusal(path)
    if hint is not None:
        raise ModelLoadError(f"--weights {path} {hint}")
    if _is_safetensors(path):
        return _read_safetensors(path)
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises UnpicklingError, RuntimeError, EOFError, ... on foreign files
        raise ModelLoadError(
            f"--weights {path} is not a plain state dict readable with weights_only=True ({type(err).__name__}: "
            f"{str(err).splitlines()[0][:200] if str(err) else ''}). Save the weights with "
            "torch.save(model.state_dict(), path) or as safetensors; from a checkpoint that holds other objects "
            "(hyper-parameters, callbacks), save its 'state_dict' entry alone."
        ) from None
    if isinstance(loaded, Mapping):
        for key in ("state_dict", "model_state_dict", "model"):
            inner = loaded.get(key)
            if isinstance(inner, Mapping) and inner and all(isinstance(v, Tensor) for v in inner.values()):
                loaded = inner
                break
    if not isinstance(loaded, Mapping) or not all(isinstance(v, Tensor) for v in loaded.values()):
        raise ModelLoadError(
            f"--weights {path} holds a {type(loaded).__name__}, not a state dict (a mapping of names to tensors)"
        )
    return dict(loaded)


def _prefixes(keys: list[str]) -> list[str]:
    """Dotted prefixes of the keys (``"model."``, ``"model.net."``...), most common first."""
    counts: dict[str, int] = {}
    for key in keys:
        parts = key.split(".")[:-1]
        for i in range(1, min(len(parts), 3) + 1):
            prefix = ".".join(parts[:i]) + "."
            counts[prefix] = counts.get(prefix, 0) + 1
    return sorted(counts, key=lambda p: (-counts[p], len(p)))


def _strip_prefix(state: Mapping[str, Tensor], expected: set[str]) -> tuple[dict[str, Tensor], str | None]:
    """``state`` with the one prefix whose removal gives exactly the ``expected`` keys, and that prefix."""
    keys = list(state)
    if set(keys) == expected:
        return dict(state), None
    for prefix in _prefixes(keys):
        stripped = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
        if set(stripped) == expected:
            return stripped, prefix
    return dict(state), None


def _listing(names: list[str], limit: int = 8) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def fit_state_dict(model: nn.Module, state: Mapping[str, Tensor], source: Path | str) -> list[str]:
    """Load ``state`` into ``model`` strictly, after stripping a prefix the keys show; returns notes.

    A mismatch raises :class:`~camkit.errors.ModelLoadError` with the missing keys, the
    unexpected keys and the keys of the wrong shape in one message.

    Example:
        >>> import torch
        >>> from camkit.modelload.statedict import fit_state_dict
        >>> net = torch.nn.Linear(2, 2)
        >>> ckpt = {f"model.{k}": torch.zeros_like(v) for k, v in net.state_dict().items()}
        >>> fit_state_dict(net, ckpt, "last.ckpt"), float(net.weight.detach().abs().sum())
        (["stripped the prefix 'model.' from the keys of last.ckpt"], 0.0)
    """
    own = model.state_dict()
    fitted, prefix = _strip_prefix(state, set(own))
    notes = [f"stripped the prefix {prefix!r} from the keys of {source}"] if prefix else []
    dropped = len(state) - len(fitted)
    if prefix and dropped:
        notes.append(f"ignored {dropped} key(s) of {source} outside the prefix {prefix!r}")
    counters = lambda k: k.endswith("num_batches_tracked")  # noqa: E731  (BatchNorm counters say little: listed last)
    missing = sorted((k for k in own if k not in fitted), key=counters)
    unexpected = sorted((k for k in fitted if k not in own), key=counters)
    shapes = [
        f"{k} {list(fitted[k].shape)} (the model has {list(own[k].shape)})"
        for k in own
        if k in fitted and fitted[k].shape != own[k].shape
    ]
    if missing or unexpected or shapes:
        parts = []
        if missing:
            parts.append(f"missing {len(missing)} key(s): {_listing(missing)}")
        if unexpected:
            parts.append(f"unexpected {len(unexpected)} key(s): {_listing(unexpected)}")
        if shapes:
            parts.append(f"{len(shapes)} key(s) of another shape: {_listing(shapes, 4)}")
        raise ModelLoadError(
            f"the weights in {source} do not fit {type(model).__name__}: {'; '.join(parts)}. Check that --model "
            "names the architecture (and class count) the state dict was saved from."
        )
    model.load_state_dict(fitted, strict=True)
    return notes


def classes_in(state: Mapping[str, Tensor]) -> int | None:
    """The output count of the last 2-D weight in a state dict (the classifier head), if any."""
    heads = [v for k, v in state.items() if k.endswith(".weight") and v.dim() == 2]
    return int(heads[-1].shape[0]) if heads else None
