"""pytest plugin for ``tools/peer_suites.py``: one run of a peer library's own tests.

Loaded with ``-p peer_plugin`` (``tools/`` on ``PYTHONPATH``). Environment:

* ``CAMKIT_PEER_COMPAT``: a compat module (``camkit.compat.pytorch_grad_cam``) whose
  ``install()`` runs before collection, so the suite's ``import pytorch_grad_cam`` loads camkit's
  translation; unset: the real package is tested.
* ``CAMKIT_PEER_REPORT``: a JSON file that receives ``{nodeid: outcome}``; the file of the same
  name with ``.durations`` added receives ``{nodeid: seconds}`` (setup, call and teardown).

In both runs pretrained torchvision weights (``weights="DEFAULT"``, ``pretrained=True``) are
not downloaded: the model keeps its random initialisation, seeded identically before every
test, so both runs see the same "pretrained" model.
"""

from __future__ import annotations

import importlib
import json
import os
import random
from typing import Any

import pytest

_OUTCOMES: dict[str, str] = {}
_SECONDS: dict[str, float] = {}


class _RandomWeights(dict):
    """What ``WeightsEnum.get_state_dict`` returns instead of a download: load_state_dict keeps the random init."""


def _patch_weights() -> None:
    import torch
    from torchvision.models._api import WeightsEnum

    def get_state_dict(self: Any, *args: Any, **kwargs: Any) -> _RandomWeights:
        return _RandomWeights()

    WeightsEnum.get_state_dict = get_state_dict  # type: ignore[method-assign]
    original = torch.nn.Module.load_state_dict

    def load_state_dict(self: torch.nn.Module, state_dict: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(state_dict, _RandomWeights):
            return torch.nn.modules.module._IncompatibleKeys([], [])
        return original(self, state_dict, *args, **kwargs)

    torch.nn.Module.load_state_dict = load_state_dict  # type: ignore[method-assign]


def pytest_configure(config: pytest.Config) -> None:
    _patch_weights()
    compat = os.environ.get("CAMKIT_PEER_COMPAT")
    if compat:
        importlib.import_module(compat).install()


@pytest.fixture(autouse=True)
def _same_random_state() -> None:
    import numpy as np
    import torch

    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _SECONDS[report.nodeid] = round(_SECONDS.get(report.nodeid, 0.0) + report.duration, 3)
    if report.when == "call":
        _OUTCOMES[report.nodeid] = report.outcome  # passed, failed or skipped (xfail)
    elif report.failed:
        _OUTCOMES[report.nodeid] = "error"  # a fixture or teardown failed
    elif report.skipped and report.when == "setup":
        _OUTCOMES[report.nodeid] = "skipped"


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed:
        _OUTCOMES[report.nodeid or "<collection>"] = "error"


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    path = os.environ.get("CAMKIT_PEER_REPORT")
    if path and not hasattr(session.config, "workerinput"):  # pytest-xdist: the controller writes the report
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(_OUTCOMES, handle, indent=1, sort_keys=True)
        with open(path + ".durations", "w", encoding="utf-8") as handle:
            json.dump(_SECONDS, handle, indent=1, sort_keys=True)
