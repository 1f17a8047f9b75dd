"""``camkit audit`` over volumes with region masks (energy and pointing in 3-D), and over videos."""

from __future__ import annotations

import csv
import importlib.util
import json

import numpy as np
import pytest
import torch
from media_helpers import AFFINE, lesion_scan, moving_clip, write_scan
from mediafactory import volume_net

import camkit
from camkit.cli import main
from camkit.media import write_video, write_volume
from camkit.metrics import energy_pointing_game, pointing_game
from camkit.runs.files import safe_name

needs_nibabel = pytest.mark.skipif(
    importlib.util.find_spec("nibabel") is None, reason="NIfTI files need nibabel (the optional 'medical' extra)"
)


def _rows(path):
    with open(path, newline="") as handle:
        return {r["key"]: r for r in csv.DictReader(handle)}


@pytest.fixture(scope="module")
def scans(tmp_path_factory):
    import nibabel as nib

    """Four scans (lesions in different places) with lesion and organ masks, a CSV, and three bad rows."""
    root = tmp_path_factory.mktemp("scans")
    (root / "masks").mkdir()
    lines = ["path,label,object_mask,organ_mask"]
    for i, center in enumerate([(5, 10, 9), (10, 5, 5), (8, 8, 11), (4, 4, 4)]):
        scan, lesion = lesion_scan(center=center, seed=i)
        write_volume(root / f"scan{i}.nii.gz", scan, AFFINE)
        write_volume(root / "masks" / f"lesion{i}.nii.gz", lesion.astype(np.float32), AFFINE)
        np.save(root / "masks" / f"organ{i}.npy", scan > 50)
        lines.append(f"scan{i}.nii.gz,{'ab'[i % 2]},masks/lesion{i}.nii.gz,masks/organ{i}.npy")
    nib.save(nib.Nifti1Image(np.zeros((16, 16, 16, 2), np.float32), AFFINE), str(root / "fmri.nii.gz"))
    write_volume(root / "masks" / "small.nii.gz", np.ones((8, 8, 8)), AFFINE)
    lines += ["fmri.nii.gz,a,,", "scan0.nii,a,masks/small.nii.gz,", "scan1.nii.gz.bak,b,,"]
    write_scan(root / "scan0.nii")  # the same scan as .nii, with a mask of the wrong shape
    (root / "data.csv").write_text("\n".join(lines[:-1]) + "\n")  # the .bak row left out
    return root


@needs_nibabel
def test_audit_over_volumes_with_masks_measures_energy_and_pointing_in_3d(scans, tmp_path, capsys):
    code = main(["audit", str(scans / "data.csv"), "--model", "mediafactory:volume_net", "--layer", "conv2",
                 "--device", "cpu", "--out", str(tmp_path / "out"), "--classes", str(_classes(tmp_path)),
                 "--save-maps", "--no-progress"])  # fmt: skip
    captured = capsys.readouterr()
    assert code == 1, captured.err  # two bad rows
    rows = _rows(tmp_path / "out" / "results.csv")
    assert list(rows) == [f"scan{i}.nii.gz" for i in range(4)] + ["fmri.nii.gz", "scan0.nii"]
    assert rows["fmri.nii.gz"]["error"].startswith("fmri.nii.gz is 4-D [16, 16, 16, 2]: a time series")
    assert rows["scan0.nii"]["error"] == (
        "mask small.nii.gz for region 'object' is [8, 8, 8], the input is [16, 16, 16]; masks must match it"
    )
    net = volume_net().eval()
    for i in range(4):
        row = rows[f"scan{i}.nii.gz"]
        scan, lesion = lesion_scan(center=[(5, 10, 9), (10, 5, 5), (8, 8, 11), (4, 4, 4)][i], seed=i)
        e = camkit.GradCAM(net, "conv2").explain(torch.from_numpy(scan)[None, None])
        assert int(row["prediction"]) == int(e.target[0]) and row["error"] == ""
        lesion_t = torch.from_numpy(lesion)[None]
        assert float(row["energy_object"]) == pytest.approx(float(energy_pointing_game(e.maps, lesion_t)[0]), abs=1e-5)
        assert float(row["pointing_object"]) == float(pointing_game(e.maps, lesion_t)[0])
        organ = torch.from_numpy(scan > 50)[None]
        assert float(row["energy_organ"]) == pytest.approx(float(energy_pointing_game(e.maps, organ)[0]), abs=1e-5)
        # energy by hand: the map's mass inside the lesion over its whole mass
        assert float(row["energy_object"]) == pytest.approx(float(e.maps[0][lesion_t[0]].sum() / e.maps[0].sum()), abs=1e-5)
        saved = camkit.media.read_volume(tmp_path / "out" / "maps" / safe_name(row["key"], ".nii.gz"))  # --save-maps
        np.testing.assert_allclose(saved.affine, AFFINE, atol=1e-6)
        np.testing.assert_allclose(saved.data, e.maps[0].numpy(), atol=1e-5)
        thumb = camkit.read_rgb(tmp_path / "out" / row["overlay"])
        assert thumb.shape == (16, 16, 3)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["images"] == 6 and summary["errors"] == 2 and set(summary["energy"]) == {"object", "organ"}
    assert summary["data"]["kind"] == "csv of volumes"
    report = (tmp_path / "out" / "report.html").read_text()
    assert "energy object" in report and "energy organ" in report and "Attention most outside the object" in report
    assert report.count('src="data:image/png;base64,') >= 4


