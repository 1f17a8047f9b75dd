"""No host sync inside an explain call when the target is a tensor on the device.

On the CPU, :func:`camkit._internal.syncs.record_syncs` records the aten ops that would make a CUDA
device wait for the host, and ``camkit._internal.syncs.reads_are_free`` is replaced so that camkit
takes the paths it takes on a GPU (a CPU tensor is otherwise free to read). The CUDA form
runs every method under ``torch.cuda.set_sync_debug_mode("error")`` (skipped without a GPU).
"""

from __future__ import annotations

import pytest
import torch
from factories import FACTORIES, NEEDS_VIT
from models import RANK_SIZES, RankNet, TinyNet, rank_input

import camkit
from camkit._internal import syncs as _syncs
from camkit._internal.syncs import record_syncs

# Methods that sync on a device by the nature of their solver, documented in docs/guide/gpu.md:
XFAIL: dict[str, str] = {
    "dff": "NMF starts from an SVD (NNDSVDa), whose status torch reads back on CUDA, and stops early by "
    "reading each sample's error every 10 rounds",
    **{
        key: "region methods count each image's regions (torch.unique) and evaluate each distinct coalition "
        "once (unique rows): both need sizes on the host"
        for key in ("featureablation", "kernelshap", "lime", "shapleyvaluesampling")
    },
    "kpcacam": "the kernel matrix's eigh: torch reads its status back on CUDA (the sigmoid kernel is not PSD, "
    "so the power method Eigen-CAM uses does not apply)",
}


def _method_params():
    return [
        pytest.param(key, marks=pytest.mark.xfail(strict=True, reason=XFAIL[key])) if key in XFAIL
        else pytest.param(key, marks=pytest.mark.skip(reason=NEEDS_VIT[key])) if key in NEEDS_VIT else key
        for key in camkit.list_methods()
    ]


@pytest.fixture
def on_device(monkeypatch):
    """Take the paths camkit takes on a GPU: no value of a tensor is free to read."""
    monkeypatch.setattr(_syncs, "reads_are_free", lambda tensor: False)


# --- the recorder itself -------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, fn",
    [
        ("item", lambda t: t.sum().item()),
        ("bool", lambda t: bool(t[0] > 0)),
        ("if", lambda t: 1 if t.max() > 0 else 0),
        ("int", lambda t: int(t[0])),
        ("index", lambda t: [0, 1, 2, 3][t.argmax()]),
        ("nonzero", lambda t: t.nonzero()),
        ("mask", lambda t: t[t > 0]),
        ("mask put", lambda t: t.clone().__setitem__(t > 0, 0.0)),
        ("masked_select", lambda t: t.masked_select(t > 0)),
        ("unique", lambda t: torch.unique(t)),
        ("unique rows", lambda t: torch.unique(t[None], dim=0)),
        ("equal", lambda t: torch.equal(t, t)),
        ("allclose", lambda t: torch.allclose(t, t)),
        ("svd", lambda t: torch.linalg.svd(t.view(2, 2))),
        ("repeat_interleave", lambda t: torch.repeat_interleave(torch.tensor([1, 2]))),
        ("tolist", lambda t: t.tolist()),
        ("cpu", lambda t: t.cpu()),
        ("numpy", lambda t: t.numpy()),
    ],
)
def test_recorder_sees_each_kind_of_sync(name, fn):
    t = torch.tensor([1.0, -2.0, 3.0, 0.5])
    with record_syncs() as syncs:
        fn(t)
    assert len(syncs) >= 1, name
    assert all(s.device == "cpu" for s in syncs)
    assert "test_syncs.py" in syncs[0].where


def test_recorder_ignores_asynchronous_work():
    t = torch.tensor([[1.0, -2.0], [3.0, 0.5]])
    with record_syncs() as syncs:
        i = t.argmax(dim=1)
        t.gather(1, i[:, None])
        torch.where(t > 0, t, 0.0).topk(1, dim=1)
        t[torch.tensor([1, 0])].index_select(0, i).clamp(0, 1)
        torch.repeat_interleave(t, 2, dim=0)
        t.to(torch.float64).softmax(dim=1)
    assert syncs == []


