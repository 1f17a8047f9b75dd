"""The Audit tab on an audit of volumes: a row is re-explained live as the audit explained it (the slice through the peak)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
from media_helpers import AFFINE, lesion_scan
from mediafactory import volume_net

import camkit
from camkit.cli import main
from camkit.explorer import Session
from camkit.explorer.audit_tab import AuditBrowser
from camkit.media import write_volume
from camkit.media.nifti import normalize_intensity, read_volume

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("nibabel") is None, reason="NIfTI files need nibabel (the optional 'medical' extra)"
)


def test_a_volume_row_is_re_explained_live_through_the_slice_of_its_peak(tmp_path):
    data = tmp_path / "data"
    for label, center in (("healthy", (4, 4, 4)), ("lesion", (10, 6, 7))):
        (data / label).mkdir(parents=True)
        scan, _ = lesion_scan(center=center, seed=len(label))
        write_volume(data / label / f"{label}.nii.gz", scan, AFFINE)
    (tmp_path / "classes.txt").write_text("healthy\nlesion\nother\n")
    code = main(["audit", str(data), "--model", "mediafactory:volume_net", "--layer", "conv2", "--device", "cpu",
                 "--out", str(tmp_path / "audit"), "--classes", str(tmp_path / "classes.txt"), "--no-progress"])  # fmt: skip
    assert code == 0
    model = volume_net().eval()
    browser = AuditBrowser(Session(model, device="cpu"), [tmp_path / "audit"])
    label = browser.labels[0]
    _headers, cells, _count = browser.rows(label)
    assert len(cells) == 2
    key = next(r["key"] for r in browser._audit(label).rows if "lesion" in r["key"])
    saved, image, _note = browser.saved(label, key)
    assert saved is not None and image is not None and image.endswith(".nii.gz")
    picture, note = browser.explain(label, key, "gradcam", "conv2")
    assert picture is not None, note
    assert note.startswith("live: gradcam, layer conv2")
    # the picture is the Python API's map on the slice through its peak, enlarged by a whole factor
    x = torch.from_numpy(normalize_intensity(read_volume(image).data, "minmax"))[None, None]
    row = next(r for r in browser._audit(label).rows if r["key"] == key)
    heat = camkit.GradCAM(model, "conv2")(x, row["target"])[0].numpy()
    peak = int(heat.reshape(heat.shape[0], -1).max(axis=1).argmax())
    grey = (x[0, 0, peak].numpy() * 255).round().astype(np.uint8)
    expected = camkit.overlay(np.repeat(grey[:, :, None], 3, axis=2), heat[peak])
    factor = picture.shape[0] // expected.shape[0]
    assert factor >= 1 and np.array_equal(picture[::factor, ::factor], expected)
    # a method that does not fit is a message, not a crash
    picture, note = browser.explain(label, key, "gradcam", "no.such.layer")
    assert picture is None and "could not explain" in note
