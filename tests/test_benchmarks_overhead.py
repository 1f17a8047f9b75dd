"""The per-call overhead case's arithmetic and floor, and its CUDA goals' wiring (no GPU needed)."""

from __future__ import annotations

import torch
from models import TinyNet, tiny_input

from benchmarks import case_gpu, case_overhead
from benchmarks._harness import Timing
from camkit.hooks import LayerCapture


def test_overhead_ratio_of_the_medians_with_the_rounds_spread():
    ours, theirs, floor = Timing((3.0, 5.0, 4.0)), Timing((4.0, 4.0, 6.0)), Timing((1.0, 2.0, 2.0))
    ratio = case_overhead.overhead_ratio(ours, theirs, floor)
    assert (ratio.median, ratio.lo, ratio.hi) == (1.0, 0.5, 1.5)  # (4 - 2) / (4 - 2); rounds 2/3, 3/2, 2/4
    noisy = case_overhead.overhead_ratio(ours, Timing((1.0, 4.0, 6.0)), floor)  # round 1: the anchor under the floor
    assert (noisy.median, noisy.lo, noisy.hi) == (1.0, 0.5, 1.5)
    assert case_overhead.overhead_ratio(ours, Timing((1.0, 2.0, 2.0)), floor) is None


def test_the_floor_is_the_gradient_camkit_takes():
    model = TinyNet().eval()
    x, classes = tiny_input(batch=2), torch.tensor([1, 3])
    floor = case_overhead.floor_call(model, "conv2", x, classes)()
    with LayerCapture([("conv2", model.conv2)]) as capture:
        out = model(x)
        (want,) = capture.gradients(out.gather(1, classes[:, None])[:, 0])
    torch.testing.assert_close(floor, want)
    assert all(p.grad is None for p in model.parameters()) and not model.conv2._forward_hooks


def test_cuda_goals_compare_with_the_fastest_anchor_and_the_graph_replay():
    label = case_overhead.label
    times = {case_overhead.FORWARD: 1.0, case_overhead.CAMKIT: 1.2, case_overhead.COMPILED: 0.3,
             label("torchcam"): 1.3, label("torchcam + resize"): 0.1, label("captum"): 1.25, case_gpu.GRAPHED: 0.25}
    timings = {f"Grad-CAM: {name}": Timing((t, t)) for name, t in times.items()}
    small = case_gpu.overhead_goals(timings, "Grad-CAM", "here", 8)
    assert [(g.measured, g.status) for g in small] == [("0.96x", "met"), ("1.20x", "met")]  # 1.2 / 1.25; 0.3 / 0.25
    large = case_gpu.overhead_goals(timings, "Grad-CAM", "here", 64)
    assert [(g.measured, g.status) for g in large] == [("0.96x", "met"), ("1.20x", "not met"), ("0.30x", "met")]
    assert "below an eager no-grad forward" in large[-1].text
