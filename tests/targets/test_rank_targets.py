"""Targets on signals and volumes: SegmentationTarget on [B, K, T] and [B, K, D, H, W] by hand,
Grad-CAM of a segmenter against a hand Grad-CAM (a tiny Conv1d/Conv3d net, MONAI's UNet and
SegResNet), masks of the wrong rank refused, NeuronTarget at a voxel.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import camkit
from camkit import InvalidTargetError, SegmentationTarget
from camkit.targets import NeuronTarget, bind_target

CONV = {1: nn.Conv1d, 3: nn.Conv3d}
MODE = {1: "linear", 3: "trilinear"}


class TinySegmenter(nn.Module):
    """Encoder at half resolution, nearest upsampling, 1x1 head: logits [B, 3, *S]."""

    def __init__(self, spatial_dims: int, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        conv = CONV[spatial_dims]
        self.down = conv(1, 4, 3, stride=2, padding=1)
        self.relu = nn.ReLU()
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.head = conv(4, 3, 1)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.up(self.relu(self.down(x))))


def hand_gradcam(model: nn.Module, layer: nn.Module, x: Tensor, target: SegmentationTarget) -> tuple[Tensor, Tensor]:
    """Grad-CAM written out: relu(sum_c mean_s(dS/dA_c) A_c), resized linearly to x, min-max normalised."""
    seen: list[Tensor] = []
    handle = layer.register_forward_hook(lambda _m, _i, out: seen.append(out))
    try:
        scores = target(model(x))
    finally:
        handle.remove()
    acts = seen[-1]
    (grads,) = torch.autograd.grad(scores.sum(), acts)
    weights = grads.mean(dim=tuple(range(2, grads.dim())), keepdim=True)
    raw = (weights * acts).sum(dim=1).clamp_min(0).detach()
    mode = {1: "linear", 2: "bilinear", 3: "trilinear"}[x.dim() - 2]
    up = F.interpolate(raw[:, None], size=x.shape[2:], mode=mode, align_corners=False)[:, 0]
    low = up.flatten(1).amin(1).view(-1, *(1,) * (up.dim() - 1))
    high = up.flatten(1).amax(1).view(-1, *(1,) * (up.dim() - 1))
    return raw, (up - low) / (high - low)


# ---------------------------------------------------------------- SegmentationTarget by hand


def test_segmentation_target_on_signal_logits_by_hand():
    logits = torch.tensor([[[1.0, 3.0, 0.0], [2.0, 0.0, 5.0]]], requires_grad=True)  # B=1, K=2, T=3
    score = SegmentationTarget(1)(logits)  # class 1 wins t0 and t2: 2 + 5
    assert score.tolist() == [7.0]
    score.sum().backward()
    assert logits.grad is not None
    assert logits.grad[0].tolist() == [[0.0, 0.0, 0.0], [1.0, 0.0, 1.0]]
    assert SegmentationTarget(0)(logits).tolist() == [3.0]
    assert SegmentationTarget(0, mask=torch.tensor([1.0, 0.5, 0.0]))(logits).tolist() == [2.5]
    assert SegmentationTarget(1, mask=torch.tensor([[True, True, False]]))(logits).tolist() == [2.0]


def test_segmentation_target_on_volume_logits_by_hand():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 2, 3, 4, generator=g)
    winner = logits.argmax(dim=1)
    for category in range(3):
        expected = [float(logits[b, category][winner[b] == category].sum()) for b in range(2)]
        assert SegmentationTarget(category)(logits).tolist() == pytest.approx(expected, abs=1e-6)
    weights = torch.rand(2, 3, 4, generator=g)  # one mask [D, H, W] for every sample
    expected = [float((logits[b, 2] * weights).sum()) for b in range(2)]
    assert SegmentationTarget(2, mask=weights)(logits).tolist() == pytest.approx(expected, abs=1e-6)
    per_sample = torch.rand(2, 2, 3, 4, generator=g) > 0.5  # [B, D, H, W]
    expected = [float(logits[b, c][per_sample[b]].sum()) for b, c in enumerate((0, 1))]
    assert SegmentationTarget([0, 1], mask=per_sample)({"out": logits}).tolist() == pytest.approx(expected, abs=1e-6)


def test_masks_and_logits_of_the_wrong_rank_are_refused():
    volume = torch.zeros(1, 2, 3, 4, 4)
    with pytest.raises(InvalidTargetError, match=r"mask must be \[D, H, W\] or \[B, D, H, W\] = \[1, 3, 4, 4\]"):
        SegmentationTarget(0, mask=torch.ones(4, 4))(volume)  # an image's mask for a volume
    with pytest.raises(InvalidTargetError, match=r"logits \[B, K, D, H, W\] of a volume"):
        SegmentationTarget(0, mask=torch.ones(1, 4, 4))(volume)
    with pytest.raises(InvalidTargetError, match=r"mask must be \[T\] or \[B, T\] = \[1, 8\]"):
        SegmentationTarget(0, mask=torch.ones(2, 8))(torch.zeros(1, 2, 8))  # two masks for one signal
    with pytest.raises(InvalidTargetError, match=r"mask must be \[H, W\] or \[B, H, W\] = \[1, 4, 4\]"):
        SegmentationTarget(0, mask=torch.ones(3, 4, 4))(torch.zeros(1, 2, 4, 4))  # a volume's mask for an image
    with pytest.raises(
        InvalidTargetError, match=r"\[B, K, T\], \[B, K, H, W\] or \[B, K, D, H, W\], got shape \[1, 2\]"
    ):
        SegmentationTarget(0)(torch.zeros(1, 2))
    with pytest.raises(InvalidTargetError, match="got list"):
        SegmentationTarget(0, mask=[[1.0]])(torch.zeros(1, 2, 1))  # type: ignore[arg-type]


def test_a_wrong_rank_mask_is_refused_through_an_explainer():
    model = TinySegmenter(3).eval()
    x = torch.randn(1, 1, 4, 8, 8)
    with pytest.raises(InvalidTargetError, match=r"mask must be \[D, H, W\] or \[B, D, H, W\] = \[1, 4, 8, 8\]"):
        camkit.GradCAM(model, "down").explain(x, SegmentationTarget(1, mask=torch.ones(8, 8)))


# ---------------------------------------------------------------- Grad-CAM of segmenters


@pytest.mark.parametrize(("spatial_dims", "size"), [(1, (16,)), (3, (4, 8, 8))], ids=["signal", "volume"])
def test_gradcam_of_a_tiny_segmenter_equals_a_hand_gradcam(spatial_dims, size):
    model = TinySegmenter(spatial_dims).eval()
    x = torch.randn(3, 1, *size, generator=torch.Generator().manual_seed(1))
    region = torch.zeros(*size)
    region[(slice(None),) * (spatial_dims - 1) + (slice(2, 6),)] = 1.0  # a band of the last axis
    with torch.no_grad():
        shown = model(x).argmax(dim=1).flatten(1)[:, 0].tolist()  # a class each sample predicts somewhere
    for target in (SegmentationTarget(shown), SegmentationTarget([0, 1, 2], mask=region)):
        e = camkit.GradCAM(model, "down").explain(x, target)
        raw, maps = hand_gradcam(model, model.down, x, target)
        assert e.maps.shape == (3, *size) and e.raw.shape == (3, *(s // 2 for s in size))
        assert not bool(e.flat.any())
        torch.testing.assert_close(e.raw, raw, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(e.maps, maps, atol=1e-5, rtol=1e-5)
        alone = torch.cat([camkit.GradCAM(model, "down").explain(x[i : i + 1], _row(target, i)).maps for i in range(3)])
        torch.testing.assert_close(e.maps, alone, atol=1e-5, rtol=1e-5)


def _row(target: SegmentationTarget, i: int) -> SegmentationTarget:
    """The same target for sample i alone."""
    category = target.category[i] if isinstance(target.category, list) else target.category
    return SegmentationTarget(category, mask=target.mask)


def _monai_segmenters() -> list:
    nets = pytest.importorskip("monai.networks.nets")
    torch.manual_seed(0)
    unet = nets.UNet(
        spatial_dims=3, in_channels=1, out_channels=2, channels=(4, 8, 16), strides=(2, 2), num_res_units=0
    )
    torch.manual_seed(0)
    segresnet = nets.SegResNet(
        spatial_dims=3, init_filters=4, in_channels=1, out_channels=2, blocks_down=(1, 1), blocks_up=(1,),
        norm=("group", {"num_groups": 2}),
    )  # fmt: skip
    # The bottom of the U (3^3 for 12^3 inputs) and the second encoder stage (6^3).
    return [(unet.eval(), "model.1.submodule.1.submodule"), (segresnet.eval(), "down_layers.1")]


def test_gradcam_of_monai_unet_and_segresnet_equals_a_hand_gradcam():
    x = torch.randn(2, 1, 12, 12, 12, generator=torch.Generator().manual_seed(2))
    mask = torch.zeros(2, 12, 12, 12, dtype=torch.bool)
    mask[0, 2:6, 4:10, 4:10] = True  # one region per volume
    mask[1, 6:11, 2:6, 8:12] = True
    for model, layer in _monai_segmenters():
        target = SegmentationTarget(1, mask=mask)
        e = camkit.GradCAM(model, layer).explain(x, target)
        raw, maps = hand_gradcam(model, model.get_submodule(layer), x, target)
        assert e.maps.shape == (2, 12, 12, 12) and not bool(e.flat.any())
        torch.testing.assert_close(e.raw, raw, atol=1e-6, rtol=1e-4)
        torch.testing.assert_close(e.maps, maps, atol=1e-5, rtol=1e-4)
        assert e.frame_share.shape == (2, 12)  # the share of each slice, as for a video's frames


# ---------------------------------------------------------------- NeuronTarget


def test_neuron_target_at_a_voxel_and_over_a_signal():
    model = TinySegmenter(3).eval()
    x = torch.randn(2, 1, 4, 8, 8, generator=torch.Generator().manual_seed(3))
    at_voxel = NeuronTarget("down", 2, position=(1, 3, 0))
    with torch.no_grad(), bind_target(at_voxel, model):
        out = model(x)
        score = at_voxel(out)
    torch.testing.assert_close(score, model.down(x)[:, 2, 1, 3, 0].detach())
    signal_model = TinySegmenter(1).eval()
    s = torch.randn(2, 1, 16, generator=torch.Generator().manual_seed(4))
    peak = NeuronTarget("relu", 1, reduce="max")
    with torch.no_grad(), bind_target(peak, signal_model):
        score = peak(signal_model(s))
    torch.testing.assert_close(score, signal_model.relu(signal_model.down(s))[:, 1].amax(dim=1).detach())
