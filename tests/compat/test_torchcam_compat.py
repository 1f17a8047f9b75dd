"""camkit.compat.torchcam against torchcam 0.5.0 on the same inputs: maps within 1e-5 where torchcam is right."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
from functools import partial

import numpy as np
import pytest
import torch
from torch import nn

import camkit
from camkit.compat.torchcam import methods as ours
from camkit.compat.torchcam import metrics as our_metrics
from camkit.compat.torchcam.utils import overlay_mask

tc = pytest.importorskip("torchcam.methods")
tc_metrics = pytest.importorskip("torchcam.metrics")
tc_utils = pytest.importorskip("torchcam.utils")


@pytest.fixture(autouse=True)
def _quiet():
    logging.getLogger("torchcam").setLevel(logging.ERROR)
    logging.getLogger("camkit.compat.torchcam").setLevel(logging.ERROR)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 6, 3, padding=1), nn.ReLU()),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(1),
        nn.Linear(6, 4),
    ).eval()


def _x() -> torch.Tensor:
    return torch.rand(2, 3, 10, 10, generator=torch.Generator().manual_seed(3))


def _hooks(model: nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks) for m in model.modules())


def _run(cls, model, x, class_idx, seed=0, **kwargs):
    with cls(model, **kwargs) as extractor:
        torch.manual_seed(seed)
        scores = model(x)
        cams = extractor(class_idx, scores)
        fused = extractor.fuse_cams(cams)
    assert _hooks(model) == 0
    return cams, fused


CASES = [
    ("GradCAM", {}),
    ("XGradCAM", {}),
    ("LayerCAM", {}),
    ("ScoreCAM", {"batch_size": 5}),
    ("ISCAM", {"batch_size": 5, "num_samples": 3}),
    ("SSCAM", {"batch_size": 5, "num_samples": 2, "std": 0.5}),
]


@pytest.mark.parametrize(("name", "kwargs"), CASES)
@pytest.mark.parametrize("class_idx", [1, [0, 3]])
def test_maps_equal_torchcam(name, kwargs, class_idx):
    model, x = _model(), _x()
    layers = ["0.1", "0.3"]  # two layers: one map each, then fused
    theirs, their_fused = _run(getattr(tc, name), model, x, class_idx, target_layer=layers, **kwargs)
    mine, my_fused = _run(getattr(ours, name), model, x, class_idx, target_layer=layers, **kwargs)
    assert len(mine) == len(theirs) == 2
    for a, b in zip(mine, theirs):
        assert a.shape == b.shape == (2, 10, 10)
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    assert theirs[1].amax() > 0.99  # real maps, not flat ones
    torch.testing.assert_close(my_fused, their_fused, atol=1e-5, rtol=0)


def test_unnormalised_maps_and_output_targets_equal_torchcam():
    model, x = _model(), _x()
    target = lambda out: out[2] - out[0]  # noqa: E731  a scalar per sample
    results = []
    for lib in (tc, ours):
        with lib.GradCAM(model, "0.3") as extractor:
            raw = extractor(1, model(x), normalized=False)[0]
            results.append((raw, extractor(scores=model(x), targets=target)[0]))  # torchcam frees the graph: rerun
    torch.testing.assert_close(results[0][0], results[1][0], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(results[0][1], results[1][1], atol=1e-5, rtol=0)


def test_gradcampp_is_camkits_because_torchcams_alpha_division_is_lost():
    # torchcam divides alpha[mask] in place, but boolean indexing copies: alpha stays g^2, so its
    # weights are sum(g^2 relu(g)). camkit computes Grad-CAM++'s alpha (eq. 19).
    model, x = _model(), _x()
    theirs, _ = _run(tc.GradCAMpp, model, x, 2, target_layer="0.3")
    mine, _ = _run(ours.GradCAMpp, model, x, 2, target_layer="0.3")
    acts, grads = [], []
    layer = model[0][3]
    def keep(module, args, output):
        acts.append(output)
        output.register_hook(grads.append)

    handle = layer.register_forward_hook(keep)
    model(x)[:, 2].sum().backward()
    handle.remove()
    a, g = acts[0].detach(), grads[0]
    lost = (g.pow(2) * g.clamp_min(0)).sum(dim=(2, 3))
    expected = torch.relu((lost[:, :, None, None] * a).sum(dim=1))
    expected = (expected - expected.amin(dim=(1, 2), keepdim=True)) / (
        expected.amax(dim=(1, 2), keepdim=True) - expected.amin(dim=(1, 2), keepdim=True) + 1e-8
    )
    torch.testing.assert_close(theirs[0], expected, atol=1e-5, rtol=0)
    raw = camkit.GradCAMPlusPlus(model, "0.3").explain(x, [2, 2]).raw
    torch.testing.assert_close(mine[0], ours.GradCAMpp._normalize(raw.clone()), atol=1e-6, rtol=0)
    assert not torch.allclose(mine[0], theirs[0], atol=1e-3)
    for p in model.parameters():
        p.grad = None


def test_cam_equals_torchcam_where_the_map_is_non_negative_and_applies_the_relu():
    model, x = _model(), _x()
    theirs, _ = _run(tc.CAM, model, x, 1, target_layer="0.3", fc_layer="3")
    mine, _ = _run(ours.CAM, model, x, 1, target_layer="0.3", fc_layer="3")
    signed = torch.einsum("c,bchw->bhw", model[3].weight[1].detach(), model[0](x).detach())
    if bool((signed >= 0).all()):
        torch.testing.assert_close(mine[0], theirs[0], atol=1e-5, rtol=0)
    else:  # torchcam normalises the signed map; camkit's CAM drops the negative evidence first
        relu = torch.relu(signed)
        expected = (relu - relu.amin(dim=(1, 2), keepdim=True)) / (relu.amax(dim=(1, 2), keepdim=True) + 1e-8)
        torch.testing.assert_close(mine[0], expected, atol=1e-5, rtol=0)
        low = signed.amin(dim=(1, 2), keepdim=True)
        torch.testing.assert_close(theirs[0], (signed - low) / ((signed - low).amax(dim=(1, 2), keepdim=True) + 1e-8))


def test_contract_hooks_errors_and_inference_mode():
    model, x = _model(), _x()
    extractor = ours.GradCAM(model, "0.3")
    # the layer's two (activations, outputs kept for backpropagation), as torchcam; the input hook is unlisted
    assert _hooks(model) == 3 and len(extractor.hook_handles) == 2
    with pytest.raises(AssertionError, match="forwarded"):
        extractor(0, torch.zeros(2, 4))
    scores = model(x)
    with pytest.raises(ValueError, match="class_idx"):
        extractor(-1, scores)
    with pytest.raises(ValueError, match="scores"):
        extractor(0)
    with pytest.raises(ValueError, match="batch size"):
        extractor([0, 1, 2], scores)
    extractor.remove_hooks()
    assert _hooks(model) == 0 and extractor.hook_handles == []
    with pytest.raises(ValueError, match="unknown `target_layer`"):
        ours.GradCAM(model, "0.9")
    # a forward under inference_mode still explains (the input is explained again, with autograd)
    with ours.ScoreCAM(model, "0.3", batch_size=4) as extractor:
        with torch.inference_mode():
            scores = model(x)
        assert extractor(1, scores)[0].shape == (2, 10, 10)
    assert _hooks(model) == 0
    assert all(p.grad is None for p in model.parameters())


def test_classification_metric_equals_torchcam():
    model, x = _model(), _x()
    results = []
    for lib, metrics in ((tc, tc_metrics), (ours, our_metrics)):
        with lib.GradCAM(model, "0.3") as extractor:
            metric = metrics.ClassificationMetric(extractor, partial(torch.softmax, dim=-1))
            metric.update(x)
            metric.update(x, class_idx=1)
            results.append(metric.summary())
    assert results[0].keys() == results[1].keys()
    for key in results[0]:
        assert results[1][key] == pytest.approx(results[0][key], abs=1e-5)


def test_overlay_mask_equals_torchcam():
    from PIL import Image

    rng = np.random.default_rng(0)
    img = Image.fromarray(rng.integers(0, 255, (12, 16, 3), dtype=np.uint8))
    mask = Image.fromarray(rng.random((6, 8)).astype(np.float32), mode="F")
    np.testing.assert_array_equal(np.asarray(overlay_mask(img, mask, alpha=0.5)), np.asarray(tc_utils.overlay_mask(img, mask, alpha=0.5)))
    with pytest.raises(ValueError, match="alpha"):
        overlay_mask(img, mask, alpha=1.0)


def test_install_refuses_when_the_real_torchcam_is_imported():
    import camkit.compat.torchcam as compat

    assert "torchcam.methods" in sys.modules  # imported at the top of this module
    with pytest.raises(compat.AlreadyImportedError, match=r"torchcam\.methods"):
        compat.install()
    assert not compat.installed() and sys.modules["torchcam.methods"] is tc


@pytest.mark.slow  # a fresh interpreter importing camkit and torchvision: ~20-45 s on the shared CPU
def test_install_aliases_torchcam_and_the_readme_example_runs_unchanged():
    # torchcam's README quick tour, after the one-line switch (pretrained weights and the downloaded
    # photo replaced by random ones: the machine cannot download)
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(
        """
        import camkit.compat.torchcam; camkit.compat.torchcam.install(); camkit.compat.torchcam.install()
        import torch
        from torchvision.models import get_model
        model = get_model("resnet18", weights=None).eval()
        img = (torch.rand(3, 64, 64, generator=torch.Generator().manual_seed(0)) * 255).to(torch.uint8)
        input_tensor = img.float() / 255
        from torchcam.methods import LayerCAM
        with LayerCAM(model) as cam_extractor:
          out = model(input_tensor.unsqueeze(0))
          # Retrieve the CAM by passing the class index and the model output
          activation_map = cam_extractor(out.squeeze(0).argmax().item(), out)
        import matplotlib; matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from torchvision.transforms.v2.functional import to_pil_image
        from torchcam.utils import overlay_mask
        result = overlay_mask(to_pil_image(img), to_pil_image(activation_map[0].squeeze(0), mode='F'), alpha=0.5)
        plt.imshow(result); plt.axis('off'); plt.tight_layout()
        hooks = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())
        print(tuple(activation_map[0].shape), result.size, hooks, float(activation_map[0].max()) > 0.99)
        import torchcam, torchcam.methods.core, torchcam.metrics
        print(torchcam is camkit.compat.torchcam, LayerCAM.__module__, torchcam.methods.core._CAM.__module__,
              overlay_mask.__module__, torchcam.metrics.ClassificationMetric.__module__, torchcam.__version__)
        """)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().split("\n")
    assert lines[-2] == "(1, 2, 2) (64, 64) 0 True"
    assert lines[-1].split() == [
        "True", "camkit.compat.torchcam.methods.gradient", "camkit.compat.torchcam.methods.core",
        "camkit.compat.torchcam.utils", "camkit.compat.torchcam.metrics", "0.5.0",
    ]


def test_refinecam_equals_torchcam():
    model, x = _model(), _x()
    results = []
    for lib in (tc, ours):
        with lib.RefineCAM(model, ["0.1", "0.3"], base_method=lib.LayerCAM) as extractor:
            results.append(extractor(2, model(x))[0])
        assert _hooks(model) == 0
    torch.testing.assert_close(results[1], results[0], atol=1e-5, rtol=0)
    assert results[0].amax() > 0.99


@pytest.mark.parametrize("name", ["GradCAM", "ISCAM"])
def test_video_maps_equal_torchcam(name):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv3d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool3d(1), nn.Flatten(1), nn.Linear(4, 3)).eval()
    x = torch.rand(2, 3, 4, 6, 6, generator=torch.Generator().manual_seed(1))
    kwargs = {"num_samples": 2} if name == "ISCAM" else {}
    theirs, _ = _run(getattr(tc, name), model, x, [0, 2], target_layer="1", **kwargs)
    mine, _ = _run(getattr(ours, name), model, x, [0, 2], target_layer="1", **kwargs)
    assert mine[0].shape == theirs[0].shape == (2, 4, 6, 6)
    torch.testing.assert_close(mine[0], theirs[0], atol=1e-5, rtol=0)
    assert theirs[0].amax() > 0.99


class _FailsOnCall(nn.Module):
    """The test model, raising from its ``fail_at``-th forward on (counting from 1)."""

    def __init__(self, fail_at: int) -> None:
        super().__init__()
        self.net, self.calls, self.fail_at = _model(), 0, fail_at

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls >= self.fail_at:
            raise RuntimeError("boom")
        return self.net(x)


@pytest.mark.parametrize(("name", "kwargs"), [
    ("ScoreCAM", {"batch_size": 4}),
    ("SSCAM", {"batch_size": 4, "num_samples": 2}),
    ("ISCAM", {"batch_size": 4, "num_samples": 2}),
    ("SmoothGradCAMpp", {"num_samples": 2}),
])
def test_an_error_inside_the_extraction_restores_hooks_and_training_flags(name, kwargs):
    # torchcam's own tests check this by replacing private steps of its loops; here the model raises
    # on the forward after the user's and the explainer's first one (a masked or a noisy input)
    model = _FailsOnCall(fail_at=3).train()
    model.net[0][1].eval()
    flags = [m.training for m in model.modules()]
    x = _x()
    with getattr(ours, name)(model, "net.0.3", **kwargs) as extractor:
        scores = model(x)
        with pytest.raises(RuntimeError, match="boom"):
            extractor(1, scores)
        assert extractor._hooks_enabled
        assert [m.training for m in model.modules()] == flags
        model.fail_at = 10**6
        x2 = x.flip(0)
        model(x2)  # the hooks record again: the next call explains x2
        assert torch.equal(extractor._input, x2)
    assert _hooks(model) == 0
    assert all(p.grad is None for p in model.parameters())


def test_eval_mode_restores_every_flag_when_the_models_eval_raises(monkeypatch):
    from camkit._internal.state import eval_mode

    model = _model().train()
    model[0][1].eval()
    flags = [m.training for m in model.modules()]

    def failing_eval():
        for module in model.modules():
            module.training = False
        raise RuntimeError("boom")

    monkeypatch.setattr(model, "eval", failing_eval)
    with pytest.raises(RuntimeError, match="boom"), eval_mode(model):
        pass
    assert [m.training for m in model.modules()] == flags
    monkeypatch.undo()
    with eval_mode(model):  # nothing left half-saved: the next block saves and restores as usual
        assert not any(m.training for m in model.modules())
    assert [m.training for m in model.modules()] == flags
    with ours.GradCAM(model, "0.3") as extractor, extractor._eval_mode():
        assert not model.training
    assert [m.training for m in model.modules()] == flags
