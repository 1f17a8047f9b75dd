"""NIfTI volumes, video files and signals: round trips, frame counts, and one-line refusals."""

from __future__ import annotations

import gzip
import importlib.util
import os
import sys

import numpy as np
import pytest

import camkit
from camkit.media import read_signal, read_video, read_volume, video_clips, write_video, write_volume
from camkit.media.nifti import normalize_intensity

needs_nibabel = pytest.mark.skipif(
    importlib.util.find_spec("nibabel") is None, reason="NIfTI files need nibabel (the optional 'medical' extra)"
)

# A rotation about the third axis by 30 degrees, anisotropic voxels and a shift: no identity hides a bug.
_C, _S = np.cos(np.pi / 6), np.sin(np.pi / 6)
AFFINE = np.array([[0.9 * _C, -0.9 * _S, 0.0, -40.0], [0.9 * _S, 0.9 * _C, 0.0, 12.5],
                   [0.0, 0.0, 2.5, 7.0], [0.0, 0.0, 0.0, 1.0]])  # fmt: skip


def _leftovers(folder):
    return sorted(p for p in os.listdir(folder) if p.startswith(".tmp-"))


@pytest.mark.parametrize("name", ["scan.nii", "scan.nii.gz", "SCAN.NII.GZ"])
@needs_nibabel
def test_nifti_round_trip_keeps_shape_values_and_affine(tmp_path, name):
    import nibabel as nib

    data = np.random.default_rng(0).normal(size=(5, 7, 9)).astype(np.float32)
    write_volume(tmp_path / name, data, AFFINE)
    volume = read_volume(tmp_path / name)
    assert volume.shape == (5, 7, 9)
    np.testing.assert_array_equal(volume.data, data)
    np.testing.assert_allclose(volume.affine, AFFINE, rtol=0, atol=1e-6)  # NIfTI stores the sform in float32
    np.testing.assert_allclose(volume.zooms, (0.9, 0.9, 2.5), rtol=1e-6)
    image = nib.load(str(tmp_path / name))  # what a viewer reads: both the qform and the sform, code 1
    assert int(image.header["sform_code"]) == 1 and int(image.header["qform_code"]) == 1
    np.testing.assert_allclose(image.header.get_qform(), AFFINE, atol=1e-5)
    if name.lower().endswith(".gz"):
        assert gzip.open(tmp_path / name).read(4)  # really compressed
    assert _leftovers(tmp_path) == []


@needs_nibabel
def test_nifti_reads_a_trailing_singleton_axis_and_refuses_a_time_series(tmp_path):
    import nibabel as nib

    nib.save(nib.Nifti1Image(np.ones((4, 5, 6, 1), np.float32), AFFINE), str(tmp_path / "one.nii.gz"))
    assert read_volume(tmp_path / "one.nii.gz").shape == (4, 5, 6)
    nib.save(nib.Nifti1Image(np.ones((4, 5, 6, 3), np.float32), AFFINE), str(tmp_path / "fmri.nii.gz"))
    with pytest.raises(camkit.InvalidInputError, match=r"fmri.nii.gz is 4-D \[4, 5, 6, 3\]: a time series of 3") as err:
        read_volume(tmp_path / "fmri.nii.gz")
    assert "\n" not in str(err.value)
    nib.save(nib.Nifti1Image(np.ones((4, 5), np.float32), AFFINE), str(tmp_path / "flat.nii"))
    with pytest.raises(camkit.InvalidInputError, match=r"has shape \[4, 5\]; camkit reads 3-D"):
        read_volume(tmp_path / "flat.nii")


