"""Models and weights from files and factories: state dicts, ``package.module:factory``, whole pickles.

State dicts are always read with ``torch.load(..., weights_only=True)``. A whole pickled model
runs code from the file when unpickled, so it is refused unless the caller trusts the file.
TorchScript files are refused with an explanation: hooks cannot attach to scripted modules.
"""

from __future__ import annotations

import importlib
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import ModelLoadError

__all__ = ["SCRIPT_HINT", "apply_state_dict", "classes_in", "first_line", "is_torchscript", "load_factory", "load_whole", "read_state_dict"]


def is_torchscript(path: Path) -> bool:
    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
    return any(n.endswith("/constants.pkl") or "/code/" in n for n in names)


SCRIPT_HINT = (
    "is a TorchScript file; camkit needs forward and backward hooks on the model's layers, and hooks "
    "cannot attach to scripted modules. Pass the eager model instead: --model package.module:factory "
    "(or torchvision:NAME) with --weights a state dict saved by torch.save(model.state_dict(), path)."
)


def read_state_dict(path: Path) -> dict[str, Tensor]:
    """A state dict from a file, read with ``weights_only=True``; common checkpoint wrappers unwrapped."""
    if not path.is_file():
        raise ModelLoadError(f"no weights file at {path}")
    if is_torchscript(path):
        raise ModelLoadError(f"--weights {path} {SCRIPT_HINT}")
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises UnpicklingError, RuntimeError, EOFError, ... on foreign files
        raise ModelLoadError(
            f"--weights {path} is not a plain state dict readable with weights_only=True ({type(err).__name__}: "
            f"{str(err).splitlines()[0] if str(err) else ''}). Save the weights with "
            "torch.save(model.state_dict(), path)."
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
    state = dict(loaded)
    if state and all(k.startswith("module.") for k in state):  # saved from DataParallel / DDP
        state = {k[len("module.") :]: v for k, v in state.items()}
    return state


def apply_state_dict(model: nn.Module, state: Mapping[str, Tensor], source: Path) -> None:
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as err:
        lines = str(err).splitlines()
        detail = "; ".join(line.strip() for line in lines[1:4]) or lines[0]
        raise ModelLoadError(
            f"the weights in {source} do not fit {type(model).__name__}: {detail[:500]}. Check that --model names "
            "the architecture the state dict was saved from."
        ) from None


def classes_in(state: Mapping[str, Tensor]) -> int | None:
    """The output count of the last 2-D weight in a state dict (the classifier head), if any."""
    heads = [v for k, v in state.items() if k.endswith(".weight") and v.dim() == 2]
    return int(heads[-1].shape[0]) if heads else None


def load_factory(spec: str, weights: str | None) -> tuple[nn.Module, list[str]]:
    module_name, attr = spec.split(":", 1)
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ModelLoadError(
            f"cannot import {module_name!r} for --model {spec} ({err}); is it installed or on PYTHONPATH?"
        ) from err
    except Exception as err:  # the module itself fails while importing (SyntaxError, NameError, ...)
        raise ModelLoadError(
            f"importing {module_name!r} for --model {spec} failed: {type(err).__name__}: {first_line(err)}"
        ) from err
    factory: Any = module
    for part in attr.split("."):
        if not hasattr(factory, part):
            raise ModelLoadError(f"module {module_name!r} has no attribute {attr!r} (from --model {spec})")
        factory = getattr(factory, part)
    if not callable(factory):
        raise ModelLoadError(f"--model {spec}: {attr} is a {type(factory).__name__}, not a callable returning a model")
    try:
        model = factory()
    except Exception as err:  # the user's factory failed: say so in one line (the cause stays chained)
        raise ModelLoadError(f"--model {spec}: {attr}() raised {type(err).__name__}: {first_line(err)}") from err
    if not isinstance(model, nn.Module):
        raise ModelLoadError(f"--model {spec}: {attr}() returned a {type(model).__name__}, not a torch.nn.Module")
    notes: list[str] = []
    if weights is not None:
        path = Path(weights)
        apply_state_dict(model, read_state_dict(path), path)
    else:
        notes.append("weights as built by the factory (no --weights given)")
    return model, notes


def first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:300] if text else ""


def load_whole(path: Path, weights: str | None, trust_pickle: bool) -> nn.Module:
    if not path.is_file():
        raise ModelLoadError(
            f"--model {str(path)!r} is not torchvision:NAME, package.module:factory, or an existing file"
        )
    if is_torchscript(path):
        raise ModelLoadError(f"--model {path} {SCRIPT_HINT}")
    if weights is not None:
        raise ModelLoadError(
            f"--weights goes with --model torchvision:NAME or package.module:factory, not with a saved model file ({path})"
        )
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # not loadable as plain tensors: a pickled object
        loaded = None
    else:
        raise ModelLoadError(
            f"--model {path} holds a {type(loaded).__name__} (a state dict?), not a model; pass the architecture "
            f"as --model torchvision:NAME or package.module:factory and this file as --weights"
        )
    if not trust_pickle:
        raise ModelLoadError(
            f"--model {path} is a whole pickled model: loading it runs code stored in the file. Pass --trust-pickle "
            "(Python: trust_pickle=True) only for files you trust; safer, save model.state_dict() and pass "
            "--model package.module:factory --weights FILE."
        )
    loaded = torch.load(path, map_location="cpu", weights_only=False)
    if not isinstance(loaded, nn.Module):
        raise ModelLoadError(f"--model {path} unpickles to a {type(loaded).__name__}, not a torch.nn.Module")
    return loaded
