"""CheferRollout's and LeGrad's two paths, the whole graph and block by block, and the memory budget that chooses.

Both paths must give the same maps (in float64, so that only the order of float32 sums in the
relevance differs), on every family the attention tests cover and on the device when there is
one; the choice must follow ``path=`` and ``max_memory=``, be reported in ``extras``, and the
estimate it rests on must bound the whole graph's memory, measured here tensor by tensor.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_invariants import _assert_same_state, _hook_count, _state
from torch import Tensor, nn
from vit_helpers import SIZE, LiveBytes, assert_maps_close, hf_vit, timm_vit, torchvision_vit

import camkit
from camkit.errors import InvalidInputError
from camkit.methods.attention.budget import MARGIN, free_memory, whole_graph_bytes

pytest.importorskip("timm")
pytest.importorskip("transformers")

BUILDERS = {
    "timm": lambda: timm_vit(),
    "timm-registers": lambda: timm_vit(reg_tokens=4),
    "timm-avg-no-class-token": lambda: timm_vit(global_pool="avg", class_token=False),
    "torchvision": torchvision_vit,
    "hf-vit": lambda: hf_vit("vit"),
    "hf-deit": lambda: hf_vit("deit"),
    "hf-dinov2-registers": lambda: hf_vit("dinov2"),
}
METHODS = {"cheferrollout": camkit.CheferRollout, "legrad": camkit.LeGrad}
# one family of each library in make test; the others (prefix tokens of other kinds, mean pooling) in the heavy run
LIGHT = ("timm", "torchvision", "hf-vit")
FAMILIES = [f if f in LIGHT else pytest.param(f, marks=pytest.mark.heavy) for f in BUILDERS]
TARGET = [[0, 3], [2, 1], [1, 1]]  # two classes per image: two backward passes per path


def _x(batch: int = 3, dtype: torch.dtype = torch.float32) -> Tensor:
    return torch.rand(batch, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(5 + batch), dtype=torch.float64).to(dtype)


def _assert_same_maps(got, expected) -> None:
    scale = expected.raw.abs().amax()
    torch.testing.assert_close(got.raw, expected.raw, atol=float(2e-6 * scale), rtol=0)
    assert_maps_close(got.maps, expected.maps, expected.raw, 1e-5)
    # the scores of the model's own forward (fused attention) and of the unfused one: Hugging Face's eager
    # attention takes its softmax in float32 even in a float64 model
    torch.testing.assert_close(got.scores, expected.scores, atol=1e-8, rtol=1e-6)
    assert torch.equal(got.flat, expected.flat)


@pytest.mark.parametrize("key", list(METHODS))
@pytest.mark.parametrize("family", FAMILIES)
def test_the_whole_graph_equals_block_by_block_in_float64(family, key, device):
    model = BUILDERS[family]().double().to(device)
    x, target = _x(dtype=torch.float64).to(device), torch.tensor(TARGET, device=device)
    whole = METHODS[key](model, path="whole").explain(x, target)
    blockwise = METHODS[key](model, path="blockwise").explain(x, target)
    assert (whole.extras["path"], blockwise.extras["path"]) == ("whole", "blockwise")
    assert not whole.flat.any() and whole.maps.device.type == device.type
    _assert_same_maps(whole, blockwise)
    # a callable target: LeGrad calls its blocks again on that path, Chefer runs its forward whole
    callable_target = lambda out: out[:, [1, 2]]  # noqa: E731
    _assert_same_maps(METHODS[key](model, path="whole").explain(x, callable_target),
                      METHODS[key](model, path="blockwise").explain(x, callable_target))


@pytest.mark.parametrize("key", list(METHODS))
def test_clip_similarity_on_both_paths(key):
    model = hf_vit("clip").double()
    text = torch.randn(3, 8, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    target = camkit.SimilarityTarget(text)
    x = _x(dtype=torch.float64)
    whole = METHODS[key](model, path="whole", output="image_embeds").explain(x, target)
    blockwise = METHODS[key](model, path="blockwise", output="image_embeds").explain(x, target)
    _assert_same_maps(whole, blockwise)


@pytest.mark.parametrize("key", list(METHODS))
@pytest.mark.parametrize("family", ["torchvision", "hf-dinov2-registers"])
def test_the_whole_graph_batch_equals_one_by_one(family, key):
    model = BUILDERS[family]()
    explainer = METHODS[key](model, path="whole")
    x, target = _x(), torch.tensor([2, 0, 1])
    batched = explainer.explain(x, target)
    assert batched.extras["path"] == "whole"
    for i in range(3):
        single = explainer.explain(x[i : i + 1], target[i : i + 1])
        torch.testing.assert_close(batched.raw[i], single.raw[0], atol=1e-7, rtol=1e-5)
        torch.testing.assert_close(batched.maps[i], single.maps[0], atol=1e-5, rtol=0)


def _messy(model: nn.Module) -> nn.Module:
    """Training flags mixed, a frozen parameter and gradients already set."""
    model.train()
    params = list(model.parameters())
    params[1].requires_grad_(False)
    params[-1].grad = torch.randn_like(params[-1])
    for module in list(model.modules())[::3]:
        module.eval()
    return model


@pytest.mark.parametrize("key", list(METHODS))
@pytest.mark.parametrize("family", ["timm", "torchvision", "hf-vit"])
def test_the_whole_graph_leaves_the_model_and_input_as_they_were(family, key):
    model = _messy(BUILDERS[family]())
    before, x = _state(model), _x()
    x_before = x.clone()
    explanation = METHODS[key](model, max_memory=2**40).explain(x, [1, 0, 2])  # the budget allows the whole graph
    assert explanation.extras["path"] == "whole"
    assert _hook_count(model) == 0 and torch.is_grad_enabled()
    assert all("forward" not in m.__dict__ for m in model.modules())
    _assert_same_state(before, _state(model))
    assert torch.equal(x, x_before) and not x.requires_grad


@pytest.mark.parametrize("key", list(METHODS))
def test_the_whole_graph_leaves_no_trace_when_the_head_fails(key):
    model = _messy(torchvision_vit())
    before = _state(model)
    model.heads.forward = lambda *a, **k: (_ for _ in ()).throw(ValueError("boom in the head"))
    try:
        with pytest.raises(ValueError, match="boom in the head"):
            METHODS[key](model, path="whole").explain(_x(2), [0, 1])
    finally:
        del model.heads.forward
    assert _hook_count(model) == 0 and torch.is_grad_enabled()
    assert all("forward" not in m.__dict__ for m in model.modules())
    _assert_same_state(before, _state(model))


@pytest.mark.parametrize("key", list(METHODS))
def test_the_choice_follows_the_budget_and_is_reported(key):
    model = timm_vit()
    x, target = _x(), [0, 1, 2]
    estimate = METHODS[key](model, path="whole").explain(x, target).extras["estimated_bytes"]
    assert isinstance(estimate, int) and estimate > 0
    assert estimate == whole_graph_bytes(METHODS[key](model)._shape, 3, (SIZE, SIZE))
    cases = [  # (keywords, path taken, budget reported)
        ({}, "blockwise", None),  # the CPU without max_memory: block by block
        ({"max_memory": estimate}, "whole", estimate),  # it fits exactly
        ({"max_memory": estimate - 1}, "blockwise", estimate - 1),
        ({"max_memory": 1}, "blockwise", 1),
        ({"max_memory": 2**40}, "whole", 2**40),
        ({"path": "whole", "max_memory": 1}, "whole", 1),  # a forced path ignores the budget
        ({"path": "blockwise", "max_memory": 2**40}, "blockwise", 2**40),
    ]
    for kwargs, path, budget in cases:
        extras = METHODS[key](model, **kwargs).explain(x, target).extras
        assert extras == {"path": path, "estimated_bytes": estimate, "budget_bytes": budget}, kwargs
    # twice the batch, twice the estimate: a budget that fits three images does not fit six
    six = METHODS[key](model, max_memory=estimate).explain(torch.cat([x, x]), target * 2).extras
    assert six["estimated_bytes"] == 2 * estimate and six["path"] == "blockwise"


@pytest.mark.parametrize("key", list(METHODS))
def test_cases_the_blocks_cannot_replay_report_the_whole_graph(key):
    model = timm_vit()
    model.train()  # keep_mode: dropout in training mode would draw new masks in a replay
    extras = METHODS[key](model, keep_mode=True, path="blockwise").explain(_x(2), [0, 1]).extras
    assert extras["path"] == "whole"


def test_an_unknown_token_count_keeps_block_by_block():
    """Where the tokens cannot be counted from the input (here: as if the patch embedding were no convolution),
    there is no estimate, and no budget lets the whole graph in."""
    explainer = camkit.LeGrad(torchvision_vit(), max_memory=2**40)
    explainer._shape = dataclasses.replace(explainer._shape, patch=None)
    extras = explainer.explain(_x(2), [0, 1]).extras
    assert extras == {"path": "blockwise", "estimated_bytes": None, "budget_bytes": 2**40}


@pytest.mark.parametrize("cls", list(METHODS.values()))
def test_max_memory_is_checked(cls):
    model = torchvision_vit()
    for bad in (0, -5, 1.5e9, "1GB", True):
        with pytest.raises(InvalidInputError, match="max_memory must be a positive number of bytes"):
            cls(model, max_memory=bad)


@pytest.mark.parametrize("key", list(METHODS))
@pytest.mark.parametrize("family", ["timm", "torchvision", "hf-vit"])
def test_the_estimate_bounds_the_whole_graphs_memory(family, key):
    """Every tensor made during the whole-graph call, forward and backward, counted while it lives: the peak is
    below the estimate, and the estimate is not loose by more than 3x."""
    model = BUILDERS[family]()
    explainer = METHODS[key](model, path="whole")
    x = _x(4)
    explainer.explain(x, [0, 1, 2, 3])  # warm-up
    with LiveBytes() as live:
        got = explainer.explain(x, [0, 1, 2, 3])
    estimate = got.extras["estimated_bytes"]
    assert live.peak <= estimate <= 3 * live.peak, (live.peak, estimate)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("key", list(METHODS))
def test_cuda_default_takes_the_whole_graph_within_the_free_memory(key):
    from torchvision.models import VisionTransformer

    torch.manual_seed(0)  # large enough that CUDA's rounding of each allocation (512 bytes) does not count
    model = VisionTransformer(image_size=64, patch_size=8, num_layers=3, num_heads=4, hidden_dim=64, mlp_dim=128,
                              num_classes=4)  # fmt: skip
    nn.init.normal_(model.heads.head.weight, std=0.5)
    model = model.eval().cuda()
    x = torch.rand(8, 3, 64, 64, device="cuda")
    target = torch.arange(8, device="cuda") % 4
    free = free_memory(torch.device("cuda"))
    assert free is not None and free > 0
    got = METHODS[key](model).explain(x, target)
    assert got.extras["path"] == "whole"
    assert 0.5 * MARGIN * free <= got.extras["budget_bytes"] <= 1.5 * MARGIN * free
    assert METHODS[key](model, max_memory=1).explain(x, target).extras["path"] == "blockwise"
    whole = METHODS[key](model, path="whole")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    whole.explain(x, target)
    torch.cuda.synchronize()
    assert torch.cuda.max_memory_allocated() - base <= got.extras["estimated_bytes"]
