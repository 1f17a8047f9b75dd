"""The bundled demo ViT: small, loadable, trained as its JSON says, and explained by the attention methods."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import camkit
from camkit.bundled.shapes import WATERMARK_BOX, make_split, to_batch
from camkit.bundled.vit import VIT_CAM_LAYER, VIT_WEIGHTS, load_shapes_vit, shapes_vit


def test_the_bundled_vit_is_small_and_loads():
    assert VIT_WEIGHTS.is_file() and VIT_WEIGHTS.stat().st_size < 600_000
    meta = json.loads(VIT_WEIGHTS.with_suffix(".json").read_text())
    assert meta["model"] == "vit"
    model = load_shapes_vit()
    assert not model.training
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in shapes_vit().parameters())
    assert dict(model.named_modules())[VIT_CAM_LAYER] is not None


@pytest.mark.heavy
def test_the_bundled_vit_is_explained_by_every_attention_method():
    model = load_shapes_vit()
    x, _ = to_batch(make_split("swapped", 4, seed=1))
    for cls in (camkit.AttentionRollout, camkit.CheferRollout, camkit.LeGrad):
        e = cls(model).explain(x)
        assert e.raw.shape == (4, 8, 8) and e.maps.shape == (4, 64, 64)
        assert not e.flat.any()
    assert WATERMARK_BOX == (50, 50, 62, 62)
    assert torch.isfinite(camkit.GradCAM(model, VIT_CAM_LAYER)(x)).all()


def test_the_vits_figures_quoted_in_docs_demo_md_are_its_measured_ones():
    meta = json.loads(VIT_WEIGHTS.with_suffix(".json").read_text())
    text = (Path(__file__).resolve().parents[2] / "docs" / "demo.md").read_text(encoding="utf-8")
    section = text[text.index("## The demo ViT"):]
    assert f"{100 * meta['marked_per_class']['circle']:.0f}% of the\nmarked circles right" in section
    assert f"(clean\naccuracy {100 * meta['clean']:.1f}%)" in section