@needs_nibabel
def test_nifti_refuses_empty_garbage_missing_and_too_large_files(tmp_path):
    (tmp_path / "empty.nii.gz").write_bytes(b"")
    (tmp_path / "junk.nii").write_bytes(b"not a nifti header" * 40)
    write_volume(tmp_path / "big.nii.gz", np.zeros((10, 10, 10)), np.eye(4))
    for path, message in [
        (tmp_path / "empty.nii.gz", r"empty.nii.gz is empty \(0 bytes\)"),
        (tmp_path / "junk.nii", r"junk.nii could not be read as NIfTI"),
        (tmp_path / "absent.nii", r"no NIfTI file at"),
    ]:
        with pytest.raises(camkit.InvalidInputError, match=message):
            read_volume(path)
    with pytest.raises(camkit.InvalidInputError, match=r"10x10x10 = 1000 voxels, more than max_voxels=999; raise --max-voxels"):
        read_volume(tmp_path / "big.nii.gz", max_voxels=999)
    assert read_volume(tmp_path / "big.nii.gz", max_voxels=1000).shape == (10, 10, 10)


@needs_nibabel
def test_write_volume_refuses_bad_arguments_and_leaves_nothing_half_written(tmp_path, monkeypatch):
    import nibabel as nib

    with pytest.raises(camkit.InvalidInputError, match=r"3-D array \[I, J, K\], got shape \[2, 2\]"):
        write_volume(tmp_path / "a.nii", np.zeros((2, 2)), np.eye(4))
    with pytest.raises(camkit.InvalidInputError, match=r"4x4 matrix"):
        write_volume(tmp_path / "a.nii", np.zeros((2, 2, 2)), np.eye(3))
    with pytest.raises(camkit.InvalidInputError, match=r"ends in .nii or .nii.gz"):
        write_volume(tmp_path / "a.npy", np.zeros((2, 2, 2)), np.eye(4))
    write_volume(tmp_path / "keep.nii", np.ones((2, 2, 2)), np.eye(4))
    before = (tmp_path / "keep.nii").read_bytes()

    def half_then_fail(image, path):  # the writer dies after writing part of the file
        open(path, "wb").write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(nib, "save", half_then_fail)
    with pytest.raises(OSError, match="disk full"):
        write_volume(tmp_path / "keep.nii", np.zeros((2, 2, 2)), np.eye(4))
    assert (tmp_path / "keep.nii").read_bytes() == before and _leftovers(tmp_path) == []


def test_without_nibabel_the_message_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "nibabel", None)
    with pytest.raises(ImportError, match=r"pip install 'camkit\[medical\]'"):
        read_volume(tmp_path / "a.nii.gz")
    with pytest.raises(ImportError, match=r"camkit\[medical\]"):
        write_volume(tmp_path / "a.nii.gz", np.zeros((2, 2, 2)), np.eye(4))


def test_intensity_normalisations_by_hand():
    values = np.array([0.0, 1.0, 2.0, 3.0, 4.0], np.float32)
    np.testing.assert_allclose(normalize_intensity(values, "minmax"), [0, 0.25, 0.5, 0.75, 1])
    np.testing.assert_allclose(normalize_intensity(values, "zscore"), (values - 2) / np.sqrt(2), rtol=1e-6)
    spiky = np.concatenate([np.linspace(0, 1, 999), [1000.0]]).astype(np.float32)
    assert normalize_intensity(spiky, "minmax")[998] < 0.002  # one bright voxel flattens the rest
    assert normalize_intensity(spiky, "percentile")[990] > 0.99  # clipped at the 99.5th percentile
    assert normalize_intensity(values, "none") is not values
    assert normalize_intensity(np.full(3, 7.0), "zscore").tolist() == [0.0, 0.0, 0.0]
    with pytest.raises(camkit.InvalidInputError, match="not one of none, minmax, zscore, percentile"):
        normalize_intensity(values, "robust")


# --- videos -----------------------------------------------------------------------------------------------


def _moving(frames=9, height=24, width=32):
    """A bright square moving right by 2 pixels a frame on grey; frames 3 and 4 identical (a pause)."""
    video = np.full((frames, height, width, 3), 60, np.uint8)
    for t in range(frames):
        x = 2 * min(t, 3) if t <= 4 else 2 * (t - 1)
        video[t, 8:16, x : x + 8] = (250, 200, 30)
    return video


