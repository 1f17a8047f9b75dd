"""``camkit explain`` on a NIfTI scan, an MP4 clip and a signal; and each bad input in one line."""

from __future__ import annotations

import csv
import importlib.util
import json
import os

import numpy as np
import pytest
import torch
from media_helpers import AFFINE, burst_signal, moving_clip, write_scan
from mediafactory import signal_net, video_net, volume_net

import camkit
from camkit.cli import main
from camkit.media import read_video, read_volume, write_video
from camkit.runs.files import safe_name

needs_nibabel = pytest.mark.skipif(
    importlib.util.find_spec("nibabel") is None, reason="NIfTI files need nibabel (the optional 'medical' extra)"
)
pytest.importorskip("matplotlib")


def _run(capsys, *args):
    code = main(["explain", *map(str, args)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _files(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


@pytest.mark.heavy
@needs_nibabel
def test_explain_a_nifti_scan_writes_the_map_with_its_affine_and_slice_pictures(tmp_path, capsys):
    scan, _ = write_scan(tmp_path / "scan.nii.gz")
    code, out, err = _run(capsys, tmp_path / "scan.nii.gz", "--model", "mediafactory:volume_net", "--layer", "conv2",
                          "--intensity", "zscore", "--device", "cpu", "--out", tmp_path / "out")  # fmt: skip
    assert code == 0, err
    assert "explained 1 image(s), 0 failed" in out
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    entry = manifest["images"][0]
    stem = safe_name(str(tmp_path / "scan.nii.gz"), "")
    assert entry["kind"] == "volume" and entry["error"] == "" and entry["map"] == f"maps/{stem}.nii.gz"
    assert entry["pictures"] == [f"overlays/{stem}-slices.png", f"overlays/{stem}-montage.png"]
    assert manifest["model"]["preprocess"]["volume"] == {"size": None, "intensity": "zscore"}
    written = read_volume(tmp_path / "out" / entry["map"])
    assert written.shape == scan.shape
    np.testing.assert_allclose(written.affine, AFFINE, atol=1e-6)
    # the map equals Grad-CAM on the z-scored scan, computed here
    x = torch.from_numpy((scan - scan.mean()) / scan.std())[None, None]
    expected = camkit.GradCAM(volume_net().eval(), "conv2").explain(x)
    assert entry["prediction"] == int(expected.target[0])
    np.testing.assert_allclose(written.data, expected.maps[0].numpy(), atol=1e-5)
    slices = camkit.read_rgb(tmp_path / "out" / entry["pictures"][0])
    assert slices.shape == (round((2 * 2.5 + 0.7) * 100), 600, 3)  # 2 rows (scan, map) of 3 panels of 2 in
    assert _files(tmp_path / "out") == sorted(["manifest.json", entry["map"], *entry["pictures"]])


@needs_nibabel
def test_explain_resizes_a_volume_only_with_size_and_maps_it_back(tmp_path, capsys):
    _scan, _ = write_scan(tmp_path / "scan.nii")
    code, _, err = _run(capsys, tmp_path / "scan.nii", "--model", "mediafactory:volume_net", "--size", "8",
                        "--device", "cpu", "--out", tmp_path / "out")  # fmt: skip
    assert code == 0, err
    entry = json.loads((tmp_path / "out" / "manifest.json").read_text())["images"][0]
    assert entry["model_input"] == [1, 1, 8, 8, 8] and entry["map_shape"] == [16, 16, 16]
    written = read_volume(tmp_path / "out" / entry["map"])
    assert written.shape == (16, 16, 16) and 0 <= written.data.min() and written.data.max() <= 1
    code, _, err = _run(capsys, tmp_path / "scan.nii", "--model", "mediafactory:volume_net", "--size", "4x8",
                        "--device", "cpu", "--out", tmp_path / "bad")  # fmt: skip
    assert code == 2 and err.count("\n") == 1 and "N (a cube) or DxHxW, got 4x8" in err


def test_explain_an_mp4_writes_the_map_an_overlay_video_and_the_frame_curve(tmp_path, capsys):
    clip = moving_clip(frames=10)
    write_video(tmp_path / "clip.mp4", clip, fps=5)
    code, _out, err = _run(capsys, tmp_path / "clip.mp4", "--model", "mediafactory:video_net", "--layer", "conv2",
                          "--device", "cpu", "--out", tmp_path / "out")  # fmt: skip
    assert code == 0, err
    entry = json.loads((tmp_path / "out" / "manifest.json").read_text())["images"][0]
    assert entry["kind"] == "video" and entry["clips"] == 1 and entry["fps"] == 5.0
    heat = np.load(tmp_path / "out" / entry["map"])
    assert heat.shape == (10, 32, 32) and heat.dtype == np.float32
    # the map equals Grad-CAM on the frames as read back and preprocessed (ImageNet statistics, no resize)
    frames = read_video(tmp_path / "clip.mp4").frames
    x = (torch.from_numpy(frames).permute(3, 0, 1, 2).float() / 255 - torch.tensor(camkit.io.IMAGENET_MEAN).view(3, 1, 1, 1)) \
        / torch.tensor(camkit.io.IMAGENET_STD).view(3, 1, 1, 1)  # fmt: skip
    expected = camkit.GradCAM(video_net().eval(), "conv2").explain(x[None])
    np.testing.assert_allclose(heat, expected.maps[0].numpy(), atol=1e-5)
    overlay = read_video(tmp_path / "out" / entry["overlay_video"])
    assert entry["overlay_video"].endswith(".mp4") and overlay.frames.shape == (10, 32, 32, 3) and overlay.fps == 5.0
    with open(tmp_path / "out" / entry["curve"]) as handle:
        rows = list(csv.DictReader(handle))
    assert [int(r["frame"]) for r in rows] == list(range(10)) and float(rows[3]["seconds"]) == 0.6
    shares = np.array([float(r["share"]) for r in rows])
    np.testing.assert_allclose(shares, expected.frame_share[0].numpy(), atol=1e-5)
    stem = entry["overlay_video"][: -len(".mp4")]
    assert entry["pictures"] == [stem + "-frames.png", stem + "-curve.png"]
    assert camkit.read_rgb(tmp_path / "out" / entry["pictures"][1]).shape == (200, 600, 3)


@pytest.mark.heavy
def test_explain_cuts_a_video_into_clips_for_one_class(tmp_path, capsys):
    write_video(tmp_path / "clip.gif", moving_clip(frames=10, height=16, width=16, size=4), fps=4)
    code, _, err = _run(capsys, tmp_path / "clip.gif", "--model", "mediafactory:video_net", "--frames", "4",
                        "--stride", "2", "--video-format", "gif", "--device", "cpu", "--out", tmp_path / "out")  # fmt: skip
    assert code == 0, err
    entry = json.loads((tmp_path / "out" / "manifest.json").read_text())["images"][0]
    assert entry["clips"] == 4 and entry["note"] == "" and len(entry["targets"]) == 1  # starts 0, 2, 4, 6
    assert np.load(tmp_path / "out" / entry["map"]).shape == (10, 16, 16)
    assert len(read_video(tmp_path / "out" / entry["overlay_video"]).frames) == 10
    code, _, err = _run(capsys, tmp_path / "clip.gif", "--model", "mediafactory:video_net", "--frames", "4",
                        "--device", "cpu", "--out", tmp_path / "out2")  # fmt: skip
    entry = json.loads((tmp_path / "out2" / "manifest.json").read_text())["images"][0]
    assert entry["clips"] == 2 and entry["note"] == "the last 2 frame(s) fill no whole clip of 4: not explained"
    assert np.load(tmp_path / "out2" / entry["map"]).shape == (8, 16, 16)


def test_explain_a_signal(tmp_path, capsys):
    np.save(tmp_path / "ecg.npy", burst_signal())
    code, _, err = _run(capsys, tmp_path / "ecg.npy", "--model", "mediafactory:signal_net", "--layer", "conv2", "--device", "cpu",
                        "--out", tmp_path / "out")  # fmt: skip
    assert code == 0, err
    entry = json.loads((tmp_path / "out" / "manifest.json").read_text())["images"][0]
    expected = camkit.GradCAM(signal_net().eval(), "conv2").explain(torch.from_numpy(burst_signal())[None])
    np.testing.assert_allclose(np.load(tmp_path / "out" / entry["map"]), expected.maps[0].numpy(), atol=1e-5)
    assert camkit.read_rgb(tmp_path / "out" / entry["pictures"][0]).shape[1] == 800


@needs_nibabel
def test_bad_inputs_get_one_line_error_rows_and_no_files(tmp_path, capsys):
    import nibabel as nib

    write_scan(tmp_path / "ok.nii.gz")
    nib.save(nib.Nifti1Image(np.zeros((8, 8, 8, 4), np.float32), AFFINE), str(tmp_path / "fmri.nii.gz"))
    write_scan(tmp_path / "big.nii.gz", shape=(20, 20, 20))
    (tmp_path / "junk.nii").write_bytes(b"\x00" * 100)
    code, _out, err = _run(capsys, *(tmp_path / n for n in ("ok.nii.gz", "fmri.nii.gz", "big.nii.gz", "junk.nii")),
                          "--model", "mediafactory:volume_net", "--max-voxels", "5000", "--device", "cpu",
                          "--out", tmp_path / "out")  # fmt: skip
    assert code == 1
    entries = {os.path.basename(e["path"]): e for e in json.loads((tmp_path / "out" / "manifest.json").read_text())["images"]}
    assert entries["ok.nii.gz"]["error"] == ""
    assert entries["fmri.nii.gz"]["error"].startswith("fmri.nii.gz is 4-D [8, 8, 8, 4]: a time series of 4 volumes")
    assert entries["big.nii.gz"]["error"].startswith("big.nii.gz is 20x20x20 = 8000 voxels, more than max_voxels=5000")
    assert entries["junk.nii"]["error"].startswith("junk.nii could not be read as NIfTI")
    assert err.count("failed: ") == 3 and all(len(line) < 400 for line in err.splitlines())
    stem = safe_name(str(tmp_path / "ok.nii.gz"), "")
    assert _files(tmp_path / "out") == sorted(["manifest.json", f"maps/{stem}.nii.gz", f"overlays/{stem}-slices.png",
                                               f"overlays/{stem}-montage.png"])  # fmt: skip


@needs_nibabel
def test_a_rank_or_channel_count_the_model_does_not_take(tmp_path, capsys):
    write_scan(tmp_path / "scan.nii.gz")
    write_video(tmp_path / "clip.mp4", moving_clip(frames=6, height=16, width=16, size=4), fps=5)
    (tmp_path / "empty.mp4").write_bytes(b"")
    (tmp_path / "junk.avi").write_bytes(os.urandom(4096))
    cases = [
        ("scan.nii.gz", "mediafactory:image_net", "the model takes images [B, C, H, W] (its first convolution is a Conv2d), but this input is volumes or videos [1, 1, 16, 16, 16]"),
        ("clip.mp4", "mediafactory:signal_net", "the model takes signals [B, C, T]"),
        ("scan.nii.gz", "mediafactory:video_net", "takes 3 channel(s), but x has 1"),
        ("clip.mp4", "mediafactory:volume_net", "takes 1 channel(s), but x has 3"),
        ("empty.mp4", "mediafactory:video_net", "empty.mp4 is empty (0 bytes)"),
        ("junk.avi", "mediafactory:video_net", "junk.avi "),
    ]
    for name, model, message in cases:
        out = tmp_path / f"out-{name}-{model.split(':')[1]}"
        code, _, err = _run(capsys, tmp_path / name, "--model", model, "--device", "cpu", "--out", out)
        assert code == 1, (name, model, err)
        entry = json.loads((out / "manifest.json").read_text())["images"][0]
        assert message in entry["error"] and "\n" not in entry["error"], (name, entry["error"])
        assert _files(out) == ["manifest.json"]


@needs_nibabel
def test_images_and_volumes_are_explained_in_separate_runs(tmp_path, capsys):
    write_scan(tmp_path / "scan.nii.gz")
    camkit.save_png(tmp_path / "a.png", np.zeros((8, 8, 3), np.uint8))
    code, _, err = _run(capsys, tmp_path / "scan.nii.gz", tmp_path / "a.png", "--model", "mediafactory:volume_net",
                        "--device", "cpu", "--out", tmp_path / "out")  # fmt: skip
    assert code == 2 and err.count("\n") == 1 and "separate runs" in err and "a.png is an image" in err
    assert not (tmp_path / "out").exists()


@needs_nibabel
def test_without_matplotlib_the_maps_are_written_and_the_note_says_why_pictures_are_missing(tmp_path, capsys,
                                                                                             monkeypatch):  # fmt: skip
    import sys

    write_scan(tmp_path / "scan.nii.gz")
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    code, _, err = _run(capsys, tmp_path / "scan.nii.gz", "--model", "mediafactory:volume_net", "--device", "cpu",
                        "--out", tmp_path / "out")  # fmt: skip
    assert code == 0, err
    entry = json.loads((tmp_path / "out" / "manifest.json").read_text())["images"][0]
    assert entry["note"] == "pictures left out: they need matplotlib (pip install 'camkit[plot]')"
    assert "pictures" not in entry and _files(tmp_path / "out") == sorted(["manifest.json", entry["map"]])


def test_clips_of_a_video_for_a_model_of_another_rank_fail_in_one_line(tmp_path, capsys):
    write_video(tmp_path / "clip.mp4", moving_clip(frames=8, height=16, width=16, size=4), fps=5)
    code, _, _ = _run(capsys, tmp_path / "clip.mp4", "--model", "mediafactory:image_net", "--frames", "4",
                      "--device", "cpu", "--out", tmp_path / "out")  # fmt: skip
    entry = json.loads((tmp_path / "out" / "manifest.json").read_text())["images"][0]
    assert code == 1 and entry["error"].startswith("the model takes images [B, C, H, W]"), entry["error"]
