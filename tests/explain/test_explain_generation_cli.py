"""``camkit explain IMAGE --model hf:FOLDER --prompt ...``: the strip, the page and the tokens of a vision-language model's answer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import camkit
from camkit.cli import main

pytest.importorskip("transformers")


def _image(path: Path) -> Path:
    rng = np.random.default_rng(0)
    camkit.save_png(path, rng.integers(0, 256, (40, 48, 3), dtype=np.uint8))
    return path


def test_prompt_needs_a_vision_language_folder(tmp_path, capsys):
    image = _image(tmp_path / "a.png")
    code = main(["explain", str(image), "--model", "demo", "--prompt", "what is this?", "--out", str(tmp_path / "o")])
    assert code == 2
    assert "--prompt explains vision-language models given as hf:PATH" in capsys.readouterr().err
    code = main(["explain", str(image), "--model", "hf:x", "--prompt", "what?", "--size", "8", "--out", str(tmp_path / "o")])
    assert code == 2
    assert "--size do not apply with --prompt" in capsys.readouterr().err