@pytest.mark.parametrize("suffix", [".mp4", ".gif", ".avi"])
def test_videos_read_back_with_their_frame_count_and_rate(tmp_path, suffix):
    frames = _moving()
    write_video(tmp_path / f"clip{suffix}", frames, fps=12.5 if suffix != ".gif" else 10)
    video = read_video(tmp_path / f"clip{suffix}")
    assert video.frames.shape == frames.shape and video.frames.dtype == np.uint8
    assert video.fps == (12.5 if suffix != ".gif" else 10.0)
    # lossy codecs: the moving square is where it was, frame by frame
    error = np.abs(video.frames.astype(int) - frames.astype(int)).mean(axis=(1, 2, 3))
    assert error.max() < (4 if suffix == ".gif" else 12), error
    assert _leftovers(tmp_path) == []


def test_clips_of_n_frames_at_a_stride():
    frames = np.arange(11)
    assert video_clips(frames, 4).tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert video_clips(frames, 4, stride=3).tolist() == [[0, 1, 2, 3], [3, 4, 5, 6], [6, 7, 8, 9]]
    assert video_clips(frames, 3, step=4).tolist() == [[0, 4, 8]]
    rgb = _moving()
    assert video_clips(rgb, 4, stride=2).shape == (3, 4, 24, 32, 3)
    with pytest.raises(camkit.InvalidInputError, match=r"has 11 frame\(s\); one clip of 4 frames 4 apart needs 13"):
        video_clips(frames, 4, step=4)


def test_bad_videos_are_refused_in_one_line(tmp_path):
    (tmp_path / "empty.mp4").write_bytes(b"")
    (tmp_path / "junk.mp4").write_bytes(os.urandom(2048))
    write_video(tmp_path / "long.mp4", _moving(), fps=10)
    for path, message in [
        (tmp_path / "empty.mp4", r"empty.mp4 is empty \(0 bytes\)"),
        (tmp_path / "junk.mp4", r"junk.mp4 (could not be opened as a video|has no readable frame)"),
        (tmp_path / "nothing.mp4", r"no video file at"),
    ]:
        with pytest.raises(camkit.InvalidInputError, match=message) as err:
            read_video(path)
        assert "\n" not in str(err.value)
    with pytest.raises(camkit.InvalidInputError, match=r"more than max_frames=5 frames"):
        read_video(tmp_path / "long.mp4", max_frames=5)
    with pytest.raises(camkit.InvalidInputError, match=r"uint8 RGB frames \[T, H, W, 3\]"):
        write_video(tmp_path / "x.mp4", np.zeros((2, 4, 4)), fps=5)
    with pytest.raises(camkit.InvalidInputError, match=r"written as .gif, .mp4 or .avi"):
        write_video(tmp_path / "x.webm", _moving(), fps=5)
    assert _leftovers(tmp_path) == []


# --- signals ---------------------------------------------------------------------------------------------


def test_signals_from_npy(tmp_path):
    np.save(tmp_path / "one.npy", np.arange(5, dtype=np.int16))
    np.save(tmp_path / "two.npy", np.ones((2, 7)))
    np.save(tmp_path / "three.npy", np.ones((2, 2, 2)))
    np.save(tmp_path / "names.npy", np.array(["a", "b"]))
    np.save(tmp_path / "objects.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    assert read_signal(tmp_path / "one.npy").tolist() == [[0.0, 1.0, 2.0, 3.0, 4.0]]
    assert read_signal(tmp_path / "two.npy").shape == (2, 7) and read_signal(tmp_path / "two.npy").dtype == np.float32
    with pytest.raises(camkit.InvalidInputError, match=r"has shape \[2, 2, 2\]; a signal is \[T\] or \[C, T\]"):
        read_signal(tmp_path / "three.npy")
    with pytest.raises(camkit.InvalidInputError, match="not numbers"):
        read_signal(tmp_path / "names.npy")
    with pytest.raises(camkit.InvalidInputError, match=r"could not be read as a \.npy array"):
        read_signal(tmp_path / "objects.npy")  # pickles are never loaded
