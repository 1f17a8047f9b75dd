"""camkit.compat.quantus.install(): Quantus's import paths resolve to camkit's translation, or refuse clearly.

Everything that touches ``sys.modules`` runs in a subprocess, so the real Quantus's import state
never leaks into (or from) the test session.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("quantus")

ROOT = Path(__file__).resolve().parents[2]


def run(code: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                          timeout=120, cwd=ROOT)  # fmt: skip


def test_install_aliases_quantus_paths_to_camkit_and_names_what_it_lacks() -> None:
    done = run("""
        import sys
        import camkit.compat.quantus as cq
        cq.install(); cq.install()  # twice is harmless
        import quantus
        from quantus.metrics.faithfulness import PixelFlipping, IROF
        from quantus.metrics import MPRT
        from quantus.functions.similarity_func import correlation_spearman
        from quantus.functions.explanation_func import explain
        from quantus.helpers.model.model_interface import ModelInterface
        assert quantus is cq and quantus.installed()
        assert PixelFlipping is cq.PixelFlipping and IROF is cq.IROF and MPRT is cq.MPRT
        assert quantus.similarity_func.correlation_spearman is correlation_spearman
        assert correlation_spearman.__module__.startswith("camkit.compat.quantus")
        assert quantus.explain is explain and quantus.__version__ == "0.6.0"
        real = [m for m, mod in sys.modules.items() if m.startswith("quantus") and "site-packages" in str(getattr(mod, "__file__", ""))]
        assert not real, real
        # the parts camkit does not translate raise an error that names them
        # quantus.helpers.utils holds camkit's index helpers; its other names raise an error that names them
        from quantus.helpers import utils
        from quantus.helpers.utils import expand_indices, get_baseline_value
        assert expand_indices.__module__.startswith("camkit.compat.quantus") and utils.get_baseline_value is get_baseline_value
        try:
            from quantus.helpers.utils import get_name
        except cq.NotTranslatedError as error:
            assert "quantus.helpers.utils.get_name" in str(error), error
            assert isinstance(error, ImportError)
        else:
            raise SystemExit("no error")
        from quantus.helpers.model.pytorch_model import PyTorchModel
        assert PyTorchModel.__module__ == "camkit.compat.quantus.functions.pytorch_model"
        try:
            from quantus.helpers.model.tf_model import TensorFlowModel
        except cq.NotTranslatedError as error:
            assert "tf_model.TensorFlowModel" in str(error), error
        else:
            raise SystemExit("no error for the TensorFlow model wrapper")
        try:
            from quantus.helpers.plotting import *  # a star import is refused too
        except cq.NotTranslatedError:
            pass
        else:
            raise SystemExit("no error for the star import")
        try:
            quantus.baseline_replacement_by_indices
        except AttributeError as error:
            assert "original Quantus" in str(error)
        # uninstall gives the real Quantus back
        cq.uninstall()
        assert not cq.installed()
        del quantus
        import quantus
        assert quantus is not cq and quantus.__file__.endswith("quantus/__init__.py"), quantus.__file__
        print("OK")
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "OK"


def test_install_refuses_when_quantus_is_already_imported() -> None:
    done = run("""
        import quantus
        import camkit.compat.quantus as cq
        try:
            cq.install()
        except cq.AlreadyImportedError as error:
            assert "before the first 'import quantus'" in str(error) and "site-packages" in str(error), error
            assert isinstance(error, ImportError)
            assert not cq.installed()
            print("REFUSED")
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "REFUSED"
