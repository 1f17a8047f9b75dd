"""``camkit explain IMAGE --model hf:FOLDER`` on a SegFormer segmenter and a DETR detector saved with save_pretrained."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import camkit
from camkit.cli import main
from camkit.modelload import Preprocess, hf, load_model

transformers = pytest.importorskip("transformers")


def _image(path: Path, height: int = 48, width: int = 80) -> np.ndarray:
    rng = np.random.default_rng(0)
    picture = np.full((height, width, 3), 60, np.uint8)
    picture[10:40, 20:70] = rng.integers(100, 255, (30, 50, 3), dtype=np.uint8)
    camkit.save_png(path, picture)
    return picture


@pytest.fixture
def segformer(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    config = transformers.SegformerConfig(
        num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[8, 16], patch_sizes=[7, 3],
        strides=[4, 2], num_attention_heads=[1, 1], mlp_ratios=[2, 2], decoder_hidden_size=16, num_labels=3,
        id2label={0: "road", 1: "car", 2: "sky"},
    )  # fmt: skip
    folder = tmp_path / "segformer"
    transformers.SegformerForSemanticSegmentation(config).save_pretrained(folder)
    transformers.SegformerImageProcessor(size={"height": 64, "width": 64}).save_pretrained(folder)
    return folder


@pytest.fixture
def detr(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    backbone = transformers.ResNetConfig(
        embedding_size=8, hidden_sizes=[8, 16, 16, 32], depths=[1, 1, 1, 1], out_features=["stage4"]
    )
    config = transformers.DetrConfig(
        use_pretrained_backbone=False, use_timm_backbone=False, backbone_config=backbone, d_model=16,
        encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
        encoder_ffn_dim=16, decoder_ffn_dim=16, num_queries=12, num_labels=4,
        id2label={0: "cat", 1: "dog", 2: "car", 3: "tree"},
    )  # fmt: skip
    model = transformers.DetrForObjectDetection(config).eval()
    with torch.no_grad():  # at random init every query gives the same answer: let the queries look at different places
        cross = model.model.decoder.layers[0].encoder_attn
        cross.q_proj.weight.normal_(0, 1.0)
        cross.k_proj.weight.normal_(0, 1.0)
        model.model.query_position_embeddings.weight.normal_(0, 1.0)
        model.class_labels_classifier.weight.normal_(0, 0.5)
        model.class_labels_classifier.bias.zero_()
        model.bbox_predictor.layers[-1].weight.normal_(0, 0.5)
    folder = tmp_path / "detr"
    model.save_pretrained(folder)
    transformers.DetrImageProcessor(size={"shortest_edge": 64, "longest_edge": 96}).save_pretrained(folder)
    return folder


def test_explain_hf_segformer(tmp_path: Path, segformer: Path, one_thread: None) -> None:
    picture = _image(tmp_path / "street.png")
    out = tmp_path / "out"
    assert main(["explain", str(tmp_path / "street.png"), "--model", f"hf:{segformer}", "--device", "cpu",
                 "--out", str(out)]) == 0  # fmt: skip
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["task"] == "segment" and manifest["method"] == "gradcam"
    processor = transformers.AutoImageProcessor.from_pretrained(segformer)
    pixels = processor(images=picture, return_tensors="pt")["pixel_values"]
    loaded = load_model(f"hf:{segformer}", None, device="cpu")
    x, _ = loaded.preprocess(picture)
    assert x.shape == pixels.shape[1:] == (3, 64, 64)
    torch.testing.assert_close(x, pixels[0], atol=1e-5, rtol=0)
    model = loaded.model.eval()
    with torch.no_grad():
        logits = model(pixels).logits
    present = torch.unique(logits.argmax(dim=1)).tolist()
    upsampled = processor.post_process_semantic_segmentation(model(pixels), target_sizes=[(48, 80)])[0]
    assert len(present) >= 2 and present == torch.unique(upsampled).tolist()  # the processor predicts the same classes
    classes = manifest["images"][0]["classes"]
    assert [c["label"] for c in classes] == present
    assert [c["label_name"] for c in classes] == [["road", "car", "sky"][c] for c in present]
    for record in classes:
        expected = camkit.GradCAM(model).explain(pixels, camkit.SegmentationTarget(record["label"])).maps[0]
        back, _ = loaded.preprocess.invert_map(expected, 48, 80)
        saved = np.load(out / record["map"])
        assert saved.shape == (48, 80) and record["overlay"].endswith(f"-class{record['label']}.png")
        np.testing.assert_allclose(saved, back.numpy(), atol=1e-5)
        drawn = camkit.read_rgb(out / record["overlay"])
        assert drawn.shape == (48, 80, 3) and (drawn != picture).any()
    assert sorted(p.name for p in (out / "overlays").iterdir()) == sorted(Path(c["overlay"]).name for c in classes)


def test_explain_hf_detr(tmp_path: Path, detr: Path, one_thread: None) -> None:
    picture = _image(tmp_path / "street.png")
    out = tmp_path / "out"
    threshold = 0.45
    assert main(["explain", str(tmp_path / "street.png"), "--model", f"hf:{detr}", "--device", "cpu", "--out", str(out),
                 "--score-threshold", str(threshold)]) == 0  # fmt: skip
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["task"] == "detect" and manifest["model"]["preprocess"]["max_size"] == 96
    processor = transformers.AutoImageProcessor.from_pretrained(detr)
    pixels = processor(images=picture, return_tensors="pt")["pixel_values"]
    loaded = load_model(f"hf:{detr}", None, device="cpu")
    x, _ = loaded.preprocess(picture)
    assert x.shape == pixels.shape[1:] == (3, 58, 96)  # 48 x 80: 64 x 106 would pass 96, so 96 * 48 / 80 = 57.6 -> 58
    torch.testing.assert_close(x, pixels[0], atol=1e-5, rtol=0)
    model = loaded.model.eval()
    with torch.no_grad():
        output = model(pixels)
    found = processor.post_process_object_detection(output, threshold=threshold, target_sizes=[(48, 80)])[0]
    order = torch.sort(found["scores"], descending=True, stable=True).indices
    dets = manifest["images"][0]["detections"]
    assert 2 <= len(dets) == len(order) < 12  # the threshold keeps some queries, not all
    for det, i in zip(dets, order.tolist()):
        assert det["score"] == pytest.approx(float(found["scores"][i]), abs=1e-6)
        assert det["label"] == int(found["labels"][i]) and det["label_name"] == ["cat", "dog", "car", "tree"][det["label"]]
        assert det["box"] == pytest.approx(found["boxes"][i].tolist(), abs=0.01)  # in the image's pixels, not the input's
        assert np.load(out / det["map"]).shape == (48, 80)
        assert camkit.read_rgb(out / det["overlay"]).shape == (48, 80, 3)
    assert len(list((out / "overlays").iterdir())) == len(dets)


@pytest.mark.parametrize("height,width", [(48, 80), (80, 48), (64, 64), (60, 70), (30, 200)])
def test_detr_resize_matches_processor(height: int, width: int) -> None:
    processor = transformers.DetrImageProcessor(size={"shortest_edge": 64, "longest_edge": 96})
    picture = np.random.default_rng(1).integers(0, 256, (height, width, 3), dtype=np.uint8)
    pixels = processor(images=picture, return_tensors="pt")["pixel_values"][0]
    pre = hf.preprocess_from_processor(processor)
    assert isinstance(pre, Preprocess) and (pre.resize, pre.max_size) == (64, 96)
    x, _ = pre(picture)
    assert x.shape == pixels.shape
    torch.testing.assert_close(x, pixels, atol=1e-5, rtol=0)


def test_detr_processor_with_fixed_pad_is_refused() -> None:
    processor = transformers.DetrImageProcessor(do_pad=True, pad_size={"height": 128, "width": 128})
    with pytest.raises(camkit.ModelLoadError, match="pad_size"):
        hf.preprocess_from_processor(processor)
