"""Methods that score a vision-language model's image units for each token it wrote.

:mod:`camkit.vlm.methods.registry` states the contract (:class:`~camkit.vlm.methods.registry.MethodRequest`
in, :class:`~camkit.vlm.methods.registry.UnitScores` out) and holds the registry; importing this
package imports every method module, each of which registers itself.
"""

from . import attention, attention_gradients, attnlrp, gradcam, gradient_input, perturbation  # noqa: F401  (each method module registers itself)
from .registry import VLM_METHODS, MethodRequest, UnitScores, get_vlm_method, list_vlm_methods, register_vlm_method

__all__ = ["VLM_METHODS", "MethodRequest", "UnitScores", "get_vlm_method", "list_vlm_methods", "register_vlm_method"]
