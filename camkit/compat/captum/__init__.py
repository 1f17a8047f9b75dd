"""captum 0.9.0's ``captum.attr`` and ``captum.metrics`` computed by camkit: switch a script with one line.

    import camkit.compat.captum as cc
    cc.install()                    # before the script's first 'import captum'
    from captum.attr import IntegratedGradients   # now camkit's translation

Or import the classes from ``camkit.compat.captum.attr`` directly. Every class keeps captum's
constructor and ``attribute(inputs, baselines=, target=, additional_forward_args=, ...)``
contract (tuples of inputs, captum's shapes and dtypes) and computes on camkit's explainer of the
same method. What camkit does not compute (LLM and text attribution, influence functions,
concept tools, the neuron methods) is refused with :class:`~camkit.compat.captum.attr.NotComputedError`.
The differences from the original are listed in docs/migration/captum.md.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from ._install import ABSENT, AlreadyImportedError, install, installed, uninstall

__all__ = ["AlreadyImportedError", "attr", "install", "installed", "metrics", "uninstall"]

__version__ = "0.9.0"

def __getattr__(name: str) -> ModuleType:
    if name in {"attr", "metrics"}:
        module = importlib.import_module(f"{__name__}.{name}")
        globals()[name] = module
        return module
    if name in ABSENT:
        raise ImportError(f"captum.{name}: camkit does not compute {ABSENT[name]}; run this code on the original captum")
    raise AttributeError(f"module 'captum' (camkit.compat.captum) has no attribute {name!r}")
