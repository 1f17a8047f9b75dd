"""The layer rule, layouts from evidence, the raw-map contract, EigenCAM, bad inputs and threads (issue 14).

Models are built from code or from timm / transformers configs (random init, tiny, no downloads).
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import camkit
from camkit.functional import flat_maps
from camkit.functional.perturbation import eigen_projection
from tests.models import TinyNet

timm = pytest.importorskip("timm")
transformers = pytest.importorskip("transformers")


def _seeded(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def hand_gradcam(model: nn.Module, layer: nn.Module, x: torch.Tensor, target: torch.Tensor, to_nchw) -> torch.Tensor:
    """Grad-CAM written out: capture, autograd.grad, mean-gradient weights, ReLU, upsample, min-max."""
    store = {}
    handle = layer.register_forward_hook(lambda m, i, o: store.setdefault("a", o))
    try:
        out = model(x)
    finally:
        handle.remove()
    out = out.logits if hasattr(out, "logits") else out
    (grad,) = torch.autograd.grad(out.gather(1, target[:, None]).sum(), store["a"])
    acts, grads = to_nchw(store["a"].detach()), to_nchw(grad)
    raw = (grads.mean(dim=(2, 3), keepdim=True) * acts).sum(dim=1).clamp_min(0)
    up = F.interpolate(raw[:, None], size=x.shape[-2:], mode="bilinear", align_corners=False)[:, 0]
    low = up.amin(dim=(1, 2), keepdim=True)
    return (up - low) / (up.amax(dim=(1, 2), keepdim=True) - low)


# --- the automatic layer ------------------------------------------------------------------------


def tiny_timm_vit(**kw):
    torch.manual_seed(0)
    return timm.create_model(
        "vit_tiny_patch16_224", pretrained=False, num_classes=4, img_size=32, patch_size=8, depth=2, **kw
    ).eval()


@pytest.mark.heavy
@pytest.mark.parametrize("batch", [2, 3])
def test_timm_vit_gets_the_last_norm1_not_a_module_inside_attention(batch):
    model = tiny_timm_vit()
    x = torch.randn(batch, 3, 32, 32, generator=_seeded(1))
    explainer = camkit.GradCAM(model)
    explanation = explainer.explain(x, torch.arange(batch) % 4)
    assert explanation.layers == ("blocks.1.norm1",)
    assert explanation.raw.shape == (batch, 4, 4)
    expected = hand_gradcam(
        model, model.blocks[1].norm1, x, torch.arange(batch) % 4,
        lambda t: t[:, 1:].reshape(t.shape[0], 4, 4, t.shape[2]).permute(0, 3, 1, 2),
    )
    torch.testing.assert_close(explanation.maps, expected, atol=1e-4, rtol=0)


def test_generic_rule_skips_attention_patch_embedding_and_what_follows_the_last_attention():
    model = tiny_timm_vit()
    names = [n for n, _ in camkit.layers.qualifying_layers(model, torch.randn(1, 3, 32, 32))]
    assert names[-1] == "blocks.1.norm1"
    assert not any(".attn" in n for n in names)  # q/k/v, q_norm/k_norm live there
    assert "blocks.1.mlp.fc2" not in names and "norm" not in names  # patch tokens get no gradient there
    assert "patch_embed.proj" in names  # it qualifies, but later layers do too


@pytest.mark.heavy
@pytest.mark.parametrize("batch", [2, 3])
def test_hf_swin_is_never_explained_at_its_position_bias(batch):
    config = transformers.SwinConfig(
        image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[1, 2], window_size=4, num_labels=3
    )
    torch.manual_seed(0)
    model = transformers.SwinForImageClassification(config).eval()
    x = torch.randn(batch, 3, 32, 32, generator=_seeded(2))
    explanation = camkit.GradCAM(model, output="logits").explain(x, torch.zeros(batch, dtype=torch.long))
    (layer,) = explanation.layers
    assert "relative_position" not in layer and "attention" not in layer
    assert explanation.raw.shape[0] == batch and explanation.maps.shape == (batch, 32, 32)


@pytest.mark.parametrize(
    ("make", "expect"),
    [
        (
            lambda: transformers.ViTForImageClassification(
                transformers.ViTConfig(
                    image_size=32, patch_size=8, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=32, num_labels=3,
                )
            ),
            "layers.1.layernorm_before",
        ),
        (
            lambda: transformers.CLIPVisionModel(
                transformers.CLIPVisionConfig(
                    image_size=32, patch_size=8, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=32,
                )
            ),
            "layers.1.layer_norm1",
        ),
    ],
    ids=["hf-vit", "hf-clip-vision"],
)
def test_hf_token_models_are_not_explained_at_the_patch_embedding(make, expect):
    torch.manual_seed(0)
    model = make().eval()
    output = "logits" if hasattr(model, "classifier") else "pooler_output"
    explainer = camkit.GradCAM(model, output=output)
    x = torch.randn(2, 3, 32, 32, generator=_seeded(3))
    target = (lambda out: out.sum(dim=1)) if output == "pooler_output" else torch.tensor([0, 1])
    explanation = explainer.explain(x, target)
    assert explanation.layers[0].endswith(expect), explanation.layers
    assert "patch_embedding" not in explanation.layers[0] and "embeddings" not in explanation.layers[0]


def test_no_qualifying_layer_raises_and_says_why():
    # A head initialised to zero (as timm does for MLP-Mixer) gives the score no gradient anywhere.
    dead = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3))
    nn.init.zeros_(dead[4].weight)
    with pytest.raises(camkit.LayerNotFoundError, match=r"gradient is exactly zero.*layer="):
        camkit.GradCAM(dead)(torch.randn(2, 3, 8, 8))
    mlp = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 4))
    with pytest.raises(camkit.LayerNotFoundError, match="no layer's output is a spatial map"):
        camkit.GradCAM(mlp)(torch.randn(2, 3, 8, 8))


# --- layouts from evidence ----------------------------------------------------------------------


@pytest.mark.heavy
def test_container_layout_comes_from_what_it_returns_not_its_last_leaf():
    torch.manual_seed(0)
    model = timm.create_model("convnext_atto", pretrained=False, num_classes=3).eval()
    x = torch.randn(2, 3, 64, 64, generator=_seeded(4))
    target = torch.tensor([0, 2])
    stage = camkit.GradCAM(model, "stages.3").explain(x, target)
    block = camkit.GradCAM(model, "stages.3.blocks.1").explain(x, target)
    torch.testing.assert_close(stage.maps, block.maps)
    expected = hand_gradcam(model, model.stages[3], x, target, lambda t: t)
    torch.testing.assert_close(stage.maps, expected, atol=1e-4, rtol=0)


def test_hf_convnext_stage_is_channel_first():
    config = transformers.ConvNextConfig(hidden_sizes=[8, 16, 24, 32], depths=[1, 1, 1, 2], num_labels=3)
    torch.manual_seed(0)
    model = transformers.ConvNextForImageClassification(config).eval()
    x = torch.randn(3, 3, 64, 64, generator=_seeded(5))
    target = torch.tensor([0, 1, 2])
    stage = camkit.GradCAM(model, "convnext.encoder.stages.3", output="logits").explain(x, target)
    expected = hand_gradcam(model, model.convnext.encoder.stages[3], x, target, lambda t: t)
    torch.testing.assert_close(stage.maps, expected, atol=1e-4, rtol=0)


@pytest.mark.heavy
def test_timm_dynamic_patch_embed_is_read_as_channel_last():
    model = tiny_timm_vit(dynamic_img_size=True)
    x = torch.randn(2, 3, 32, 48, generator=_seeded(6))
    target = torch.tensor([1, 3])
    explanation = camkit.GradCAM(model, "patch_embed").explain(x, target)
    assert explanation.raw.shape == (2, 4, 6)
    expected = hand_gradcam(model, model.patch_embed, x, target, lambda t: t.permute(0, 3, 1, 2))
    torch.testing.assert_close(explanation.maps, expected, atol=1e-4, rtol=0)


def test_ambiguous_layout_asks_for_reshape():
    class Square(nn.Module):  # [B, 8, 8, 8] on a 64x64 input fits both layouts; its type says nothing
        def __init__(self):
            super().__init__()
            self.body = nn.Conv2d(3, 8, 8, stride=8)

        def forward(self, x):
            return self.body(x)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.square = Square()
            self.fc = nn.Linear(8, 2)

        def forward(self, x):
            return self.fc(self.square(x).mean(dim=(2, 3)))

    with pytest.raises(camkit.InvalidInputError, match=r"fits both.*reshape="):
        camkit.GradCAM(Net(), "square")(torch.randn(2, 3, 64, 64))
    maps = camkit.GradCAM(Net(), "square", reshape=lambda t: t)(torch.randn(2, 3, 64, 64))
    assert maps.shape == (2, 64, 64)


# --- the raw-map contract -----------------------------------------------------------------------


def test_flatness_is_decided_on_the_raw_map_with_a_relative_tolerance():
    raw = torch.full((3, 4, 4), 1.44e-6)
    raw[0, 1, 1] += 1e-13  # a spread of 1e-13 on a map of 1.44e-6: rounding
    raw[1] *= 1 + 1e-7 * torch.randn(4, 4, generator=_seeded(7))  # relative noise of 1e-7
    raw[2, 0, 0] = 2e-6  # a real bump
    maps, flat = camkit.methods._core.output.finish_maps([raw], (8, 8))
    assert flat.tolist() == [True, True, False]
    assert torch.equal(maps[:2], torch.zeros(2, 8, 8))
    assert maps[2].max() == 1 and maps[2].min() == 0
    assert flat_maps(torch.zeros(1, 2, 2)).tolist() == [True]


@pytest.mark.heavy
def test_one_by_one_layers_are_refused_naming_the_last_spatial_layer():
    from torchvision.models import resnet18

    torch.manual_seed(0)
    model = resnet18(num_classes=3).eval()
    x = torch.randn(2, 3, 32, 32, generator=_seeded(8))
    for layer in ("layer4", "avgpool"):
        with pytest.raises(camkit.InvalidInputError, match=r"1x1 output.*last layer with a spatial output here is 'layer3'"):
            camkit.GradCAM(model, layer)(x)
    # The automatic choice does not fail: the family default (layer4) is 1x1 here, so the
    # generic rule picks the last spatial layer, with a warning.
    with pytest.warns(camkit.CamkitWarning, match=r"default layer 'layer4' gives no spatial map.*using 'layer3'"):
        assert camkit.GradCAM(model).explain(x).layers == ("layer3",)


def test_a_layer_that_ignores_the_batch_is_refused():
    class Biased(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding=1)
            self.table = nn.Conv2d(1, 4, 1)  # runs on a constant [1, 1, 8, 8]: a position table
            self.fc = nn.Linear(4, 2)

        def forward(self, x):
            bias = self.table(torch.ones(1, 1, 8, 8))
            return self.fc((self.conv(x) + bias).mean(dim=(2, 3)))

    with pytest.raises(camkit.InvalidInputError, match=r"layer 'table'.*does not follow the batch"):
        camkit.GradCAM(Biased(), "table")(torch.randn(3, 3, 8, 8))


# --- EigenCAM and eigen_smooth against pytorch-grad-cam -----------------------------------------


def _signed_like_camkit(projection: torch.Tensor, acts: torch.Tensor) -> torch.Tensor:
    # camkit's deterministic sign: the projection correlates positively with the channel-summed map.
    total = acts.sum(dim=1).flatten(1)
    agreement = (projection.flatten(1) * (total - total.mean(dim=1, keepdim=True))).sum(dim=1)
    return projection * torch.where(agreement < 0, -1.0, 1.0)[:, None, None]


def _minmax(maps: torch.Tensor) -> torch.Tensor:
    low = maps.amin(dim=(1, 2), keepdim=True)
    return (maps - low) / (maps.amax(dim=(1, 2), keepdim=True) - low)


def test_eigencam_is_the_relu_of_the_signed_projection_as_pytorch_grad_cam():
    pgc = pytest.importorskip("pytorch_grad_cam")
    from pytorch_grad_cam.utils.svd_on_activations import get_2d_projection

    model, x = TinyNet().eval(), torch.randn(3, 3, 8, 8, generator=_seeded(9))
    with torch.no_grad():
        acts = model.conv2(model.relu(model.bn1(model.conv1(x))))
    projection = torch.from_numpy(get_2d_projection(acts.numpy().copy()))
    ours = camkit.EigenCAM(model, "conv2")(x)
    torch.testing.assert_close(ours, _minmax(_signed_like_camkit(projection, acts).clamp_min(0)), atol=1e-4, rtol=0)
    anchor = torch.from_numpy(pgc.EigenCAM(model, [model.conv2])(input_tensor=x, targets=None))
    signed = _signed_like_camkit(projection, acts)
    for i in range(3):
        # The anchor keeps whatever sign its SVD gave: it shows the ReLU of one side or the other.
        side = 1.0 if (projection[i] * signed[i]).sum() > 0 else -1.0
        torch.testing.assert_close(anchor[i], _minmax((side * signed[i : i + 1]).clamp_min(0))[0], atol=1e-4, rtol=0)
        if side > 0:
            torch.testing.assert_close(ours[i], anchor[i], atol=1e-4, rtol=0)


def _conv2_acts_and_grads(model: TinyNet, x: torch.Tensor, targets: torch.Tensor):
    store = {}
    handle = model.conv2.register_forward_hook(lambda m, i, o: store.setdefault("a", o))
    try:
        out = model(x)
    finally:
        handle.remove()
    (grad,) = torch.autograd.grad(out.gather(1, targets[:, None]).sum(), store["a"])
    return store["a"].detach(), grad


@pytest.mark.parametrize(
    ("method", "atol"),
    # Grad-CAM++: pytorch-grad-cam adds 1e-6 to the alpha denominators, camkit does not (eq. 19 exactly);
    # with this tiny net's gradients (~1e-2, so G^2 ~ 1e-4) that moves alpha by about 1%.
    [("GradCAM", 1e-4), ("HiResCAM", 1e-4), ("LayerCAM", 1e-4), ("XGradCAM", 1e-4), ("GradCAMPlusPlus", 1e-2)],
)
def test_eigen_smooth_matches_pytorch_grad_cam(method, atol):
    pgc = pytest.importorskip("pytorch_grad_cam")
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget
    from pytorch_grad_cam.utils.svd_on_activations import get_2d_projection

    model, x = TinyNet().eval(), torch.randn(2, 3, 8, 8, generator=_seeded(10))
    targets = torch.tensor([1, 3])
    explainer = getattr(camkit, method)(model, "conv2", eigen_smooth=True)
    ours = explainer(x, targets)
    plain = getattr(camkit, method)(model, "conv2")(x, targets)
    assert not torch.allclose(ours, plain, atol=1e-3)  # it does change the map
    # By hand: the first principal component of the method's weighted activations, camkit's sign, ReLU.
    acts, grads = _conv2_acts_and_grads(model, x, targets)
    contributions = explainer.contributions(acts, grads)
    projection = torch.from_numpy(get_2d_projection(contributions.numpy().copy()))
    signed = _signed_like_camkit(projection, contributions)
    torch.testing.assert_close(ours, _minmax(signed.clamp_min(0)), atol=1e-4, rtol=0)
    anchor = getattr(pgc, method)(model, [model.conv2])(
        input_tensor=x, targets=[ClassifierOutputTarget(int(t)) for t in targets], eigen_smooth=True
    )
    anchor = torch.from_numpy(anchor)
    for i in range(2):
        # The anchor keeps whatever sign its own SVD gave (its call recomputes the weighted
        # activations, and a rounding-level difference can flip an SVD's sign between LAPACK
        # builds): it shows the ReLU of one side or the other, never a third map.
        sides = {side: _minmax((side * signed[i : i + 1]).clamp_min(0))[0] for side in (1.0, -1.0)}
        gaps = {side: float((anchor[i] - expected).abs().max()) for side, expected in sides.items()}
        side = min(gaps, key=lambda s: gaps[s])
        assert gaps[side] <= atol, f"the anchor's map is neither side's: gaps {gaps}"
        assert gaps[-side] > 0.1, "the two sides' maps must differ for this check to mean anything"
        if side > 0:
            torch.testing.assert_close(ours[i], anchor[i], atol=atol, rtol=0)


def test_eigen_smooth_is_refused_where_it_means_nothing():
    with pytest.raises(camkit.InvalidInputError, match="eigen_smooth"):
        camkit.EigenCAM(TinyNet().eval(), "conv2", eigen_smooth=True)(torch.randn(1, 3, 8, 8))


def test_eigen_smooth_on_forward_cams_projects_the_weighted_activations():
    model, x = TinyNet().eval(), torch.randn(2, 3, 8, 8, generator=_seeded(11))
    explanation = camkit.CAM(model, "relu2", eigen_smooth=True).explain(x, torch.tensor([0, 4]))
    with torch.no_grad():
        acts = model.relu2(model.conv2(model.relu(model.bn1(model.conv1(x)))))
    weights = model.fc.weight[torch.tensor([0, 4])]
    expected = eigen_projection(weights[:, :, None, None] * acts).clamp_min(0)
    torch.testing.assert_close(explanation.raw, expected, atol=1e-5, rtol=1e-4)


# --- bad inputs ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_other_input_dtypes_are_cast_to_the_models(dtype):
    model, x = TinyNet().eval(), torch.randn(2, 3, 8, 8, generator=_seeded(12))
    reference = camkit.GradCAM(model, "conv2")(x.to(dtype).float(), 1)
    maps = camkit.GradCAM(model, "conv2")(x.to(dtype), 1)
    assert maps.dtype == torch.float32
    torch.testing.assert_close(maps, reference)


def test_nan_and_inf_inputs_are_refused_naming_the_samples():
    model, x = TinyNet().eval(), torch.randn(4, 3, 8, 8)
    x[1, 0, 0, 0] = float("nan")
    x[3, 2, 1, 1] = float("inf")
    for method in ("gradcam", "saliency", "scorecam", "integratedgradients"):
        with pytest.raises(camkit.InvalidInputError, match=r"sample\(s\) \[1, 3\] of 4"):
            camkit.get_method(method)(model)(x)


def test_numpy_integer_targets_work_and_wrong_types_are_explained():
    model, x = TinyNet().eval(), torch.randn(2, 3, 8, 8, generator=_seeded(13))
    explainer = camkit.GradCAM(model, "conv2")
    torch.testing.assert_close(explainer(x, np.int64(1)), explainer(x, 1))
    torch.testing.assert_close(explainer(x, np.array([1, 2])), explainer(x, [1, 2]))
    with pytest.raises(camkit.InvalidTargetError, match=r"string.*class indices"):
        explainer(x, "cat")
    with pytest.raises(camkit.InvalidTargetError, match="not an integer"):
        explainer(x, 1.0)
    with pytest.raises(TypeError, match=r"layer must be a dotted name.*got int 4"):
        camkit.GradCAM(model, 4)
    with pytest.raises(TypeError, match="each layer must be"):
        camkit.GradCAM(model, ["conv2", 4])


# --- threads and modes --------------------------------------------------------------------------


def test_concurrent_calls_are_correct():
    model = TinyNet().train()  # train mode: the calls must not hand each other train flags either
    inputs = [torch.randn(2, 3, 8, 8, generator=_seeded(20 + i)) for i in range(30)]
    one, two = camkit.GradCAM(model, "conv2"), camkit.LayerCAM(model, "conv2")
    expected_one = [one(x, 1) for x in inputs]
    expected_two = [two(x, 2) for x in inputs]
    barrier = threading.Barrier(3)

    def run(explainer, target, expected):
        barrier.wait()
        return [torch.allclose(explainer(x, target), e) for x, e in zip(inputs, expected)]

    with ThreadPoolExecutor(3) as pool:
        jobs = [
            pool.submit(run, one, 1, expected_one),
            pool.submit(run, one, 1, expected_one),  # one explainer from two threads
            pool.submit(run, two, 2, expected_two),  # and a second one on the same model
        ]
        results = [job.result() for job in jobs]
    assert all(all(r) for r in results)
    assert all(m.training for m in model.modules())
    assert all(not m._forward_hooks for m in model.modules())


def test_keep_mode_in_train_restores_batchnorm_statistics():
    model = TinyNet().train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    camkit.GradCAM(model, "conv2", keep_mode=True)(torch.randn(4, 3, 8, 8) + 3, 1)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert model.training and model.bn1.training
