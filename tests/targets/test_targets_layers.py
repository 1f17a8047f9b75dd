"""Targets, layer resolution, the registry and the error family."""

from __future__ import annotations

import pytest
import torch
from models import TinyNet, tiny_input
from torch import nn

import camkit

LOGITS = torch.tensor([[0.1, 0.9, -1.0], [2.0, 1.0, 0.5]])


def test_target_kinds_select_the_right_scores():
    classes, scores = camkit.resolve_target(None, LOGITS)
    assert classes.tolist() == [1, 0] and scores.tolist() == pytest.approx([0.9, 2.0])
    classes, scores = camkit.resolve_target(2, LOGITS)
    assert classes.tolist() == [2, 2] and scores.tolist() == pytest.approx([-1.0, 0.5])
    classes, scores = camkit.resolve_target([0, 2], LOGITS)
    assert scores.tolist() == pytest.approx([0.1, 0.5])
    classes, scores = camkit.resolve_target(torch.tensor([[2, 0], [1, 1]]), LOGITS)
    torch.testing.assert_close(scores, torch.tensor([[-1.0, 0.1], [1.0, 1.0]]))
    classes, scores = camkit.resolve_target(lambda out: out[:, 0] - out[:, 1], LOGITS)
    assert classes is None and scores.tolist() == pytest.approx([-0.8, 1.0])


@pytest.mark.parametrize(
    ("target", "message"),
    [
        (3, "out of range"),
        (-1, "out of range"),
        ([0], "batch has 2 samples"),
        ([0, 1, 2], "batch has 2 samples"),
        ([0, 5], "class 5 is out of range"),
        (torch.tensor([0.0, 1.0]), "integers"),
        (torch.tensor([0, 1], dtype=torch.complex64), "integers, got dtype torch.complex64"),
        (True, "not a bool"),
        (lambda out: out.sum(), "callable target must return"),
    ],
)
def test_bad_targets_raise_clear_errors(target, message):
    with pytest.raises(camkit.InvalidTargetError, match=message):
        camkit.resolve_target(target, LOGITS)


def test_short_target_list_never_gives_zero_maps():
    with pytest.raises(camkit.InvalidTargetError):
        camkit.GradCAM(TinyNet(), "conv2")(tiny_input(batch=3), [1])


def test_callable_target_equals_class_target():
    model = TinyNet().eval()
    x = tiny_input()
    by_class = camkit.GradCAM(model, "conv2")(x, 2)
    by_fn = camkit.GradCAM(model, "conv2")(x, lambda out: out[:, 2])
    torch.testing.assert_close(by_class, by_fn)


def test_non_tensor_outputs_need_a_selector():
    class DictOut(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = TinyNet()

        def forward(self, x):
            return {"scores": self.net(x), "aux": x.mean()}  # no "logits" key: nothing is chosen by default

    model = DictOut().eval()
    with pytest.raises(camkit.OutputSelectionError, match="'scores': Tensor\\[3, 5\\]"):
        camkit.GradCAM(model, "net.conv2")(tiny_input())
    got = camkit.GradCAM(model, "net.conv2", output="scores")(tiny_input(), 1)
    torch.testing.assert_close(got, camkit.GradCAM(model.net, "conv2")(tiny_input(), 1))
    with pytest.raises(camkit.OutputSelectionError, match="does not select"):
        camkit.GradCAM(model, "net.conv2", output="nope")(tiny_input())


def test_unknown_layer_lists_close_names():
    with pytest.raises(camkit.LayerNotFoundError) as info:
        camkit.GradCAM(TinyNet(), "conv3")
    text = str(info.value)
    assert "no layer 'conv3'" in text and "'conv2'" in text and "list_layers" in text
    assert isinstance(info.value, KeyError) and isinstance(info.value, camkit.CamkitError)
    assert not text.startswith("\"")


def test_layer_as_module_and_foreign_module():
    model = TinyNet()
    assert camkit.GradCAM(model, model.conv2).layers()[0][0] == "conv2"
    with pytest.raises(camkit.LayerNotFoundError, match="not part of the model"):
        camkit.GradCAM(model, nn.Conv2d(1, 1, 1))


def test_data_parallel_prefix_resolves():
    model = TinyNet().eval()
    wrapped = nn.DataParallel(model)
    assert camkit.resolve_layers(wrapped, "conv2")[0][0] == "module.conv2"


def test_list_layers_shapes_in_execution_order():
    infos = camkit.list_layers(TinyNet(), tiny_input(batch=1))
    assert [(i.name, i.output_shape) for i in infos] == [
        ("conv1", (1, 4, 8, 8)),
        ("bn1", (1, 4, 8, 8)),
        ("relu", (1, 4, 8, 8)),
        ("conv2", (1, 6, 8, 8)),
        ("relu2", (1, 6, 8, 8)),
        ("pool", (1, 6, 1, 1)),
        ("fc", (1, 5)),
    ]
    assert camkit.auto_layer(TinyNet(), tiny_input())[0] == "relu2"


def test_registry_and_unknown_method():
    assert {"gradcam", "gradcam++", "xgradcam", "hirescam", "layercam"} <= set(camkit.list_methods())
    assert camkit.get_method("GradCAM") is camkit.GradCAM
    with pytest.raises(camkit.UnknownMethodError, match="did you mean 'gradcam'") as info:
        camkit.get_method("gradcan")
    assert isinstance(info.value, KeyError)


def test_bad_inputs():
    explainer = camkit.GradCAM(TinyNet(), "conv2")
    with pytest.raises(camkit.InvalidInputError, match="add a batch dimension"):
        explainer(tiny_input()[0])
    with pytest.raises(camkit.InvalidInputError, match="floating-point"):
        explainer(torch.zeros(1, 3, 8, 8, dtype=torch.uint8))
    with pytest.raises(TypeError, match=r"nn\.Module"):
        camkit.GradCAM(lambda x: x, "conv2")  # type: ignore[arg-type]


def test_keep_mode_runs_in_callers_mode():
    model = TinyNet().train()
    x = tiny_input(batch=4)
    eval_maps = camkit.GradCAM(model, "conv2")(x)
    assert model.training and model.bn1.training
    train_maps = camkit.GradCAM(model, "conv2", keep_mode=True)(x)
    assert not torch.allclose(eval_maps, train_maps)  # batch statistics differ from running ones
    torch.testing.assert_close(eval_maps, camkit.GradCAM(TinyNet().eval(), "conv2")(x))


def test_flat_maps_are_zero_not_nan():
    class Dead(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 2, 1)
            self.fc = nn.Linear(2, 2)
            with torch.no_grad():
                self.conv.weight.zero_()
                self.conv.bias.fill_(-1.0)

        def forward(self, x):
            return self.fc(torch.relu(self.conv(x)).mean(dim=(2, 3)))

    explanation = camkit.GradCAM(Dead(), "conv").explain(tiny_input())
    assert explanation.flat.all()
    assert torch.equal(explanation.maps, torch.zeros(3, 8, 8))
