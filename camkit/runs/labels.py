"""How labels written in the data (class folder names, CSV cells) become the model's output indices.

A folder name says nothing about which output of the model it is, so the mapping must come
from somewhere explicit, in this order:

1. ``classes`` (``--classes FILE``): the class names in the model's output order;
2. the model's own class list (torchvision weights' categories, the demo model's classes);
3. ``alphabetical=True`` (``--alphabetical-classes``): the sorted label names numbered
   0, 1, ... (the convention of torchvision's ``ImageFolder``), accepted on purpose.

Labels that are all integers are output indices already. Otherwise, with none of the three,
the audit stops and shows the mapping it would have used (:class:`LabelMappingError`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import CamkitError

__all__ = ["LabelMapping", "LabelMappingError", "map_labels"]


class LabelMappingError(CamkitError, ValueError):
    """Labels that cannot be matched to the model's outputs without an explicit mapping."""


@dataclass(frozen=True)
class LabelMapping:
    """The result of :func:`map_labels`.

    Attributes:
        indices: per record, the output index of its label (-1: no label).
        names: class names by output index, when known.
        source: ``"classes"``, ``"model"``, ``"alphabetical"``, ``"index"`` or ``"none"`` (no labels).
    """

    indices: list[int]
    names: list[str] | None
    source: str

    def describe(self) -> dict[str, Any]:
        """For ``summary.json`` and ``run.json``: where the mapping came from and the names by index."""
        return {"source": self.source, "classes": list(self.names) if self.names else None}


def _show(names: Sequence[str], limit: int = 12) -> str:
    shown = ", ".join(f"{i}={name}" for i, name in enumerate(names[:limit]))
    return shown + (f", ... ({len(names)} in all)" if len(names) > limit else "")


def map_labels(
    labels: Sequence[str | None],
    *,
    classes: Sequence[str] | None = None,
    model_classes: Sequence[str] | None = None,
    alphabetical: bool = False,
) -> LabelMapping:
    """Map labels to output indices (see the module docstring for the rule).

    Example:
        >>> from camkit.runs.labels import map_labels
        >>> m = map_labels(["square", "circle", None], model_classes=["circle", "square"])
        >>> m.indices, m.source
        ([1, 0, -1], 'model')
        >>> map_labels(["dog", "cat"], alphabetical=True).indices
        [1, 0]
        >>> try:
        ...     map_labels(["dog", "cat"])
        ... except Exception as err:
        ...     print(str(err)[:60])
        the labels ['cat', 'dog'] need a mapping to the model's outp
    """
    given = sorted({lab for lab in labels if lab})
    if not given:
        return LabelMapping([-1] * len(labels), list(classes or model_classes or []) or None, "none")
    names: list[str] | None = None
    source = ""
    if classes:
        names, source = list(classes), "classes"
    elif model_classes:
        names, source = list(model_classes), "model"
    if names is not None:
        lookup = {name: i for i, name in enumerate(names)}
        digits = all(lab.isdigit() for lab in given)
        unknown = [lab for lab in given if lab not in lookup and not (digits and int(lab) < len(names))]
        if unknown:
            where = "--classes" if source == "classes" else "the model's class list"
            raise LabelMappingError(
                f"label(s) {unknown[:10]} are not in {where} ({_show(names)}); rename the folders or labels, "
                "or pass --classes FILE with the model's class names in output order"
            )
        return LabelMapping(
            [(lookup[lab] if lab in lookup else int(lab)) if lab else -1 for lab in labels], names, source
        )
    if all(lab.isdigit() for lab in given):
        return LabelMapping([int(lab) if lab else -1 for lab in labels], None, "index")
    if not alphabetical:
        raise LabelMappingError(
            f"the labels {given[:10]}{' ...' if len(given) > 10 else ''} need a mapping to the model's outputs, and "
            f"the model has no class list. In alphabetical order they would map to: {_show(given)}. Pass --classes "
            "FILE (one name per line, in the model's output order), or --alphabetical-classes to accept that order "
            "(Python: classes=[...] or alphabetical_classes=True)"
        )
    lookup = {name: i for i, name in enumerate(given)}
    return LabelMapping([lookup[lab] if lab else -1 for lab in labels], given, "alphabetical")
