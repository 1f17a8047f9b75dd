"""Models from where people keep them: timm names, Hugging Face folders, torchvision presets, checkpoints.

Each model is built from a small config (random init), saved locally the way its library saves it,
and loaded back by camkit; the prediction and confidence camkit reports on a non-square photo
(scikit-image's chelsea, 300 x 451) must equal those of the library's own pipeline.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torchvision

import camkit
from camkit.cli import main
from camkit.modelload import ModelLoadError, Preprocess, load_model

pytest.importorskip("safetensors")
skdata = pytest.importorskip("skimage.data")
PIL_Image = pytest.importorskip("PIL.Image")


@pytest.fixture(scope="module")
def photo(tmp_path_factory):
    """The photo as a PIL image and as a lossless PNG (the same pixels reach both pipelines)."""
    rgb = skdata.chelsea()
    assert rgb.shape[0] != rgb.shape[1]
    path = tmp_path_factory.mktemp("photo") / "chelsea.png"
    camkit.save_png(path, rgb)
    return PIL_Image.fromarray(rgb), path


def _explain(model_args, photo_path, out, extra=()):
    code = main(["explain", str(photo_path), *model_args, "--device", "cpu", "--out", str(out), *extra])
    assert code == 0
    return json.loads((out / "manifest.json").read_text())


def _agree(reference_logits, camkit_x, camkit_model, manifest):
    """camkit's input gives the library's logits; the manifest's prediction and confidence are the library's."""
    with torch.no_grad():
        out = camkit_model.eval()(camkit_x[None])
    logits = out.logits if hasattr(out, "logits") else out
    torch.testing.assert_close(logits, reference_logits, atol=1e-5, rtol=1e-5)
    probs = reference_logits.softmax(dim=1)[0]
    entry = manifest["images"][0]
    assert entry["error"] == ""
    assert entry["prediction"] == int(probs.argmax())
    assert entry["confidence"] == pytest.approx(float(probs.max()), abs=1e-5)


@pytest.mark.heavy
@pytest.mark.parametrize("name", ["test_resnet", "test_vit"])  # bilinear and bicubic; mean/std 0.5, crop_pct 0.95
def test_timm_safetensors_matches_timms_own_pipeline(name, photo, tmp_path):
    timm = pytest.importorskip("timm")
    from safetensors.torch import save_file

    torch.manual_seed(0)
    net = timm.create_model(name, num_classes=5).eval()
    save_file(net.state_dict(), tmp_path / "model.safetensors")
    config = timm.data.resolve_data_config({}, model=net)
    reference_x = timm.data.create_transform(**config)(photo[0])
    with torch.no_grad():
        reference = net(reference_x[None])

    model, preprocess = load_model(f"timm:{name}", weights=str(tmp_path / "model.safetensors"), device="cpu")
    assert "num_classes=5 taken from the state dict" in load_model(
        f"timm:{name}", weights=str(tmp_path / "model.safetensors"), device="cpu"
    ).notes
    assert preprocess.describe()["origin"] == "timm data config"
    assert preprocess.interpolation == config["interpolation"] and preprocess.mean == (0.5, 0.5, 0.5)
    x, shown = preprocess(photo[0])
    torch.testing.assert_close(x, reference_x, atol=1e-6, rtol=0)  # the same pixels, up to float rounding
    assert shown.shape == (160, 160, 3)
    for other in (np.asarray(photo[0]), torch.from_numpy(np.asarray(photo[0]).copy()).permute(2, 0, 1)):
        assert torch.equal(preprocess(other)[0], x)  # a PIL image, an array and a tensor give one input
    manifest = _explain(["--model", f"timm:{name}", "--weights", str(tmp_path / "model.safetensors")], photo[1],
                        tmp_path / "out")  # fmt: skip
    _agree(reference, x, model, manifest)
    assert manifest["model"]["preprocess"]["resize"] == 168 and manifest["model"]["preprocess"]["crop"] == [160, 160]
    assert manifest["model"]["preprocess"]["backend"] == "pil"


def _hf_folder(root, processor):
    transformers = pytest.importorskip("transformers")
    config = transformers.ViTConfig(
        image_size=64, patch_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=37, num_labels=3, id2label={0: "cat", 1: "dog", 2: "fox"},
        label2id={"cat": 0, "dog": 1, "fox": 2},
    )  # fmt: skip
    torch.manual_seed(1)
    net = transformers.ViTForImageClassification(config).eval()
    net.save_pretrained(root)  # safetensors by default
    processor.save_pretrained(root)
    assert (root / "model.safetensors").is_file() and (root / "preprocessor_config.json").is_file()
    return net


HF_PROCESSORS = {
    # resize straight to height x width, bicubic, statistics that are not ImageNet's
    "height-width": {
        "size": {"height": 64, "width": 64}, "resample": 3, "image_mean": [0.3, 0.5, 0.7],
        "image_std": [0.2, 0.3, 0.4],
    },
    # shortest edge, then a centre crop (HF floors the crop offset), bilinear
    "shortest-edge-crop": {
        "size": {"shortest_edge": 72}, "do_center_crop": True, "crop_size": {"height": 64, "width": 64},
        "resample": 2, "image_mean": [0.3, 0.5, 0.7], "image_std": [0.2, 0.3, 0.4],
    },
}


@pytest.mark.parametrize("kind", sorted(HF_PROCESSORS))
def test_hf_folder_matches_transformers_pipeline(kind, photo, tmp_path):
    transformers = pytest.importorskip("transformers")
    folder = tmp_path / "vit"
    net = _hf_folder(folder, transformers.ViTImageProcessor(**HF_PROCESSORS[kind]))
    processor = transformers.AutoImageProcessor.from_pretrained(folder)
    inputs = processor(photo[0], return_tensors="pt")
    with torch.no_grad():
        reference = net(**inputs).logits

    loaded = load_model(f"hf:{folder}", device="cpu")
    assert loaded.categories == ["cat", "dog", "fox"]
    assert loaded.preprocess.mean == (0.3, 0.5, 0.7) and loaded.preprocess.std == (0.2, 0.3, 0.4)
    x, _ = loaded.preprocess(photo[0])
    torch.testing.assert_close(x, inputs["pixel_values"][0], atol=2e-6, rtol=0)
    manifest = _explain(["--model", f"hf:{folder}"], photo[1], tmp_path / "out")
    _agree(reference, x, loaded.model, manifest)
    assert manifest["images"][0]["prediction_name"] == ["cat", "dog", "fox"][manifest["images"][0]["prediction"]]
    assert manifest["model"]["preprocess"]["origin"] == "Hugging Face ViTImageProcessor"


def test_hf_preprocessing_is_recorded_in_run_json(photo, tmp_path):
    transformers = pytest.importorskip("transformers")
    folder = tmp_path / "vit"
    _hf_folder(folder, transformers.ViTImageProcessor(**HF_PROCESSORS["shortest-edge-crop"]))
    (tmp_path / "data").mkdir()
    camkit.save_png(tmp_path / "data" / "a.png", skdata.chelsea())
    code = main(["audit", str(tmp_path / "data"), "--model", f"hf:{folder}", "--device", "cpu", "--workers", "0",
                 "--no-progress", "--out", str(tmp_path / "run")])  # fmt: skip
    assert code == 0
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["preprocess"]["resize"] == 72 and run["preprocess"]["crop"] == [64, 64]
    assert run["preprocess"]["mean"] == [0.3, 0.5, 0.7] and run["preprocess"]["crop_rounding"] == "floor"


def test_hf_without_processor_needs_the_preprocessing_given(tmp_path):
    transformers = pytest.importorskip("transformers")
    folder = tmp_path / "vit"
    _hf_folder(folder, transformers.ViTImageProcessor())
    (folder / "preprocessor_config.json").unlink()
    with pytest.raises(ModelLoadError, match=r"no image processor.*--size, --mean and --std"):
        load_model(f"hf:{folder}", device="cpu")
    loaded = load_model(f"hf:{folder}", size=64, mean=(0.5,) * 3, std=(0.5,) * 3, device="cpu")
    assert loaded.preprocess.size == (64, 64)
    # an extra state dict (fine-tuned weights kept apart from the folder) goes over the folder's weights
    from safetensors.torch import save_file

    other = {k: torch.full_like(v, 0.125) if v.is_floating_point() else v for k, v in loaded.model.state_dict().items()}
    save_file(other, tmp_path / "tuned.safetensors")
    tuned = load_model(f"hf:{folder}", str(tmp_path / "tuned.safetensors"), size=64, mean=(0.5,) * 3,
                       std=(0.5,) * 3, device="cpu")  # fmt: skip
    assert all(torch.equal(v, other[k]) for k, v in tuned.model.state_dict().items())


def _offline(monkeypatch, tmp_path):
    """An offline machine with an empty hub cache (huggingface_hub reads its settings once, at import)."""
    constants = pytest.importorskip("huggingface_hub.constants")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))


def test_hf_hub_id_offline_without_cache_is_one_line(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    _offline(monkeypatch, tmp_path)
    with pytest.raises(ModelLoadError, match=r"not in transformers' cache and could not be fetched") as caught:
        load_model("hf:someone/no-such-model-camkit-test", device="cpu")
    assert "\n" not in str(caught.value)


def test_timm_pretrained_offline_without_cache_is_one_line(tmp_path, monkeypatch):
    pytest.importorskip("timm")
    _offline(monkeypatch, tmp_path)
    with pytest.raises(ModelLoadError, match=r"timm could not load its pretrained weights") as caught:
        load_model("timm:test_resnet", weights="pretrained", device="cpu")
    assert "\n" not in str(caught.value)
    with pytest.raises(ModelLoadError, match=r"timm has no model 'test_resnt'; did you mean test_resnet"):
        load_model("timm:test_resnt", device="cpu")


@pytest.mark.heavy
def test_torchvision_state_dict_gets_the_default_weights_preset(photo, tmp_path):
    torch.manual_seed(2)
    net = torchvision.models.resnet18(weights=None, num_classes=4).eval()
    torch.save(net.state_dict(), tmp_path / "r18.pth")
    transform = torchvision.models.ResNet18_Weights.DEFAULT.transforms()  # metadata only: nothing is downloaded
    reference_x = transform(photo[0])
    with torch.no_grad():
        reference = net(reference_x[None])
    loaded = load_model("torchvision:resnet18", str(tmp_path / "r18.pth"), device="cpu")
    pre = loaded.preprocess
    assert (pre.resize, pre.crop, pre.interpolation, pre.backend) == (256, (224, 224), "bilinear", "pil")
    assert pre.origin == "torchvision weights ResNet18_Weights.IMAGENET1K_V1"  # DEFAULT's, recorded in manifests
    x, _ = pre(photo[0])
    torch.testing.assert_close(x, reference_x, atol=1e-6, rtol=0)
    manifest = _explain(["--model", "torchvision:resnet18", "--weights", str(tmp_path / "r18.pth")], photo[1],
                        tmp_path / "out")  # fmt: skip
    _agree(reference, x, loaded.model, manifest)
    # given options replace the preset: --size alone is a plain resize, --crop keeps the preset's resize
    assert load_model("torchvision:resnet18", str(tmp_path / "r18.pth"), size=96, device="cpu").preprocess == (
        Preprocess(size=(96, 96))
    )
    cropped = load_model("torchvision:resnet18", str(tmp_path / "r18.pth"), crop=(200, 180), device="cpu").preprocess
    assert (cropped.resize, cropped.crop, cropped.backend) == (256, (200, 180), "pil")
    assert load_model("tinyfactory:tiny", size=40, crop=32, device="cpu").preprocess == Preprocess(
        resize=40, crop=(32, 32)
    )


def test_lightning_checkpoint_prefix_is_stripped(tmp_path):
    torch.manual_seed(3)
    net = torchvision.models.resnet18(weights=None, num_classes=3)
    checkpoint = {
        "epoch": 7, "global_step": 700, "pytorch-lightning_version": "2.4.0",
        "state_dict": {f"model.{k}": v for k, v in net.state_dict().items()},
        "optimizer_states": [{"state": {}, "param_groups": [{"lr": 0.1}]}], "hyper_parameters": {"lr": 0.1},
    }  # fmt: skip
    torch.save(checkpoint, tmp_path / "last.ckpt")
    loaded = load_model("torchvision:resnet18", str(tmp_path / "last.ckpt"), device="cpu")
    own = loaded.model.state_dict()
    assert all(torch.equal(own[k], v) for k, v in net.state_dict().items())
    assert f"stripped the prefix 'model.' from the keys of {tmp_path / 'last.ckpt'}" in loaded.notes
    # a LightningModule that also keeps a loss with weights: those keys are outside the prefix and left out
    checkpoint["state_dict"]["criterion.weight"] = torch.ones(3)
    torch.save(checkpoint, tmp_path / "extra.ckpt")
    notes = load_model("torchvision:resnet18", str(tmp_path / "extra.ckpt"), device="cpu").notes
    assert any("ignored 1 key(s)" in note for note in notes)


def test_key_mismatch_lists_missing_unexpected_and_shapes_in_one_message(tmp_path):
    from tinyfactory import Tiny

    state = Tiny(seed=1).state_dict()
    state.pop("conv1.bias")
    state["extra.weight"] = torch.zeros(2, 2)
    state["conv2.weight"] = torch.zeros(8, 6, 5, 5)
    torch.save(state, tmp_path / "bad.pt")
    with pytest.raises(ModelLoadError) as caught:
        load_model("tinyfactory:tiny", str(tmp_path / "bad.pt"), device="cpu")
    message = str(caught.value)
    assert "\n" not in message
    assert "missing 1 key(s): conv1.bias" in message and "unexpected 1 key(s): extra.weight" in message
    assert "1 key(s) of another shape: conv2.weight [8, 6, 5, 5] (the model has [8, 6, 3, 3])" in message


def test_refusals_are_one_line_with_exit_2(tmp_path, capsys):
    import warnings

    from tinyfactory import Tiny

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.jit.script(Tiny()).save(str(tmp_path / "scripted.pt"))
        program = torch.export.export(Tiny().eval(), (torch.rand(1, 3, 8, 8),))
    torch.export.save(program, str(tmp_path / "program.pt2"))
    (tmp_path / "model.onnx").write_bytes(b"\x08\x07\x12\x07pytorch\x1a\x052.9.0")  # an ONNX header
    camkit.save_png(tmp_path / "a.png", np.zeros((8, 8, 3), np.uint8))
    expected = {
        "scripted.pt": "is a TorchScript file", "program.pt2": "is a torch.export program (.pt2)",
        "model.onnx": "is an ONNX model",
    }  # fmt: skip
    for name, reason in expected.items():
        for args in (["--model", str(tmp_path / name), "--trust-pickle"],
                     ["--model", "tinyfactory:tiny", "--weights", str(tmp_path / name)]):  # fmt: skip
            code = main(["explain", str(tmp_path / "a.png"), *args, "--device", "cpu", "--out", str(tmp_path / "o")])
            err = capsys.readouterr().err.strip()
            assert code == 2 and len(err.splitlines()) == 1, err
            assert reason in err and "hooks" in err and "Pass the eager model instead" in err


@pytest.mark.parametrize(
    "make",
    [
        # Pillow backend, lanczos, a non-square output
        lambda t: t.ViTImageProcessorPil(size={"height": 48, "width": 80}, resample=1, image_mean=[0.3, 0.5, 0.7],
                                         image_std=[0.2, 0.3, 0.4]),
        # ConvNeXT below 384: shortest edge / crop_pct, then a square crop; at 384 and above: a square warp
        lambda t: t.ConvNextImageProcessor(size={"shortest_edge": 96}, crop_pct=0.8),
        lambda t: t.ConvNextImageProcessor(size={"shortest_edge": 400}),
        # no rescale: the statistics are in 0..255 units
        lambda t: t.ViTImageProcessor(size={"height": 48, "width": 80}, do_rescale=False, image_mean=[100, 110, 120],
                                      image_std=[50, 60, 70]),
        lambda t: t.CLIPImageProcessor(size={"shortest_edge": 40}, crop_size={"height": 32, "width": 32}),
    ],
    ids=["pil-lanczos", "convnext-crop-pct", "convnext-warp", "no-rescale", "clip"],
)
def test_hf_processor_steps_are_reproduced(make, photo):
    transformers = pytest.importorskip("transformers")
    from camkit.modelload.hf import preprocess_from_processor

    processor = make(transformers)
    reference = processor(photo[0], return_tensors="pt")["pixel_values"][0]
    x, shown = preprocess_from_processor(processor)(photo[0])
    assert x.shape == reference.shape and shown.shape[:2] == reference.shape[1:]
    torch.testing.assert_close(x, reference, atol=2e-6, rtol=1e-6)


def test_unreproduced_processor_steps_and_float_images_are_refused():
    transformers = pytest.importorskip("transformers")
    from camkit.modelload.hf import preprocess_from_processor

    class Custom(transformers.ViTImageProcessor):
        def resize(self, image, size, resample=None, **kwargs):  # a step of its own
            return super().resize(image, size, resample, **kwargs).flip(-1)

    with pytest.raises(ModelLoadError, match=r"Custom has steps of its own.*--size, --mean\s+and --std"):
        preprocess_from_processor(Custom())
    with pytest.raises(ModelLoadError, match=r"resizes to .*longest_edge=1333"):
        preprocess_from_processor(transformers.ViTImageProcessor(size={"shortest_edge": 800, "longest_edge": 1333}))
    with pytest.raises(camkit.InvalidInputError, match=r"got a float32 array \[8, 8, 3\].*\(img \* 255\)\.round\(\)"):
        Preprocess(size=(4, 4))(np.zeros((8, 8, 3), np.float32))


def test_audit_with_size_and_crop_uses_the_crop_as_input_size(tmp_path):
    (tmp_path / "data").mkdir()
    camkit.save_png(tmp_path / "data" / "a.png", np.full((30, 50, 3), 90, np.uint8))
    (tmp_path / "data" / "b.png").write_bytes(b"not an image")  # its placeholder row must have the input's size
    summary = camkit.audit(tmp_path / "data", "tinyfactory:tiny", out=tmp_path / "run", layer="conv2", size=(40, 48),
                           crop=32, device="cpu", workers=0, progress=False, batch_size=2)  # fmt: skip
    assert summary["images"] == 2 and summary["errors"] == 1
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["preprocess"]["size"] == [40, 48] and run["preprocess"]["crop"] == [32, 32]
