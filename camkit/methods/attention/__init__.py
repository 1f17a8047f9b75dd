"""Explanations made for vision transformers: attention rollout, Chefer's gradient rollout and LeGrad.

``base`` holds what the three share (the attention layers, the token layout, the output contract),
``rollout``, ``chefer`` and ``legrad`` one method each; ``capture`` reads the attention probabilities
during a forward, ``blockwise`` calls the blocks again one segment at a time, and ``budget`` estimates
the whole graph's memory and chooses between the two paths.
"""

from .base import AttentionExplainer
from .chefer import CheferRollout
from .legrad import LeGrad
from .rollout import AttentionRollout

__all__ = ["AttentionExplainer", "AttentionRollout", "CheferRollout", "LeGrad"]
