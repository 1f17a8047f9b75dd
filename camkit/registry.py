"""The method registry (``camkit.get_method``, ``camkit.list_methods``, ``@register_method``).

It lives with the methods that fill it, in :mod:`camkit.methods.registry`; this module keeps the
path ``camkit.registry`` that scripts import it by.
"""

from .methods.registry import MethodInfo, get_method, list_methods, register_method, takes_layer

__all__ = ["MethodInfo", "get_method", "list_methods", "register_method", "takes_layer"]
