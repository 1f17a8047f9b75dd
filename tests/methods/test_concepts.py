"""ConceptRelevance: channel relevance and conditional maps against hand computations, LRP, hygiene."""

from __future__ import annotations

import pytest
import torch
from models import RankNet, TinyNet, rank_input, tiny_input
from torch import nn

import camkit
from camkit.errors import InvalidInputError, InvalidTargetError
from camkit.functional import merge_top, relevance_boxes

CONV = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}
SIZES = {1: (5,), 2: (3, 4), 3: (2, 3, 2)}


class HandNet(nn.Module):
    """1x1 convolution (the concept layer ``conv``), ReLU, a linear read-out: every gradient by hand."""

    def __init__(self, dims: int, seed: int = 0) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.conv = CONV[dims](2, 3, 1, bias=False)
        positions = int(torch.tensor(SIZES[dims]).prod())
        self.fc = nn.Linear(3 * positions, 2, bias=False)
        with torch.no_grad():
            self.conv.weight.copy_(torch.randn(self.conv.weight.shape, generator=g))
            self.fc.weight.copy_(torch.randn(self.fc.weight.shape, generator=g))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv(x)).flatten(1))


def _hand(net: HandNet, x: torch.Tensor, target: torch.Tensor):
    """Relevance [B, C] and conditional maps [B, C(all channels), C_in, *S] written out."""
    w = net.conv.weight.detach().flatten(1)  # [C, C_in]
    a = torch.einsum("oc,bc...->bo...", w, x)
    v = net.fc.weight.detach()[target].view(x.shape[0], 3, *x.shape[2:])  # dS/d relu(a)
    g = v * (a > 0)
    rel = (a * g).flatten(2).sum(2)
    # conditional map of channel c: x_i * w_ci * g_c at each position
    cond = x[:, None] * torch.einsum("oc,bo...->boc...", w, g)  # [B, C, C_in, *S]
    return rel, cond


@pytest.mark.parametrize("dims", [1, 2, 3])
def test_gradient_rule_equals_hand_computation(dims):
    torch.manual_seed(dims)
    net = HandNet(dims, seed=dims)
    x = torch.randn(3, 2, *SIZES[dims])
    target = torch.tensor([0, 1, 1])
    rel, cond = _hand(net, x, target)
    e = camkit.ConceptRelevance(net, "conv").explain(x, target, channels=[2, 0])
    torch.testing.assert_close(e.extras["relevance"], rel)
    torch.testing.assert_close(e.raw, cond[:, [2, 0]])
    assert e.maps.shape == (3, 2, *SIZES[dims])
    assert e.extras["channels"].tolist() == [[2, 0]] * 3
    # layer maps: each chosen channel's relevance at the layer, summing to its channel relevance
    torch.testing.assert_close(e.extras["layer_maps"].flatten(2).sum(2), rel[:, [2, 0]])
    # top-K per image picks the most relevant channels, in order
    top = camkit.ConceptRelevance(net, "conv").explain(x, target, channels=2)
    assert top.extras["channels"].tolist() == rel.topk(2, dim=1).indices.tolist()
    torch.testing.assert_close(top.raw, torch.stack([cond[b, top.extras["channels"][b]] for b in range(3)]))


@pytest.mark.parametrize("dims", [1, 2, 3])
def test_conditional_maps_of_all_channels_add_up_to_gradient_x_input(dims):
    net = RankNet(dims).eval()
    x = rank_input(dims)
    e = camkit.ConceptRelevance(net, "conv2").explain(x, channels=list(range(6)))
    ixg = camkit.InputXGradient(net).explain(x, e.target)
    torch.testing.assert_close(e.raw.sum(1), ixg.raw, atol=1e-5, rtol=1e-4)
    # completeness at the layer: sum_c R_c = sum (A * dS/dA), which equals LayerGradientXActivation's total
    lgxa = camkit.LayerGradientXActivation(net, "conv2").explain(x, e.target)
    torch.testing.assert_close(e.extras["relevance"].sum(1), lgxa.raw.flatten(1).sum(1), atol=1e-5, rtol=1e-4)


class _Restricted(nn.Module):
    """``net`` with the backward through ``conv2`` kept only on channel ``c`` (the forward unchanged)."""

    def __init__(self, net: nn.Module, channel: int) -> None:
        super().__init__()
        self.net = net
        self.channel = channel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        net = self.net
        h = net.relu(net.bn1(net.conv1(x)))
        z = net.conv2(h)
        keep = torch.zeros(1, z.shape[1], *([1] * (z.dim() - 2)))
        keep[:, self.channel] = 1.0
        z = z * keep + (z * (1 - keep)).detach()
        return net.fc(torch.flatten(net.pool(net.relu2(z)), 1))


