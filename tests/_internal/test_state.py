"""GradModes: autograd mode switches made in one hook and undone in another, checked by hand."""

from __future__ import annotations

import pytest
import torch

from camkit._internal.state import GradModes


@pytest.mark.parametrize("start", [True, False])
def test_enter_and_leave_give_back_the_mode_before_each_switch(start):
    with torch.set_grad_enabled(start):
        with GradModes() as modes:
            modes.enter(not start)
            assert torch.is_grad_enabled() is (not start)
            modes.enter(start)
            assert torch.is_grad_enabled() is start
            modes.leave()
            assert torch.is_grad_enabled() is (not start)
            modes.leave()
            assert torch.is_grad_enabled() is start
            with pytest.raises(IndexError):
                modes.leave()  # nothing left open: the start's mode is not a switch to undo
        assert torch.is_grad_enabled() is start


@pytest.mark.parametrize("start", [True, False])
def test_the_end_puts_back_the_start_mode_over_open_switches_and_the_blocks_own(start):
    with torch.set_grad_enabled(start):
        modes = GradModes()
        modes.enter(not start)
        modes.enter(start)
        modes.enter(not start)  # three left open
        torch.set_grad_enabled(not start).__enter__()  # the block changing the mode itself
        modes.close()
        assert torch.is_grad_enabled() is start
        modes.close()  # a second close changes nothing
        assert torch.is_grad_enabled() is start


def test_an_error_between_a_pre_hook_and_its_forward_hook_leaves_the_mode_as_it_was():
    net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
    seen = []

    def boom(*_):
        seen.append(torch.is_grad_enabled())
        raise RuntimeError("boom")

    with torch.enable_grad():
        with pytest.raises(RuntimeError, match="boom"), GradModes() as modes:
            handles = [
                net[0].register_forward_pre_hook(lambda *_: modes.enter(False)),
                net[0].register_forward_hook(lambda *_: modes.leave()),
                net[1].register_forward_pre_hook(boom),
            ]
            try:
                net(torch.ones(1, 2))
            finally:
                for handle in handles:
                    handle.remove()
        assert seen == [True]  # the forward hook gave the mode back before the next module
        assert torch.is_grad_enabled()
        with pytest.raises(RuntimeError, match="cut"), GradModes() as modes:
            modes.enter(False)  # a pre-hook whose forward hook never runs
            raise RuntimeError("cut")
        assert torch.is_grad_enabled()


def test_nested_helpers_each_put_back_their_own_start():
    with torch.no_grad():
        with GradModes() as outer:
            outer.enter(True)
            with GradModes() as inner:
                inner.enter(False)
                outer.enter(False)  # interleaved with the inner one's switches
                inner.enter(True)
                assert torch.is_grad_enabled()
            assert torch.is_grad_enabled()  # the inner one's start: the outer switch to True
        assert not torch.is_grad_enabled()
