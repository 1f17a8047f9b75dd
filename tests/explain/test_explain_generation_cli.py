"""``camkit explain IMAGE --model hf:FOLDER --prompt ...``: the strip, the page and the tokens of a vision-language model's answer."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

import camkit
from camkit.cli import main

pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "vlm"))
import tiny_llava


def _image(path: Path) -> Path:
    rng = np.random.default_rng(0)
    camkit.save_png(path, rng.integers(0, 256, (40, 48, 3), dtype=np.uint8))
    return path


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    model, processor = tiny_llava.build()
    where = tmp_path_factory.mktemp("llava")
    model.save_pretrained(where)
    processor.save_pretrained(where)
    return where


def test_prompt_needs_a_vision_language_folder(tmp_path, capsys):
    image = _image(tmp_path / "a.png")
    code = main(["explain", str(image), "--model", "demo", "--prompt", "what is this?", "--out", str(tmp_path / "o")])
    assert code == 2
    assert "--prompt explains vision-language models given as hf:PATH" in capsys.readouterr().err
    code = main(["explain", str(image), "--model", "hf:x", "--prompt", "what?", "--size", "8", "--out", str(tmp_path / "o")])
    assert code == 2
    assert "--size do not apply with --prompt" in capsys.readouterr().err
    code = main(["explain", str(image), "--model", "hf:x", "--prompt", "what?", "--method", "gradcam++", "--out", str(tmp_path / "o")])
    assert code == 2
    assert "gradcam++" in capsys.readouterr().err


def test_the_strip_page_and_tokens_are_the_python_apis(folder, tmp_path, capsys):
    image = _image(tmp_path / "cat.png")
    out = tmp_path / "out"
    code = main(["explain", str(image), "--model", f"hf:{folder}", "--prompt", "what is in the picture ?",
                 "--max-new-tokens", "4", "--out", str(out), "--device", "cpu"])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    manifest = json.loads((out / "manifest.json").read_text())
    (entry,) = manifest["images"]
    assert entry["error"] == "" and manifest["prompt"] == "what is in the picture ?"
    model, processor, _ = camkit.modelload.hf.load_hf_generation(str(folder))
    want = camkit.explain_generation(model, processor, camkit.read_rgb(image), "what is in the picture ?", max_new_tokens=4)
    record = json.loads((out / entry["json"]).read_text())
    assert [t["token"] for t in record["tokens"]] == want.tokens[0]
    assert [t["id"] for t in record["tokens"]] == want.token_ids[0].tolist()
    np.testing.assert_allclose([t["log_prob"] for t in record["tokens"]], want.scores[0].tolist(), rtol=1e-5, atol=1e-6)
    assert record["answer"] == entry["answer"] == processor.tokenizer.decode(want.token_ids[0].tolist())
    torch.testing.assert_close(torch.from_numpy(np.load(out / entry["map"])), want.maps[0], rtol=1e-5, atol=1e-6)
    count = len(want.tokens[0])
    page = (out / entry["page"]).read_text()
    assert page.count("data-map=") == count and "what is in the picture ?" in page
    strip = cv2.imread(str(out / entry["strip"]))
    assert strip is not None and strip.shape[1] > strip.shape[0]  # one row of panels
    assert f"({count} tokens)" in capsys.readouterr().out


def test_an_answer_is_teacher_forced(folder, tmp_path):
    image = _image(tmp_path / "a.png")
    out = tmp_path / "o"
    assert main(["explain", str(image), "--model", f"hf:{folder}", "--prompt", "describe the image", "--answer",
                 "a red cat", "--out", str(out), "--method", "gradcam"]) == 0  # fmt: skip
    (entry,) = json.loads((out / "manifest.json").read_text())["images"]
    tokens = json.loads((out / entry["json"]).read_text())["tokens"]
    assert [t["token"].strip() for t in tokens] == ["a", "red", "cat"]
    assert re.search(r"<button[^>]*>cat<small>", (out / entry["page"]).read_text())
