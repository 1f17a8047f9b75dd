"""CheferRollout and LeGrad one block at a time: the same maps as one backward through every block's graph.

The explainers recompute and differentiate one transformer block at a time
(``camkit.methods.attention.blockwise``); LeGrad with classes given before the forward differentiates each
block as the forward reaches it instead (``camkit.methods.attention.legrad``). ``path="whole"`` takes
the whole-graph path (one forward that keeps every block's graph, one backward; ``test_vit_paths.py``
checks the choice between them). Here the paths run
on every family and must agree, the path taken must really have run (its block calls or its
forwards are counted), and the cases it must not replay take the whole-graph path.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_invariants import _assert_same_state, _hook_count, _state
from torch import Tensor, nn
from vit_helpers import SIZE, assert_maps_close, hf_vit, timm_vit, torchvision_vit

import camkit
from camkit.errors import InvalidInputError
from camkit.methods.attention import blockwise as _blockwise

pytest.importorskip("timm")
pytest.importorskip("transformers")

BUILDERS = {
    "timm": lambda: timm_vit(),
    "timm-registers": lambda: timm_vit(reg_tokens=4),
    "timm-avg-no-class-token": lambda: timm_vit(global_pool="avg", class_token=False),
    "torchvision": torchvision_vit,
    "hf-vit": lambda: hf_vit("vit"),
    "hf-deit": lambda: hf_vit("deit"),
    "hf-dinov2-registers": lambda: hf_vit("dinov2"),
}
METHODS = {"cheferrollout": camkit.CheferRollout, "legrad": camkit.LeGrad}


def _x(batch: int) -> Tensor:
    return torch.rand(batch, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(7 + batch))


class _Replays(list):
    """The blocks called again, in the order first called, each once; :attr:`samples` counts samples per block."""

    def __init__(self) -> None:
        super().__init__()
        self.samples: list[int] = []

    def add(self, block: nn.Module, samples: int) -> None:
        for i, seen in enumerate(self):
            if seen is block:
                self.samples[i] += samples
                return
        self.append(block)
        self.samples.append(samples)

    def clear(self) -> None:
        super().clear()
        self.samples.clear()


@pytest.fixture
def replays(monkeypatch):
    """The blocks called again (each listed once) and how many samples each was called on in all."""
    calls = _Replays()
    run = _blockwise.BlockCall.run

    def counted(self, block, tokens):
        calls.add(block, tokens.shape[0])
        return run(self, block, tokens)

    monkeypatch.setattr(_blockwise.BlockCall, "run", counted)
    return calls


@pytest.fixture
def forwards(monkeypatch):
    """The batch size of each call of an explainer's model (LeGrad's single pass: one per part of the batch)."""
    sizes: list[int] = []
    call = camkit.Explainer._call_model

    def counted(self, x):
        sizes.append(x.shape[0])
        return call(self, x)

    monkeypatch.setattr(camkit.Explainer, "_call_model", counted)
    return sizes


def _two_classes(out: Tensor) -> Tensor:
    """A callable target: classes 0 and 3 of every image (LeGrad scores it at each block through the head)."""
    return out[:, [0, 3]]


def _both(cls, model, x, target, **kwargs):
    new = cls(model, **kwargs).explain(x, target)
    whole = cls(model, path="whole", **kwargs)
    return new, whole.explain(x, target)


def _assert_equal(new, old) -> None:
    torch.testing.assert_close(new.raw, old.raw, atol=1e-6, rtol=0)
    assert_maps_close(new.maps, old.maps, old.raw, 1e-6)
    # the block-by-block scores come from the model's own forward (fused attention), the whole graph's
    # from one with the attention unfused: equal up to rounding
    torch.testing.assert_close(new.scores, old.scores, atol=1e-6, rtol=1e-5)
    assert torch.equal(new.flat, old.flat)


@pytest.mark.heavy
@pytest.mark.parametrize("key", list(METHODS))
@pytest.mark.parametrize("family", list(BUILDERS))
def test_block_by_block_equals_the_whole_graph(family, key, replays, forwards):
    model = BUILDERS[family]()
    x = _x(3)
    target = torch.tensor([[0, 3], [2, 1], [1, 1]])  # two classes per image: two backward passes per block
    new, old = _both(METHODS[key], model, x, target)
    if key == "legrad":  # classes given: one forward per half of the batch, no block called again
        assert replays == [] and forwards == [2, 1, 3]  # (then the whole graph's forward)
        assert not new.flat.any()
        _assert_equal(new, old)
        forwards.clear()
        new, old = _both(METHODS[key], model, x, None)  # the predicted class: a forward without graph names it
        assert replays == [] and forwards == [3, 2, 1, 3]
        _assert_equal(new, old)
        forwards.clear()
        new, old = _both(METHODS[key], model, x, _two_classes)  # a callable target: the blocks called again
        assert forwards == [3, 3]
    else:  # a family camkit knows, classes given: the forward halts at the last segment (block 2, segments of 2),
        # which runs inside the model's own forward, sample by sample; the first segment is called again
        assert forwards == [3, 1, 1, 1, 3]
        assert len(replays) == 2 and replays.samples == [3, 3]
        assert not new.flat.any()
        _assert_equal(new, old)
        forwards.clear()
        replays.clear()
        new, old = _both(METHODS[key], model, x, None)  # the predicted class: named in each part's forward
        assert forwards == [3, 1, 1, 1, 3] and replays.samples == [3, 3]
        _assert_equal(new, old)
        forwards.clear()
        replays.clear()
        new, old = _both(METHODS[key], model, x, _two_classes)  # a callable target: the forward runs whole
        assert forwards == [3, 3]
    assert len(replays) == 3 and replays.samples == [3, 3, 3]  # each block called again once on each sample
    assert not new.flat.any()
    _assert_equal(new, old)


@pytest.mark.parametrize("key", list(METHODS))
def test_clip_similarity_block_by_block(key, replays):
    model = hf_vit("clip")
    text = torch.randn(3, 8, generator=torch.Generator().manual_seed(2))
    new, old = _both(METHODS[key], model, _x(3), camkit.SimilarityTarget(text), output="image_embeds")
    assert len(replays) == 3
    _assert_equal(new, old)
    replays.clear()
    new, old = _both(METHODS[key], model, _x(3), 2, output="image_embeds")  # one embedding dimension
    assert len(replays) == (0 if key == "legrad" else 2)  # Chefer: the last segment in the model's own forward
    _assert_equal(new, old)


def test_legrad_some_layers_replays_from_the_first_read_block_on(replays):
    model = timm_vit()
    new, old = _both(camkit.LeGrad, model, _x(2), _two_classes, layers=[1, -1])
    assert replays == [model.blocks[1], model.blocks[2]]  # block 0 is not called again
    _assert_equal(new, old)
    replays.clear()
    new, old = _both(camkit.LeGrad, model, _x(2), _two_classes, layers=[0, -1])
    assert replays == list(model.blocks)  # block 1 runs to hand its output to block 2
    _assert_equal(new, old)


def test_legrad_single_pass_some_layers_and_a_head_of_the_callers(replays, forwards):
    model = timm_vit()
    x, target = _x(3), torch.tensor([1, 0, 3])
    new, old = _both(camkit.LeGrad, model, x, target, layers=[1, -1])  # block 0 runs the model's own attention
    assert replays == [] and forwards == [2, 1, 3]
    _assert_equal(new, old)
    forwards.clear()
    head = lambda t: model.head(model.fc_norm(model.norm(t.mean(dim=1))))  # noqa: E731
    new, old = _both(camkit.LeGrad, model, x, target, head=head)
    assert replays == [] and forwards == [3, 3]  # a caller's head may mix the samples: the whole batch at once
    _assert_equal(new, old)


def test_legrad_numpy_classes_take_the_single_pass(replays, forwards):
    model = timm_vit()
    x = _x(3)
    for target in (np.int64(2), np.array([1, 0, 3])):
        forwards.clear()
        new, old = _both(camkit.LeGrad, model, x, target)
        assert replays == [] and forwards == [2, 1, 3]  # one forward per half of the batch, then the whole graph's
        assert new.target.tolist() == old.target.tolist() == torch.as_tensor(target).expand(3).tolist()
        _assert_equal(new, old)


class _ReadsMiddle(nn.Module):
    """A timm ViT whose output also reads the second block's class token: a path around the last block.

    ``early``: the side branch is computed as soon as the block has run and the model keeps no
    reference to the block's output (only the side branch's graph does).
    """

    def __init__(self, early: bool = False, read: int = 1) -> None:
        super().__init__()
        self.vit = timm_vit()
        self.side = nn.Linear(16, 4)
        self.early = early
        self.read = read  # the block whose output is read (the first, with read=0)

    def forward(self, x: Tensor) -> Tensor:
        tokens = self.vit._pos_embed(self.vit.patch_embed(x))
        middle = side = None
        for index, block in enumerate(self.vit.blocks):
            tokens = block(tokens)
            if index == self.read and self.early:
                side = self.side(tokens[:, 0] * 2.0)
            elif index == self.read:
                middle = tokens
        side = self.side(middle[:, 0]) if middle is not None else side
        assert side is not None
        return self.vit.forward_head(self.vit.norm(tokens)) + side


@pytest.mark.parametrize("segment", [None, 3])  # block 1's output kept as block 2's input, or inside one segment
@pytest.mark.parametrize("early", [False, True])
def test_a_score_reading_a_middle_block_directly(early, segment, replays):
    model = _ReadsMiddle(early).eval()
    explainer = camkit.CheferRollout(model)
    explainer._segment = segment
    new = explainer.explain(_x(2), torch.tensor([1, 2]))
    whole = camkit.CheferRollout(model, path="whole")
    old = whole.explain(_x(2), torch.tensor([1, 2]))
    assert len(replays) == 3 and replays.samples == [2, 2, 2]
    _assert_equal(new, old)
    without = camkit.CheferRollout(model.vit).explain(_x(2), torch.tensor([1, 2]))
    # the side branch moves the map (by ~15% of its peak here): the gradient through it was taken
    assert (new.raw - without.raw).abs().max() > 0.05 * new.raw.abs().max()


def _as_known(monkeypatch) -> None:
    """Let CheferRollout treat any model as a family it knows (each sample scored alone): its last segment then
    runs inside the model's own forward, the blocks before it standing in for themselves."""
    monkeypatch.setattr(camkit.methods.attention.chefer, "known_head", lambda model: nn.Identity())


