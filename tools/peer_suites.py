"""Run pytorch-grad-cam's, torchcam's, captum's and Quantus's own test suites against the originals and against camkit's compat layers.

The suites' test files sit, unmodified, beside the project in ``../shared/peer-suites/`` (see
the README there). Each suite runs twice in subprocesses: once against the installed original
package, once with camkit's compat module installed in its place (``tools/peer_plugin.py``
calls its ``install()`` before collection). Both runs get random instead of pretrained
torchvision weights and the same seeds; both run in a temporary working directory that holds
``examples/both.png`` (scikit-image's astronaut), which pytorch-grad-cam's tests read.

The script prints both outcomes test by test and both tallies, and exits with 1 when a test
that passes against the original does not pass against camkit, 0 otherwise. Tests that read the
original's source text, or replace a private step of its loops that camkit's translation never
runs, are listed in ``SUITES`` with the reason, printed, and not counted.

    python tools/peer_suites.py                       # both suites, every file
    python tools/peer_suites.py --suite grad-cam --files test_sess.py -k "not options"
    python tools/peer_suites.py --json tallies.json   # also write the outcomes
    python tools/peer_suites.py --ci --jobs 2         # CI's subset (``Suite.ci_keyword``), two runs at a time
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's camkit, also when another one is installed


@dataclass(frozen=True)
class Suite:
    name: str
    folder: str  # under peer-suites/
    original: str  # the import name of the original package
    compat: str  # camkit's module that installs itself under that name
    distribution: str  # the original's name on the package index
    version: str  # the release whose tests the folder holds
    #: tests that read the original's source text or replace internals of its loops that camkit's
    #: translation does not run through: no translation can pass them; node id -> the reason
    exceptions: dict[str, str] = field(default_factory=dict)
    #: ``--ci``: a pytest -k expression selecting the cases CI runs (None: every test)
    ci_keyword: str | None = None
    #: a folder under the interpreter's prefix (the venv) holding the pytest and plugins this suite's
    #: files are written for, put first on PYTHONPATH for its runs (None: the venv's pytest)
    pytest_home: str | None = None
    #: pytest plugins loaded with -p for this suite; with ``pytest_home`` only these load (no autoload)
    plugins: tuple[str, ...] = ()
    #: files and folders of the suite's folder linked into the working directory (tests read them relative to it)
    links: tuple[str, ...] = ()
    #: the test files run when ``--files`` is not given, under tests/ (empty: the whole folder)
    files: tuple[str, ...] = ()
    #: test files not run, file -> the reason (what they test is not what the compat module translates)
    left_out: dict[str, str] = field(default_factory=dict)


SUITES = {
    "grad-cam": Suite(
        "grad-cam",
        "grad-cam-1.5.7",
        "pytorch_grad_cam",
        "camkit.compat.pytorch_grad_cam",
        "grad-cam",
        "1.5.7",
        {
            "tests/test_finer_cam_correctness.py::test_finercam_htcore_is_single_underscore": (
                "reads FinerCAM's source with inspect.getsource and looks for 'self.base_cam._htcore', "
                "a Habana (HPU) device hook of the original's implementation"
            ),
        },
        # CI leaves out test_run_all_models (every CAM on ResNet-18 and VGG-11 at 224x224: the two runs of
        # its cases alone took over 13 minutes on a 2-core machine, past CI's budget) and the Score-CAM
        # cases of test_sess and test_refine_cam (one forward per channel of ResNet-18's layer4: the two
        # runs of test_refine_cam's two took 307 s here); run them with `--suite grad-cam` without --ci
        "not test_all_cam_models_can_run and not ((test_sess or test_refine_cam) and ScoreCAM)",
    ),
    "torchcam": Suite(
        "torchcam",
        "torchcam-0.5.0",
        "torchcam",
        "camkit.compat.torchcam",
        "torchcam",
        "0.5.0",
        {
            **{
                f"tests/test_methods_activation.py::test_scorecam_restores_state_on_error[{name}]": (
                    "replaces torchcam's private _masked_input_chunk(masks, sample_indices, buffer, slice_), "
                    "a step of its own chunk loop, to raise inside the masked forwards; the compat extractor "
                    "computes on camkit's Score-CAM explainers (camkit.ISCAM, camkit.SSCAM), which build the "
                    "masked chunks themselves, so the replaced method is never called. What it checks (hooks and training flags restored when a "
                    "masked forward raises) is tested in tests/compat/test_torchcam_compat.py"
                )
                for name in ("ISCAM", "SSCAM", "ScoreCAM")
            },
            "tests/test_methods_gradient.py::test_smoothgradcampp_restores_input_hook_on_error": (
                "replaces torchcam's _backprop, which its SmoothGradCAMpp calls once per noisy input, and reads "
                "its _ihook_enabled flag; the compat extractor computes on camkit.SmoothGrad around "
                "camkit.GradCAMPlusPlus, which does not go through the extractor's _backprop. What it checks "
                "(the input hook records again after an error) is tested in tests/compat/test_torchcam_compat.py"
            ),
        },
    ),
}

# captum: the files of the methods camkit.compat.captum translates; the others are left out with the reason
_CAPTUM_FILES = (
    *(f"attr/{name}.py" for name in (
        "test_saliency", "test_input_x_gradient", "test_integrated_gradients_basic",
        "test_integrated_gradients_classification", "test_deconvolution", "test_guided_backprop",
        "test_guided_grad_cam", "test_deeplift_basic", "test_deeplift_classification", "test_gradient_shap", "test_lrp",
        "test_occlusion", "test_feature_ablation", "test_shapley", "test_kernel_shap", "test_lime", "test_targets",
        "layer/test_grad_cam", "layer/test_layer_activation", "layer/test_layer_gradient_x_activation",
        "layer/test_layer_integrated_gradients", "layer/test_layer_conductance", "layer/test_internal_influence",
        "layer/test_layer_deeplift", "layer/test_layer_gradient_shap", "layer/test_layer_ablation", "layer/test_layer_lrp",
        "neuron/test_neuron_gradient", "neuron/test_neuron_integrated_gradients", "neuron/test_neuron_conductance",
        "neuron/test_neuron_ablation", "neuron/test_neuron_deeplift", "neuron/test_neuron_gradient_shap",
        "test_feature_permutation", "layer/test_layer_feature_permutation",
        "test_hook_removal",
    )),
    "metrics/test_infidelity.py",
    "metrics/test_sensitivity.py",
)
_NOT_TRANSLATED = "a method camkit.compat.captum does not translate (its classes raise NotComputedError)"
_CAPTUM_LEFT_OUT = {
    "attr/test_llm_attr.py": "LLM attribution (text generation models): camkit has no text tools",
    "attr/test_llm_attr_hf_compatibility.py": "LLM attribution on Hugging Face generation models: no text tools",
    "attr/test_interpretable_input.py": "text templates and token inputs for LLM attribution",
    "attr/models/test_base.py": "interpretable embedding layers of text models",
    "attr/test_data_parallel.py": "DataParallel across CUDA devices (every case needs two or more GPUs)",
    "attr/test_jit.py": "TorchScript models: camkit's explainers refuse them (hooks cannot attach)",
    "attr/test_dataloader_attr.py": "attribution over a DataLoader (DataLoaderAttribution): not translated",
    "attr/test_class_summarizer.py": "summarizers (running statistics of attributions): not attribution methods",
    "attr/test_summarizer.py": "summarizers: not attribution methods",
    "attr/test_stat.py": "summarizer statistics: not attribution methods",
    "attr/test_approximation_methods.py": "captum's private quadrature helpers (approximation_methods)",
    "attr/test_utils_batching.py": "captum's private batching helpers (_utils.batching)",
    "attr/test_common.py": "captum's private input-validation helpers (_utils.common)",
    "attr/test_baselines.py": "ProductBaselines (captum's baseline sampler for perturbation methods)",
    "attr/test_input_layer_wrapper.py": "ModelInputWrapper (layer attribution to model inputs)",

}
SUITES["captum"] = Suite(
    "captum",
    "captum-0.9.0",
    "captum",
    "camkit.compat.captum",
    "captum",
    "0.9.0",
    {
        "tests/attr/test_deeplift_basic.py::Test::test_reusable_modules": (
            "asserts captum's RuntimeError for a model that calls one ReLU module twice; camkit's DeepLift follows "
            "each call and computes it, equal to the same network with two modules "
            "(tests/compat/test_captum_install.py::test_deeplift_on_a_reused_relu_is_computed_where_captum_refuses)"
        ),
        **{
            f"tests/attr/layer/test_internal_influence.py::Test::{name}": (
                "expects 0.8 within 0.01 for an integral that is 0.81 (a ReLU step on 81 of the path's 100 units); "
                "captum passes only through its trapezoid weights summing to (n - 1)/n, camkit's sum to 1 "
                "(tests/compat/test_captum_layer_methods.py::"
                "test_internal_influence_integrates_a_relu_step_exactly_where_captum_falls_short)"
            )
            for name in ("test_simple_with_baseline_internal_inf", "test_multiple_with_baseline_internal_inf")
        },
        "tests/attr/test_lrp.py::Test::test_lrp_repeated_module": (
            "asserts captum's RuntimeError for a module used more than once; camkit's LRP reads calls, not modules, "
            "and propagates through each call"
        ),
        "tests/attr/test_lrp.py::Test::test_lrp_multi_inputs": (
            "asserts captum's relevance for a model that adds its two inputs: each summand gets the whole relevance "
            "of the sum, so the two carry it twice (the delta it asserts, -104: attributions summing to 192 for an output of 88); camkit shares it in proportion "
            "to the summands and carries it once "
            "(tests/compat/test_captum_gradient_forms.py::test_lrp_of_two_summed_inputs_shares_relevance_where_captum_duplicates_it)"
        ),
    },
    # CI: ten files whose tests all pass, the gradient, Grad-CAM, layer-activation and neuron ones (two runs:
    # about a minute on 2 cores); the other files by hand (`--suite captum`), as their failures are listed in
    # docs/migration/captum.md
    "test_saliency or test_input_x_gradient or test_deconvolution or test_guided_backprop or test_guided_grad_cam "
    "or test_grad_cam or test_layer_activation or test_layer_gradient_x_activation or test_neuron_gradient "
    "or test_neuron_integrated_gradients",
    files=_CAPTUM_FILES,
    left_out=_CAPTUM_LEFT_OUT,
)


# Quantus 0.6.0's tests: written for pytest 7 with pytest-lazy-fixture 0.6.3 (which pytest 8 and later
# break) and pytest-mock 3.10.0, installed by `make peer-suites` into <venv>/peer-quantus and put first
# on PYTHONPATH for these runs only; tools/peer_quantus.py stands in for TensorFlow (not installed).
SUITES["quantus"] = Suite(
    "quantus",
    "quantus-0.6.0",
    "quantus",
    "camkit.compat.quantus",
    "quantus",
    "0.6.0",
    {
        **{
            f"tests/metrics/test_robustness_metrics.py::test_return_nan_when_prediction_changes[{case}]": (
                "the mock_prediction_changed fixture replaces Quantus's private model wrappers' predict "
                "(quantus.helpers.model.pytorch_model.PyTorchModel and tf_model.TensorFlowModel), which camkit's "
                "metrics never call (they run the nn.Module itself); it errors on the original too without "
                "TensorFlow. What it checks (NaN when a perturbation changes the class) is tested in "
                "tests/compat/test_quantus_robustness.py"
            )
            for case in (
                "AvgSensitivity-load_1d_3ch_conv_model-almost_uniform_1d_no_abatch-params3",
                "AvgSensitivity-load_mnist_model-load_mnist_images-params2",
                "LocalLipschitzEstimate-load_1d_3ch_conv_model-almost_uniform_1d_no_abatch-params1",
                "LocalLipschitzEstimate-load_mnist_model-load_mnist_images-params0",
                "MaxSensitivity-load_1d_3ch_conv_model-almost_uniform_1d_no_abatch-params5",
                "MaxSensitivity-load_mnist_model-load_mnist_images-params4",
            )
        },
        "tests/metrics/test_robustness_metrics.py::test_return_nan_when_prediction_changes_continuity": (
            "replaces Quantus's private PyTorchModel.predict through mock_prediction_changed (see above)"
        ),
    },
    # CI: the axiomatic, complexity and localisation metrics but Focus (its 16 cases, which pass on camkit, add
    # about 30 s a run: over CI's minute) and AUC (one case compares floats exactly): 122 cases, about 25 s a
    # run on 2 cores
    "(test_axiomatic_metrics or test_complexity_metrics or test_localisation_metrics) and not test_focus "
    "and not test_auc",
    pytest_home="peer-quantus",
    plugins=("pytest_lazyfixture", "pytest_mock", "peer_quantus"),
    links=("tests", "tutorials"),
)


def peer_root(explicit: str | None) -> Path | None:
    """Where the peer suites are: ``--peer-dir``, ``$CAMKIT_PEER_SUITES``, or ``shared/peer-suites`` beside the checkout.

    For a git worktree, "beside the checkout" is beside the main checkout (the one holding the
    common ``.git``), so every worktree finds the same copy.
    """
    candidates = [explicit, os.environ.get("CAMKIT_PEER_SUITES"), str(ROOT.parent / "shared" / "peer-suites")]
    try:
        common = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--path-format=absolute", "--git-common-dir"],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout.strip()
        candidates.append(str(Path(common).parent.parent / "shared" / "peer-suites"))
    except (OSError, subprocess.SubprocessError):
        pass
    for candidate in candidates:
        if candidate and Path(candidate).is_dir():
            return Path(candidate)
    return None


def _workdir(suite: Suite | None = None, base: Path | None = None) -> Path:
    """A temporary working directory with ``examples/both.png`` (an RGB photograph, written as OpenCV reads it).

    It also holds links to the ``suite.links`` of the suite's folder ``base``.
    """
    import cv2
    from skimage import data

    work = Path(tempfile.mkdtemp(prefix="camkit-peer-"))
    (work / "examples").mkdir()
    cv2.imwrite(str(work / "examples" / "both.png"), cv2.cvtColor(data.astronaut(), cv2.COLOR_RGB2BGR))
    if suite is not None and base is not None:
        for name in suite.links:
            (work / name).symlink_to(base / name)
    return work


def pytest_home(suite: Suite) -> Path | None:
    """The folder of the suite's own pytest (``<venv>/<pytest_home>``), or None when the suite uses the venv's."""
    return Path(sys.prefix) / suite.pytest_home if suite.pytest_home else None


def run_once(suite: Suite, base: Path, files: list[str], keyword: str | None, compat: bool, timeout: float,
             workers: int = 0, threads: int | None = None) -> tuple[dict[str, str], float, str, dict[str, float]]:
    """One pytest run of ``suite``; ``({nodeid: outcome}, seconds, output tail, {nodeid: seconds})``.

    ``threads``: the run's torch (OpenMP) threads; ``None`` leaves torch's default.
    """
    work = _workdir(suite, base)
    report = work / "outcomes.json"
    tests = [str(base / "tests" / f) for f in files] if files else [str(base / "tests")]
    plugins = [option for name in suite.plugins for option in ("-p", name)]
    command = [sys.executable, "-m", "pytest", "-p", "peer_plugin", *plugins, "-p", "no:cacheprovider", "-q",
               "--rootdir", str(base), "-W", "ignore", "--continue-on-collection-errors", *tests]
    if keyword:
        command += ["-k", keyword]
    if workers > 1:
        command += ["-p", "xdist"] * (suite.pytest_home is not None) + ["-n", str(workers)]
    env = dict(os.environ)
    home = pytest_home(suite)
    first = [str(home)] if home is not None else []
    env["PYTHONPATH"] = os.pathsep.join([*first, str(ROOT / "tools"), str(ROOT), str(base), env.get("PYTHONPATH", "")])
    if home is not None:
        env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # the venv's plugins are written for its newer pytest
    env["CAMKIT_PEER_REPORT"] = str(report)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["TQDM_DISABLE"] = "1"
    env.pop("CAMKIT_PEER_COMPAT", None)
    if threads is not None:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    if compat:
        env["CAMKIT_PEER_COMPAT"] = suite.compat
    start = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=timeout)
        tail = (done.stdout + done.stderr)[-3000:]
    except subprocess.TimeoutExpired as expired:
        tail = f"timed out after {timeout:.0f} s\n" + str(expired.stdout or "")[-2000:]
    seconds = time.perf_counter() - start
    outcomes = json.loads(report.read_text()) if report.exists() else {}
    durations_file = Path(str(report) + ".durations")
    durations = json.loads(durations_file.read_text()) if durations_file.exists() else {}
    shutil.rmtree(work, ignore_errors=True)
    return outcomes, seconds, tail, durations


def slowest(durations: dict[str, float], count: int = 8) -> str:
    """The ``count`` slowest tests, one per line with their seconds."""
    ranked = sorted(durations.items(), key=lambda item: -item[1])[:count]
    return "\n".join(f"  {seconds:8.1f} s  {nodeid}" for nodeid, seconds in ranked)


def compare(suite: Suite, original: dict[str, str], ours: dict[str, str] | None) -> tuple[list[str], list[str]]:
    """Print both outcomes per test; return the regressions and the listed exceptions that ran."""
    regressions: list[str] = []
    excepted: list[str] = []
    width = max((len(n) for n in original), default=20)
    print(f"\n{'test':<{width}}  {'original':<8}  camkit")
    for nodeid in sorted(set(original) | set(ours or {})):
        theirs = original.get(nodeid, "-")
        mine = "missing" if ours is None else ours.get(nodeid, "-")
        note = ""
        if nodeid in suite.exceptions:
            excepted.append(nodeid)
            note = "  (listed exception: not counted)"
        elif theirs == "passed" and mine != "passed" and ours is not None:
            regressions.append(nodeid)
            note = "  <-- REGRESSION"
        print(f"{nodeid:<{width}}  {theirs:<8}  {mine}{note}")
    return regressions, excepted


def tally(outcomes: dict[str, str]) -> str:
    counts: dict[str, int] = {}
    for outcome in outcomes.values():
        counts[outcome] = counts.get(outcome, 0) + 1
    return ", ".join(f"{counts[k]} {k}" for k in ("passed", "failed", "error", "skipped") if k in counts) or "no tests"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", choices=[*SUITES, "all"], default="all")
    parser.add_argument("--files", nargs="*", default=[], help="test files to run (names under the suite's tests/)")
    parser.add_argument("-k", dest="keyword", default=None, help="pytest -k expression")
    parser.add_argument("--peer-dir", default=None, help="the peer-suites folder (default: ../shared/peer-suites)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per pytest run")
    parser.add_argument("--json", default=None, help="write the outcomes and timings to this file")
    parser.add_argument("-n", "--workers", type=int, default=0,
                        help="pytest-xdist worker processes per run (0 or 1: one process)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="pytest runs at a time (the original's and camkit's run side by side), the CPUs "
                             "shared out among them as torch threads")
    parser.add_argument("--ci", action="store_true",
                        help="CI's deterministic subset: each suite's ci_keyword unless -k is given (torchcam: every test)")
    args = parser.parse_args(argv)

    root = peer_root(args.peer_dir)
    if root is None:
        print("peer suites not found (../shared/peer-suites, $CAMKIT_PEER_SUITES or --peer-dir): skipped")
        return 0
    names = list(SUITES) if args.suite == "all" else [args.suite]
    plans: list[tuple[Suite, Path, list[str], str | None]] = []
    for name in names:
        suite = SUITES[name]
        base = root / suite.folder
        print(f"\n=== {suite.name}: {base}")
        if not (base / "tests").is_dir():
            print(f"{suite.name}: no tests/ folder at {base}: skipped")
            continue
        if importlib.util.find_spec(suite.original) is None:
            print(f"{suite.name}: the original package '{suite.original}' is not installed: skipped")
            continue
        installed = importlib.metadata.version(suite.distribution)
        if installed != suite.version:
            print(f"{suite.name}: {suite.distribution} {installed} is installed, the tests are {suite.version}'s: "
                  f"skipped (pip install {suite.distribution}=={suite.version}, or `make peer-suites`)")
            continue
        home = pytest_home(suite)
        if home is not None and not home.is_dir():
            print(f"{suite.name}: its pytest is not installed at {home}: skipped (`make peer-suites`)")
            continue
        files = [f for f in args.files if (base / "tests" / f).exists()] if args.files else list(suite.files)
        for left, why in ({} if args.files else suite.left_out).items():
            print(f"{suite.name}: left out {left}: {why}")
        if args.files and not files:
            print(f"{suite.name}: none of {args.files} is in this suite: skipped")
            continue
        keyword = args.keyword if args.keyword or not args.ci else suite.ci_keyword
        if keyword and keyword == suite.ci_keyword:
            print(f"{suite.name}: CI subset (-k {keyword!r})")
        if importlib.util.find_spec(suite.compat) is None:
            print(f"{suite.name}: compat module missing ({suite.compat}); the camkit run is skipped")
        plans.append((suite, base, files, keyword))
    # every run is submitted at once, in order: with --jobs 2 the original's run and camkit's of a suite
    # start together, and the next suite's runs follow as those end
    jobs = max(1, args.jobs)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    threads = max(1, cpus // jobs) if jobs > 1 else None
    with ThreadPoolExecutor(jobs) as pool:
        runs = {
            (suite.name, compat): pool.submit(run_once, suite, base, files, keyword, compat, args.timeout,
                                              args.workers, threads)
            for suite, base, files, keyword in plans
            for compat in (False, True)
            if not compat or importlib.util.find_spec(suite.compat) is not None
        }
    failed = False
    summary: dict[str, object] = {}
    for suite, _, _, _ in plans:
        name = suite.name
        original, t_orig, tail_orig, d_orig = runs[(name, False)].result()
        if (name, True) in runs:
            ours, t_ours, tail_ours, d_ours = runs[(name, True)].result()
        else:
            ours, t_ours, tail_ours, d_ours = None, 0.0, "", {}
        print(f"\n=== {suite.name}")
        regressions, excepted = compare(suite, original, ours)
        print(f"\n{suite.name} original: {tally(original)} in {t_orig:.0f} s; slowest:\n{slowest(d_orig)}")
        if ours is not None:
            print(f"{suite.name} camkit:   {tally(ours)} in {t_ours:.0f} s; slowest:\n{slowest(d_ours)}")
        for nodeid in excepted:
            print(f"not counted: {nodeid}: {suite.exceptions[nodeid]}")
        if not original:
            print(f"{suite.name}: the original run reported no tests; its output:\n{tail_orig}")
        if regressions:
            failed = True
            print(f"{suite.name}: {len(regressions)} test(s) pass on the original and not on camkit; camkit run output:\n{tail_ours}")
        summary[name] = {"original": original, "camkit": ours, "seconds": [round(t_orig), round(t_ours)],
                         "regressions": regressions, "exceptions": excepted,
                         "durations": {"original": d_orig, "camkit": d_ours}}
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1, sort_keys=True))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
