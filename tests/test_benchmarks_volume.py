"""The 3-D Grad-CAM benchmark case (``benchmarks/case_volume.py``) on tiny inputs: its output
contract for any rank, the agreement of each anchor's maps with camkit's on a small Conv3d
model, its goals, and the runner end to end on small clips and volumes.

Nothing here writes into ``benchmarks/``: reports go to pytest's ``tmp_path``.
"""

from __future__ import annotations

import doctest
import gc
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import _runner, case_volume  # noqa: E402
from benchmarks._harness import MET, NOT_MEASURED, NOT_MET, Context, Timing, max_abs_diff  # noqa: E402


def test_case_doctests_pass():
    result = doctest.testmod(case_volume, verbose=False)
    assert result.attempted >= 2
    assert result.failed == 0


def test_finish_like_camkit_upsamples_linearly_by_rank_then_min_max():
    # 1-D, 2 -> 4, linear, align_corners=False: source t = (i + 0.5) / 2 - 0.5 = -0.25 (clamped), 0.25, 0.75,
    # 1.25 (clamped) -> 0, 0.5, 1.5, 2 -> min-max -> 0, 0.25, 0.75, 1
    quarter = torch.tensor([0.0, 0.25, 0.75, 1.0])
    torch.testing.assert_close(case_volume.finish_like_camkit(torch.tensor([[0.0, 2.0]]), (4,)), quarter[None])
    # 3-D, depth 2 -> 4 with values 0 and 4 (trilinear; H and W 1 -> 2 copy): 0, 1, 3, 4 -> min-max as above;
    # given as [B, 1, d, h, w] (captum's layout)
    raw = torch.tensor([0.0, 4.0]).view(1, 1, 2, 1, 1)
    out = case_volume.finish_like_camkit(raw, (4, 2, 2))
    torch.testing.assert_close(out, quarter.view(1, 4, 1, 1).expand(1, 4, 2, 2))
    # an affine change of the raw map (an anchor's own normalisation, 5 + 3 * map) changes nothing; two maps of a
    # batch are normalised each on its own; a constant map becomes zeros, never NaN
    g = torch.Generator().manual_seed(0)
    maps = torch.rand(2, 2, 3, 3, generator=g)
    torch.testing.assert_close(
        case_volume.finish_like_camkit(maps, (4, 6, 6)), case_volume.finish_like_camkit(5 + 3 * maps, (4, 6, 6))
    )
    both = case_volume.finish_like_camkit(torch.stack([maps[0], 10 * maps[0]]), (4, 6, 6))
    torch.testing.assert_close(both[0], both[1])
    assert torch.equal(case_volume.finish_like_camkit(torch.ones(1, 2, 2, 2), (4, 4, 4)), torch.zeros(1, 4, 4, 4))
    with pytest.raises(ValueError, match=r"size with 3 axes must be \[B, \*s\] or \[B, 1, \*s\], got \[1, 4\]"):
        case_volume.finish_like_camkit(torch.zeros(1, 4), (4, 4, 4))


def test_correlation_is_pearsons():
    assert case_volume.correlation(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([3.0, 2.0, 1.0])) == pytest.approx(-1.0)
    # x = (0, 1, 2, 3), y = (0, 1, 1, 4), both of mean 1.5: deviations (-1.5, -0.5, 0.5, 1.5) and
    # (-1.5, -0.5, -0.5, 2.5); sums of products 6, of squares 5 and 9 -> r = 6 / sqrt(45)
    r = case_volume.correlation(torch.tensor([[0.0, 1.0], [2.0, 3.0]]), torch.tensor([0.0, 1.0, 1.0, 4.0]))
    assert r == pytest.approx(6 / 45**0.5)
    with pytest.raises(ValueError, match="same size, got 2 and 3 values"):
        case_volume.correlation(torch.zeros(2), torch.zeros(3))


