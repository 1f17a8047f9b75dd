"""camkit.compat.torchcam's FinerCAM, LeGrad, DeletionInsertionMetric and explain against torchcam 0.5.0."""

from __future__ import annotations

import logging
from functools import partial

import pytest
import torch
from torch import nn
from torchvision.models import VisionTransformer

from camkit.compat.torchcam import explain as our_explain
from camkit.compat.torchcam import methods as ours
from camkit.compat.torchcam import metrics as our_metrics
from camkit.errors import InvalidInputError
from camkit.metrics import auc, deletion_curve, insertion_curve

tc = pytest.importorskip("torchcam.methods")
tc_metrics = pytest.importorskip("torchcam.metrics")
tc_explain = pytest.importorskip("torchcam.explain")


@pytest.fixture(autouse=True)
def _quiet():
    logging.getLogger("torchcam").setLevel(logging.ERROR)


def _model(classes: int = 5) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 6, 3, padding=1), nn.ReLU(), nn.Conv2d(6, 4, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(1), nn.Linear(4, classes),
    ).eval()  # fmt: skip


def _x(batch: int = 2, size: int = 8) -> torch.Tensor:
    return torch.rand(batch, 3, size, size, generator=torch.Generator().manual_seed(1))


def _hooks(model: nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


@pytest.mark.parametrize("base", ["GradCAM", "LayerCAM"])
@pytest.mark.parametrize(("class_idx", "comparison_idx"), [([0, 3], None), ([1, 2], [[0, 4], [3, 4]]), (2, 4)])
def test_finercam_equals_torchcam(base, class_idx, comparison_idx):
    model, x = _model(), _x()
    maps = []
    for lib in (tc, ours):
        with lib.FinerCAM(model, ["0", "2"], base_method=getattr(lib, base), gamma=0.7) as extractor:
            maps.append(extractor(class_idx, model(x), comparison_idx, normalized=False))
        assert _hooks(model) == 0
    for mine, theirs in zip(maps[1], maps[0], strict=True):
        assert theirs.amax() > 0
        torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=0)
    assert all(p.grad is None for p in model.parameters())


def test_finercam_without_a_graph_explains_the_contrast_again():
    """Scores computed under no_grad cannot be backpropagated: the same contrast is explained from the input."""
    model, x = _model(), _x()
    with tc.FinerCAM(model, "2") as extractor:
        theirs = extractor([0, 3], model(x), normalized=False)[0]
    with ours.FinerCAM(model, "2") as extractor:
        with torch.no_grad():
            scores = model(x)
        mine = extractor([0, 3], scores, normalized=False)[0]
    torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=0)


def test_gradcam_backpropagates_the_scores_passed():
    """torchcam's contract: class_idx indexes the scores given (here a softmax), not the raw logits."""
    model, x = _model(), _x()
    maps, grads = [], []
    for lib in (tc, ours):
        with lib.GradCAM(model, "2") as extractor:
            maps.append(extractor([1, 4], model(x).softmax(dim=-1), normalized=False)[0])
            grads.append(extractor.hook_g[0])  # the layer's gradient, stored as torchcam stores it
    torch.testing.assert_close(maps[1], maps[0], atol=1e-6, rtol=0)
    torch.testing.assert_close(grads[1], grads[0], atol=1e-7, rtol=0)
    with ours.GradCAM(model, "2") as extractor:
        logits_map = extractor([1, 4], model(x), normalized=False)[0]
    assert not torch.allclose(logits_map, maps[1], atol=1e-4)  # the softmax's gradient is not the logit's


def _vit() -> nn.Module:
    torch.manual_seed(0)
    return VisionTransformer(
        image_size=16, patch_size=4, num_layers=2, num_heads=2, hidden_dim=8, mlp_dim=16, num_classes=3
    ).eval()


def test_legrad_equals_torchcam_and_leaves_the_model_as_found():
    model = _vit()
    x = torch.rand(2, 3, 16, 16, generator=torch.Generator().manual_seed(2))
    maps = []
    for lib in (tc, ours):
        with lib.LeGrad(model, list(model.encoder.layers)) as extractor:
            maps.append(extractor([0, 2], model(x))[0])
        assert _hooks(model) == 0
    assert maps[1].shape == (2, 4, 4)
    torch.testing.assert_close(maps[1], maps[0], atol=1e-5, rtol=0)
    assert all(p.grad is None for p in model.parameters())
    assert not any(m.training for m in model.modules())


def test_legrad_one_sample_equals_the_batch():
    model = _vit()
    x = torch.rand(2, 3, 16, 16, generator=torch.Generator().manual_seed(2))
    with ours.LeGrad(model, "encoder.layers.encoder_layer_1") as extractor:
        batch = extractor([0, 2], model(x))[0]
        single = [extractor(c, model(x[i : i + 1]))[0] for i, c in enumerate([0, 2])]
    torch.testing.assert_close(torch.cat(single), batch, atol=1e-6, rtol=0)


