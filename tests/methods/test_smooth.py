"""SmoothGrad and AugSmooth around any explainer: formulas, determinism, symmetry, hygiene."""

from __future__ import annotations

import pytest
import torch
from models import TinyNet, tiny_input
from torch import Tensor, nn

import camkit
from camkit import functional as CF
from camkit.methods._core.output import finish_maps


def _manual_noisy_raws(explainer: camkit.Explainer, x: Tensor, classes: Tensor, samples: int, sigma: float, seed: int):
    """The documented noise recipe, written out: one N(0, 1) draw of the whole batch per sample."""
    generator = torch.Generator().manual_seed(seed)
    spread = sigma * (x.amax(dim=(1, 2, 3), keepdim=True) - x.amin(dim=(1, 2, 3), keepdim=True))
    raws = []
    for _ in range(samples):
        noisy = x + spread * torch.randn(x.shape, generator=generator)
        raws.append(explainer.explain(noisy, classes).raw.double())
    return torch.stack(raws)


def test_smoothgrad_around_gradcam_matches_the_formula():
    model, x = TinyNet().eval(), tiny_input()
    classes = model(x).argmax(dim=1)
    raws = _manual_noisy_raws(camkit.GradCAM(model, "conv2"), x, classes, samples=5, sigma=0.2, seed=11)
    expected = {"smoothgrad": raws.mean(0), "smoothgrad_sq": (raws**2).mean(0), "vargrad": raws.var(0, unbiased=False)}
    for kind, value in expected.items():
        smooth = camkit.SmoothGrad(camkit.GradCAM(model, "conv2"), samples=5, sigma=0.2, kind=kind, seed=11, max_batch=4)
        explanation = smooth.explain(x)
        scale = value.abs().max().float()  # the values are small (vargrad ~1e-6): compare relatively
        torch.testing.assert_close(explanation.raw / scale, value.float() / scale, atol=1e-5, rtol=0)
        assert explanation.maps.shape == (3, 8, 8) and explanation.raw.shape == (3, 8, 8)
        torch.testing.assert_close(explanation.maps, finish_maps([explanation.raw], (8, 8))[0])
        assert explanation.target.tolist() == classes.tolist()
        assert explanation.method == f"{kind}(gradcam)" and explanation.layers == ("conv2",)
    assert expected["vargrad"].max() > 1e-3 * expected["smoothgrad_sq"].max(), "the noise changed nothing"


@pytest.mark.parametrize("kind", ["smoothgrad", "vargrad"])
def test_smoothgrad_with_seed_is_independent_of_internal_batch_size(kind):
    model, x = TinyNet().eval(), tiny_input()
    results = [
        camkit.SmoothGrad(camkit.Saliency(model), samples=6, kind=kind, seed=3, max_batch=size).explain(x, 1).raw
        for size in (1, 4, 7, 100)
    ]
    scale = results[0].abs().max()  # compare relative to the result's own size (vargrad is ~1e-7 here)
    assert scale > 0
    for other in results[1:]:
        torch.testing.assert_close(other / scale, results[0] / scale, atol=1e-5, rtol=0)
    again = camkit.SmoothGrad(camkit.Saliency(model), samples=6, kind=kind, seed=3).explain(x, 1).raw
    torch.testing.assert_close(again / scale, results[0] / scale, atol=1e-5, rtol=0)
    other_seed = camkit.SmoothGrad(camkit.Saliency(model), samples=6, kind=kind, seed=4).explain(x, 1).raw
    assert (other_seed - results[0]).abs().max() > 0.05 * scale


def test_smoothgrad_without_seed_follows_torch_manual_seed():
    model, x = TinyNet().eval(), tiny_input()
    torch.manual_seed(5)
    first = camkit.SmoothGrad(camkit.Saliency(model), samples=3).explain(x, 0)
    torch.manual_seed(5)
    second = camkit.SmoothGrad(camkit.Saliency(model), samples=3).explain(x, 0)
    assert torch.equal(first.raw, second.raw) and first.extras["seed"] == second.extras["seed"]