@pytest.mark.parametrize("segment", [None, 3])
@pytest.mark.parametrize("read", [0, 1])
def test_the_last_segment_in_the_models_forward_when_the_score_reads_a_middle_block(read, segment, replays, forwards,
                                                                                    monkeypatch):
    """Block 1's output is the last segment's kept input (segments of 2): its stand-in gives it back, exactly.
    Block 0's stand-in gives back a placeholder: a score that reads it is found on its graph and the forward
    runs whole. With one segment of 3 no block stands in."""
    _as_known(monkeypatch)
    model = _ReadsMiddle(read=read).eval()
    x, target = _x(2), torch.tensor([1, 2])
    whole = camkit.CheferRollout(model, path="whole")
    old = whole.explain(x, target)
    forwards.clear()
    explainer = camkit.CheferRollout(model)
    explainer._segment = segment
    new = explainer.explain(x, target)
    if segment == 3:  # halted at block 0; the model's forward on each sample runs every block
        assert forwards == [2, 1, 1] and replays == []
    elif read == 1:  # halted at block 2; blocks 0 and 1 stand in, then are called again
        assert forwards == [2, 1, 1] and replays.samples == [2, 2]
    else:  # the first part's score reads block 0's placeholder: the forward again, whole, then every block again
        assert forwards == [2, 1, 2] and replays.samples == [2, 2, 2]
    _assert_equal(new, old)
    assert all("forward" not in m.__dict__ for m in model.modules())


