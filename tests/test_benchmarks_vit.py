"""The ViT case's memory figures: repeated probes give medians, paired ratios and their spread."""

from __future__ import annotations

import torch

from benchmarks import case_vit
from benchmarks._harness import MET, WITHIN_SPREAD


class _Rounds:
    """A stand-in context whose probes answer from a list of rounds (one dict of MiB per round)."""

    device = torch.device("cpu")
    smoke = False

    def __init__(self, rounds: list[dict[str, float]]) -> None:
        self.rounds, self.asked = list(rounds), []

    def peaks(self, job, runs, probe_env=None):
        self.asked.append(sorted(runs))
        answer = self.rounds.pop(0)
        return {n: answer[n] for n in runs if n in answer}, {n: "probe failed" for n in runs if n not in answer}


def test_repeated_probes_give_medians_and_the_spread_of_paired_ratios():
    fwd, chefer, whole = case_vit.FORWARD, case_vit.CHEFER, case_vit.CHEFER_WHOLE
    ctx = _Rounds([{fwd: 30.0, chefer: 66.0, whole: 400.0}, {fwd: 50.0, chefer: 55.0}, {fwd: 31.0, chefer: 56.0}])
    cfg = case_vit.Config("vit_small_patch16_224", 224, 8)
    rows, ratios = case_vit._peaks(ctx, cfg, [fwd, chefer, whole], cfg.where, repeats=3)
    assert ctx.asked == [sorted([fwd, chefer, whole]), sorted([fwd, chefer]), sorted([fwd, chefer])]  # no goal: once
    # per round 2.2, 1.1 and 56/31: the median of the rounds' ratios, their min-max the spread
    assert abs(ratios[chefer].median - 56 / 31) < 1e-12 and ratios[chefer].lo == 1.1 and abs(ratios[chefer].hi - 2.2) < 1e-12
    by_impl = {row.impl: row for row in rows}
    assert by_impl[chefer].peak_mb == 56.0 and by_impl[chefer].ratio == ratios[chefer]
    assert by_impl[chefer].note == "median of 3 processes (55.0-66.0 MiB)" and by_impl[whole].note == ""
    assert by_impl[fwd].peak_mb == 31.0 and by_impl[fwd].ratio is None
    goals = case_vit._memory_goals(ratios, (chefer,), "w")
    assert goals[0].status == WITHIN_SPREAD  # 1.1-2.2 straddles 2.0
    assert case_vit._memory_goals({chefer: ratios[chefer]}, (chefer,), "w")[0].measured == str(ratios[chefer])


def test_a_failed_probe_is_not_asked_again_and_its_goal_says_so():
    fwd, legrad = case_vit.FORWARD, case_vit.LEGRAD
    ctx = _Rounds([{fwd: 30.0}, {fwd: 32.0}])
    cfg = case_vit.Config("vit_small_patch16_224", 224, 8)
    rows, ratios = case_vit._peaks(ctx, cfg, [fwd, legrad], cfg.where, repeats=2)
    assert ctx.asked == [sorted([fwd, legrad]), [fwd]]
    assert legrad not in ratios and any(row.impl == legrad and row.note == "probe failed" for row in rows)
    goal = case_vit._memory_goals(ratios, (legrad,), "w", missing="its memory probe failed")[0]
    assert goal.measured == "-" and goal.reason == "its memory probe failed"
    assert case_vit._memory_goals({legrad: case_vit.Ratio(1.5, 1.4, 1.6)}, (legrad,), "w")[0].status == MET


class _Device:
    def __init__(self, kind: str, smoke: bool = False) -> None:
        self.device, self.smoke = torch.device(kind), smoke

    def available(self, module: str) -> bool:
        return True


def test_each_device_forces_the_path_its_default_does_not_take_and_cuda_runs_both_models_at_two_batches():
    model = case_vit.build_model("torchvision tiny ViT")
    cpu, cuda = case_vit._usable(_Device("cpu"), model), case_vit._usable(_Device("cuda"), model)
    assert case_vit.CHEFER_WHOLE in cpu and case_vit.LEGRAD_WHOLE in cpu and case_vit.CHEFER_BLOCKWISE not in cpu
    assert case_vit.CHEFER_BLOCKWISE in cuda and case_vit.LEGRAD_BLOCKWISE in cuda and case_vit.CHEFER_WHOLE not in cuda
    assert case_vit.TORCHCAM in cpu and case_vit.CHEFER in cuda
    assert [(c.model, c.batch) for c in case_vit.configs(_Device("cuda"))] == [
        ("vit_b_16", 8), ("vit_b_16", 32), ("vit_l_16", 8), ("vit_l_16", 32)]


def test_the_path_note_and_the_goal_of_the_whole_graphs_peak_within_its_estimate():
    from types import SimpleNamespace

    whole = SimpleNamespace(extras={"path": "whole", "estimated_bytes": 100 * 2**20, "budget_bytes": 2**30})
    blockwise = SimpleNamespace(extras={"path": "blockwise", "estimated_bytes": None, "budget_bytes": None})
    assert case_vit.path_note(whole) == "path whole (whole graph estimated 100 MiB, budget 1024 MiB)"
    assert case_vit.path_note(blockwise) == "path blockwise (whole graph estimated n/a, budget n/a)"
    assert case_vit.path_note(torch.zeros(1)) == ""
    cfg = case_vit.Config("vit_b_16", 224, 8)
    explained = {case_vit.CHEFER: whole, case_vit.LEGRAD: blockwise}  # only the whole graph has an estimate to keep
    goals = case_vit._within_estimate(cfg, {case_vit.CHEFER: 80.0, case_vit.LEGRAD: 5.0}, explained)
    assert len(goals) == 1 and goals[0].status == MET and goals[0].measured == "0.80x"
    over = case_vit._within_estimate(cfg, {case_vit.CHEFER: 120.0}, {case_vit.CHEFER: whole})
    assert over[0].status != MET
