"""The hook layer and Grad-CAM on real architectures: in-place ops, reused modules, cost, dtypes."""

from __future__ import annotations

import gc

import pytest
import torch
import torchvision
from models import ResBlockNet, TinyNet, tiny_input
from torch import nn

import camkit
from camkit.hooks import HookScope, LayerCapture


def _hooks(model: nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks) for m in model.modules())


def test_hook_scope_removes_everything_also_on_error():
    model = TinyNet()
    x = tiny_input().requires_grad_(True)
    with pytest.raises(ZeroDivisionError), HookScope() as hooks:
        hooks.forward(model.conv1, lambda m, i, o: None)
        hooks.forward_pre(model.conv2, lambda m, i: None)
        hooks.full_backward(model.fc, lambda m, gi, go: None)
        hooks.tensor(x, lambda g: None)
        assert len(hooks) == 4 and _hooks(model) == 3
        raise ZeroDivisionError
    assert _hooks(model) == 0
    assert not x._backward_hooks


def test_capture_records_output_before_later_inplace_ops():
    model = ResBlockNet(inplace=True).eval()
    x = tiny_input(batch=2)
    reference = {}

    def keep(module, args, output):  # returns None: the output is left as it is
        reference["bn2"] = output.clone()

    with HookScope() as hooks, torch.no_grad():
        hooks.forward(model.bn2, keep)
        model(x)
    assert (reference["bn2"] < 0).any()  # the later `out += x; relu_` would change these
    with LayerCapture([("bn2", model.bn2)]) as capture:
        model(x)
        (recorded,) = capture.activations()
    torch.testing.assert_close(recorded.detach(), reference["bn2"])


def test_gradients_equal_plain_autograd_on_out_of_place_model():
    model = ResBlockNet(inplace=False).eval()
    x = tiny_input(batch=2)
    with LayerCapture([("bn2", model.bn2)]) as capture:
        score = model(x)[:, 1]
        (grad,) = capture.gradients(score)
    # reference: the whole graph, written out by hand
    out = torch.relu(model.conv0(x))
    mid = torch.relu(model.bn1(model.conv1(out)))
    bn2 = model.bn2(model.conv2(mid)).detach().requires_grad_(True)
    logits = model.fc(torch.relu(bn2 + out).mean(dim=(2, 3)))
    (expected,) = torch.autograd.grad(logits[:, 1].sum(), bn2)
    torch.testing.assert_close(grad, expected)


@pytest.mark.parametrize("key", ["gradcam", "gradcam++", "xgradcam", "hirescam", "layercam"])
def test_inplace_add_and_functional_relu_equal_out_of_place(key):
    x = tiny_input(batch=3)
    inplace = camkit.get_method(key)(ResBlockNet(inplace=True).eval(), "bn2").explain(x)
    plain = camkit.get_method(key)(ResBlockNet(inplace=False).eval(), "bn2").explain(x)
    torch.testing.assert_close(inplace.maps, plain.maps, atol=1e-6, rtol=0)
    torch.testing.assert_close(inplace.raw, plain.raw, atol=1e-6, rtol=1e-5)
    assert not inplace.flat.any()


def test_autograd_runs_only_after_the_target_layer():
    seen = []

    class Probe(nn.Module):
        def forward(self, x):
            seen.append((torch.is_grad_enabled(), x.requires_grad))
            return x

    model = nn.Sequential(nn.Conv2d(3, 4, 3), Probe(), nn.Conv2d(4, 4, 3), Probe(), nn.Flatten(), nn.LazyLinear(2))
    model(torch.zeros(1, 3, 8, 8))  # materialise the lazy layer
    seen.clear()
    camkit.GradCAM(model, "2").explain(torch.rand(2, 3, 8, 8))
    assert seen == [(False, False), (True, True)]


def test_parameter_gradients_are_never_computed():
    model = TinyNet().eval()
    for p in model.parameters():
        p.register_hook(lambda g: pytest.fail("a parameter gradient was computed"))
    camkit.GradCAM(model, "conv2").explain(tiny_input())
    assert all(p.grad is None for p in model.parameters())


def test_reused_module_call_choice():
    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.conv = nn.Conv2d(3, 3, 3, padding=1)
            self.act = nn.Tanh()
            self.fc = nn.Linear(3, 2)

        def forward(self, x):
            x = self.act(self.conv(x))
            x = self.act(self.conv(x))
            return self.fc(x.mean(dim=(2, 3)))

    model = Twice().eval()
    x = tiny_input(batch=2)
    with LayerCapture([("act", model.act)], call=0) as capture:
        model(x)
        first = capture.activations()[0]
        assert capture.calls(0) == 2
    with torch.no_grad():
        expected_first = torch.tanh(model.conv(x))
        expected_last = torch.tanh(model.conv(expected_first))
    torch.testing.assert_close(first.detach(), expected_first)
    with LayerCapture([("act", model.act)]) as capture:
        model(x)
        torch.testing.assert_close(capture.activations()[0].detach(), expected_last)
    first_map = camkit.GradCAM(model, "act", call=0)(x)
    last_map = camkit.GradCAM(model, "act")(x)
    assert not torch.allclose(first_map, last_map)
    with pytest.raises(camkit.LayerNotReachedError, match="ran 2 time"):
        camkit.GradCAM(model, "act", call=2)(x)


