import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

torch.set_num_threads(max(1, min(2, torch.get_num_threads())))

NO_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.cuda, NO_CUDA])]


def pytest_collection_modifyitems(config, items):
    """Every CUDA case carries the ``cuda`` marker, so ``pytest -m cuda`` (``make test-gpu``) selects them all:
    the ``device`` fixture's cuda param, ``[cuda...]`` parametrisations and tests named ``*cuda*``."""
    for item in items:
        if "cuda" in item.name.lower() and item.get_closest_marker("cuda") is None:
            item.add_marker(pytest.mark.cuda)


@pytest.fixture(params=DEVICES)
def device(request):
    return torch.device(request.param)


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for a module: large torchvision models stall when threads oversubscribe a busy box."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