def test_recorder_leaves_no_mode_behind():
    with pytest.raises(RuntimeError, match="boom"):
        with record_syncs():
            raise RuntimeError("boom")
    with record_syncs() as outer:
        pass
    torch.tensor([1.0]).item()
    assert outer == []


# --- every registered method -----------------------------------------------------------


@pytest.mark.heavy
@pytest.mark.parametrize("spatial_dims", [1, 3])
@pytest.mark.parametrize("key", _method_params())
def test_explain_makes_no_host_sync_on_signals_and_volumes(key, spatial_dims, on_device):
    model = RankNet(spatial_dims).eval()
    if key in ("deepliftshap", "gradientshap", "layerdeepliftshap"):
        shape = (2, 3, *RANK_SIZES[spatial_dims])
        base = torch.linspace(-1, 1, torch.Size(shape).numel()).view(shape)
        explainer = (camkit.DeepLiftShap(model, base) if key == "deepliftshap"
                     else camkit.LayerDeepLiftShap(model, "conv2", base) if key == "layerdeepliftshap"
                     else camkit.GradientShap(model, base, samples=6, stdev=0.1, seed=0, max_batch=5))
    else:
        explainer = FACTORIES[key](model)
    x = rank_input(spatial_dims)
    target = torch.tensor([0, 1, 2])
    explainer.explain(x, target)  # warm-up: per-shape checks and per-device copies happen once
    with record_syncs() as syncs:
        explanation = explainer.explain(x, target)
    assert [str(s) for s in syncs] == []
    assert explanation.maps.shape == (3, *RANK_SIZES[spatial_dims])


