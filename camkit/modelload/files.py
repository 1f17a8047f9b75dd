"""Models and weights from files and factories: state dicts, ``package.module:factory``, whole pickles.

State dicts are read by :mod:`camkit.modelload.statedict` (safetensors, or ``torch.load(...,
weights_only=True)``). A whole pickled model runs code from the file when unpickled, so it is
refused unless the caller trusts the file. TorchScript, ``torch.export`` and ONNX files are
refused with an explanation: hooks cannot see inside them.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import ModelLoadError
from .statedict import fit_state_dict, read_state_dict, refusal

__all__ = ["first_line", "load_factory", "load_whole"]


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
        notes += fit_state_dict(model, read_state_dict(path), path)
    else:
        notes.append("weights as built by the factory (no --weights given)")
    return model, notes


def first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:300] if text else ""


def load_whole(path: Path, weights: str | None, trust_pickle: bool) -> nn.Module:
    if not path.is_file():
        raise ModelLoadError(
            f"--model {str(path)!r} is not torchvision:NAME, timm:NAME, hf:PATH_OR_ID, ultralytics:PATH.pt, "
            "package.module:factory, or an existing file"
        )
    hint = refusal(path)
    if hint is not None:
        raise ModelLoadError(f"--model {path} {hint}")
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
