"""LRP against zennit 0.5.1 with its canonizers on torchvision CNNs; batch norm merged or passed, by formula too."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import camkit

zennit = pytest.importorskip("zennit")
torchvision = pytest.importorskip("torchvision")

from zennit.attribution import Gradient  # noqa: E402
from zennit.canonizers import (  # noqa: E402
    AttributeCanonizer,
    CompositeCanonizer,
    NamedMergeBatchNorm,
    SequentialMergeBatchNorm,
)
from zennit.composites import (  # noqa: E402
    EpsilonAlpha2Beta1,
    EpsilonGammaBox,
    EpsilonPlus,
    LayerMapComposite,
    layer_map_base,
)
from zennit.rules import AlphaBeta, Epsilon, Gamma, ZPlus  # noqa: E402
from zennit.torchvision import ResNetBasicBlockCanonizer, ResNetBottleneckCanonizer  # noqa: E402
from zennit.types import Convolution  # noqa: E402

RULES = ["epsilon", "gamma", "zplus", "alphabeta", "epsilonplus", "epsilongammabox", "epsilonalpha2beta1"]
EPS = 1e-9  # epsilon and stabiliser on both sides; at zennit's default 1e-6 see test_default_stabilizers_...
CLASSES = 10


# ---------------------------------------------------------------------------------------------
# The anchor. zennit merges a batch norm into the layer before it by changing both modules'
# parameters, and leaves the batch norm computing x / sqrt(1 + eps), not x (its eps stays): its
# model then differs from the user's by that factor per batch norm (test_zennits_merge_...).
# The reference below is zennit with that one step corrected (the merged-away batch norm's eps
# set to 0 while merged), so that both explain the same function.
# ---------------------------------------------------------------------------------------------


class _ExactMerge:
    def register(self, linears, batch_norm):  # type: ignore[no-untyped-def]
        super().register(linears, batch_norm)  # type: ignore[misc]
        self.eps, batch_norm.eps = batch_norm.eps, 0.0

    def remove(self) -> None:
        super().remove()  # type: ignore[misc]
        self.batch_norm.eps = self.eps  # type: ignore[attr-defined]


class ExactSequentialMerge(_ExactMerge, SequentialMergeBatchNorm):
    pass


class ExactNamedMerge(_ExactMerge, NamedMergeBatchNorm):
    pass


def _densenet_forward(self: nn.Module, x: Tensor) -> Tensor:
    return self.classifier(torch.flatten(self.canonizer_pool(F.relu(self.features(x))), 1))


def _densenet_pool(name: str, module: nn.Module) -> dict | None:
    """DenseNet's final pooling as a module: zennit hooks modules only, and on the functional
    ``F.adaptive_avg_pool2d`` torchvision calls it would share relevance evenly (the gradient), where
    its rule for average pooling (and camkit's) shares it in proportion to the inputs."""
    if isinstance(module, torchvision.models.DenseNet):
        return {"forward": _densenet_forward.__get__(module), "canonizer_pool": nn.AdaptiveAvgPool2d(1)}
    return None


def _canonizers(name: str, model: nn.Module) -> list:
    if name.startswith("resnet"):  # zennit's ResNetCanonizer, with the exact merge
        return [CompositeCanonizer([ExactSequentialMerge(), ResNetBottleneckCanonizer(), ResNetBasicBlockCanonizer()])]
    if name.startswith("densenet"):
        # zennit has no DenseNet canonizer, and its SequentialMergeBatchNorm fails there (it pairs each
        # layer's norm1, which reads a concatenation, with the previous layer's conv2). The batch norms
        # that do follow a convolution: conv0 -> norm0 and, in every dense layer, conv1 -> norm2.
        pairs = [(("features.conv0",), "features.norm0")]
        pairs += [((f"{n}.conv1",), f"{n}.norm2") for n, m in model.named_modules() if hasattr(m, "norm2")]
        return [ExactNamedMerge(pairs), AttributeCanonizer(_densenet_pool)]
    return [ExactSequentialMerge()]  # zennit's VGGCanonizer


def _composite(rule: str, canonizers: list):
    kw = {"epsilon": EPS, "stabilizer": EPS, "canonizers": canonizers}
    if rule == "epsilongammabox":
        return EpsilonGammaBox(low=0.0, high=1.0, **kw)
    if rule == "epsilonplus":
        return EpsilonPlus(**kw)
    if rule == "epsilonalpha2beta1":
        return EpsilonAlpha2Beta1(**kw)
    one = {"epsilon": Epsilon(EPS), "gamma": Gamma(stabilizer=EPS), "zplus": ZPlus(EPS), "alphabeta": AlphaBeta(stabilizer=EPS)}
    return LayerMapComposite([*layer_map_base(EPS), (Convolution, one[rule]), (nn.Linear, one[rule])], canonizers=canonizers)


def zennit_lrp(name: str, model: nn.Module, rule: str, x: Tensor, target: Tensor) -> Tensor:
    """zennit's relevance, starting from the target score (camkit's convention)."""
    twin = copy.deepcopy(model)
    with Gradient(twin, _composite(rule, _canonizers(name, twin))) as attributor:
        _, relevance = attributor(x, lambda out: out * F.one_hot(target, out.shape[1]).to(out))
    return relevance


def camkit_lrp(model: nn.Module, rule: str, x: Tensor, target: Tensor) -> Tensor:
    bounds = {"low": 0.0, "high": 1.0} if rule == "epsilongammabox" else {}
    raw = camkit.LRP(model, rule, epsilon=EPS, stabilizer=EPS, **bounds).explain(x, target).raw
    assert isinstance(raw, Tensor)
    return raw


def trained_like(model: nn.Module, seed: int = 1) -> nn.Module:
    """Batch norm statistics and affine parameters as a trained network has them (seeded, far from the identity)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                c = module.num_features
                module.running_mean.copy_(torch.randn(c, generator=generator) * 0.5)
                module.running_var.copy_(torch.rand(c, generator=generator) * 1.5 + 0.25)
                module.weight.copy_(torch.rand(c, generator=generator) * 1.5 + 0.25)
                module.bias.copy_(torch.randn(c, generator=generator) * 0.5)
    return model


def build(name: str, trained: bool = True) -> nn.Module:
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(num_classes=CLASSES)
    if name.startswith("vgg"):  # torchvision's VGG with a narrower classifier (4096 -> 64 units), to stay small
        model.classifier = nn.Sequential(nn.Linear(512 * 7 * 7, 64), nn.ReLU(True), nn.Dropout(), nn.Linear(64, CLASSES))
    model = model.double().eval()
    return _live_stem(trained_like(model)) if trained else model


def _live_stem(model: nn.Module) -> nn.Module:
    """DenseNet with its stem's ReLU kept open, so that no exact zero reaches a passing batch norm.

    Where a passed batch norm reads an exact zero (a max-pooling window of dead ReLUs), zennit still
    hands it relevance (R_in = R_out) and routes it on; camkit holds relevance as value times
    modified gradient and drops it there, as a bias absorbs relevance
    (test_a_zero_before_a_passed_batch_norm_drops_its_relevance).
    """
    norm0 = getattr(getattr(model, "features", None), "norm0", None)
    if isinstance(norm0, nn.BatchNorm2d):
        with torch.no_grad():
            norm0.bias.add_(3.0)
    return model


def scaled_error(ours: Tensor, theirs: Tensor) -> float:
    """max |a - b| / max |b|: the distance in units of the map's scale."""
    return float((ours - theirs).abs().max() / theirs.abs().max())


def _input(size: int = 32, batch: int = 2, seed: int = 0) -> Tensor:
    return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


FAST = ["vgg11", "vgg11_bn", "resnet18"]
HEAVY = ["vgg16", "vgg16_bn", "resnet50", "densenet121"]


def _parity(name: str, rule: str) -> None:
    model, x, target = build(name), _input(), torch.tensor([1, 7])
    ours, theirs = camkit_lrp(model, rule, x, target), zennit_lrp(name, model, rule, x, target)
    assert theirs.abs().max() > 0
    assert scaled_error(ours, theirs) < 1e-5, (name, rule, scaled_error(ours, theirs))


@pytest.mark.heavy
@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("name", FAST)
def test_lrp_equals_zennit_with_trained_batch_norm(name, rule):
    _parity(name, rule)


# CI (heavy) runs each larger model with the composite that exercises the most rules (epsilon, gamma and
# z-box); the other six composites on them are slow (run by hand: about 20 s each on 2 cores)
LARGER = [
    pytest.param(name, rule, marks=pytest.mark.heavy if rule == "epsilongammabox" else pytest.mark.slow)
    for name in HEAVY
    for rule in RULES
]


@pytest.mark.parametrize(("name", "rule"), LARGER)
def test_lrp_equals_zennit_with_trained_batch_norm_on_larger_models(name, rule):
    _parity(name, rule)


def test_gamma_rule_on_a_negative_output_by_hand():
    """z = 1 * 1 + (-2) * 1 = -1 with gamma = 1: the rule scales the negative weights, w + w- = [1, -4].

    R_x = x_i (w_i + w-_i) / (1 - 4) * R_out with R_out = z = -1: [1/3, -4/3], summing to -1. The
    positive weights scaled instead ([2, -2]) sum to zero against this input: no ratio to share by.
    """
    net = nn.Sequential(nn.Flatten(), nn.Linear(2, 1, bias=False))
    with torch.no_grad():
        net[1].weight.copy_(torch.tensor([[1.0, -2.0]]))
    raw = camkit.LRP(net, "gamma", gamma=1.0, stabilizer=0.0).explain(torch.ones(1, 1, 1, 2), 0).raw
    torch.testing.assert_close(raw.flatten(), torch.tensor([1 / 3, -4 / 3]))


@pytest.mark.heavy
def test_epsilon_gamma_box_on_resnet18_keeps_negative_outputs_negative():
    """The gamma rule on outputs below zero (a residual addition gives them relevance) favours negative weights.

    The rule camkit had scaled positive weights for every output: where an output is negative its
    denominator could pass through zero, and input relevances reached thousands of times zennit's
    (up to 10.5 against 7.9e-4 on 64x64 inputs, same total).
    """
    model, x, target = build("resnet18", trained=False), _input(32, batch=1), torch.tensor([3])
    ours, theirs = camkit_lrp(model, "epsilongammabox", x, target), zennit_lrp("resnet18", model, "epsilongammabox", x, target)
    assert scaled_error(ours, theirs) < 1e-5
    assert ours.abs().max() < 2 * theirs.abs().max()
    torch.testing.assert_close(ours.sum(), theirs.sum(), rtol=1e-6, atol=0.0)


def test_zennits_merge_leaves_a_batch_norm_that_is_not_the_identity():
    """zennit's canonized model differs from the user's: its merged-away batch norm still divides by sqrt(1 + eps)."""
    model, x = _pair(conv=True)[0], _input(4)
    twin = copy.deepcopy(model)
    with torch.no_grad():
        expected = model[0](x)
        with Gradient(twin, LayerMapComposite(layer_map_base(), canonizers=[SequentialMergeBatchNorm()])):
            merged = twin[1](twin[0](x))  # the merged convolution, then the batch norm left behind
    torch.testing.assert_close(merged, model[1](expected) / (1 + model[1].eps) ** 0.5)


@pytest.mark.heavy
@pytest.mark.parametrize("name", ["vgg11_bn", "resnet18"])
def test_default_stabilizers_stay_near_zennit(name):
    """At zennit's defaults (1e-6): zennit also stabilises average pools and ResNet's sums, camkit shares them exactly."""
    model, x, target = build(name), _input(), torch.tensor([1, 7])
    ours = camkit.LRP(model, "epsilonplus").explain(x, target).raw
    twin = copy.deepcopy(model)
    with Gradient(twin, EpsilonPlus(canonizers=_canonizers(name, twin))) as attributor:
        _, theirs = attributor(x, lambda out: out * F.one_hot(target, CLASSES).to(out))
    assert scaled_error(ours, theirs) < 1e-3


# ---------------------------------------------------------------------------------------------
# The merge by formula, without zennit: a layer followed by a batch norm explains like the one
# layer with W' = s W, b' = s (b - mean) + beta, s = gamma / sqrt(var + eps).
# ---------------------------------------------------------------------------------------------


def _pair(conv: bool) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(3)
    layer = nn.Conv2d(3, 4, 3, padding=1) if conv else nn.Linear(48, 4)
    norm = nn.BatchNorm2d(4) if conv else nn.BatchNorm1d(4)
    trained_like(norm, seed=5)
    head = [nn.ReLU(), nn.Flatten(), nn.Linear(4 * 16 if conv else 4, 3)]
    split = nn.Sequential(*([] if conv else [nn.Flatten()]), layer, norm, *head).double().eval()
    merged_layer = copy.deepcopy(layer).double()
    with torch.no_grad():
        s = norm.weight / torch.sqrt(norm.running_var + norm.eps)
        merged_layer.weight.mul_(s.view(-1, *([1] * (layer.weight.dim() - 1))).double())
        merged_layer.bias.copy_(((layer.bias - norm.running_mean) * s + norm.bias).double())
    merged = nn.Sequential(*([] if conv else [nn.Flatten()]), merged_layer, *copy.deepcopy(head)).double().eval()
    return split, merged


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("conv", [True, False], ids=["conv", "linear"])
def test_batch_norm_after_a_layer_explains_as_the_merged_layer(rule, conv):
    split, merged = _pair(conv)
    x, target = _input(4, batch=3), torch.tensor([0, 2, 1])
    torch.testing.assert_close(split(x), merged(x))
    torch.testing.assert_close(camkit_lrp(split, rule, x, target), camkit_lrp(merged, rule, x, target))


def test_batch_norm_without_a_layer_before_it_passes_relevance_unchanged():
    torch.manual_seed(4)
    norm = trained_like(nn.BatchNorm2d(3), seed=6)
    fc = nn.Linear(3 * 16, 2, bias=False)
    model = nn.Sequential(norm, nn.Flatten(), fc).double().eval()
    x = _input(4, batch=2)
    raw = camkit.LRP(model, "epsilon", epsilon=0.0).explain(x, torch.tensor([1, 1])).raw
    y = norm(x).flatten(1)
    torch.testing.assert_close(raw.flatten(1), y * fc.weight[1].double())  # R_x = R_y = y_i w_i


class TwiceRead(nn.Module):
    """A convolution's output read by its batch norm and again by the sum (or computed twice)."""

    def __init__(self, twice: bool) -> None:
        super().__init__()
        torch.manual_seed(8)
        self.twice = twice
        self.conv, self.norm = nn.Conv2d(3, 4, 3, padding=1), trained_like(nn.BatchNorm2d(4), seed=9)
        self.fc = nn.Linear(4 * 16, 2)

    def forward(self, x: Tensor) -> Tensor:
        y = self.conv(x)
        normed = self.norm(y)
        other = self.conv(x) if self.twice else y
        return self.fc(F.relu(normed + other).flatten(1))


@pytest.mark.parametrize("rule", ["epsilon", "gamma", "epsilonplus"])
def test_a_layer_output_read_again_after_its_batch_norm_keeps_its_own_rule(rule):
    x, target = _input(4, batch=2), torch.tensor([0, 1])
    once, twice = TwiceRead(False).double().eval(), TwiceRead(True).double().eval()
    torch.testing.assert_close(camkit_lrp(once, rule, x, target), camkit_lrp(twice, rule, x, target))


# ---------------------------------------------------------------------------------------------
# Batch against one by one, and hygiene on a network whose batch norms are merged and passed.
# ---------------------------------------------------------------------------------------------


def _small_densenet() -> nn.Module:
    """torchvision's DenseNet, small: batch norms after convolutions (merged) and after concatenations (passed)."""
    torch.manual_seed(2)
    model = torchvision.models.DenseNet(growth_rate=4, block_config=(2, 2), num_init_features=8, bn_size=2, num_classes=5)
    return _live_stem(trained_like(model, seed=3))


@pytest.mark.parametrize("rule", ["epsilon", "epsilongammabox", "epsilonalpha2beta1"])
def test_merged_lrp_batch_equals_one_by_one(rule):
    model, x, target = _small_densenet().double().eval(), _input(16, batch=3), torch.tensor([4, 0, 2])
    batch = camkit_lrp(model, rule, x, target)
    alone = torch.cat([camkit_lrp(model, rule, x[i : i + 1], target[i : i + 1]) for i in range(3)])
    torch.testing.assert_close(batch, alone)


def test_small_densenet_equals_zennit():
    model, x, target = _small_densenet().double().eval(), _input(16), torch.tensor([1, 3])
    for rule in ("epsilon", "epsilongammabox"):
        ours, theirs = camkit_lrp(model, rule, x, target), zennit_lrp("densenet", model, rule, x, target)
        assert scaled_error(ours, theirs) < 1e-5


def test_a_zero_before_a_passed_batch_norm_drops_its_relevance():
    """R_in = R_out through a batch norm no layer precedes, except where its input is exactly zero."""
    norm = trained_like(nn.BatchNorm2d(3), seed=6)
    model = nn.Sequential(nn.ReLU(), norm, nn.Flatten(), nn.Linear(3 * 16, 2, bias=False)).double().eval()
    x = _input(4, batch=1)
    raw = camkit.LRP(model, "epsilon", epsilon=0.0).explain(x, 0).raw
    y = norm(x.relu()).flatten(1) * model[3].weight[0].double()  # relevance at the batch norm's output
    torch.testing.assert_close(raw.flatten(1), torch.where(x.flatten(1) > 0, y, 0.0))
    assert (x <= 0).any() and (y[x.flatten(1) <= 0] != 0).any()  # relevance zennit would keep


def test_merged_lrp_leaves_the_model_as_it_was():
    model = _small_densenet()
    model.train()
    model.features.denseblock1.eval()  # a mix of modes, restored as it was
    modes = {name: m.training for name, m in model.named_modules()}
    state = {k: v.clone() for k, v in model.state_dict().items()}
    flags = {name: p.requires_grad for name, p in model.named_parameters()}
    x = torch.rand(1, 3, 32, 32)
    before = x.clone()
    camkit.LRP(model, "epsilonplus").explain(x, 2)
    assert {name: m.training for name, m in model.named_modules()} == modes
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())  # running stats untouched
    assert {name: p.requires_grad for name, p in model.named_parameters()} == flags
    assert all(p.grad is None for p in model.parameters())
    for m in model.modules():
        assert not (m._forward_hooks or m._forward_pre_hooks or m._backward_hooks)
    torch.testing.assert_close(x, before, rtol=0, atol=0)