@pytest.mark.heavy
@pytest.mark.parametrize("key", _method_params())
def test_explain_makes_no_host_sync(key, on_device):
    model = TinyNet().eval()
    explainer = FACTORIES[key](model)
    x = torch.rand(3, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    target = torch.tensor([0, 1, 2])
    explainer.explain(x, target)  # warm-up: per-shape checks and per-device copies happen once
    with record_syncs() as syncs:
        explanation = explainer.explain(x, target)
    assert [str(s) for s in syncs] == []
    assert explanation.maps.shape == (3, 8, 8)


@pytest.mark.parametrize(
    "wrap",
    [
        lambda m: camkit.SmoothGrad(camkit.GradCAM(m, "conv2"), samples=3, max_batch=4, seed=0),
        lambda m: camkit.AugSmooth(camkit.Saliency(m), scales=(1.0, 0.5)),
    ],
    ids=["smoothgrad", "augsmooth"],
)
def test_wrappers_make_no_host_sync(wrap, on_device):
    explainer = wrap(TinyNet().eval())
    x = torch.rand(2, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    target = torch.tensor([4, 0])
    explainer.explain(x, target)
    with record_syncs() as syncs:
        explainer.explain(x, target)
    assert [str(s) for s in syncs] == []


@pytest.mark.parametrize(
    "make",
    [
        lambda m: camkit.GradCAM(m, "conv2", eigen_smooth=True),
        lambda m: camkit.LayerCAM(m, "conv2", eigen_smooth=True),
        lambda m: camkit.ScoreCAM(m, "conv2", eigen_smooth=True),
        lambda m: camkit.EigenCAM(m, "conv2"),
    ],
    ids=["gradcam", "layercam", "scorecam", "eigencam"],
)
def test_principal_components_make_no_host_sync_and_match_the_svd(make, monkeypatch):
    model = TinyNet().eval()
    x = torch.rand(3, 3, 8, 8, generator=torch.Generator().manual_seed(6))
    target = torch.tensor([0, 3, 1])
    host = make(model).explain(x, target)  # the exact SVD, where reads are free
    monkeypatch.setattr(_syncs, "reads_are_free", lambda tensor: False)
    explainer = make(model)
    explainer.explain(x, target)
    with record_syncs() as syncs:
        device = explainer.explain(x, target)  # the Gram-matrix power method
    assert [str(s) for s in syncs] == []
    torch.testing.assert_close(device.maps, host.maps, atol=1e-4, rtol=0)


# --- validation that moved onto the device ---------------------------------------------


def test_out_of_range_device_class_gives_nan_score_and_flat_map(on_device):
    model = TinyNet(classes=5).eval()
    x = torch.rand(3, 3, 8, 8, generator=torch.Generator().manual_seed(2))
    explainer = camkit.GradCAM(model, "conv2")
    with record_syncs() as syncs:
        bad = explainer.explain(x, torch.tensor([1, 7, -1]))
    assert syncs == []
    assert bad.scores[0].isfinite() and bad.scores[1:].isnan().all()
    assert bad.flat.tolist() == [False, True, True]
    assert bad.maps[1:].eq(0).all()
    good = explainer.explain(x[:1], torch.tensor([1]))
    torch.testing.assert_close(bad.maps[:1], good.maps)
    torch.testing.assert_close(bad.scores[:1], good.scores)


def test_out_of_range_device_classes_for_k_targets(on_device):
    model = TinyNet(classes=5).eval()
    x = torch.rand(2, 3, 8, 8, generator=torch.Generator().manual_seed(3))
    e = camkit.Saliency(model).explain(x, torch.tensor([[0, 5], [2, 3]]))
    assert e.scores.isnan().tolist() == [[False, True], [False, False]]
    assert e.flat.tolist() == [[False, True], [False, False]]


def test_cpu_classes_still_raise_before_anything_runs():
    model = TinyNet(classes=5).eval()
    x = torch.rand(2, 3, 8, 8)
    for target in (torch.tensor([1, 5]), [0, -1], 9):
        with pytest.raises(camkit.InvalidTargetError, match="out of range"):
            camkit.GradCAM(model, "conv2").explain(x, target)


def test_cam_class_beyond_the_head(on_device):
    model = TinyNet(classes=5).eval()
    x = torch.rand(2, 3, 8, 8, generator=torch.Generator().manual_seed(4))
    # The output has 8 columns but the head only 5: class 6 passes the output check.
    cam = camkit.CAM(model, "conv2", fc="fc", output=lambda out: torch.cat([out, out[:, :3]], dim=1))
    e = cam.explain(x, torch.tensor([6, 2]))
    assert e.flat.tolist() == [True, False]
    monkeyless = camkit.CAM(model, "conv2").explain(x[1:], torch.tensor([2]))
    torch.testing.assert_close(e.maps[1:], monkeyless.maps)


def test_cam_class_beyond_the_head_raises_on_the_cpu():
    model = TinyNet(classes=5).eval()
    cam = camkit.CAM(model, "conv2", fc="fc", output=lambda out: torch.cat([out, out[:, :3]], dim=1))
    with pytest.raises(camkit.InvalidTargetError, match="head's 5 outputs"):
        cam.explain(torch.rand(2, 3, 8, 8), torch.tensor([6, 2]))


@pytest.mark.parametrize("key", ["scorecam", "ablationcam"])
def test_device_paths_give_the_cpu_maps(key, monkeypatch):
    """Score-CAM without mask de-duplication and Ablation-CAM scoring dead channels: same maps."""
    model = TinyNet().eval()
    x = torch.rand(3, 3, 8, 8, generator=torch.Generator().manual_seed(5))
    x[0, :, :4] = 0  # dead channels and repeated masks for the CPU path to skip
    target = torch.tensor([0, 3, 1])
    host = FACTORIES[key](model).explain(x, target)
    monkeypatch.setattr(_syncs, "reads_are_free", lambda tensor: False)
    device = FACTORIES[key](model).explain(x, target)
    torch.testing.assert_close(device.maps, host.maps, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(device.scores, host.scores)
    if key == "scorecam":
        assert device.extras["scored"] >= host.extras["scored"]


def test_ablation_tail_is_checked_once_per_shape_on_device(on_device):
    model = TinyNet().eval()
    wrong = camkit.AblationCAM(model, "conv2", tail=lambda a: model.fc(torch.flatten(model.pool(a), 1)) + 1)
    with pytest.raises(camkit.InvalidInputError, match="does not reproduce"):
        wrong.explain(torch.rand(2, 3, 8, 8), torch.tensor([0, 1]))


# --- CUDA: the ground truth ------------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("key", _method_params())
def test_cuda_explain_under_sync_debug_error(key):
    model = TinyNet().cuda().eval()
    explainer = FACTORIES[key](model)
    x = torch.rand(3, 3, 8, 8, device="cuda")
    target = torch.tensor([0, 1, 2], device="cuda")  # made before the mode: its copy is the caller's
    explainer.explain(x, target)  # warm-up: allocator, kernels, per-device copies
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        explanation = explainer.explain(x, target)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert explanation.maps.device.type == "cuda"
    assert explanation.maps.shape == (3, 8, 8)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_out_of_range_class_is_nan_not_a_device_assert():
    model = TinyNet(classes=5).cuda().eval()
    x = torch.rand(2, 3, 8, 8, device="cuda")
    e = camkit.GradCAM(model, "conv2").explain(x, torch.tensor([1, 9], device="cuda"))
    assert e.scores.isnan().tolist() == [False, True]
    assert e.flat.tolist() == [False, True]


# --- the attention methods' two paths (whole graph, block by block) and the budget that picks one ---------------


def _tiny_vit() -> torch.nn.Module:
    from torchvision.models import VisionTransformer

    torch.manual_seed(0)
    vit = VisionTransformer(image_size=16, patch_size=4, num_layers=2, num_heads=2, hidden_dim=8, mlp_dim=16,
                            num_classes=3)  # fmt: skip
    torch.nn.init.normal_(vit.heads.head.weight, std=0.5)  # torchvision starts it at zero
    return vit.eval()


ATTENTION_PATHS = {  # keywords -> the path taken on the CPU
    "whole": ({"path": "whole"}, "whole"),
    "budget-allows-whole": ({"max_memory": 2**40}, "whole"),
    "budget-refuses-whole": ({"max_memory": 1}, "blockwise"),
    "blockwise": ({"path": "blockwise"}, "blockwise"),
}


@pytest.mark.parametrize("case", list(ATTENTION_PATHS))
@pytest.mark.parametrize("cls", [camkit.CheferRollout, camkit.LeGrad], ids=["cheferrollout", "legrad"])
def test_attention_paths_and_their_choice_make_no_host_sync(cls, case, on_device):
    kwargs, path = ATTENTION_PATHS[case]
    explainer = cls(_tiny_vit(), **kwargs)
    x = torch.rand(3, 3, 16, 16, generator=torch.Generator().manual_seed(7))
    target = torch.tensor([0, 1, 2])
    explainer.explain(x, target)
    with record_syncs() as syncs:
        explanation = explainer.explain(x, target)
    assert [str(s) for s in syncs] == []
    assert explanation.extras["path"] == path and explanation.maps.shape == (3, 16, 16)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("path", ["auto", "whole", "blockwise"])
@pytest.mark.parametrize("cls", [camkit.CheferRollout, camkit.LeGrad], ids=["cheferrollout", "legrad"])
def test_cuda_attention_paths_under_sync_debug_error(cls, path):
    """``path="auto"`` reads the free device memory (``torch.cuda.mem_get_info``) on every call: no sync either."""
    explainer = cls(_tiny_vit().cuda(), path=path)
    x = torch.rand(3, 3, 16, 16, device="cuda")
    target = torch.tensor([0, 1, 2], device="cuda")
    explainer.explain(x, target)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        explanation = explainer.explain(x, target)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert explanation.extras["path"] == ("blockwise" if path == "blockwise" else "whole")

# --- the compiled path and detection matching ------------------------------------------


def test_compiled_replay_makes_no_host_sync(on_device, monkeypatch):
    """``compile=True``: the capture holds no sync (else it would fail on CUDA) and a replay adds none."""
    from camkit.methods._core import replay

    def capture(step, inputs):  # a stand-in for a CUDA graph: the step run again on replay
        static = [t.clone() for t in inputs]
        step(*static)
        with record_syncs() as syncs:
            outputs = list(step(*static))
        assert [str(s) for s in syncs] == []
        return replay.Captured(static, outputs, lambda: [o.copy_(n) for o, n in zip(outputs, step(*static))], None)

    monkeypatch.setattr(replay, "can_capture", lambda device: True)
    monkeypatch.setattr(replay, "capture_graph", capture)
    x, target = torch.rand(3, 3, 8, 8, generator=torch.Generator().manual_seed(7)), torch.tensor([0, 1, 2])
    for key in ("gradcam", "gradcam++", "xgradcam", "layercam", "hirescam"):
        explainer = camkit.get_method(key)(TinyNet().eval(), "conv2", compile=True)
        explainer.explain(x, target)
        with record_syncs() as syncs:
            explanation = explainer.explain(x, target)
        assert [str(s) for s in syncs] == [] and len(explainer._graphs) == 1, key
        assert explanation.maps.shape == (3, 8, 8)


def test_detection_matching_reads_one_flag_per_batch(on_device):
    """Matching torchvision's detections to reference boxes: one read per batch (is any reference unmatched?).

    The images' lists are padded on the device (their lengths are host-side shapes), not walked one by one.
    """
    dets = [
        {"boxes": torch.tensor([[0.0, 0.0, 4.0, 4.0], [4.0, 4.0, 8.0, 8.0]]), "scores": torch.tensor([0.9, 0.4]),
         "labels": torch.tensor([1, 2])},
        {"boxes": torch.tensor([[1.0, 1.0, 5.0, 5.0]]), "scores": torch.tensor([0.7]), "labels": torch.tensor([2])},
        {"boxes": torch.tensor([[2.0, 2.0, 6.0, 6.0], [0.0, 0.0, 3.0, 3.0], [4.0, 4.0, 8.0, 8.0]]),
         "scores": torch.tensor([0.6, 0.5, 0.3]), "labels": torch.tensor([1, 2, 2])},
    ]
    refs = torch.tensor([[4.0, 4.0, 8.0, 8.0], [1.0, 1.0, 5.0, 5.0], [4.0, 4.0, 8.0, 8.0]])
    target = camkit.DetectionTarget(refs, labels=torch.tensor([2, 2, 2]))
    with record_syncs() as syncs:
        scores = target(dets)
    assert [(s.op, s.where.split(" ")[-1]) for s in syncs] == [("aten._local_scalar_dense.default", "(_matched)")]
    assert scores.tolist() == pytest.approx([0.4, 0.7, 0.3])
    assert target.picked().tolist() == [[1], [0], [2]]
    gone = target.for_rows(torch.tensor([0, 1, 2]))([dets[0], {k: v[:0] for k, v in dets[1].items()}, dets[2]])
    assert gone.tolist() == pytest.approx([0.4, 0.0, 0.3])


# --- the per-call paths trimmed for small batches ----------------------------------------


@pytest.mark.parametrize("shape, size", [((2, 8, 8), (32, 32)), ((2, 3, 4, 4), (8, 8)), ((2, 7), (21,)),
                                         ((2, 2, 3, 3), (6, 6, 6)), ((2, 8, 8), (8, 8))])  # fmt: skip
def test_fused_finishing_makes_no_host_sync(shape, size, on_device):
    from camkit.methods._core.output import finish_maps

    raw = torch.rand(*shape, generator=torch.Generator().manual_seed(0))
    raw[0] = 1.0  # a flat map among them
    with record_syncs() as syncs:
        maps, flat = finish_maps([raw], size)
        fused, _ = finish_maps([raw, raw * 2], size)
    assert [str(s) for s in syncs] == []
    assert maps.shape == (*shape[:-len(size)], *size) and flat[0].all() and fused.shape == maps.shape


@pytest.mark.parametrize("spatial_dims", [1, 2, 3])
@pytest.mark.parametrize("cls", [camkit.GradCAM, camkit.GradCAMPlusPlus, camkit.XGradCAM, camkit.LayerCAM,
                                 camkit.HiResCAM])  # fmt: skip
def test_gradient_cams_first_and_kept_calls_make_no_host_sync(cls, spatial_dims, on_device, monkeypatch):
    from camkit.layers import resolve

    model = RankNet(spatial_dims).eval()
    x = rank_input(spatial_dims)
    target = torch.tensor([0, 1, 2])
    layer = None  # the automatic choice: a known family's default layer, checked on the first call
    monkeypatch.setattr(resolve, "default_layer", lambda m: "conv2" if m is model else None)
    with record_syncs() as syncs:
        first = cls(model, layer).explain(x, target)  # the default layer's check, the walk of the modules
        second = cls(model, layer).explain(x, target)  # the check's decision and the walk kept
        again = cls(model, layer)
        again.explain(x, target)
        third = again.explain(x, target)
    assert [str(s) for s in syncs] == []
    assert first.layers == ("conv2",)
    assert torch.equal(first.maps, second.maps) and torch.equal(first.maps, third.maps)
