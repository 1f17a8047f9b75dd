"""What is scored: class targets and output selection, task targets, neuron and token targets.

* :mod:`camkit.targets.classes`: ``target=`` as classes (``None``, an int, one per sample,
  ``[B, K]``) or a callable, and ``output=`` to pick the tensor of a structured output
  (:func:`resolve_target`, :func:`select_output`);
* :mod:`camkit.targets.tasks`: scores beyond class logits (segmentation, similarity,
  regression, binary, detection);
* :mod:`camkit.targets.neuron`: one channel or unit of a hidden layer (:class:`NeuronTarget`);
* :mod:`camkit.targets.tokens`: the log-probability of tokens a language model reads (:class:`TokenTarget`).
"""

from .classes import OutputSelector, Target, resolve_target, select_output
from .neuron import NeuronTarget, bind_target
from .tasks import BinaryTarget, DetectionTarget, RegressionTarget, SegmentationTarget, SimilarityTarget, box_iou
from .tokens import TokenTarget, token_log_probs

__all__ = [
    "BinaryTarget",
    "DetectionTarget",
    "NeuronTarget",
    "OutputSelector",
    "RegressionTarget",
    "SegmentationTarget",
    "SimilarityTarget",
    "Target",
    "TokenTarget",
    "bind_target",
    "box_iou",
    "resolve_target",
    "select_output",
    "token_log_probs",
]
