"""``camkit explain`` and ``camkit audit`` on the command line, with the three ways of giving a model.

One module fixture runs the commands (one as a subprocess, the others in this process
meanwhile: a subprocess mostly waits for imports), then each test checks one of them.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision
from audit_helpers import make_bad_data, make_images, read_rows, run_cli, start_cli
from tinyfactory import Tiny

import camkit
from camkit.modelload import Preprocess

pytestmark = pytest.mark.heavy  # a module fixture runs the command-line tool 8 times: tens of seconds

COMMON = ["--size", "32", "--device", "cpu"]
AUDIT = ["--workers", "0", "--no-progress", "--batch-size", "4", "--alphabetical-classes"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    make_images(root / "data", per_class=2)
    images = [str(root / "data" / "cat" / "img0.png"), str(root / "data" / "dog" / "img1.png")]
    torch.manual_seed(0)
    torch.save(torchvision.models.resnet18(weights=None, num_classes=3).state_dict(), root / "r18.pt")
    torch.save(Tiny(seed=4), root / "whole.pt")
    make_bad_data(root / "bad")
    factory = ["--model", "tinyfactory:tiny", "--layer", "conv2"]
    # layer3, not layer4: at 32 px resnet18's layer4 is 1x1, which camkit refuses (a map of one position).
    tv = ["--model", "torchvision:resnet18", "--weights", str(root / "r18.pt"), "--layer", "layer3"]
    whole = ["--model", str(root / "whole.pt"), "--layer", "conv2"]
    commands = {
        "explain_factory": ["explain", *images, *factory, "--target", "top2", "--out", "ex_factory"],
        "explain_tv": ["explain", *images, *tv, "--out", "ex_tv"],
        "explain_whole_trusted": ["explain", *images, *whole, "--trust-pickle", "--target", "1", "--out", "ex_whole"],
        "audit_factory": ["audit", "data", *factory, *AUDIT, "--out", "au_factory"],
        "audit_tv": ["audit", "data", *tv, *AUDIT, "--out", "au_tv"],
        "audit_whole_refused": ["audit", "data", *whole, *AUDIT, "--out", "au_refused"],
        "audit_whole_trusted": ["audit", "data", *whole, "--trust-pickle", *AUDIT, "--out", "au_whole"],
        "audit_bad": ["audit", "bad", *factory, *AUDIT, "--max-pixels", "1000000", "--out", "au_bad"],
    }
    # the whole-model audit as a real process, the rest in this process while it runs
    proc = start_cli(*commands.pop("audit_whole_trusted"), *COMMON, cwd=root)
    results = {name: run_cli(*args, *COMMON, cwd=root) for name, args in commands.items()}
    stdout, stderr = proc.communicate(timeout=300)
    results["audit_whole_trusted"] = (proc.returncode, stdout, stderr)
    return root, images, results


def _expected(model: torch.nn.Module, path: str) -> tuple[int, float]:
    x, _ = Preprocess(size=(32, 32))(camkit.read_rgb(path))
    with torch.no_grad():
        probs = model.eval()(x[None]).softmax(dim=1)[0]
    return int(probs.argmax()), float(probs.max())


def test_explain_factory_top2(runs):
    root, images, results = runs
    code, _stdout, stderr = results["explain_factory"]
    assert code == 0, stderr
    manifest = json.loads((root / "ex_factory" / "manifest.json").read_text())
    assert manifest["camkit_version"] == camkit.__version__ and manifest["torch_version"] == torch.__version__
    assert manifest["method"] == "gradcam" and manifest["layer"] == ["conv2"] and manifest["target"] == "top2"
    assert manifest["model"]["spec"] == "tinyfactory:tiny" and manifest["errors"] == 0
    for entry, path in zip(manifest["images"], images):
        pred, conf = _expected(Tiny(), path)
        assert (
            entry["path"] == path
            and entry["prediction"] == pred
            and entry["confidence"] == pytest.approx(conf, abs=1e-6)
        )
        assert entry["targets"][0] == pred and len(entry["targets"]) == 2 and len(entry["overlays"]) == 2
        maps = np.load(root / "ex_factory" / entry["map"])
        assert maps.shape == (2, 32, 32) and maps.dtype == np.float32 and maps.min() >= 0 and maps.max() == 1.0
        assert all((root / "ex_factory" / o).is_file() for o in entry["overlays"])


def test_explain_torchvision_state_dict_and_trusted_whole_model(runs):
    root, images, results = runs
    assert results["explain_tv"][0] == 0, results["explain_tv"][2]
    tv = json.loads((root / "ex_tv" / "manifest.json").read_text())
    assert tv["layer"] == ["layer3"] and tv["model"]["notes"] == ["num_classes=3 taken from the state dict"]
    net = torchvision.models.resnet18(weights=None, num_classes=3)
    net.load_state_dict(torch.load(root / "r18.pt", weights_only=True))
    assert [e["prediction"] for e in tv["images"]] == [_expected(net, p)[0] for p in images]
    assert np.load(root / "ex_tv" / tv["images"][0]["map"]).shape == (32, 32)

    code, _, stderr = results["explain_whole_trusted"]
    assert code == 0, stderr
    whole = json.loads((root / "ex_whole" / "manifest.json").read_text())
    assert [e["targets"] for e in whole["images"]] == [[1], [1]]
    assert [e["prediction"] for e in whole["images"]] == [_expected(Tiny(seed=4), p)[0] for p in images]


def test_whole_model_refused_without_trust(runs):
    # explain and audit share the loader (TorchScript and the other refusals: tests/modelload/test_modelload.py)
    root, _, results = runs
    code, _, stderr = results["audit_whole_refused"]
    assert code == 2 and "whole pickled model: loading it runs code" in stderr and "--trust-pickle" in stderr
    assert not (root / "au_refused").exists()


@pytest.mark.parametrize(
    ("name", "model"), [("audit_factory", "tiny"), ("audit_tv", "tv"), ("audit_whole_trusted", "whole")]
)
def test_audit_each_model_form(runs, name, model):
    root, _, results = runs
    code, stdout, stderr = results[name]
    assert code == 0, stderr
    out = root / f"au_{model if model != 'tiny' else 'factory'}"
    rows = read_rows(out / "results.csv")
    assert [r["key"] for r in rows] == ["cat/img0.png", "cat/img1.png", "dog/img0.png", "dog/img1.png"]
    if model == "tv":
        net = torchvision.models.resnet18(weights=None, num_classes=3)
        net.load_state_dict(torch.load(root / "r18.pt", weights_only=True))
    else:
        net = Tiny(seed=4 if model == "whole" else 0)
    for r in rows:
        pred, conf = _expected(net, str(root / "data" / r["key"]))
        assert int(r["prediction"]) == pred and float(r["confidence"]) == pytest.approx(conf, abs=1e-5)
        assert (out / r["overlay"]).is_file() and r["error"] == ""
    summary = json.loads((out / "summary.json").read_text())
    assert summary["images"] == 4 and summary["errors"] == 0 and set(summary["per_class"]) == {"cat", "dog"}
    assert "audited 4 of 4 image(s), 0 failed" in stdout and (out / "report.html").is_file()


def test_audit_bad_data_exit_code_and_error_summary(runs):
    root, _, results = runs
    code, stdout, stderr = results["audit_bad"]
    assert code == 1
    assert "audited 6 of 12 image(s), 6 failed" in stdout
    assert "failed: 1 image(s): FILE is empty (0 bytes)" in stderr
    assert "failed: 1 image(s): FILE is a truncated PNG (no IEND chunk at the end)" in stderr
    assert len(read_rows(root / "au_bad" / "results.csv")) == 12
    assert Path(root / "au_bad" / "report.html").read_text().count("<script>") == 1