def test_block_spacing_by_hand():
    """ceil(N / steps) positions a step, the rest at the last: N = 5, steps = 3 gives counts 0, 2, 4, 5."""

    class Sum(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.flatten(1).sum(dim=1, keepdim=True)

    x = torch.tensor([[[[0.3, 0.25, 0.2, 0.15, 0.1]]]])
    fractions, removed = deletion_curve(Sum(), x, x[:, 0], 0, steps=3, spacing="block")
    _, inserted = insertion_curve(Sum(), x, x[:, 0], 0, steps=3, spacing="block")
    torch.testing.assert_close(fractions, torch.tensor([0.0, 0.4, 0.8, 1.0]))
    torch.testing.assert_close(removed, torch.tensor([[1.0, 0.45, 0.1, 0.0]]))
    torch.testing.assert_close(inserted, torch.tensor([[0.0, 0.55, 0.9, 1.0]]))
    torch.testing.assert_close(auc(fractions, removed), torch.tensor([0.41]))
    # any rank: a signal [1, 1, 8] and a volume [1, 1, 2, 2, 2] with steps=3 take 3, 3, then the last 2
    for shape in [(1, 1, 8), (1, 1, 2, 2, 2)]:
        v = torch.arange(8.0, 0.0, -1.0).reshape(shape) / 36
        fr, curve = deletion_curve(Sum(), v, v[:, 0], 0, steps=3, spacing="block")
        torch.testing.assert_close(fr, torch.tensor([0.0, 3 / 8, 6 / 8, 1.0]))
        torch.testing.assert_close(curve, torch.tensor([[1.0, 15 / 36, 3 / 36, 0.0]]))
    with pytest.raises(InvalidInputError, match="spacing"):
        deletion_curve(Sum(), x, x[:, 0], 0, steps=3, spacing="uneven")


def test_deletion_insertion_metric_equals_torchcam():
    model, x = _model(), _x(batch=3)
    summaries = []
    for lib, mod in ((tc, tc_metrics), (ours, our_metrics)):
        with lib.LayerCAM(model, "2") as extractor:
            metric = mod.DeletionInsertionMetric(extractor, partial(torch.softmax, dim=-1), steps=7, batch_size=5)
            metric.update(x, class_idx=[0, 1, 4])
            metric.update(x[:1])
            summaries.append(metric.summary())
        assert _hooks(model) == 0
    assert summaries[1] == pytest.approx(summaries[0], abs=1e-6)


def test_explain_equals_torchcam():
    model, x = _model(), _x(batch=1)
    results = [
        module.explain(model, x, expected_class_idx=1, class_names=list("abcde"), target_layer="2")
        for module in (tc_explain, our_explain)
    ]
    theirs, mine = results
    assert mine.predicted_class_idx == theirs.predicted_class_idx
    assert set(mine.cams) == set(theirs.cams) == {theirs.predicted_class_idx, 1}
    for idx, maps in theirs.cams.items():
        torch.testing.assert_close(mine.cams[idx][0], maps[0], atol=1e-5, rtol=0)
    assert mine.target_layers == ("2",) and mine.method == "GradCAM"
    assert _hooks(model) == 0


@pytest.mark.parametrize("name", ["ScoreCAM", "ISCAM"])
def test_score_cams_with_distinct_per_sample_targets_equal_torchcam(name):
    """Each sample's own target scores its masked copies, even when a chunk mixes samples (batch_size=3)."""
    from operator import itemgetter

    model, x = _model(), _x(batch=2)
    kwargs = {"batch_size": 3, **({"num_samples": 2} if name == "ISCAM" else {})}
    maps = []
    for lib in (tc, ours):
        with getattr(lib, name)(model, "2", **kwargs) as extractor:
            maps.append(extractor(scores=model(x), targets=[itemgetter(0), itemgetter(3)], normalized=False)[0])
    torch.testing.assert_close(maps[1], maps[0], atol=1e-5, rtol=0)
    with getattr(ours, name)(model, "2", **kwargs) as extractor:  # the batch equals its samples one by one
        alone = [extractor(scores=model(x[i : i + 1]), targets=fn, normalized=False)[0] for i, fn in
                 enumerate([itemgetter(0), itemgetter(3)])]  # fmt: skip
    torch.testing.assert_close(torch.cat(alone), maps[1], atol=1e-6, rtol=0)


def test_gradcam_reads_the_layer_output_before_an_inplace_op():
    """The scores are backpropagated to the layer's own output, not to the in-place ReLU's that follows it."""
    torch.manual_seed(1)
    net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d(1), nn.Flatten(1),
                        nn.Linear(4, 2)).eval()  # fmt: skip
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(3))
    with ours.GradCAM(net, "0") as extractor:
        mine = extractor(1, net(x), normalized=False)[0]
    acts = net[0](x).detach().requires_grad_(True)
    (grads,) = torch.autograd.grad(net[2:](torch.relu(acts))[:, 1].sum(), acts)
    expected = torch.relu((grads.mean(dim=(2, 3), keepdim=True) * acts).sum(dim=1)).detach()
    torch.testing.assert_close(mine, expected, atol=1e-6, rtol=0)
    assert (acts < 0).any()  # the conv's output has negative values that the in-place ReLU would have zeroed