class _OwnLoop(nn.Module):
    """A timm ViT whose own forward calls its blocks, each through :meth:`step`."""

    def __init__(self) -> None:
        super().__init__()
        self.vit = timm_vit()

    def step(self, block: nn.Module, tokens: Tensor) -> Tensor:
        raise NotImplementedError

    def forward(self, x: Tensor) -> Tensor:
        tokens = self.vit._pos_embed(self.vit.patch_embed(x))
        for block in self.vit.blocks:
            tokens = self.step(block, tokens)
        return self.vit.forward_head(self.vit.norm(tokens))


class _Forgiving(_OwnLoop):
    """A timm ViT whose forward goes on past a block that raises (the halt of the first forward included)."""

    def step(self, block: nn.Module, tokens: Tensor) -> Tensor:
        try:
            return block(tokens)
        except Exception:  # what the test is about
            return tokens


def test_a_model_that_catches_the_halt_takes_the_whole_forward(replays, forwards, monkeypatch):
    _as_known(monkeypatch)
    model = _Forgiving().eval()
    x, target = _x(2), torch.tensor([0, 3])
    new, old = _both(camkit.CheferRollout, model, x, target)
    assert forwards == [2, 2, 2] and replays.samples == [2, 2, 2]  # the forward that went on is not used
    _assert_equal(new, old)


