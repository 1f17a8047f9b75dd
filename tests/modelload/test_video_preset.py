"""Video preprocessing: torchvision's video weights' transforms, reproduced step by step."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torchvision

from camkit.errors import ModelLoadError
from camkit.modelload.video import VideoPreprocess, video_preprocess


@pytest.mark.parametrize("name, weights", [("r3d_18", "KINETICS400_V1"), ("mvit_v1_b", "DEFAULT"), ("s3d", "DEFAULT")])
def test_the_preset_equals_torchvision_s_own_transforms(name, weights):
    pre = video_preprocess(f"torchvision:{name}", weights)
    chosen = torchvision.models.get_model_weights(name)[weights]
    frames = np.random.default_rng(0).integers(0, 256, (5, 90, 120, 3), dtype=np.uint8)
    x, shown = pre(frames)
    expected = chosen.transforms()(torch.from_numpy(frames).permute(0, 3, 1, 2))  # [T, C, H, W] -> [C, T, h, w]
    assert x.shape == expected.shape and shown.shape == (5, *expected.shape[2:], 3)
    torch.testing.assert_close(x, expected, rtol=0, atol=1e-6)
    assert pre.source == f"torchvision {name} {weights} transforms"


def test_size_mean_and_std_override_the_preset_and_a_plain_model_keeps_its_frames():
    pre = video_preprocess("torchvision:r3d_18", "KINETICS400_V1", size=(32, 40), mean=(0.5,) * 3, std=(0.25,) * 3)
    assert (pre.resize, pre.crop, pre.mean, pre.std) == ((32, 40), None, (0.5,) * 3, (0.25,) * 3)
    plain = video_preprocess(torch.nn.Identity())
    frames = np.full((3, 7, 9, 3), 255, np.uint8)
    x, shown = plain(frames)
    assert x.shape == (3, 3, 7, 9) and np.array_equal(shown, frames)
    torch.testing.assert_close(x[:, 0, 0, 0], (1 - torch.tensor(plain.mean)) / torch.tensor(plain.std))
    assert video_preprocess("torchvision:r3d_18", None).resize is None  # random weights: no preset
    with pytest.raises(ModelLoadError, match="both --mean and --std"):
        video_preprocess("torchvision:r3d_18", mean=(0.5,) * 3)
    with pytest.raises(ModelLoadError, match="N or HxW"):
        video_preprocess("torchvision:r3d_18", size=(1, 2, 3))


def test_frames_must_be_uint8_rgb():
    from camkit.errors import InvalidInputError

    with pytest.raises(InvalidInputError, match=r"uint8 RGB frames \[T, H, W, 3\]"):
        VideoPreprocess()(np.zeros((2, 4, 4), np.uint8))
