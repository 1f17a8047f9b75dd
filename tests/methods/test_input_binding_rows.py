"""Methods that rerun the model on changed copies of x give each copy its own sample's other inputs.

The reference for every method is the same model closing over sample b's second input,
explained on the same batch: the bound batch's row b must equal its row b.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import camkit


def active_hooks(model: nn.Module) -> int:
    return sum(
        len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks) + len(m._backward_pre_hooks)
        for m in model.modules()
    )


class Gated(nn.Module):
    """A score that depends on a per-sample channel gate [B, 4] (any spatial size)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4, 2)

    def forward(self, image, gate):
        return self.fc((torch.relu(self.conv(image)) * gate[:, :, None, None]).mean(dim=(2, 3)))


class Closed(nn.Module):
    """``Gated`` with one sample's gate bound in: the model takes only the image."""

    def __init__(self, net: Gated, gate: torch.Tensor) -> None:
        super().__init__()
        self.net = net
        self.register_buffer("gate", gate)  # [1, 4]

    def forward(self, image):
        return self.net(image, self.gate.expand(len(image), -1))


def _layer(prefix: str) -> str:
    return f"{prefix}conv"


# each: (name, factory(model, prefix of the conv layer's name) -> explainer)
MAKERS = {
    "occlusion": lambda m, p: camkit.Occlusion(m, window=4, stride=2, batch_size=5),
    "rise": lambda m, p: camkit.RISE(m, masks=12, seed=0, grid=4, batch_size=5),
    "featureablation": lambda m, p: camkit.FeatureAblation(m, cells=(2, 2), batch_size=3),
    "shapleyvaluesampling": lambda m, p: camkit.ShapleyValueSampling(m, samples=2, cells=(2, 2), batch_size=3),
    "kernelshap": lambda m, p: camkit.KernelShap(m, samples=6, cells=(2, 2), batch_size=3),
    "lime": lambda m, p: camkit.Lime(m, samples=6, cells=(2, 2), batch_size=3),
    "scorecam": lambda m, p: camkit.ScoreCAM(m, _layer(p), batch_size=3),
    "ablationcam": lambda m, p: camkit.AblationCAM(m, _layer(p), batch_size=3),
    "sscam": lambda m, p: camkit.SSCAM(m, _layer(p), samples=2, seed=0, batch_size=3),
    "iscam": lambda m, p: camkit.ISCAM(m, _layer(p), samples=2, batch_size=3),
    "layerconductance": lambda m, p: camkit.LayerConductance(m, _layer(p), steps=3, max_batch=4),
    "layerintegratedgradients": lambda m, p: camkit.LayerIntegratedGradients(m, _layer(p), steps=3, max_batch=4),
    "integratedgradients": lambda m, p: camkit.IntegratedGradients(m, steps=4, max_batch=5),
    "gradientshap": lambda m, p: camkit.GradientShap(m, samples=3, stdev=0.1, seed=0, max_batch=4),
    "smoothgrad": lambda m, p: camkit.SmoothGrad(camkit.Saliency(m), samples=3, seed=0, max_batch=4),
    "augsmooth": lambda m, p: camkit.AugSmooth(camkit.GradCAM(m, _layer(p)), scales=(1.0, 0.75)),
    "sess": lambda m, p: camkit.SESS(camkit.GradCAM(m, _layer(p)), num_scales=2, window=6, stride=2, max_batch=4),
}


def _data():
    g = torch.Generator().manual_seed(3)
    x = torch.rand(3, 3, 8, 8, generator=g)
    gate = torch.rand(3, 4, generator=g) * 2 - 0.5  # every sample weighs the channels differently
    return x, gate


