"""The rows that re-explain, randomise or compare the batch: run end to end by ``camkit.evaluate``, each
score equal to the native ``camkit.metrics`` function called directly on the same batch and draws."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch
from models import TinyNet

import camkit
from camkit import metrics as M
from camkit.evaluation import METRICS
from camkit.evaluation.rows import layer_features, mosaics
from camkit.runs.files import safe_name

ROWS = ["infidelity_unnormalised", "local_lipschitz_estimate", "continuity", "relative_input_stability",
        "relative_output_stability", "relative_representation_stability", "consistency", "sufficiency",
        "completeness", "non_sensitivity", "input_invariance", "focus", "mprt", "mprt_bottom_up", "mprt_independent",
        "smooth_mprt", "efficient_mprt", "random_logit"]  # fmt: skip
IMAGES, SIZE, STEPS, CHUNK = 6, 12, 4, 16


def native(name, model, x, maps, target, generator):
    """What each row must equal: the native function with the row's settings, written out here."""
    explain = camkit.Saliency(model)
    common = {"maps": maps, "generator": generator, "chunk_size": CHUNK}
    per_step = -(-SIZE * SIZE // STEPS)
    with torch.no_grad():
        predicted = model.eval()(x).argmax(dim=1)
    if name == "infidelity_unnormalised":
        return M.infidelity(model, x, maps, target, samples=10, softmax=True, generator=generator, chunk_size=CHUNK)
    if name == "local_lipschitz_estimate":
        return M.local_lipschitz_estimate(explain, x, target, model=model, samples=10, **common)
    if name == "continuity":
        return M.continuity(explain, x, target, model=model, maps=maps, steps=10, chunk_size=CHUNK)
    if name == "relative_input_stability":
        return M.relative_input_stability(explain, model, x, target, samples=10, **common)
    if name == "relative_output_stability":
        return M.relative_output_stability(explain, model, x, target, samples=10, **common)
    if name == "relative_representation_stability":
        return M.relative_representation_stability(explain, model, x, target, samples=10,
                                                   representation=layer_features(model, "conv2"), **common)  # fmt: skip
    if name == "consistency":
        return M.consistency(maps, predicted)
    if name == "sufficiency":
        return M.sufficiency(model, x, maps, relative=True, chunk_size=CHUNK)
    if name == "completeness":
        return M.completeness(model, x, maps, target, softmax=True, chunk_size=CHUNK)
    if name == "non_sensitivity":
        return M.non_sensitivity(model, x, maps, target, features_in_step=per_step, softmax=True, chunk_size=CHUNK)
    if name == "input_invariance":
        return M.input_invariance(lambda m, inputs, t: camkit.Saliency(m)(inputs, t), model, x, target)
    if name == "focus":
        tiles, sources = mosaics(x)
        shown = predicted[sources] == target[:, None]
        values = M.focus(explain(tiles, target), shown)
        return torch.where(shown.any(1) & ~shown.all(1), values, torch.full_like(values, float("nan")))
    if name.endswith("mprt") or name.startswith("mprt"):
        if name == "efficient_mprt":
            return M.efficient_mprt(camkit.Saliency, model, x, target, **common)
        order = {"mprt": "top-down", "mprt_independent": "independent"}.get(name, "bottom-up")
        samples = 5 if name == "smooth_mprt" else 1
        return M.mprt(camkit.Saliency, model, x, target, order=order, samples=samples, **common).average
    assert name == "random_logit"
    return M.random_logit(explain, model, x, target, **common)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("rows")
    rng = np.random.default_rng(3)
    (root / "data").mkdir()
    for i in range(IMAGES):  # textures tinted red, green or blue in turn
        image = rng.integers(0, 64, (SIZE, SIZE, 3)).astype(np.uint8)
        image[..., i % 3] += 180
        camkit.save_png(root / "data" / f"{i}.png", image)
    model = TinyNet(classes=3, seed=2)
    with torch.no_grad():  # a head strong enough that the tint decides the class: the batch mixes classes
        model.fc.weight.mul_(20)
        model.fc.bias.zero_()
    summary = camkit.evaluate(
        root / "data", model, out=root / "out", methods="saliency", layer="conv2", metrics=ROWS, size=SIZE,
        mean=(0.0,) * 3, std=(1.0,) * 3, device="cpu", steps=STEPS, chunk_size=CHUNK, batch_size=IMAGES,
        controls=False, gates=False, save_maps=True, progress=False,
    )  # fmt: skip
    return root, model, summary


@pytest.mark.heavy
def test_every_new_row_equals_its_native_function(run):
    root, model, _ = run
    model.eval()
    keys = [f"{i}.png" for i in range(IMAGES)]
    x = torch.cat([camkit.load_image(root / "data" / k, mean=None, std=None)[0] for k in keys])
    maps = torch.stack([torch.from_numpy(np.load(root / "out" / "maps" / safe_name("saliency", "") / safe_name(k, ".npy"))) for k in keys])
    torch.testing.assert_close(maps, camkit.Saliency(model)(x, model(x).argmax(1)).float())  # the same batch
    target = model(x).argmax(dim=1)
    got: dict[str, dict[str, float]] = {name: {} for name in ROWS}
    with open(root / "out" / "scores.csv") as handle:
        for row in csv.DictReader(handle):
            got[row["metric"]][row["key"]] = float(row["value"]) if row["value"] else float("nan")
    generator = torch.Generator().manual_seed(0)  # the run's draws, metric after metric, in the table's order
    for name in ROWS:
        want = native(name, model, x, maps, target, generator).float()
        have = torch.tensor([got[name][k] for k in keys])
        torch.testing.assert_close(have, want, rtol=1e-5, atol=1e-5, equal_nan=True, msg=name)
    assert target.unique().numel() > 1  # the batch mixes classes: focus and consistency have something to compare
    assert not torch.isnan(torch.tensor(list(got["focus"].values()))).all()


def test_rows_without_a_direction_stay_out_of_the_ranks(run):
    root, _, summary = run
    assert METRICS["completeness"].higher_is_better is None
    assert "completeness" not in summary["metrics"] and "completeness" not in summary["scores"]["saliency"]
    assert set(summary["unranked"]) == {"completeness"}
    mean = summary["unranked"]["completeness"]["scores"]["saliency"]["mean"]
    values = [float(r["value"]) for r in csv.DictReader(open(root / "out" / "scores.csv")) if r["metric"] == "completeness"]
    assert mean == pytest.approx(np.mean(values), rel=1e-5)
    assert "Not ranked" in (root / "out" / "report.html").read_text()
    assert json.loads((root / "out" / "summary.json").read_text())["unranked"]["completeness"]["family"] == "axiomatic"


def test_every_row_says_what_it_needs():
    for name, spec in METRICS.items():
        assert spec.cost and spec.summary, name
        if name in ROWS and spec.needs_reexplain:
            assert "explanation" in spec.cost, name
    reexplain = {n for n, s in METRICS.items() if s.needs_reexplain}
    assert {"focus", "input_invariance", "mprt", "efficient_mprt", "random_logit", "continuity"} <= reexplain


def test_mosaics_on_every_rank():
    for shape, parts in (((3, 2, 6), 2), ((3, 2, 4, 6), 4), ((3, 2, 4, 4, 6), 8)):
        x = torch.arange(3.0).view(3, 1, *[1] * (len(shape) - 2)).expand(*shape).clone()
        tiles, sources = mosaics(x)
        assert sources.shape == (3, parts) and sources[:, 0].tolist() == [0, 1, 2]
        assert tiles.flatten(2)[:, 0, 0].tolist() == [0.0, 1.0, 2.0]  # part 0 is the image itself
        assert sorted(tiles[1].unique().tolist()) == sorted({float((1 + p) % 3) for p in range(parts)})
