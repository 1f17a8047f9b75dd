"""camkit.modelload: the model forms, the pickle and TorchScript refusals, preprocessing geometry."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torchvision
from tinyfactory import Tiny

from camkit.modelload import ModelLoadError, Preprocess, load_model, resolve_device
from camkit.modelload.torchvision import preprocess_from_weights as _preprocess_from_weights


def _same_params(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_factory_without_and_with_state_dict(tmp_path):
    plain = load_model("tinyfactory:tiny", device="cpu")
    assert _same_params(plain.model, Tiny(seed=0))
    other = Tiny(seed=7)
    torch.save(other.state_dict(), tmp_path / "w.pt")
    loaded = load_model("tinyfactory:tiny", str(tmp_path / "w.pt"), size=16, device="cpu")
    assert _same_params(loaded.model, other) and not _same_params(loaded.model, Tiny(seed=0))
    assert loaded.preprocess.size == (16, 16) and loaded.preprocess.mean == (0.485, 0.456, 0.406)
    # checkpoints saved from DDP ("module." prefix) and wrapped as {"state_dict": ...} load too
    torch.save({"state_dict": {f"module.{k}": v for k, v in other.state_dict().items()}}, tmp_path / "ddp.pt")
    assert _same_params(load_model("tinyfactory:tiny", str(tmp_path / "ddp.pt"), device="cpu").model, other)


def test_factory_errors_name_the_problem(tmp_path):
    with pytest.raises(ModelLoadError, match=r"cannot import 'no_such_mod'"):
        load_model("no_such_mod:f", device="cpu")
    with pytest.raises(ModelLoadError, match=r"has no attribute 'nope'"):
        load_model("tinyfactory:nope", device="cpu")
    torch.save(torchvision.models.resnet18(weights=None, num_classes=3).state_dict(), tmp_path / "r.pt")
    with pytest.raises(ModelLoadError, match=r"do not fit Tiny"):
        load_model("tinyfactory:tiny", str(tmp_path / "r.pt"), device="cpu")


def test_torchvision_with_state_dict_and_class_count(tmp_path):
    torch.manual_seed(3)
    net = torchvision.models.resnet18(weights=None, num_classes=4)
    torch.save(net.state_dict(), tmp_path / "r18.pt")
    loaded = load_model("torchvision:resnet18", str(tmp_path / "r18.pt"), size=32, device="cpu")
    assert loaded.model.fc.out_features == 4 and _same_params(loaded.model, net)
    assert "num_classes=4 taken from the state dict" in loaded.notes
    with pytest.raises(ModelLoadError, match=r"did you mean resnet18"):
        load_model("torchvision:resnet81", device="cpu")
    with pytest.raises(
        ModelLoadError, match=r"neither a file nor a weights name of resnet18; known names: IMAGENET1K_V1"
    ):
        load_model("torchvision:resnet18", "NOPE", device="cpu")


def test_whole_pickled_model_needs_trust(tmp_path):
    net = Tiny(seed=5)
    torch.save(net, tmp_path / "whole.pt")
    with pytest.raises(ModelLoadError, match=r"whole pickled model: loading it runs code.*--trust-pickle"):
        load_model(str(tmp_path / "whole.pt"), device="cpu")
    loaded = load_model(str(tmp_path / "whole.pt"), trust_pickle=True, device="cpu")
    assert _same_params(loaded.model, net)
    torch.save(net.state_dict(), tmp_path / "sd.pt")
    with pytest.raises(ModelLoadError, match=r"not a model; pass the architecture .* and this file as --weights"):
        load_model(str(tmp_path / "sd.pt"), device="cpu")
    with pytest.raises(ModelLoadError, match=r"not a plain state dict readable with weights_only=True"):
        load_model("tinyfactory:tiny", str(tmp_path / "whole.pt"), device="cpu")


def test_torchscript_is_refused_with_the_reason(tmp_path):
    with warnings.catch_warnings():  # torch deprecates scripting; scripted files still exist in the wild
        warnings.simplefilter("ignore", FutureWarning)
        torch.jit.script(Tiny()).save(str(tmp_path / "scripted.pt"))
    for args in ((str(tmp_path / "scripted.pt"),), ("tinyfactory:tiny", str(tmp_path / "scripted.pt"))):
        with pytest.raises(ModelLoadError, match=r"TorchScript file; .*hooks cannot attach to scripted modules"):
            load_model(*args, trust_pickle=True, device="cpu")
    with pytest.raises(ModelLoadError, match=r"not torchvision:NAME, timm:NAME, hf:PATH_OR_ID, ultralytics:PATH.pt, package.module:factory, or an existing file"):
        load_model(str(tmp_path / "missing.pt"), device="cpu")


def test_preprocess_from_torchvision_weights_without_download():
    pre = _preprocess_from_weights(torchvision.models.ResNet18_Weights.DEFAULT)
    assert pre == Preprocess(
        resize=256, crop=(224, 224), mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225), backend="pil"
    )


def test_box_follows_resize_and_centre_crop():
    # 100 x 200 (H x W): shorter side 100 -> 50, so 50 x 100; centre crop 50 x 50 starts at column 25.
    pre = Preprocess(resize=50, crop=(50, 50), mean=(0.0,) * 3, std=(1.0,) * 3)
    assert pre.output_shape(100, 200) == (50, 50)
    box = pre.transform_boxes(np.array([[40.0, 20.0, 120.0, 60.0]]), 100, 200)
    np.testing.assert_allclose(box, [[40 * 0.5 - 25, 20 * 0.5, 120 * 0.5 - 25, 60 * 0.5]])
    # the same geometry moves the pixels: a white column at x = 100..101 lands at 100 * 0.5 - 25 = 25
    rgb = np.zeros((100, 200, 3), np.uint8)
    rgb[:, 100:102] = 255
    x, shown = pre(rgb)
    assert shown.shape == (50, 50, 3) and int(shown[:, :, 0].sum(axis=0).argmax()) == 25
    assert torch.allclose(x, torch.from_numpy(shown).permute(2, 0, 1).float() / 255, atol=1 / 255)
    mask = np.zeros((100, 200), np.uint8)
    mask[:, 100:] = 1
    assert pre.transform_mask(mask).float().mean(dim=0).tolist() == [0.0] * 25 + [1.0] * 25


def test_size_overrides_and_mean_std(tmp_path):
    pre = load_model(
        "tinyfactory:tiny", size=(12, 20), mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25), device="cpu"
    ).preprocess
    x, _shown = pre(np.full((30, 40, 3), 255, np.uint8))
    assert tuple(x.shape) == (3, 12, 20) and torch.allclose(x, torch.full_like(x, (1 - 0.5) / 0.25))
    with pytest.raises(ModelLoadError, match=r"give both --mean and --std"):
        load_model("tinyfactory:tiny", mean=(0.5, 0.5, 0.5), device="cpu")
    assert resolve_device(None).type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ModelLoadError, match=r"is not a device name"):
        resolve_device("gpu0")


def test_shared_arguments_round_trip(tmp_path):
    import argparse

    from camkit.cli.models import add_model_arguments, model_from_args

    torch.save(Tiny(seed=2).state_dict(), tmp_path / "w.pt")
    full, slim = argparse.ArgumentParser(), argparse.ArgumentParser()
    add_model_arguments(full)
    add_model_arguments(slim, preprocessing=False)  # e.g. camkit layers, which builds its own input
    args = full.parse_args(["--model", "tinyfactory:tiny", "--weights", str(tmp_path / "w.pt"), "--size", "12x20",
                            "--mean", "0", "0", "0", "--std", "1", "1", "1", "--device", "cpu"])  # fmt: skip
    loaded = model_from_args(args)
    assert _same_params(loaded.model, Tiny(seed=2))
    assert loaded.preprocess == Preprocess(size=(12, 20), mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))
    slim_args = slim.parse_args(["--model", "tinyfactory:tiny", "--device", "cpu"])
    assert not hasattr(slim_args, "size") and model_from_args(slim_args).preprocess.size == (224, 224)


def test_demo_specs_load_the_bundled_cnn_and_vit():
    from camkit.bundled.model import ShapesCNN
    from camkit.bundled.shapes import CLASSES

    cnn = load_model("demo", device="cpu")
    vit = load_model("demo-vit", device="cpu")
    assert isinstance(cnn.model, ShapesCNN)
    assert not isinstance(vit.model, ShapesCNN) and any("vit" in n for n in vit.notes)
    assert vit.categories == list(CLASSES) and vit.preprocess.size == cnn.preprocess.size
    x = torch.rand(2, 3, *vit.preprocess.size)
    assert vit.model(x).shape == (2, len(CLASSES))
    with pytest.raises(ModelLoadError, match="--model demo-vit"):
        load_model("demo-vit", weights="/no/such/file.pt", device="cpu")