def _classes(tmp_path):
    (tmp_path / "classes.txt").write_text("a\nb\nc\n")
    return tmp_path / "classes.txt"


@needs_nibabel
def test_audit_over_a_folder_of_class_folders_of_volumes_and_max_voxels(tmp_path, capsys):
    for label, centers in (("healthy", [(4, 4, 4)]), ("lesion", [(8, 8, 8), (10, 6, 7)])):
        (tmp_path / "data" / label).mkdir(parents=True)
        for i, c in enumerate(centers):
            write_scan(tmp_path / "data" / label / f"s{i}.nii.gz", center=c)
    write_scan(tmp_path / "data" / "lesion" / "big.nii.gz", shape=(24, 24, 24))
    code = main(["audit", str(tmp_path / "data"), "--model", "mediafactory:volume_net", "--device", "cpu",
                 "--out", str(tmp_path / "out"), "--alphabetical-classes", "--max-voxels", "5000",
                 "--intensity", "percentile", "--size", "12", "--no-progress"])  # fmt: skip
    captured = capsys.readouterr()
    assert code == 1, captured.err
    rows = _rows(tmp_path / "out" / "results.csv")
    assert sorted(rows) == ["healthy/s0.nii.gz", "lesion/big.nii.gz", "lesion/s0.nii.gz", "lesion/s1.nii.gz"]
    assert rows["lesion/big.nii.gz"]["error"].startswith("big.nii.gz is 24x24x24 = 13824 voxels, more than max_voxels=5000")
    assert rows["healthy/s0.nii.gz"]["label"] == "healthy" and rows["lesion/s0.nii.gz"]["correct"] in ("0", "1")
    assert camkit.read_rgb(tmp_path / "out" / rows["lesion/s0.nii.gz"]["overlay"]).shape == (12, 12, 3)  # --size 12
    run = json.loads((tmp_path / "out" / "run.json").read_text())
    assert run["preprocess"]["volume"] == {"size": [12, 12, 12], "intensity": "percentile"}
    assert "failed: 1 image(s): FILE is 24x24x24" in captured.err