@pytest.fixture(scope="module")
def resnet18():
    torch.manual_seed(0)
    return torchvision.models.resnet18(weights=None).eval()


@pytest.mark.parametrize("layer", ["layer4", "layer3.1.bn2", "layer4.0.relu"])
def test_resnet18_layers(resnet18, layer):
    x = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    explanation = camkit.GradCAM(resnet18, layer).explain(x, target=[3, 7])
    assert explanation.maps.shape == (2, 64, 64)
    assert torch.isfinite(explanation.maps).all()
    assert explanation.layers == (layer,)
    assert _hooks(resnet18) == 0


def test_resnet18_reused_relu_last_call_is_the_block_output(resnet18):
    # In a BasicBlock the relu runs twice; its last call returns the block's output.
    x = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    via_relu = camkit.GradCAM(resnet18, "layer4.0.relu").explain(x, target=5)
    via_block = camkit.GradCAM(resnet18, "layer4.0").explain(x, target=5)
    torch.testing.assert_close(via_relu.raw, via_block.raw, atol=1e-6, rtol=1e-5)
    first_call = camkit.GradCAM(resnet18, "layer4.0.relu", call=0).explain(x, target=5)
    assert not torch.allclose(first_call.raw, via_block.raw)


def test_auto_layer_and_multi_layer_fusion(resnet18):
    x = torch.rand(1, 3, 64, 64, generator=torch.Generator().manual_seed(2))
    auto = camkit.GradCAM(resnet18)
    torch.testing.assert_close(auto(x), camkit.GradCAM(resnet18, "layer4")(x))
    assert auto.layers()[0][0] == "layer4"
    fused = camkit.GradCAM(resnet18, ["layer3", "layer4"]).explain(x)
    assert isinstance(fused.raw, tuple) and [r.shape[-1] for r in fused.raw] == [4, 2]
    per = [camkit.GradCAM(resnet18, name)(x) for name in ("layer3", "layer4")]
    expected, _ = camkit.functional.normalize_maps((per[0] + per[1]) / 2)
    torch.testing.assert_close(fused.maps, expected, atol=1e-5, rtol=0)


def test_low_precision_and_channels_last_models():
    x = tiny_input(batch=2, size=16)
    reference = camkit.GradCAM(TinyNet().eval(), "conv2")(x)
    cl = TinyNet().eval().to(memory_format=torch.channels_last)
    got = camkit.GradCAM(cl, "conv2")(x.to(memory_format=torch.channels_last))
    torch.testing.assert_close(got, reference, atol=1e-5, rtol=0)
    bf16 = TinyNet().eval().to(torch.bfloat16)
    explanation = camkit.GradCAM(bf16, "conv2").explain(x.to(torch.bfloat16))
    assert explanation.maps.dtype == torch.float32
    assert (explanation.maps - reference).abs().max() < 0.1


@pytest.mark.heavy
def test_no_memory_growth_over_repeated_calls():
    model = TinyNet().eval()
    explainer = camkit.GradCAMPlusPlus(model, "conv2")
    x = tiny_input()

    def live_tensors() -> int:
        gc.collect()
        return sum(1 for o in gc.get_objects() if type(o) in (torch.Tensor, nn.Parameter))

    for _ in range(5):
        explainer(x)
    before = live_tensors()
    for _ in range(300):
        explainer(x)
    assert live_tensors() <= before


def test_layer_not_feeding_the_score():
    class SideBranch(nn.Module):
        def __init__(self):
            super().__init__()
            self.used = nn.Conv2d(3, 2, 1)
            self.unused = nn.Conv2d(3, 2, 1)

        def forward(self, x):
            self.unused(x)
            return self.used(x).mean(dim=(2, 3))

    with pytest.raises(camkit.LayerNotReachedError, match="does not depend"):
        camkit.GradCAM(SideBranch(), "unused")(tiny_input())


def test_unreached_layer_gets_zeros_only_when_asked() -> None:
    net = nn.ModuleDict({"a": nn.Conv2d(3, 2, 1), "b": nn.Conv2d(3, 2, 1)})
    x = tiny_input()
    for unreached_zero in (False, True):
        with LayerCapture([("a", net["a"]), ("b", net["b"])]) as cap:
            a, _ = net["a"](x), net["b"](x)
            score = a.sum(dim=(1, 2, 3))
            if not unreached_zero:
                with pytest.raises(camkit.LayerNotReachedError, match="layer 'b'"):
                    cap.gradients(score, retain_graph=True)
                continue
            grad_a, grad_b = cap.gradients(score, unreached_zero=True)
        assert torch.equal(grad_a, torch.ones_like(grad_a)) and torch.equal(grad_b, torch.zeros(x.shape[0], 2, *x.shape[2:]))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_call_makes_no_host_sync():
    model = TinyNet().cuda().eval()
    x = tiny_input().cuda()
    explainer = camkit.GradCAM(model, "conv2")
    explainer(x)  # warm-up (allocator, kernels)
    target = torch.tensor([0, 1, 2], device="cuda")  # the copy to the device is the test's, not camkit's
    torch.cuda.set_sync_debug_mode("error")
    try:
        explanation = explainer.explain(x, target=target)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert explanation.maps.device.type == "cuda"


def test_maps_follow_the_input_device(device):
    model = TinyNet().to(device).eval()
    maps = camkit.GradCAM(model, "conv2")(tiny_input().to(device))
    assert maps.device.type == device.type