@pytest.mark.parametrize("segment", [1, 2, 3])
@pytest.mark.parametrize("family", ["timm-registers", "torchvision", "hf-vit"])
def test_chefer_segments_of_any_length_equal_the_whole_graph(family, segment, replays):
    model = BUILDERS[family]()
    x = _x(3)
    target = torch.tensor([[0, 3], [2, 1], [1, 1]])
    explainer = camkit.CheferRollout(model)
    explainer._segment = segment
    whole = camkit.CheferRollout(model, path="whole")
    old = whole.explain(x, target)
    new = explainer.explain(x, target)
    # the last segment starts at block 2 (segments of 1 or 2) or 0 (of 3): it runs in the model's own forward
    assert replays.samples == [3] * (2 if segment < 3 else 0)
    _assert_equal(new, old)
    replays.clear()
    new = explainer.explain(x, _two_classes)  # a callable target: the forward runs whole, every segment again
    assert replays.samples == [3, 3, 3]
    _assert_equal(new, whole.explain(x, _two_classes))


@pytest.mark.parametrize("key, kept", [("cheferrollout", [0, 2]), ("legrad", [0])])
def test_only_the_segment_inputs_are_kept(key, kept, monkeypatch):
    """Chefer keeps the input of each segment's first block (ceil(sqrt(3)) = 2 blocks a segment), LeGrad the first's."""
    seen = []
    stop = _blockwise.BlockRecorder.stop

    def counted(self):
        seen.append([i for i, calls in enumerate(self.calls) if calls[0].tokens is not None])
        assert all(calls[0].args[0] is None for i, calls in enumerate(self.calls) if i not in seen[-1])
        stop(self)

    monkeypatch.setattr(_blockwise.BlockRecorder, "stop", counted)
    METHODS[key](timm_vit()).explain(_x(2), _two_classes)  # LeGrad with classes keeps no input (its single pass)
    assert seen == [kept]


class _Between(_OwnLoop):
    """A timm ViT that changes the tokens between blocks: no block's input is the previous one's output."""

    def step(self, block: nn.Module, tokens: Tensor) -> Tensor:
        return block(tokens) * 1.5