def test_audit_over_videos_with_a_mask_volume(tmp_path, capsys):
    (tmp_path / "data").mkdir()
    lines = ["path,object_mask"]
    for i in range(2):
        clip = moving_clip(frames=6, height=16, width=16, size=4 + 2 * i)
        write_video(tmp_path / "data" / f"c{i}.gif", clip, fps=4)
        np.save(tmp_path / "data" / f"m{i}.npy", (clip[..., 2] < 100))  # the yellow square, frame by frame
        lines.append(f"c{i}.gif,m{i}.npy")
    (tmp_path / "data" / "v.csv").write_text("\n".join(lines) + "\n")
    code = main(["audit", str(tmp_path / "data" / "v.csv"), "--model", "mediafactory:video_net", "--layer", "conv2",
                 "--device", "cpu", "--out", str(tmp_path / "out"), "--no-progress"])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    rows = _rows(tmp_path / "out" / "results.csv")
    for i in range(2):
        row = rows[f"c{i}.gif"]
        frames = camkit.media.read_video(tmp_path / "data" / f"c{i}.gif").frames
        x = (torch.from_numpy(frames).permute(3, 0, 1, 2).float() / 255 - torch.tensor(camkit.io.IMAGENET_MEAN).view(3, 1, 1, 1)) \
            / torch.tensor(camkit.io.IMAGENET_STD).view(3, 1, 1, 1)  # fmt: skip
        from mediafactory import video_net

        e = camkit.GradCAM(video_net().eval(), "conv2").explain(x[None])
        mask = torch.from_numpy(np.load(tmp_path / "data" / f"m{i}.npy"))[None]
        assert float(row["energy_object"]) == pytest.approx(float(energy_pointing_game(e.maps, mask)[0]), abs=1e-5)
        assert camkit.read_rgb(tmp_path / "out" / row["overlay"]).shape == (16, 16, 3)


@needs_nibabel
def test_audit_rows_for_a_model_of_another_rank_or_channel_count(tmp_path, capsys):
    (tmp_path / "data").mkdir()
    write_scan(tmp_path / "data" / "scan.nii.gz")
    for model, message in (("mediafactory:image_net", "the model takes images [B, C, H, W]"),
                           ("mediafactory:video_net", "takes 3 channel(s), but x has 1")):  # fmt: skip
        out = tmp_path / model.split(":")[1]
        code = main(["audit", str(tmp_path / "data"), "--model", model, "--device", "cpu", "--out", str(out),
                     "--no-progress"])  # fmt: skip
        assert code == 1
        error = _rows(out / "results.csv")["scan.nii.gz"]["error"]
        assert message in error and "\n" not in error, error
        assert [p.name for p in out.rglob("*") if p.parent.name in ("overlays", "maps")] == []  # no picture, no map
    capsys.readouterr()


@needs_nibabel
def test_resume_skips_finished_volumes_and_a_changed_setting_is_refused(tmp_path, capsys):
    (tmp_path / "data").mkdir()
    for i in range(3):
        write_scan(tmp_path / "data" / f"s{i}.nii.gz", center=(4 + i, 8, 8))
    args = ["audit", str(tmp_path / "data"), "--model", "mediafactory:volume_net", "--device", "cpu",
            "--out", str(tmp_path / "out"), "--no-progress", "--batch-size", "2"]  # fmt: skip
    assert main(args) == 0
    first = (tmp_path / "out" / "results.csv").read_text()
    assert main([*args, "--resume"]) == 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["images_this_run"] == 0 and (tmp_path / "out" / "results.csv").read_text() == first
    assert main([*args, "--resume", "--intensity", "zscore"]) == 2  # the preprocessing changed: not the same run
    assert "preprocess" in capsys.readouterr().err


@needs_nibabel
def test_faithfulness_on_volumes_and_mean_std_refused_for_them(tmp_path, capsys):
    (tmp_path / "data").mkdir()
    write_scan(tmp_path / "data" / "s.nii.gz")
    base = ["audit", str(tmp_path / "data"), "--model", "mediafactory:volume_net", "--device", "cpu", "--no-progress"]
    assert main([*base, "--out", str(tmp_path / "out"), "--faithfulness", "--steps", "4"]) == 0
    row = _rows(tmp_path / "out" / "results.csv")["s.nii.gz"]
    assert 0 <= float(row["deletion_auc"]) <= 1 and 0 <= float(row["insertion_auc"]) <= 1
    assert main([*base, "--out", str(tmp_path / "bad"), "--mean", "0", "0", "0", "--std", "1", "1", "1"]) == 2
    assert "volumes take --intensity" in capsys.readouterr().err and not (tmp_path / "bad").exists()