class _TinyConv3d(nn.Module):
    """A strided Conv3d stage, so a [B, 3, 4, 8, 8] clip gives a 2x4x4 grid at ``features.2``."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.features = nn.Sequential(
            nn.Conv3d(3, 4, 3, stride=2, padding=1), nn.ReLU(), nn.Conv3d(4, 6, 3, padding=1)
        )
        self.head = nn.Sequential(nn.ReLU(), nn.AdaptiveAvgPool3d(1), nn.Flatten(), nn.Linear(6, 5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


@pytest.mark.heavy
@pytest.mark.parametrize(
    ("impl", "module"),
    [("captum", "captum"), ("torchcam", "torchcam"), ("MONAI", "monai"), ("pytorch-grad-cam", "pytorch_grad_cam")],
)
def test_anchor_maps_agree_with_camkit_on_a_tiny_conv3d_model(impl, module):
    pytest.importorskip(module)
    model = _TinyConv3d().eval()
    x = torch.randn(3, 3, 4, 8, 8, generator=torch.Generator().manual_seed(2))
    cls = case_volume.first_top1(model, x)
    ours = case_volume.prepare("camkit", model, "features.2", x, cls)
    theirs = case_volume.prepare(impl, model, "features.2", x, cls)
    try:
        ours_maps = ours.run()
        assert theirs.maps is not None
        theirs_maps = theirs.maps(theirs.run())
    finally:
        theirs.close()
    assert theirs_maps.shape == ours_maps.shape == (3, 4, 8, 8)
    if impl == "pytorch-grad-cam":
        # normalised at the 2x4x4 grid, then resized with a cubic spline: close, not equal
        assert case_volume.correlation(ours_maps, theirs_maps) > 0.9
        assert max_abs_diff(ours_maps, theirs_maps) > 1e-3
    else:
        assert max_abs_diff(ours_maps, theirs_maps) < 1e-5
    # the anchor worked on its own copy: the caller's model carries no hooks
    assert all(not m._forward_hooks and not m._backward_hooks for m in model.modules())
    # and its copy goes once closed and dropped (MONAI's would outlive it through a cycle in the autograd graph),
    # so a memory probe's baseline and a later configuration do not carry it
    del theirs, theirs_maps
    gc.collect()
    assert [m for m in gc.get_objects() if type(m) is _TinyConv3d and m is not model] == []


def test_goals_use_the_fastest_anchor_round_by_round():
    cfg = case_volume.Config("r3d_18", "layer4", (3, 16, 112, 112), 4, True)
    ours = case_volume.label("camkit")
    timings = {
        "no-grad forward": Timing((1.0, 1.0, 1.0)),
        ours: Timing((1.2, 1.0, 1.1)),
        "captum x": Timing((1.0, 2.0, 1.0)),  # median 1.0: the fastest anchor
        "MONAI y": Timing((3.0, 3.0, 3.0)),
    }
    assert case_volume.fastest_anchor(timings) == "captum x"
    memory, speed = case_volume.goals(cfg, timings, {"no-grad forward": 200.0, ours: 220.0})
    assert (memory.status, memory.measured) == (MET, "1.10x")  # 220 / 200 <= 1.15
    assert "r3d_18 16x112x112, layer layer4, batch 4" in memory.text
    # per-round ratios 1.2 / 1.0, 1.0 / 2.0, 1.1 / 1.0 -> median 1.10, min 0.50, max 1.20: straddles 1.0
    assert speed.measured == "1.10x (0.50-1.20)"
    assert "camkit time / captum x time" in speed.text
    memory, speed = case_volume.goals(cfg, {k: timings[k] for k in ("no-grad forward", ours)},
                                      {"no-grad forward": 200.0, ours: 240.0})
    assert (memory.status, memory.measured) == (NOT_MET, "1.20x")
    assert speed.status == NOT_MEASURED and "no anchor ran" in speed.reason


@pytest.mark.heavy
def test_runner_runs_the_case_end_to_end_on_small_clips_and_volumes(tmp_path, monkeypatch):
    pytest.importorskip("monai")
    small = [
        case_volume.Config("r3d_18", "layer4", (3, 8, 32, 32), 2, True),
        case_volume.Config("DenseNet-3D small", "features.denseblock4", (1, 32, 64, 64), 1, False),
    ]
    monkeypatch.setattr(case_volume, "configs", lambda ctx: small)
    peaks = {"no-grad forward": 10.0, "camkit": 11.0}
    # The probe is tested in test_benchmarks_smoke.py; a fixed peak per implementation keeps this fast.
    monkeypatch.setattr(Context, "peak_memory", lambda self, job, **p: peaks[p["impl"]])
    code = _runner.main(["--smoke", "--no-anchors", "--cases", "volume", "--device", "cpu", "--out", str(tmp_path)])
    assert code == 0
    text = (tmp_path / "RESULTS.md").read_text()
    assert "### Grad-CAM on video and volumes" in text
    assert "| camkit | r3d_18 8x32x32 | 2 | cpu | 11.0 | 1.10x vs no-grad forward |" in text
    assert "| camkit | DenseNet-3D small 32x64x64 | 1 | cpu |" in text
    assert "peak memory above the model (r3d_18 8x32x32, layer layer4, batch 2) | 1.10x | **met** |" in text
    assert "(DenseNet-3D small 32x64x64, layer features.denseblock4, batch 1) | - | **not measured** |" in text
    assert text.count("**not measured** | no anchor ran") == 2