def test_blocks_that_do_not_chain_take_the_whole_graph(replays):
    model = _Between().eval()
    new, old = _both(camkit.CheferRollout, model, _x(2), torch.tensor([0, 3]))
    assert replays == []
    _assert_equal(new, old)
    vit = model.vit
    head = lambda t: vit.head(vit.fc_norm(vit.norm(t.mean(dim=1))))  # noqa: E731
    legrad_new, legrad_old = _both(camkit.LeGrad, model, _x(2), None, head=head)  # its single pass needs no chain
    assert replays == []
    _assert_equal(legrad_new, legrad_old)
    legrad_new, legrad_old = _both(camkit.LeGrad, model, _x(2), _two_classes, head=head)  # its recomputation does
    assert replays == []
    _assert_equal(legrad_new, legrad_old)


def test_training_mode_and_hidden_targets_take_the_whole_graph(replays):
    torch.manual_seed(0)
    model = timm_vit()
    model.blocks[1].attn.attn_drop.p = 0.5  # dropout in training mode: a replay would draw new masks
    model.train()
    x = _x(2)
    torch.manual_seed(3)
    new = camkit.CheferRollout(model, keep_mode=True).explain(x, 1)
    torch.manual_seed(3)
    whole = camkit.CheferRollout(model, keep_mode=True, path="whole")
    _assert_equal(new, whole.explain(x, 1))
    assert replays == []
    model.eval()
    neuron = camkit.NeuronTarget("blocks.2.mlp.fc1", 3, position=(0,))  # read inside the last block
    new, old = _both(camkit.CheferRollout, model, x, neuron)
    assert replays == [] and not new.flat.any()
    _assert_equal(new, old)


def _frozen_and_graded():
    """torchvision's tiny ViT with a frozen parameter and a gradient already set, and its state."""
    model = torchvision_vit()
    params = list(model.parameters())
    params[3].requires_grad_(False)
    params[-1].grad = torch.ones_like(params[-1])
    return model, _state(model)


def test_hygiene_when_a_replayed_block_fails(monkeypatch):
    model, before = _frozen_and_graded()
    run = _blockwise.BlockCall.run
    seen = []

    def failing(self, block, tokens):
        seen.append(block)
        if len(seen) == 2:
            block.forward = lambda *a, **k: (_ for _ in ()).throw(ValueError("boom in a replay"))
            try:
                return run(self, block, tokens)
            finally:
                del block.forward
        return run(self, block, tokens)

    monkeypatch.setattr(_blockwise.BlockCall, "run", failing)
    for cls in METHODS.values():
        seen.clear()
        with pytest.raises(ValueError, match="boom in a replay"):
            cls(model).explain(_x(2), _two_classes)  # LeGrad calls its blocks again for a callable target
        assert _hook_count(model) == 0 and torch.is_grad_enabled()
        _assert_same_state(before, _state(model))


@pytest.mark.parametrize("fail", ["last segment", "head", "first segment"])
def test_hygiene_when_cheferrollouts_last_segment_or_a_replay_fails(fail, monkeypatch):
    """Class targets on torchvision's ViT: the last segment (block 2) runs in the model's forward, blocks 0 and 1
    standing in for themselves (their forward replaced for the call), then blocks 0 and 1 are called again."""
    model, before = _frozen_and_graded()
    boom = ValueError("boom in Chefer's backward")
    if fail == "first segment":
        def failing(self, block, tokens):
            raise boom

        monkeypatch.setattr(_blockwise.BlockCall, "run", failing)
        broken = None
    else:
        broken = model.encoder.layers[2] if fail == "last segment" else model.heads
        original = broken.forward
        calls = []

        def forward(*args, **kwargs):  # the halted forward never reaches it: the first call is the last segment's
            calls.append(1)
            raise boom

        broken.forward = forward
    try:
        with pytest.raises(ValueError, match="boom in Chefer"):
            camkit.CheferRollout(model).explain(_x(2), [0, 1])
    finally:
        if broken is not None:
            del broken.forward
            assert broken.forward == original and calls == [1]
    assert _hook_count(model) == 0 and torch.is_grad_enabled()
    assert all("forward" not in m.__dict__ for m in model.modules())
    _assert_same_state(before, _state(model))