def test_zero_noise_gives_the_wrapped_explainer_back():
    model, x = TinyNet().eval(), tiny_input()
    plain = camkit.GuidedBackprop(model).explain(x, 2)
    mean = camkit.SmoothGrad(camkit.GuidedBackprop(model), samples=3, sigma=0.0, seed=0).explain(x, 2)
    torch.testing.assert_close(mean.raw, plain.raw)
    torch.testing.assert_close(mean.maps, plain.maps)
    square = camkit.SmoothGrad(camkit.GuidedBackprop(model), samples=3, sigma=0.0, kind="smoothgrad_sq", seed=0)
    torch.testing.assert_close(square.explain(x, 2).raw, plain.raw**2)
    variance = camkit.SmoothGrad(camkit.GuidedBackprop(model), samples=3, sigma=0.0, kind="vargrad", seed=0).explain(x, 2)
    assert torch.equal(variance.raw, torch.zeros_like(plain.raw)) and variance.flat.all()


def test_smoothgrad_k_targets_and_callable_targets():
    model, x = TinyNet().eval(), tiny_input(batch=2)
    targets = torch.tensor([[0, 2], [4, 1]])
    multi = camkit.SmoothGrad(camkit.GradCAM(model, "conv2"), samples=3, seed=1).explain(x, targets)
    assert multi.maps.shape == (2, 2, 8, 8) and multi.target.tolist() == targets.tolist()
    for k in range(2):
        single = camkit.SmoothGrad(camkit.GradCAM(model, "conv2"), samples=3, seed=1).explain(x, targets[:, k])
        torch.testing.assert_close(multi.raw[:, k], single.raw, atol=1e-5, rtol=0)
    by_callable = camkit.SmoothGrad(camkit.Saliency(model), samples=2, seed=1).explain(x, lambda out: out[:, 3])
    by_class = camkit.SmoothGrad(camkit.Saliency(model), samples=2, seed=1).explain(x, 3)
    torch.testing.assert_close(by_callable.raw, by_class.raw)


def test_smoothgrad_argument_errors():
    explainer = camkit.Saliency(TinyNet())
    with pytest.raises(camkit.InvalidInputError, match="kind must be one of"):
        camkit.SmoothGrad(explainer, kind="smooth")  # type: ignore[arg-type]
    with pytest.raises(camkit.InvalidInputError, match="samples must be a positive int"):
        camkit.SmoothGrad(explainer, samples=0)
    with pytest.raises(camkit.InvalidInputError, match="sigma"):
        camkit.SmoothGrad(explainer, sigma=-1.0)
    with pytest.raises(TypeError, match="camkit explainer"):
        camkit.SmoothGrad(TinyNet())  # type: ignore[arg-type]
    assert "smoothgrad" not in camkit.list_methods() and "augsmooth" not in camkit.list_methods()


def _hook_count(model: nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._backward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


@pytest.mark.parametrize(
    "wrap",
    [
        lambda m: camkit.SmoothGrad(camkit.GuidedBackprop(m), samples=3, seed=0, max_batch=4),
        lambda m: camkit.SmoothGrad(camkit.GradCAM(m, "conv2"), samples=3, seed=0),
        lambda m: camkit.AugSmooth(camkit.GuidedGradCAM(m, "conv2")),
    ],
)
def test_wrappers_keep_the_hygiene_invariants(wrap):
    model = TinyNet()
    model.train()
    model.bn1.eval()
    model.conv1.weight.requires_grad_(False)
    model.fc.weight.grad = torch.randn_like(model.fc.weight)
    grad_before = model.fc.weight.grad.clone()
    state_before = {k: v.clone() for k, v in model.state_dict().items()}
    flags = [m.training for m in model.modules()]
    x = tiny_input()
    x_before = x.clone()
    with torch.no_grad():
        maps = wrap(model)(x)
        assert not torch.is_grad_enabled()
    assert maps.shape == (3, 8, 8) and 0 <= maps.min() and maps.max() <= 1
    assert torch.equal(x, x_before) and not x.requires_grad
    assert [m.training for m in model.modules()] == flags
    assert not model.conv1.weight.requires_grad and model.conv1.bias.grad is None
    assert torch.equal(model.fc.weight.grad, grad_before)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state_before.items())
    assert _hook_count(model) == 0 and torch._C._len_torch_function_stack() == 0
    with torch.inference_mode(), pytest.raises(camkit.InferenceModeError):
        wrap(model)(x)


