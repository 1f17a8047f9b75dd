"""tools/peer_suites.py on one small file of each peer suite (skipped where ../shared/peer-suites is absent)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import peer_suites  # noqa: E402

slow = pytest.mark.slow  # two pytest subprocesses per suite


@pytest.fixture(scope="module")
def peers():
    root = peer_suites.peer_root(None)
    if root is None:
        pytest.skip("../shared/peer-suites is absent")
    return root


def _run(tmp_path, suite, files):
    report = tmp_path / f"{suite}.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "peer_suites.py"), "--suite", suite, "--files", *files, "--json", str(report),
         "--timeout", "900", "--jobs", "2"],  # the original's and camkit's runs side by side, as in CI
        capture_output=True, text=True, timeout=1900,
    )
    return done, json.loads(report.read_text())[suite] if report.exists() else None


@slow
def test_grad_cam_file_passes_on_both_sides(peers, tmp_path):
    pytest.importorskip("pytorch_grad_cam")
    done, result = _run(tmp_path, "grad-cam", ["test_svd_no_side_effect.py", "test_finer_cam_correctness.py"])
    assert done.returncode == 0, done.stdout[-3000:]
    assert "grad-cam original: 7 passed" in done.stdout and "grad-cam camkit:   6 passed, 1 failed" in done.stdout
    assert result["exceptions"] == ["tests/test_finer_cam_correctness.py::test_finercam_htcore_is_single_underscore"]
    assert result["regressions"] == []


@slow
def test_torchcam_file_runs_or_says_the_compat_module_is_missing(peers, tmp_path):
    pytest.importorskip("torchcam")
    done, result = _run(tmp_path, "torchcam", ["test_methods_utils.py"])
    if importlib.util.find_spec("camkit.compat.torchcam") is None:
        assert "compat module missing" in done.stdout and done.returncode == 0
        assert result["camkit"] is None and set(result["original"].values()) == {"passed"}
    else:
        assert done.returncode == 0, done.stdout[-3000:]
        assert result["regressions"] == []


def test_compare_counts_regressions_and_leaves_listed_exceptions_out(capsys):
    suite = peer_suites.Suite("demo", "demo", "demo", "camkit.compat.demo", "demo", "1.0", {"t::listed": "reads the source"})
    original = {"t::a": "passed", "t::b": "passed", "t::c": "failed", "t::listed": "passed", "t::d": "skipped"}
    ours = {"t::a": "passed", "t::b": "failed", "t::c": "failed", "t::listed": "failed", "t::d": "passed"}
    regressions, excepted = peer_suites.compare(suite, original, ours)
    assert regressions == ["t::b"] and excepted == ["t::listed"]
    printed = capsys.readouterr().out
    assert "t::b" in printed and "REGRESSION" in printed and "listed exception" in printed
    assert peer_suites.tally(ours) == "2 passed, 3 failed"
    # a missing camkit run (no compat module) counts no regression
    assert peer_suites.compare(suite, original, None) == ([], ["t::listed"])


def test_every_listed_exception_names_a_test_of_its_suite_and_a_reason():
    for suite in peer_suites.SUITES.values():
        for nodeid, reason in suite.exceptions.items():
            path = nodeid.split("::")[0]
            assert path.startswith("tests/") and path.rsplit("/", 1)[-1].startswith("test_") and "::" in nodeid
            assert len(reason) > 40


def test_the_suites_are_the_pinned_releases():
    assert (peer_suites.SUITES["grad-cam"].distribution, peer_suites.SUITES["grad-cam"].version) == ("grad-cam", "1.5.7")
    assert (peer_suites.SUITES["torchcam"].distribution, peer_suites.SUITES["torchcam"].version) == ("torchcam", "0.5.0")


def test_captum_suite_runs_the_translated_files_and_names_the_others():
    suite = peer_suites.SUITES["captum"]
    assert (suite.distribution, suite.version, suite.compat) == ("captum", "0.9.0", "camkit.compat.captum")
    assert "attr/test_saliency.py" in suite.files and "attr/test_llm_attr.py" in suite.left_out
    assert not set(suite.files) & set(suite.left_out)
    assert all(len(why) > 20 for why in suite.left_out.values())
    root = peer_suites.peer_root(None)
    if root is not None and (root / suite.folder / "tests").is_dir():
        tests = root / suite.folder / "tests"
        on_disk = {str(p.relative_to(tests)) for p in tests.rglob("test_*.py")}
        assert set(suite.files) | set(suite.left_out) == on_disk  # every file either run or left out with a reason


def test_ci_subset_leaves_out_the_heavy_grad_cam_cases():
    keyword = peer_suites.SUITES["grad-cam"].ci_keyword
    assert keyword == "not test_all_cam_models_can_run and not ((test_sess or test_refine_cam) and ScoreCAM)"
    assert peer_suites.SUITES["torchcam"].ci_keyword is None  # torchcam's suite runs whole in CI


def test_quantus_runs_on_its_own_pytest_with_tensorflow_stood_in():
    suite = peer_suites.SUITES["quantus"]
    assert (suite.distribution, suite.version) == ("quantus", "0.6.0")
    assert suite.pytest_home == "peer-quantus" and "peer_quantus" in suite.plugins
    assert {"pytest_lazyfixture", "pytest_mock"} <= set(suite.plugins) and suite.links == ("tests", "tutorials")
    assert suite.ci_keyword is not None and "test_focus" in suite.ci_keyword
