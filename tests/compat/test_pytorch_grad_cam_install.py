"""install(): pytorch-grad-cam's import paths resolve to camkit's translation; a cam.py-style script runs unchanged.

Everything that touches ``sys.modules`` runs in one subprocess, so the real package's import
state never leaks into (or from) the test session.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("pytorch_grad_cam")
cv2 = pytest.importorskip("cv2")

ROOT = Path(__file__).resolve().parents[2]

# In the style of pytorch-grad-cam's usage example (cam.py): argparse, a torchvision ResNet,
# cv2 image IO, a method table, the context manager, guided backprop and the overlays.
CAM_PY = """
import argparse
import cv2
import numpy as np
import torch
from torchvision import models
from pytorch_grad_cam import GradCAM, HiResCAM, ScoreCAM, GradCAMPlusPlus, AblationCAM, XGradCAM, EigenCAM, \\
    EigenGradCAM, LayerCAM, FullGrad, GradCAMElementWise, KPCA_CAM, ShapleyCAM, FinerCAM
from pytorch_grad_cam import GuidedBackpropReLUModel
from pytorch_grad_cam.utils.image import show_cam_on_image, deprocess_image, preprocess_image
from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

parser = argparse.ArgumentParser()
parser.add_argument('--image-path', type=str, default='./examples/both.png')
parser.add_argument('--aug-smooth', action='store_true')
parser.add_argument('--eigen-smooth', action='store_true')
parser.add_argument('--method', type=str, default='gradcam')
parser.add_argument('--output-dir', type=str, default='output')
args = parser.parse_args()
methods = {"gradcam": GradCAM, "hirescam": HiResCAM, "scorecam": ScoreCAM, "gradcam++": GradCAMPlusPlus,
           "ablationcam": AblationCAM, "xgradcam": XGradCAM, "eigencam": EigenCAM, "eigengradcam": EigenGradCAM,
           "layercam": LayerCAM, "fullgrad": FullGrad, "gradcamelementwise": GradCAMElementWise,
           "kpcacam": KPCA_CAM, "shapleycam": ShapleyCAM, "finercam": FinerCAM}
torch.manual_seed(0)
model = models.resnet18(num_classes=10).eval()
target_layers = [model.layer4]
rgb_img = cv2.imread(args.image_path, 1)[:, :, ::-1]
rgb_img = np.float32(rgb_img) / 255
input_tensor = preprocess_image(rgb_img, mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
targets = None
cam_algorithm = methods[args.method]
with cam_algorithm(model=model, target_layers=target_layers) as cam:
    cam.batch_size = 32
    grayscale_cam = cam(input_tensor=input_tensor, targets=targets, aug_smooth=args.aug_smooth,
                        eigen_smooth=args.eigen_smooth)
    grayscale_cam = grayscale_cam[0, :]
    cam_image = show_cam_on_image(rgb_img, grayscale_cam, use_rgb=True)
    cam_image = cv2.cvtColor(cam_image, cv2.COLOR_RGB2BGR)
gb_model = GuidedBackpropReLUModel(model=model, device='cpu')
gb = gb_model(input_tensor, target_category=None)
cam_mask = cv2.merge([grayscale_cam, grayscale_cam, grayscale_cam])
cam_gb = deprocess_image(cam_mask * gb)
gb = deprocess_image(gb)
cv2.imwrite(f'{args.output_dir}/{args.method}_cam.jpg', cam_image)
cv2.imwrite(f'{args.output_dir}/{args.method}_gb.jpg', gb)
cv2.imwrite(f'{args.output_dir}/{args.method}_cam_gb.jpg', cam_gb)
print("SHAPES", grayscale_cam.shape, cam_image.shape, gb.shape)
"""

SCRIPT = """
import sys, runpy
import camkit.compat.pytorch_grad_cam as compat
compat.install()
for method in ("gradcam", "eigencam", "finercam"):
    sys.argv = ["cam.py", "--method", method, "--aug-smooth"]
    runpy.run_path("cam.py", run_name="__main__")
"""

CHECKS = """
import sys
import camkit.compat.pytorch_grad_cam as compat
compat.install()
compat.install()  # twice is harmless
import pytorch_grad_cam
import pytorch_grad_cam.utils.model_targets as targets
from pytorch_grad_cam.metrics.road import ROADCombined
from pytorch_grad_cam.sess import sliding_window
assert pytorch_grad_cam is compat and pytorch_grad_cam.GradCAM is compat.GradCAM
assert targets.__name__ == "camkit.compat.pytorch_grad_cam.utils.model_targets"
assert all(m.__name__.startswith("camkit.compat.pytorch_grad_cam") for n, m in sys.modules.items()
           if n.startswith("pytorch_grad_cam"))
try:
    import pytorch_grad_cam.sobel_cam_not_a_module
except ModuleNotFoundError:
    print("MISSING-SUBMODULE-RAISES")
compat.uninstall()
assert not compat.installed() and "pytorch_grad_cam" not in sys.modules
import pytorch_grad_cam as real
assert real is not compat and real.__name__ == "pytorch_grad_cam" and "camkit" not in real.__file__
try:
    compat.install()
except compat.AlreadyImportedError as err:
    assert isinstance(err, ImportError) and "before the first 'import pytorch_grad_cam'" in str(err)
    print("REFUSED")
"""


def _run(code, cwd):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "TQDM_DISABLE": "1"}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=900)


@pytest.mark.heavy
def test_install_aliases_the_package_and_refuses_after_the_real_import(tmp_path):
    done = _run(CHECKS, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "MISSING-SUBMODULE-RAISES" in done.stdout and "REFUSED" in done.stdout


@pytest.mark.slow  # three CAMs with aug_smooth and guided backprop on a ResNet-18: minutes on a loaded CPU
def test_a_cam_py_style_script_runs_unchanged_after_install(tmp_path):
    rng = np.random.default_rng(0)
    (tmp_path / "examples").mkdir()
    cv2.imwrite(str(tmp_path / "examples" / "both.png"), rng.integers(0, 255, (48, 64, 3), dtype="uint8"))
    (tmp_path / "output").mkdir()
    (tmp_path / "cam.py").write_text(CAM_PY)
    done = _run(SCRIPT, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("SHAPES (48, 64) (48, 64, 3) (48, 64, 3)") == 3
    written = sorted(p.name for p in (tmp_path / "output").iterdir())
    assert len(written) == 9 and "gradcam_cam.jpg" in written
