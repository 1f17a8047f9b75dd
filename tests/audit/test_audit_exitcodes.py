"""Issue 16 case 8 and the command-line fixes: exit codes 0/1/2, one-line messages, ``--debug``, ``--model demo``.

One module fixture runs every command: one as a subprocess, the others in this process meanwhile.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from audit_helpers import make_images, read_rows, run_cli, start_cli

import camkit

pytestmark = pytest.mark.heavy  # a module fixture runs the command-line tool 13 times: tens of seconds

AUDIT = ["--model", "tinyfactory:tiny", "--layer", "conv2", "--size", "32", "--device", "cpu", "--workers", "0",
         "--no-progress"]  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from camkit.bundled.shapes import CLASSES, make_split

    root = tmp_path_factory.mktemp("codes")
    make_images(root / "data", classes=(), per_class=2)
    make_images(root / "labelled", per_class=1)
    (root / "afile.txt").write_text("not a folder")
    (root / "latin1.csv").write_bytes("path,label\ncaf\xe9.png,x\n".encode("latin-1"))
    (root / "badmod.py").write_text("raise ValueError('broken at import')\n")
    (root / "empty").mkdir()
    (root / "mine").mkdir()
    (root / "mine" / "results.csv").write_text("mine\n")
    for i, sample in enumerate(make_split("marked", 8, seed=9)):
        folder = root / "shapes" / CLASSES[sample.label]
        folder.mkdir(parents=True, exist_ok=True)
        camkit.save_png(folder / f"{i}.png", sample.image)
    commands = {
        "out_file": ["audit", "data", *AUDIT, "--out", "afile.txt"],
        "out_unwritable": ["audit", "data", *AUDIT, "--out", "afile.txt/sub"],
        "out_foreign": ["audit", "data", *AUDIT, "--out", "mine"],
        "latin1": ["audit", "latin1.csv", *AUDIT, "--out", "o_latin1"],
        "empty": ["audit", "empty", *AUDIT, "--out", "o_empty"],
        "unmapped": ["audit", "labelled", *AUDIT, "--out", "o_unmapped"],
        "factory_raises": ["audit", "data", *AUDIT, "--model", "tinyfactory:broken", "--out", "o_broken"],
        "factory_debug": ["audit", "data", *AUDIT, "--model", "tinyfactory:broken", "--out", "o_debug", "--debug"],
        "import_fails": ["audit", "data", *AUDIT, "--model", "badmod:build", "--out", "o_import"],
        "cuda": ["audit", "data", *AUDIT, "--device", "cuda", "--out", "o_cuda"],
        "demo": [
            "audit",
            "shapes",
            "--model",
            "demo",
            "--device",
            "cpu",
            "--workers",
            "0",
            "--no-progress",
            "--out",
            "o_demo",
        ],
        "explain_random": [
            "explain",
            "data/img0.png",
            "--model",
            "torchvision:resnet18",
            "--size",
            "64",
            "--device",
            "cpu",
            "--out",
            "o_explain",
        ],
        "layers_inspect": [
            "layers",
            "--model",
            "torchvision:resnet18",
            "--inspect",
            "--depth",
            "0",
            "--input-shape",
            "1,3,32,32",
            "--device",
            "cpu",
        ],
    }
    # one command as a real process (the exit status and the streams as a shell sees them), the rest in
    # this process while it runs (a process spends its seconds importing torch)
    proc = start_cli(*commands.pop("out_file"), cwd=root)
    results = {name: run_cli(*args, cwd=root) for name, args in commands.items()}
    stdout, stderr = proc.communicate(timeout=300)
    results["out_file"] = (proc.returncode, stdout, stderr)
    return root, results


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("out_file", "camkit audit: error: --out afile.txt is a file; pass a folder"),
        ("out_unwritable", "camkit audit: error: --out afile.txt/sub cannot be written"),
        ("out_foreign", "camkit audit: error: --out mine is not empty and is not a camkit run (it holds results.csv)"),
        ("latin1", "camkit audit: error: the CSV manifest latin1.csv is not UTF-8 text"),
        ("empty", "camkit audit: error: nothing to audit: no image files under empty"),
        ("unmapped", "In alphabetical order they would map to: 0=cat, 1=dog. Pass --classes FILE"),
        ("factory_raises", "camkit audit: error: --model tinyfactory:broken: broken() raised RuntimeError: weights"),
        ("import_fails", "camkit audit: error: importing 'badmod' for --model badmod:build failed: ValueError: broken"),
    ],
)
def test_could_not_start_is_exit_2_with_one_line(runs, name, message):
    root, results = runs
    code, stdout, stderr = results[name]
    assert code == 2, stderr
    assert message in stderr and "Traceback" not in stderr
    assert len(stderr.strip().splitlines()) == 1 and "(--debug shows the traceback)" in stderr
    assert stdout == ""
    if name == "out_foreign":
        assert (root / "mine" / "results.csv").read_text() == "mine\n" and sorted(
            p.name for p in (root / "mine").iterdir()
        ) == ["results.csv"]


def test_debug_shows_the_traceback(runs):
    _, results = runs
    code, _, stderr = results["factory_debug"]
    assert code == 2 and "Traceback (most recent call last)" in stderr and "RuntimeError: weights server down" in stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
def test_missing_device_is_exit_2(runs):
    _, results = runs
    code, _, stderr = results["cuda"]
    assert code == 2 and "--device cuda: no CUDA GPU is available here; use --device cpu" in stderr
    assert "Traceback" not in stderr


def test_model_demo_brings_its_preprocessing_and_classes(runs):
    from camkit.bundled.shapes import CLASSES

    root, results = runs
    code, stdout, stderr = results["demo"]
    assert code == 0, stderr
    summary = json.loads((root / "o_demo" / "summary.json").read_text())
    assert summary["label_mapping"] == {"source": "model", "classes": list(CLASSES)}
    pre = summary["model"]["preprocess"]
    assert {k: pre[k] for k in ("size", "resize", "crop", "mean", "std", "origin")} == {
        "size": [64, 64], "resize": None, "crop": None, "mean": [0.0, 0.0, 0.0], "std": [1.0, 1.0, 1.0],
        "origin": "the bundled demo model",
    }  # fmt: skip
    rows = read_rows(root / "o_demo" / "results.csv")
    assert len(rows) == 8 and all(r["prediction_name"] in CLASSES for r in rows)
    assert summary["accuracy"] >= 0.75 and "audited 8 of 8 image(s), 0 failed" in stdout


def test_random_weights_announced_on_the_console(runs):
    root, results = runs
    code, _, stderr = results["explain_random"]
    assert code == 0, stderr
    assert "camkit explain: warning: torchvision:resnet18 has random weights (no --weights given)" in stderr
    drawn = camkit.read_rgb(next((root / "o_explain" / "overlays").iterdir()))
    assert drawn.shape == (40, 48, 3)  # the image's own size, not the 64x64 input
    assert np.asarray(drawn).dtype == np.uint8


def test_layers_inspect_advice_fits_a_model_the_command_built(runs):
    _, results = runs
    code, stdout, stderr = results["layers_inspect"]
    assert code == 0, stderr
    assert "Call model.eval()" not in stdout
    assert "note: --model built the model in training mode; camkit layers, explain and audit run it in eval" in stdout
    assert "on the command line: --layer layer4.0.relu explains its last call only" in stdout
