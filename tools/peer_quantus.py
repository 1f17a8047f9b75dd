"""pytest plugin for Quantus 0.6.0's own tests (``tools/peer_suites.py --suite quantus``), in both runs alike.

Loaded with ``-p peer_quantus`` beside ``peer_plugin``. It runs when pytest reads its options,
before Quantus's ``tests/conftest.py`` is imported, and:

* calls ``install()`` of ``$CAMKIT_PEER_COMPAT`` (the camkit run) at once, since that conftest
  imports ``quantus`` at its top, before ``pytest_configure``;
* stands in for what needs TensorFlow, which is not installed: ``keras.datasets.cifar10``
  (whose ``load_data`` downloads CIFAR-10; the stand-in returns seeded random images of its
  shape, the same in both runs) and the four TensorFlow model builders the conftest imports
  (``LeNetTF``, ``ConvNet1DTF``, ``TitanicSimpleTFModel``, ``CifarCNNModel``), inert objects
  that only its session fixtures touch;
* skips every case parametrised with a TensorFlow model fixture or marked ``tf_model``, and
  leaves out ``tests/helpers/test_tf_model.py`` (it imports tensorflow);
* in the camkit run, serves ``quantus.helpers.model.models`` (the suite's test architectures,
  LeNet, ConvNet1D and the Titanic network whose weights the fixtures load) from the original
  package's file, loaded by path: they are the suite's fixtures, not API that camkit translates.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

#: the conftest's fixtures that build TensorFlow models
TF_FIXTURES = frozenset({"load_mnist_model_tf", "load_cifar10_model_tf", "load_1d_3ch_conv_model_tf", "titanic_model_tf"})
TF_BUILDERS = ("LeNetTF", "ConvNet1DTF", "TitanicSimpleTFModel", "CifarCNNModel")
TF_FILES = ("test_tf_model.py",)


class TensorFlowStandIn:
    """What a TensorFlow model builder returns here: accepts the conftest's calls, computes nothing."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def load_weights(self, *args: Any, **kwargs: Any) -> None:
        return None

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        return None


def _cifar10_standin() -> None:
    import numpy as np

    def load_data() -> tuple[tuple[Any, Any], tuple[Any, Any]]:
        rng = np.random.default_rng(0)
        x = rng.integers(0, 256, size=(124, 32, 32, 3), dtype=np.uint8)
        y = rng.integers(0, 10, size=(124, 1))
        return (x, y), (x[:0], y[:0])

    for name in ("keras", "keras.datasets", "keras.datasets.cifar10"):
        module = sys.modules.setdefault(name, ModuleType(name))
        module.__path__ = []
    sys.modules["keras"].datasets = sys.modules["keras.datasets"]  # type: ignore[attr-defined]
    sys.modules["keras.datasets"].cifar10 = sys.modules["keras.datasets.cifar10"]  # type: ignore[attr-defined]
    sys.modules["keras.datasets.cifar10"].load_data = load_data  # type: ignore[attr-defined]


def _test_models(compat: bool) -> None:
    """``quantus.helpers.model.models`` with the TensorFlow builders stood in for."""
    name = "quantus.helpers.model.models"
    if compat:
        path = Path(str(importlib.metadata.distribution("quantus").locate_file("quantus/helpers/model/models.py")))
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        parent = importlib.import_module("quantus.helpers.model")  # camkit's module for untranslated paths
        sys.modules[name] = module
        parent.models = module  # type: ignore[attr-defined]
    else:
        module = importlib.import_module(name)
    for builder in TF_BUILDERS:
        if not hasattr(module, builder):
            setattr(module, builder, type(builder, (TensorFlowStandIn,), {}))


def _prepare() -> None:
    if importlib.util.find_spec("tensorflow") is not None:
        return  # the real TensorFlow models run
    compat = os.environ.get("CAMKIT_PEER_COMPAT")
    if compat:
        importlib.import_module(compat).install()
    _cifar10_standin()
    _test_models(bool(compat))


_prepare()


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if importlib.util.find_spec("tensorflow") is None and collection_path.name in TF_FILES:
        return True
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if importlib.util.find_spec("tensorflow") is not None:
        return
    skip = pytest.mark.skip(reason="TensorFlow case: TensorFlow is not installed (both runs alike)")
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        lazy = {getattr(value, "name", None) for value in params.values()}
        if lazy & TF_FIXTURES or item.get_closest_marker("tf_model") is not None:
            item.add_marker(skip)
