"""``camkit evaluate`` end to end on a tiny generated folder: outputs, maps, batching, resume, bad inputs."""

from __future__ import annotations

import csv
import json
from collections import defaultdict

import numpy as np
import pytest
import torch
from evaluate_helpers import TruthModel, write_manifest

import camkit
from camkit.cli import main

BASE = ["--model", "evaluate_helpers:truth_model", "--size", "16", "--mean", "0", "0", "0", "--std", "1", "1", "1",
        "--device", "cpu", "--layer", "relu", "--steps", "4", "--no-progress"]  # fmt: skip
RUN = [*BASE, "--methods", "saliency,hirescam", "--metrics", "deletion,pointing_game,energy_pointing_game"]


def read_scores(path):
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_manifest(tmp_path_factory.mktemp("evaluate") / "data", 6)


@pytest.fixture(scope="module")
def run(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "out"
    assert main(["evaluate", str(data), *RUN, "--out", str(out), "--save-maps", "--batch-size", "4"]) == 0
    return out


def test_outputs_agree_with_each_other(run):
    rows = read_scores(run / "scores.csv")
    summary = json.loads((run / "summary.json").read_text())
    methods = ["saliency", "hirescam", "edge", "centre", "randomcam"]
    assert summary["methods"] == methods and summary["controls"] == ["edge", "centre", "randomcam"]
    assert len(rows) == 6 * 5 * 3  # image x method x metric
    values = defaultdict(list)
    for r in rows:
        values[r["method"], r["metric"]].append(float(r["value"]))
        assert r["control"] == str(int(r["method"] in summary["controls"]))
    for (method, metric), vs in values.items():
        entry = summary["scores"][method][metric]
        assert entry["mean"] == pytest.approx(np.mean(vs), abs=1e-5)
        assert entry["low"] <= entry["mean"] + 1e-9 and entry["mean"] <= entry["high"] + 1e-9
    ranks = [summary["scores"][m]["deletion"]["mean_rank"] for m in methods]
    assert sum(ranks) == pytest.approx(5 * 6 / 2)  # mean ranks of 5 methods add up to 1 + ... + 5
    page = (run / "report.html").read_text()
    assert "<svg" in page and "Verdict" in page and "src=" not in page and "http" not in page.split("</head>")[1]
    assert json.loads((run / "run.json").read_text())["command"] == "evaluate"


def test_saved_maps_are_the_explainers_maps(run, data):
    model = TruthModel()
    x = camkit.to_tensor(camkit.read_rgb(data.parent / "img0.png"))[None]  # [1, 3, 16, 16] in [0, 1]
    target = model(x).argmax(dim=1)
    from camkit.runs.files import safe_name

    for method, explainer in (("saliency", camkit.Saliency(model)), ("hirescam", camkit.HiResCAM(model, "relu"))):
        saved = np.load(run / "maps" / safe_name(method, "") / safe_name("img0.png", ".npy"))
        assert saved.dtype == np.float32 and saved.shape == (16, 16)
        np.testing.assert_allclose(saved, explainer(x, target)[0].numpy(), atol=1e-6)


@pytest.mark.heavy
def test_batch_size_does_not_change_the_scores(run, data, tmp_path):
    out = tmp_path / "one"
    assert main(["evaluate", str(data), *RUN, "--out", str(out), "--batch-size", "1", "--no-gates"]) == 0
    key = lambda r: (r["key"], r["method"], r["metric"])  # noqa: E731
    ones = {key(r): float(r["value"]) for r in read_scores(out / "scores.csv")}
    many = {key(r): float(r["value"]) for r in read_scores(run / "scores.csv")}
    assert ones.keys() == many.keys()
    assert max(abs(ones[k] - many[k]) for k in ones) < 1e-5


def test_resume_redoes_only_the_lost_batches(data, tmp_path):
    out = tmp_path / "out"
    args = ["evaluate", str(data), *RUN, "--out", str(out), "--batch-size", "2"]
    assert main(args) == 0
    before = read_scores(out / "scores.csv")
    parts = sorted((out / "parts").glob("*.jsonl"))
    assert len(parts) == 3
    parts[1].unlink()  # a run killed before its second batch was written
    (out / "scores.csv").unlink()
    assert main(args) == 2  # a camkit run is never overwritten without --resume or --overwrite
    assert main([*args, "--resume"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["images_this_run"] == 2 and read_scores(out / "scores.csv") == before
    assert main([*args[:-2], "--batch-size", "2", "--steps", "5", "--resume"]) == 2  # changed settings


@pytest.mark.parametrize(
    "case, expected",
    [
        ("unknown_metric", "unknown metric(s) ['nope']"),
        ("unknown_method", "unknown method(s) ['gradcamm']"),
        ("masks_missing", "need a localisation region per image"),
        ("mask_size", "masks must have their image's size"),
        ("no_scores", "needs a classifier returning scores [B, classes]"),
        ("not_a_run", "is not empty and is not a camkit run"),
    ],
)
def test_bad_inputs_are_one_line_errors(case, expected, data, tmp_path, capsys):
    out = tmp_path / "out"
    args = ["evaluate", str(data), *BASE, "--methods", "saliency", "--metrics", "deletion", "--out", str(out)]
    if case == "unknown_metric":
        args[-3] = "deletion,nope"
    elif case == "unknown_method":
        args[args.index("--methods") + 1] = "gradcamm"
    elif case == "masks_missing":
        args[1] = str(data.parent)  # the folder, not the manifest: no regions
        args[-3] = "pointing_game"
    elif case == "mask_size":
        manifest = write_manifest(tmp_path / "masked", 2, masks=True)
        camkit.save_png(tmp_path / "masked" / "mask1.png", np.zeros((8, 16, 3), np.uint8))
        args[1] = str(manifest)
    elif case == "no_scores":
        args[args.index("evaluate_helpers:truth_model")] = "evaluate_helpers:no_scores"
    elif case == "not_a_run":
        out.mkdir()
        (out / "notes.txt").write_text("mine")
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0], err
    if case == "not_a_run":
        assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_the_model_and_inputs_are_left_as_they_were(data, tmp_path):
    model = TruthModel().train()
    model.conv.weight.requires_grad_(False)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    camkit.evaluate(data, model, out=tmp_path / "out", methods="saliency,hirescam", layer="relu", metrics="deletion",
                    size=16, mean=(0.0,) * 3, std=(1.0,) * 3, device="cpu", steps=4, progress=False)  # fmt: skip
    assert model.training and all(m.training for m in model.modules())
    assert not model.conv.weight.requires_grad and model.head.weight.requires_grad
    assert all(p.grad is None for p in model.parameters())
    assert all(not m._forward_hooks and not m._backward_hooks and not m._forward_pre_hooks for m in model.modules())
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())


def test_an_unreadable_image_is_an_error_row_and_exit_1(tmp_path, capsys):
    manifest = write_manifest(tmp_path / "data", 3)
    (tmp_path / "data" / "img1.png").write_bytes(b"")  # empty file
    out = tmp_path / "out"
    assert main(["evaluate", str(manifest), *RUN, "--out", str(out)]) == 1
    assert "failed: 1 image(s): img1.png is empty (0 bytes)" in capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["images"], summary["scored"], summary["errors"]) == (3, 2, 1)
    assert {r["key"] for r in read_scores(out / "scores.csv")} == {"img0.png", "img2.png"}
