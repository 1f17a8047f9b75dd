"""The output contract's map operations for any rank, against torch's own interpolation and by hand."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import camkit
from camkit.functional import flat_maps, interpolation_mode, normalize_maps, upsample_maps
from camkit.methods._core.output import finish_maps


@pytest.mark.parametrize(("size", "mode"), [((12,), "linear"), ((6, 10), "bilinear"), ((3, 6, 10), "trilinear")])
def test_upsample_is_torch_interpolation_of_the_rank(size, mode):
    raw = torch.rand(2, 3, *(max(1, s // 2) for s in size))
    expected = F.interpolate(raw.reshape(6, 1, *raw.shape[2:]), size=size, mode=mode, align_corners=False)
    assert interpolation_mode(len(size)) == mode
    assert torch.equal(upsample_maps(raw, size), expected.reshape(2, 3, *size))


def test_linear_upsampling_by_hand():
    # align_corners=False: output sample i reads input position (i + 0.5) / 2 - 0.5.
    out = upsample_maps(torch.tensor([[0.0, 4.0]]), (4,))
    torch.testing.assert_close(out, torch.tensor([[0.0, 1.0, 3.0, 4.0]]))


def test_trilinear_upsampling_by_hand():
    raw = torch.zeros(1, 2, 1, 1)
    raw[0, 1] = 8.0  # depth 0 is 0, depth 1 is 8
    out = upsample_maps(raw, (4, 2, 2))
    torch.testing.assert_close(out[0, :, 0, 0], torch.tensor([0.0, 2.0, 6.0, 8.0]))
    assert torch.equal(out[0, :, 0, 0], out[0, :, 1, 1])


def test_normalise_and_flat_over_every_spatial_axis():
    maps = torch.tensor([[[[1.0, 3.0]], [[5.0, 1.0]]], [[[2.0, 2.0]], [[2.0, 2.0]]]])  # [2, 2, 1, 2]
    out, flat = normalize_maps(maps, spatial_dims=3)
    torch.testing.assert_close(out[0].flatten(), torch.tensor([0.0, 0.5, 1.0, 0.0]))
    assert flat.tolist() == [False, True] and torch.equal(out[1], torch.zeros(2, 1, 2))
    assert flat_maps(maps, spatial_dims=3).tolist() == [False, True]
    # The same tensor read as K=2 image maps per sample: each [1, 2] map normalised alone.
    assert normalize_maps(maps)[1].tolist() == [[False, False], [True, True]]
    assert flat_maps(torch.tensor([[1.0, 1.0 + 1e-9], [0.0, 1.0]]), spatial_dims=1).tolist() == [True, False]
    with pytest.raises(camkit.InvalidInputError, match="1, 2 or 3 spatial axes"):
        normalize_maps(maps, spatial_dims=4)


def test_finish_maps_reads_the_rank_from_the_size():
    # A volume [B, d, h, w] and K maps of a signal [B, K, t] have the same number of dimensions.
    raw = torch.tensor([[[[0.0, 2.0]]]])  # [1, 1, 1, 2]
    maps, flat = finish_maps([raw], (2, 2, 4))
    assert maps.shape == (1, 2, 2, 4) and flat.shape == (1,)
    k_maps, k_flat = finish_maps([torch.tensor([[[0.0, 2.0], [1.0, 1.0]]])], (4,))
    assert k_maps.shape == (1, 2, 4) and k_flat.tolist() == [[False, True]]
    torch.testing.assert_close(k_maps[0, 0], torch.tensor([0.0, 0.25, 0.75, 1.0]))
    with pytest.raises(camkit.InvalidInputError, match="raw map of shape"):
        finish_maps([torch.zeros(2, 3, 3)], (4, 4, 4), batch=2)  # a 2-D raw map for a volume


def test_input_batch_messages_name_the_ranks():
    net = torch.nn.Sequential(torch.nn.Conv1d(1, 2, 3), torch.nn.AdaptiveAvgPool1d(1), torch.nn.Flatten())
    explainer = camkit.Saliency(net)
    with pytest.raises(camkit.InvalidInputError, match=r"\[B, C, T\] \(a signal\).*x\[None, None\]"):
        explainer.explain(torch.rand(16))
    with pytest.raises(camkit.InvalidInputError, match=r"got shape \[1, 1, 2, 2, 2, 2\]"):
        explainer.explain(torch.rand(1, 1, 2, 2, 2, 2))