# ---------------------------------------------------------------------------------------------
# AugSmooth
# ---------------------------------------------------------------------------------------------


def _symmetric_input() -> Tensor:
    x = tiny_input(batch=2)
    return (x + x.flip(-1)) / 2


@pytest.mark.parametrize("make", [lambda m: camkit.GradCAM(m, "conv2"), lambda m: camkit.Saliency(m)])
def test_augsmooth_on_a_flip_symmetric_input_gives_a_symmetric_map(make):
    model, x = TinyNet().eval(), _symmetric_input()
    plain = make(model)(x)
    assert (plain - plain.flip(-1)).abs().max() > 1e-2, "the model alone is already symmetric: a test that cannot fail"
    smoothed = camkit.AugSmooth(make(model)).explain(x)
    torch.testing.assert_close(smoothed.maps, smoothed.maps.flip(-1), atol=1e-6, rtol=0)
    assert smoothed.maps.shape == (2, 8, 8) and smoothed.method == f"augsmooth({make(model).key})"


def test_augsmooth_flip_only_matches_the_formula():
    model, x = TinyNet().eval(), tiny_input()
    inner = camkit.GradCAM(model, "conv2")
    classes = model(x).argmax(dim=1)
    expected = CF.normalize_maps((inner(x, classes) + inner(x.flip(-1), classes).flip(-1)) / 2)[0]
    smoothed = camkit.AugSmooth(camkit.GradCAM(model, "conv2"), scales=(1.0,)).explain(x)
    torch.testing.assert_close(smoothed.maps, expected, atol=1e-6, rtol=0)
    raw_expected = (inner.explain(x, classes).raw + inner.explain(x.flip(-1), classes).raw.flip(-1)) / 2
    torch.testing.assert_close(smoothed.raw, raw_expected)


def test_augsmooth_identity_is_the_wrapped_explainer():
    model, x = TinyNet().eval(), tiny_input()
    plain = camkit.Saliency(model).explain(x, 1)
    same = camkit.AugSmooth(camkit.Saliency(model), flip=False, scales=(1.0,)).explain(x, 1)
    torch.testing.assert_close(same.maps, plain.maps, atol=1e-6, rtol=0)
    torch.testing.assert_close(same.raw, plain.raw)


def test_augsmooth_scales_map_back_to_the_input_size():
    model, x = TinyNet().eval(), tiny_input(batch=2, size=12)
    explanation = camkit.AugSmooth(camkit.GradCAM(model, "conv2"), scales=(0.5, 1.5)).explain(x, torch.tensor([[1, 2], [0, 4]]))
    assert explanation.maps.shape == (2, 2, 12, 12) and explanation.raw.shape == (2, 2, 12, 12)
    assert explanation.extras["scales"] == (0.5, 1.5)
    with pytest.raises(camkit.InvalidInputError, match="positive"):
        camkit.AugSmooth(camkit.GradCAM(model, "conv2"), scales=(0.0,))


def test_wrappers_on_device(device):
    model, x = TinyNet().eval().to(device), tiny_input().to(device)
    explanation = camkit.SmoothGrad(camkit.Saliency(model), samples=2, seed=0).explain(x)
    assert explanation.maps.device.type == device.type
    assert camkit.AugSmooth(camkit.GradCAM(model, "conv2"))(x).device.type == device.type


class _Scaled(nn.Module):
    """TinyNet whose logits are multiplied by a keyword input."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = TinyNet()

    def forward(self, x: Tensor, *, scale: float = 1.0) -> Tensor:
        return self.inner(x) * scale


def test_keyword_inputs_reach_every_forward_and_positional_inputs_are_refused():
    model, x = _Scaled().eval(), tiny_input()
    for make in (
        lambda m: camkit.SmoothGrad(camkit.Saliency(m), samples=2, seed=0),
        lambda m: camkit.IntegratedGradients(m, steps=4, max_batch=5),
    ):
        tripled = make(model).explain(x, 1, kwargs={"scale": 3.0})
        plain = make(model).explain(x, 1)
        torch.testing.assert_close(tripled.raw, 3 * plain.raw, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(tripled.scores, 3 * plain.scores)
        with pytest.raises(camkit.InvalidInputError, match="kwargs="):
            make(model).explain(x, 1, inputs=(x,))