@pytest.mark.parametrize("fail", ["block", "head"])
def test_hygiene_when_legrads_single_pass_fails(fail):
    model, before = _frozen_and_graded()
    failing = model.encoder.layers[1] if fail == "block" else model.heads
    failing.forward = lambda *a, **k: (_ for _ in ()).throw(ValueError("boom in the pass"))
    try:
        with pytest.raises(ValueError, match="boom in the pass"):
            camkit.LeGrad(model).explain(_x(2), [0, 1])
    finally:
        del failing.forward
    assert _hook_count(model) == 0 and torch.is_grad_enabled()
    assert all("forward" not in m.__dict__ for m in model.modules())
    _assert_same_state(before, _state(model))


def test_legrads_single_pass_refuses_a_block_run_twice():
    model = timm_vit()
    block = model.blocks[1]
    model.blocks.insert(2, block)  # the same block twice in a row: its layer read twice in one forward
    with pytest.raises(camkit.errors.LayerNotReachedError, match="ran 2 times"):
        camkit.LeGrad(model).explain(_x(2), [0, 1])
    assert _hook_count(model) == 0


def test_legrads_single_pass_checks_the_classes():
    model = timm_vit()
    with pytest.raises(camkit.errors.InvalidTargetError, match="out of range"):
        camkit.LeGrad(model).explain(_x(2), [0, 40])
    with pytest.raises(camkit.errors.InvalidTargetError, match="out of range"):
        camkit.LeGrad(model).explain(_x(2), 40)
    with pytest.raises(camkit.errors.InvalidTargetError, match="batch has 2 samples"):
        camkit.LeGrad(model).explain(_x(2), [0, 1, 2])


@pytest.mark.parametrize("key", list(METHODS))
def test_batch_equals_one_by_one_block_by_block(key, replays, forwards):
    model = hf_vit("dinov2")
    x = _x(3)
    target = torch.tensor([2, 0, 1])
    batched = METHODS[key](model).explain(x, target)
    # Chefer: blocks 0 and 1 called again, block 2 in the model's forward on each sample after the halted one
    assert len(replays) == (0 if key == "legrad" else 2) and forwards == ([2, 1] if key == "legrad" else [3, 1, 1, 1])
    for i in range(3):
        single = METHODS[key](model).explain(x[i : i + 1], target[i : i + 1])
        torch.testing.assert_close(batched.raw[i], single.raw[0], atol=1e-7, rtol=1e-5)
        torch.testing.assert_close(batched.maps[i], single.maps[0], atol=1e-5, rtol=0)


@pytest.mark.heavy
@pytest.mark.parametrize("key", list(METHODS))
@pytest.mark.parametrize("family", ["timm-registers", "torchvision", "hf-dinov2-registers"])
def test_micro_batches_equal_the_whole_batch(family, key, monkeypatch, forwards):
    """Chefer's blocks called again (the first segment; the last runs in the model's forward on each part), or
    LeGrad's single pass (one forward per part), a micro-batch at a time."""
    sizes = []
    run = _blockwise.BlockCall.run

    def counted(self, block, tokens):
        sizes.append(tokens.shape[0])
        return run(self, block, tokens)

    monkeypatch.setattr(_blockwise.BlockCall, "run", counted)
    model = BUILDERS[family]()
    x = _x(3)
    target = torch.tensor([[0, 3], [2, 1], [1, 1]])
    explainers = {size: METHODS[key](model) for size in (1, 2, 3)}
    for size, explainer in explainers.items():
        explainer._block_batch = size

    def expected(parts: list[int]) -> tuple[list[int], list[int]]:
        """(samples per block call again, per model call) for micro-batches of these sizes"""
        if key == "legrad":
            return [], parts
        return sorted(parts * 2), [3, *parts]  # blocks 0 and 1 on each part; the halted forward, then one per part

    whole = explainers[3].explain(x, target)
    assert (sorted(sizes), forwards) == expected([3])
    for size, parts in ((1, [1, 1, 1]), (2, [2, 1])):
        sizes.clear()
        forwards.clear()
        got = explainers[size].explain(x, target)
        assert (sorted(sizes), forwards) == expected(parts)
        torch.testing.assert_close(got.raw, whole.raw, atol=1e-7, rtol=1e-5)
        torch.testing.assert_close(got.maps, whole.maps, atol=1e-5, rtol=0)
        # the scores come from one forward per part: equal up to rounding
        torch.testing.assert_close(got.scores, whole.scores, atol=1e-6, rtol=1e-5)
    sizes.clear()
    forwards.clear()
    automatic = METHODS[key](model).explain(x, target)  # Chefer: ceil(3 / 4) = 1 sample per call; LeGrad: halves
    assert (sorted(sizes), forwards) == expected([2, 1] if key == "legrad" else [1, 1, 1])
    torch.testing.assert_close(automatic.raw, whole.raw, atol=1e-7, rtol=1e-5)


