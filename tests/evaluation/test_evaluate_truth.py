"""The truth test: on a model whose output depends only on pixels inside a known box, the faithful
methods rank above the controls and the controls come last."""

from __future__ import annotations

import json

from evaluate_helpers import TruthModel, write_manifest

import camkit

FAITHFUL = ("saliency", "inputxgradient", "hirescam")  # all zero where the pixels do not reach the output
CONTROLS = ("edge", "centre", "randomcam")


def test_faithful_methods_rank_above_the_controls(tmp_path):
    manifest = write_manifest(tmp_path / "data", 12)
    model = TruthModel()
    summary = camkit.evaluate(
        manifest, model, out=tmp_path / "out", methods=list(FAITHFUL), layer="relu",
        metrics="deletion,insertion,pointing_game,energy_pointing_game", size=16, mean=(0.0,) * 3, std=(1.0,) * 3,
        device="cpu", steps=8, progress=False,
    )  # fmt: skip
    assert summary["methods"] == [*FAITHFUL, *CONTROLS] and summary["scored"] == 12
    overall = {m: summary["overall"][m]["mean_rank"] for m in summary["methods"]}
    ranked = sorted(overall, key=overall.get)
    assert set(ranked[-3:]) == set(CONTROLS), overall  # the controls last
    for metric in ("deletion", "energy_pointing_game"):
        ranks = {m: summary["scores"][m][metric]["mean_rank"] for m in summary["methods"]}
        assert max(ranks[m] for m in FAITHFUL) < min(ranks[c] for c in CONTROLS), (metric, ranks)
    # insertion onto a blurred copy cannot see this model: the blur keeps the box's mean, all the model reads
    insertion = [summary["scores"][m]["insertion"]["mean"] for m in summary["methods"]]
    assert max(insertion) - min(insertion) < 0.01
    # pixels outside the box never reach the output: the gradient maps put all their energy inside it
    for method in FAITHFUL:
        assert summary["scores"][method]["energy_pointing_game"]["mean"] > 0.999
        assert summary["scores"][method]["pointing_game"]["mean"] == 1.0
    assert summary["scores"]["centre"]["pointing_game"]["mean"] == 0.0  # the centre is outside the box
    # the model-free controls fail both gates; class 1 is minus class 0, so |gradient| maps ignore the class
    gates = json.loads((tmp_path / "out" / "gates.json").read_text())["gates"]
    for control in ("edge", "centre"):
        assert gates[control]["model_randomisation"]["spearman"] == 1.0 and not gates[control]["random_logit"]["passed"]
    assert gates["saliency"]["random_logit"]["spearman"] > 0.99 and not gates["saliency"]["random_logit"]["passed"]
    assert gates["hirescam"]["random_logit"]["passed"]  # relu(grad x act) of class 1 is zero: not the class-0 map
    assert summary["verdict"]["best"] is None and "tie for the best mean on pointing_game" in summary["verdict"]["text"]
