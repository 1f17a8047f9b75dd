"""``ScoreCAM``: the module path pytorch-grad-cam keeps it under."""

from ._cams import ScoreCAM

__all__ = ["ScoreCAM"]
