"""Loading a model and its preprocessing from a command-line style description.

Shared by ``camkit explain``, ``camkit audit`` and the other subcommands. A model is given as

* ``torchvision:NAME`` (``torchvision:resnet50``), with ``weights`` a torchvision weights
  name (``DEFAULT``, ``IMAGENET1K_V2``: downloaded by torchvision where there is internet)
  or a local state-dict file; without ``weights`` the model has random weights;
* ``package.module:factory``: a callable returning the ``nn.Module`` (``factory`` may be a
  dotted attribute path), optionally with ``weights`` a state-dict file for it;
* a file written by ``torch.save(model)``: a whole pickled model. Unpickling runs code
  from the file, so it is refused unless ``trust_pickle=True`` (``--trust-pickle``);
* ``demo``: the bundled demo model (:func:`camkit.demo.model.load_shapes_cnn`), with its own
  preprocessing (64x64, no mean/std normalisation) and class names (circle, square,
  triangle, cross); ``weights`` may name another state dict for it.

State dicts are always read with ``torch.load(..., weights_only=True)``. TorchScript files
are refused with an explanation: hooks cannot attach to scripted modules.

Preprocessing (:class:`Preprocess`) comes from ``size``/``mean``/``std`` when given, else
from the torchvision weights' own transforms (resize the shorter side, centre-crop), else
a 224x224 resize with ImageNet statistics. Region boxes in original-image pixels follow
the same resize and crop (:meth:`Preprocess.transform_boxes`).

The package is split by what it loads: :mod:`~camkit.modelload.spec` (the grammar and
:func:`load_model`), :mod:`~camkit.modelload.torchvision`, :mod:`~camkit.modelload.files`
(factories, state dicts and pickles) and :mod:`~camkit.modelload.preprocess`. The command-line
options that feed it are in :mod:`camkit.cli.models`.
"""

from ..errors import ModelLoadError
from .preprocess import Preprocess
from .spec import LoadedModel, load_model, resolve_device, warn_random_weights

__all__ = ["LoadedModel", "ModelLoadError", "Preprocess", "load_model", "resolve_device", "warn_random_weights"]
