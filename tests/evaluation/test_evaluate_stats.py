"""The evaluation's statistics on hand-made score tables, against values worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from camkit.evaluation.analysis import analyse, verdict
from camkit.evaluation.report import cd_diagram
from camkit.evaluation.stats import (
    bootstrap_interval,
    friedman,
    image_ranks,
    nemenyi_cd,
    prob_first,
    rank_alpha,
    split_half,
)
from camkit.evaluation.table import METRICS

# 5 images x 3 methods, lower is better; per-image ranks (no ties) a: 1 1 1 2 1, b: 2 3 2 1 2, c: 3 2 3 3 3
TABLE = np.array([[1.0, 2.0, 3.0], [1.0, 3.0, 2.0], [1.0, 2.0, 3.0], [2.0, 1.0, 3.0], [1.0, 2.0, 3.0]])


def test_ranks_friedman_and_nemenyi_by_hand():
    ranks = image_ranks(TABLE, higher_is_better=False)
    assert ranks.sum(axis=0).tolist() == [6.0, 10.0, 14.0]
    assert image_ranks(TABLE, higher_is_better=True).sum(axis=0).tolist() == [14.0, 10.0, 6.0]
    # chi2 = 12 / (n k (k + 1)) * sum(R_j^2) - 3 n (k + 1) = 12 / 60 * (36 + 100 + 196) - 60 = 6.4
    chi2, p = friedman(TABLE)
    assert chi2 == pytest.approx(6.4) and p == pytest.approx(math.exp(-6.4 / 2))  # chi2 with 2 dof: exp(-x/2)
    # Demšar 2006, table 5: q_0.05 = 2.343 for k = 3; CD = q sqrt(k (k + 1) / (6 n)) = 2.343 sqrt(12 / 30)
    assert nemenyi_cd(3, 5) == pytest.approx(2.343 * math.sqrt(12 / 30), abs=1e-3)
    assert nemenyi_cd(10, 20) == pytest.approx(3.164 * math.sqrt(110 / 120), abs=1e-3)  # q_0.05 = 3.164 for k = 10
    # two methods: Wilcoxon's signed-rank test; b - a = 1, 2, 1, -1, 1: the four |1|s share ranks 1-4 (2.5 each),
    # so W = min(R+, R-) = R- = 2.5; the p-value is scipy's (well above 0.05: five images cannot separate them)
    w, p = friedman(TABLE[:, :2])
    assert w == 2.5 and p == pytest.approx(0.3125)
    assert all(math.isnan(v) for v in friedman(TABLE[:, :1]))


def test_bootstrap_interval_holds_the_mean_and_repeats_with_its_seed():
    values = np.random.default_rng(1).normal(3.0, 1.0, 40)
    low, high = bootstrap_interval(values, seed=5)
    assert low < values.mean() < high and high - low < 1.5
    assert bootstrap_interval(values, seed=5) == (low, high)
    # the percentile interval of the mean is about mean +- 1.96 sd / sqrt(n)
    half = 1.96 * values.std(ddof=1) / math.sqrt(40)
    assert low == pytest.approx(values.mean() - half, abs=0.1) and high == pytest.approx(values.mean() + half, abs=0.1)
    assert bootstrap_interval(np.array([2.0, np.nan, 2.0]), seed=0) == (2.0, 2.0)


def test_krippendorff_alpha_split_half_and_probability_first():
    same = np.array([[1.0, 2.0, 3.0]] * 6)
    assert rank_alpha(same) == 1.0 and split_half(same, seed=0) == (1.0, 1.0)
    reversed_pair = np.array([[1.0, 2.0, 3.0], [3.0, 2.0, 1.0]])
    assert rank_alpha(reversed_pair) < 0
    chance = np.argsort(np.random.default_rng(0).random((400, 5)), axis=1) + 1.0  # random orders: alpha near 0
    assert abs(rank_alpha(chance)) < 0.05
    assert math.isnan(rank_alpha(same[:1]))
    assert prob_first(np.array([[0.9, 0.1], [0.8, 0.2]]), True, seed=0).tolist() == [1.0, 0.0]
    assert prob_first(np.array([[0.5, 0.5], [0.2, 0.2]]), True, seed=0).tolist() == [0.5, 0.5]  # a tie shares
    assert prob_first(np.array([[0.9, 0.1], [0.8, 0.2]]), False, seed=0).tolist() == [0.0, 1.0]


def test_analyse_and_verdict():
    rng = np.random.default_rng(0)
    clear = np.stack([rng.normal(m, 0.05, 30) for m in (0.9, 0.5, 0.1)], axis=1)
    s = analyse({"insertion": clear, "energy_pointing_game": clear}, METRICS, ["a", "b", "edge"], controls=["edge"])
    assert s["verdict"]["best"] == "a" and s["metrics"]["insertion"]["separated"]
    assert s["scores"]["a"]["insertion"]["mean_rank"] == 1.0 and s["scores"]["a"]["insertion"]["prob_first"] == 1.0
    assert s["scores"]["a"]["insertion"]["mean"] == pytest.approx(clear[:, 0].mean())
    assert s["agreement"] == []  # insertion and energy pointing are of different families: no pair
    # a failed gate blocks the verdict
    gated = analyse({"insertion": clear}, METRICS, ["a", "b", "edge"], controls=["edge"],
                    gates={"a": {"model_randomisation": {"passed": False}}})
    assert gated["verdict"]["best"] is None and "a fails the model_randomisation gate" in gated["verdict"]["text"]
    # a control leading is named
    s = analyse({"insertion": clear}, METRICS, ["edge", "b", "a"], controls=["edge"])
    assert s["verdict"]["best"] is None and "a control leads on insertion (edge)" in s["verdict"]["text"]
    # disagreeing metrics (insertion: higher is better, deletion: lower is better, same table)
    s = analyse({"insertion": clear, "deletion": clear}, METRICS, ["a", "b", "c"])
    assert s["verdict"]["best"] is None and "disagree: insertion -> a, deletion -> c" in s["verdict"]["text"]
    # the failed gates of several leaders are named in the leaders' order, whatever the hash seed
    both = {"a": {"model_randomisation": {"passed": False}}, "c": {"random_logit": {"passed": False}}}
    s = analyse({"insertion": clear, "deletion": clear}, METRICS, ["a", "b", "c"], gates=both)
    assert "a fails the model_randomisation gate; c fails the random_logit gate" in s["verdict"]["text"]
    assert s["agreement"][0]["spearman"] == -1.0
    # noise only: no metric is reliable
    noise = rng.normal(0.5, 0.1, (30, 3))
    s = analyse({"insertion": noise}, METRICS, ["a", "b", "c"])
    assert not s["metrics"]["insertion"]["reliable"] and s["verdict"]["text"].startswith("No best method can be named")
    assert verdict({"metrics": {}, "controls": [], "gates": {}})["best"] is None


def test_rows_with_a_missing_score_are_left_out_of_the_ranks():
    table = np.vstack([TABLE, [[np.nan, 1.0, 2.0]]])
    s = analyse({"deletion": table}, METRICS, ["a", "b", "c"])
    assert s["metrics"]["deletion"]["images"] == 5 and s["metrics"]["deletion"]["images_scored"] == 6
    assert s["metrics"]["deletion"]["friedman"]["chi2"] == pytest.approx(6.4)
    assert [s["scores"][m]["deletion"]["mean_rank"] for m in "abc"] == [1.2, 2.0, 2.8]


def test_cd_diagram_joins_methods_within_the_critical_difference():
    svg = cd_diagram({"a": 1.0, "b": 1.5, "c": 3.0}, cd=1.0)
    assert svg.count('stroke-width="3"') == 1  # one group: a and b
    svg = cd_diagram({"a": 1.0, "b": 2.0, "c": 3.0}, cd=1.2)
    assert svg.count('stroke-width="3"') == 2  # a-b and b-c
    assert cd_diagram({"a": 1.0, "b": 2.0, "c": 3.0}, cd=0.5).count('stroke-width="3"') == 0
    assert "&lt;x&gt;" in cd_diagram({"<x>": 1.0, "b": 2.0}, cd=None)