@pytest.mark.parametrize("rule", ["epsilon", "epsilonplus", "epsilongammabox"])
def test_lrp_rule_equals_lrp_restricted_by_hand(rule):
    net = TinyNet().eval()
    x = tiny_input()
    e = camkit.ConceptRelevance(net, "conv2", rule).explain(x, 1, channels=[3, 5])
    for k, channel in enumerate((3, 5)):
        restricted = camkit.LRP(_Restricted(net, channel), rule).explain(x, 1)
        torch.testing.assert_close(e.raw[:, k], restricted.raw, atol=1e-5, rtol=1e-4)
    # every channel's conditional relevance adds up to the plain LRP relevance
    full = camkit.ConceptRelevance(net, "conv2", rule).explain(x, 1, channels=list(range(6)))
    torch.testing.assert_close(full.raw.sum(1), camkit.LRP(net, rule).explain(x, 1).raw, atol=1e-5, rtol=1e-4)


def test_batch_equals_one_by_one_and_relevance_alone():
    net = TinyNet().eval()
    x = tiny_input(3)
    explainer = camkit.ConceptRelevance(net, "conv2")
    batched = explainer.explain(x, channels=2)
    for i in range(3):
        single = explainer.explain(x[i : i + 1], channels=2)
        torch.testing.assert_close(batched.extras["relevance"][i : i + 1], single.extras["relevance"], atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(batched.raw[i : i + 1], single.raw, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(batched.maps[i : i + 1], single.maps, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(explainer.relevance(x), batched.extras["relevance"])
    assert explainer.explain(x, channels=0).raw.shape == (3, 0, 3, 8, 8)


def _hooks(model: nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks) for m in model.modules())


@pytest.mark.parametrize("rule", ["gradient", "epsilonplus"])
def test_hygiene(rule):
    net = TinyNet()
    net.train()
    net.bn1.eval()
    net.conv1.weight.requires_grad_(False)
    net.fc.weight.grad = torch.ones_like(net.fc.weight)
    flags = [m.training for m in net.modules()]
    state = {k: v.clone() for k, v in net.state_dict().items()}
    x = tiny_input()
    x0 = x.clone()
    camkit.ConceptRelevance(net, "conv2", rule).explain(x, channels=2)
    assert _hooks(net) == 0
    assert [m.training for m in net.modules()] == flags
    assert not net.conv1.weight.requires_grad and net.conv2.weight.requires_grad
    assert torch.equal(net.fc.weight.grad, torch.ones_like(net.fc.weight))
    assert all(p.grad is None for n, p in net.named_parameters() if n != "fc.weight")
    assert all(torch.equal(v, state[k]) for k, v in net.state_dict().items())
    assert torch.equal(x, x0)
    net.fail = True
    with pytest.raises(RuntimeError, match="boom"):
        camkit.ConceptRelevance(net, "conv2", rule).explain(x)
    assert _hooks(net) == 0 and [m.training for m in net.modules()] == flags


def test_refusals():
    net = TinyNet().eval()
    x = tiny_input()
    with pytest.raises(InvalidInputError, match="rule must be"):
        camkit.ConceptRelevance(net, "conv2", "nonsense")
    with pytest.raises(InvalidTargetError, match="one class per image"):
        camkit.ConceptRelevance(net, "conv2").explain(x, torch.tensor([[0, 1]] * 3))
    with pytest.raises(InvalidInputError, match=r"0\.\.5"):
        camkit.ConceptRelevance(net, "conv2").explain(x, channels=[6])
    with pytest.raises(InvalidInputError, match="more than the layer"):
        camkit.ConceptRelevance(net, "conv2").explain(x, channels=7)


def test_references_stream_equals_whole_set():
    net = TinyNet().eval()
    x = tiny_input(10, seed=3)
    explainer = camkit.ConceptRelevance(net, "conv2")
    refs = camkit.ConceptReferences(explainer, channels=[0, 4], k=3)
    for start in range(0, 10, 4):
        refs.update(x[start : start + 4], 2, torch.arange(start, min(start + 4, 10)) + 100)
    whole = explainer.explain(x, 2, channels=[0, 4])
    rel = whole.extras["relevance"][:, [0, 4]].t()
    values, order = rel.topk(3, dim=1)
    assert refs.indices.tolist() == (order + 100).tolist()
    torch.testing.assert_close(refs.values, values)
    boxes = relevance_boxes(whole.extras["layer_maps"].flatten(0, 1), (8, 8)).view(10, 2, 4)
    assert refs.boxes.tolist() == [[boxes[i, k].tolist() for i in order[k].tolist()] for k in range(2)]


def test_relevance_boxes_any_rank_and_merge_top():
    m = torch.zeros(2, 4)
    m[0, 1] = 1.0
    m[0, 2] = 0.6
    assert relevance_boxes(m, (4,)).tolist() == [[1, 3], [0, 4]]  # the zero map gives the whole input
    v = torch.zeros(1, 2, 2, 2)
    v[0, 1, 0, 1] = 2.0
    assert relevance_boxes(v, (4, 4, 4)).tolist() == [[2, 0, 2, 4, 2, 4]]
    vals, idx = merge_top(torch.tensor([[4.0, 1.0]]), torch.tensor([[7, 8]]), torch.tensor([[4.0, 2.0]]),
                          torch.tensor([[9, 10]]), 3)  # fmt: skip
    assert vals.tolist() == [[4.0, 4.0, 2.0]] and idx.tolist() == [[7, 9, 10]]
