"""camkit evaluate --prompt: deletion and insertion by a token's log-probability on a tiny LLaVA, the scorer checked by hand."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import camkit
from camkit.cli import main
from camkit.evaluation.generation import evaluate_generation, token_scorer
from camkit.metrics import token_deletion_curve

pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "vlm"))
import tiny_llava

PROMPT = "what is in the picture ?"


@pytest.fixture(scope="module")
def pair():
    return tiny_llava.build()


def _teacher_forced(model, processor, image, answer_ids):
    from camkit.vlm.families import family_of
    from camkit.vlm.prompts import prepare, teacher_forced

    family = family_of(model)
    prompts = prepare(model, processor, family, image, PROMPT)
    forced = teacher_forced(prompts, [answer_ids], family, 0, torch.device("cpu"))
    return family, forced


def test_the_scorer_hides_the_patches_of_the_image_tokens(pair):
    model, processor = pair
    image = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (3, 32, 32), dtype=np.uint8))
    result = camkit.explain_generation(model, processor, image, PROMPT, answer="a red cat")
    family, forced = _teacher_forced(model, processor, image, result.token_ids[0])
    positions, ids = forced.positions[0][:, 0], forced.token_ids[0][:, 0]
    score = token_scorer(model, family, dict(forced.inputs), positions, ids, baseline=0.5)
    everything = torch.ones(3, 16, dtype=torch.bool)
    torch.testing.assert_close(score(everything, torch.arange(3)), result.scores[0], rtol=1e-4, atol=1e-5)
    # by hand: a 32 x 32 image is LLaVA's crop itself; image token 5 is patch (row 1, column 1) of the 4 x 4 grid of 8 px
    keep = everything[:1].clone()
    keep[0, 5] = False
    pixels = forced.inputs["pixel_values"].clone()
    pixels[..., 8:16, 8:16] = 0.5
    with torch.no_grad():
        logits = model(**{**forced.inputs, "pixel_values": pixels}).logits
    want = logits[0, positions[2] - 1].float().log_softmax(-1)[ids[2]]
    torch.testing.assert_close(score(keep, torch.tensor([2])), want[None], rtol=1e-4, atol=1e-5)
    # the deletion curve starts at the token's own log-probability and ends with every patch hidden
    _, curves = token_deletion_curve(score, torch.rand(3, 16), steps=2)
    torch.testing.assert_close(curves[:, 0], result.scores[0], rtol=1e-4, atol=1e-5)
    pixels[:] = 0.5
    with torch.no_grad():
        logits = model(**{**forced.inputs, "pixel_values": pixels}).logits
    hidden = logits[0, positions - 1].float().log_softmax(-1).gather(1, ids[:, None])[:, 0]
    torch.testing.assert_close(curves[:, -1], hidden, rtol=1e-4, atol=1e-5)


def test_evaluate_writes_scores_and_a_summary(pair, tmp_path):
    for name in ("a.png", "b.png"):
        camkit.save_png(tmp_path / "data" / name, np.random.default_rng(len(name)).integers(0, 256, (30, 40, 3), dtype=np.uint8))
    summary = evaluate_generation(tmp_path / "data", pair[0], pair[1], prompt=PROMPT, out=tmp_path / "out",
                                  methods="gradcam", answer="a red cat", steps=4)  # fmt: skip
    assert summary["scored"] == 2 and summary["errors"] == {}
    assert set(summary["methods"]) == {"gradcam", "random"} and sorted(summary["ranking"]) == ["gradcam", "random"]
    with open(tmp_path / "out" / "scores.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 2 * 2 * 3  # images x (method + control) x tokens
    mean = np.mean([float(r["deletion_auc"]) for r in rows if r["method"] == "gradcam"])
    assert summary["methods"]["gradcam"]["deletion_auc"] == pytest.approx(mean)
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["prompt"] == PROMPT


def test_the_command_line(pair, tmp_path, capsys):
    folder = tmp_path / "llava"
    pair[0].save_pretrained(folder)
    pair[1].save_pretrained(folder)
    camkit.save_png(tmp_path / "data" / "a.png", np.zeros((32, 32, 3), np.uint8))
    code = main(["evaluate", str(tmp_path / "data"), "--model", f"hf:{folder}", "--prompt", PROMPT, "--answer", "a cat",
                 "--steps", "2", "--out", str(tmp_path / "out")])  # fmt: skip
    printed = capsys.readouterr().out
    assert code == 0 and "gradcam: insertion AUC" in printed and "random: insertion AUC" in printed