@pytest.mark.parametrize("key", sorted(MAKERS))
def test_rows_get_their_own_samples_inputs(key):
    net = Gated().eval()
    x, gate = _data()
    x0, gate0 = x.clone(), gate.clone()
    bound = MAKERS[key](net, "").explain(x, 1, kwargs={"gate": gate})
    assert active_hooks(net) == 0
    torch.testing.assert_close(x, x0)
    torch.testing.assert_close(gate, gate0)
    for b in range(len(x)):
        # the whole batch under sample b's gate (so noise drawn per batch is the same), row b kept
        closed = MAKERS[key](Closed(net, gate[b : b + 1]).eval(), "net.").explain(x, 1)
        torch.testing.assert_close(bound.raw[b], closed.raw[b], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(bound.maps[b], closed.maps[b], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(bound.scores[b], closed.scores[b])
    # the gates matter: with every sample given sample 0's gate, some map differs
    same = MAKERS[key](net, "").explain(x, 1, kwargs={"gate": gate[:1].expand(3, -1).clone()})
    assert not torch.allclose(same.raw[1:], bound.raw[1:], atol=1e-4)


@pytest.mark.parametrize("key", ["occlusion", "rise", "scorecam", "lime"])
def test_positional_and_keyword_slots_agree(key):
    net = Gated().eval()
    x, gate = _data()
    by_kwargs = MAKERS[key](net, "").explain(x, 1, kwargs={"gate": gate})
    positional = MAKERS[key](net, "").explain(x, 1, inputs=(x, gate))
    torch.testing.assert_close(positional.raw, by_kwargs.raw)

    class GateFirst(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = net

        def forward(self, gate, image):
            return self.inner(image, gate)

    swapped = MAKERS[key](GateFirst().eval(), "inner.")
    swapped.input_index = 1
    torch.testing.assert_close(swapped.explain(x, 1, inputs=(gate, x)).raw, by_kwargs.raw)
    named = MAKERS[key](GateFirst().eval(), "inner.")
    named.input_index = "image"
    torch.testing.assert_close(named.explain(x, 1, kwargs={"gate": gate}).raw, by_kwargs.raw)


def test_input_index_is_a_constructor_argument_of_the_perturbation_methods():
    net = Gated().eval()
    x, gate = _data()
    occ = camkit.Occlusion(net, window=4, stride=2, input_index="image")
    assert occ.input_index == "image"
    ref = camkit.Occlusion(net, window=4, stride=2).explain(x, 1, kwargs={"gate": gate})
    torch.testing.assert_close(occ.explain(x, 1, kwargs={"gate": gate}).raw, ref.raw)


def test_shared_inputs_go_in_as_they_are():
    """A gate of first dimension 1 is broadcast by the model: every row shares it, as the closed model."""
    net = Gated().eval()
    x, gate = _data()
    shared = camkit.Occlusion(net, window=4, stride=2, batch_size=5).explain(x, 1, kwargs={"gate": gate[:1]})
    closed = camkit.Occlusion(Closed(net, gate[:1]).eval(), window=4, stride=2).explain(x, 1)
    torch.testing.assert_close(shared.raw, closed.raw, atol=1e-5, rtol=1e-4)


def test_occlusion_equals_the_hand_computation_with_a_bound_input():
    net = Gated().eval()
    x, gate = _data()
    raw = camkit.Occlusion(net, window=4, stride=4).explain(x, 1, kwargs={"gate": gate}).raw
    with torch.no_grad():
        for b in range(3):
            base = net(x[b : b + 1], gate[b : b + 1])[0, 1]
            for i in range(2):
                for j in range(2):
                    covered = x[b : b + 1].clone()
                    covered[..., 4 * i : 4 * i + 4, 4 * j : 4 * j + 4] = 0
                    drop = base - net(covered, gate[b : b + 1])[0, 1]
                    block = raw[b, 4 * i : 4 * i + 4, 4 * j : 4 * j + 4]
                    torch.testing.assert_close(block, drop.expand(4, 4), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(
    ("value", "match"),
    [
        (torch.rand(5, 4), r"kwargs\['gate'\] has shape \[5, 4\], but x has 3 samples"),
        ([torch.rand(3, 4)], r"kwargs\['gate'\] is a list holding tensors"),
    ],
)
def test_inputs_that_cannot_be_split_by_sample_are_refused(value, match):
    net = Gated().eval()
    x, _ = _data()
    for make in (MAKERS["occlusion"], MAKERS["smoothgrad"], MAKERS["scorecam"]):
        with pytest.raises(camkit.InvalidInputError, match=match):
            make(net, "").explain(x, 1, kwargs={"gate": value})
        assert active_hooks(net) == 0


def test_gradient_methods_still_take_any_keyword_input():
    """Only methods that rerun the model on copies split inputs by sample; one forward takes them as given."""
    net = Gated().eval()
    x, gate = _data()
    odd = gate[:, None].expand(3, 5, 4)  # first dimension 3 = B: fine; a [5, 4] gate the model could not use

    class Mean(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = net

        def forward(self, image, gate):
            return self.inner(image, gate.mean(dim=1) if gate.dim() == 3 else gate.mean(dim=0, keepdim=True))

    plain = camkit.GradCAM(Mean().eval(), "inner.conv").explain(x, 1, kwargs={"gate": torch.rand(5, 4)})
    assert plain.maps.shape == (3, 8, 8)
    rows = camkit.Occlusion(Mean().eval(), window=4, stride=4).explain(x, 1, kwargs={"gate": odd})
    ref = camkit.Occlusion(net, window=4, stride=4).explain(x, 1, kwargs={"gate": gate})
    torch.testing.assert_close(rows.raw, ref.raw, atol=1e-5, rtol=1e-4)