def test_micro_batches_are_refused_below_one_sample():
    with pytest.raises(camkit.errors.InvalidInputError, match="at least one sample"):
        _blockwise.micro_batches(4, 0)
    assert _blockwise.micro_batches(8) == [slice(0, 2), slice(2, 4), slice(4, 6), slice(6, 8)]


@pytest.mark.parametrize("cls", [camkit.CheferRollout, camkit.LeGrad])
def test_path_whole_takes_no_block_again_and_gives_the_same_maps(cls, replays):
    from torchvision.models import VisionTransformer

    torch.manual_seed(0)
    vit = VisionTransformer(image_size=16, patch_size=4, num_layers=3, num_heads=2, hidden_dim=8, mlp_dim=16,
                            num_classes=3).eval()  # fmt: skip
    x = torch.rand(3, 3, 16, 16)
    target = (lambda out: out[:, 1]) if cls is camkit.LeGrad else [0, 2, 1]  # LeGrad recomputes for a callable
    whole = cls(vit, path="whole").explain(x, target)
    assert len(replays) == 0 and whole.extras["path"] == "whole"  # no block called again
    blockwise = cls(vit, path="blockwise").explain(x, target)
    _assert_equal(blockwise, whole)
    assert len(replays) > 0 and blockwise.extras["path"] == "blockwise"  # (LeGrad: for a callable target)
    for path in ("yes", True, None):
        with pytest.raises(InvalidInputError, match="path must be one of 'auto', 'whole', 'blockwise'"):
            cls(vit, path=path)


def test_given_classes_are_the_targets_that_name_classes_before_the_forward():
    from camkit.targets.classes import given_classes

    assert given_classes(None, 2) is None and given_classes(lambda out: out[:, 0], 2) is None
    assert given_classes(True, 2) is None and given_classes([0.5, 1.0], 2) is None  # refused on the other path
    assert given_classes([0, 1, 2], 2) is None  # the wrong batch: the other path says so
    assert given_classes(3, 2).tolist() == [3, 3]
    assert given_classes([[1, 2], [0, 4]], 2).tolist() == [[1, 2], [0, 4]]
    assert given_classes(torch.tensor([5, 6], dtype=torch.int32), 2).dtype == torch.long
    # numpy integers and arrays name classes as resolve_target reads them
    assert given_classes(np.int64(4), 2).tolist() == [4, 4]
    assert given_classes(np.array([1, 3], dtype=np.int32), 2).tolist() == [1, 3]
    assert given_classes(np.bool_(True), 2) is None and given_classes("cat", 2) is None and given_classes(2.0, 2) is None
    assert given_classes(torch.tensor([0, 1], dtype=torch.complex64), 2) is None and given_classes([[0], [1, 2]], 2) is None
