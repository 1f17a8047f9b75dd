"""Loading a model and its preprocessing from a command-line style description.

Shared by ``camkit explain``, ``camkit audit`` and the other subcommands. A model is given as

* ``torchvision:NAME`` (``torchvision:resnet50``), with ``weights`` a torchvision weights
  name (``DEFAULT``, ``IMAGENET1K_V2``: downloaded by torchvision where there is internet)
  or a local state-dict file; without ``weights`` the model has random weights;
* ``timm:NAME`` (``timm:convnext_atto``), with ``weights`` a state-dict file or ``pretrained``
  (timm's own loading, from its cache when offline), and timm's data config as preprocessing
  (:mod:`~camkit.modelload.timm`);
* ``hf:PATH_OR_ID``: a Hugging Face ``save_pretrained`` folder or a hub id (through transformers'
  cache), with its image processor as preprocessing and its ``id2label`` as class names
  (:mod:`~camkit.modelload.hf`);
* ``package.module:factory``: a callable returning the ``nn.Module`` (``factory`` may be a
  dotted attribute path), optionally with ``weights`` a state-dict file for it;
* a file written by ``torch.save(model)``: a whole pickled model. Unpickling runs code
  from the file, so it is refused unless ``trust_pickle=True`` (``--trust-pickle``);
* ``demo``: the bundled demo model (:func:`camkit.bundled.model.load_shapes_cnn`), with its own
  preprocessing (64x64, no mean/std normalisation) and class names (circle, square,
  triangle, cross); ``weights`` may name another state dict for it.

State dicts are safetensors files or pickles read with ``torch.load(..., weights_only=True)``;
Lightning checkpoints work too, their ``model.`` prefix stripped
(:mod:`~camkit.modelload.statedict`). TorchScript, ``torch.export`` and ONNX files are refused
with an explanation: hooks cannot see inside them.

Preprocessing (:class:`Preprocess`) is the model's own: the torchvision weights' transforms
(for a user's state dict, those of the architecture's ``DEFAULT`` weights), timm's data config,
or the Hugging Face image processor; ``size``, ``crop``, ``mean`` and ``std`` replace it, and a
model with none gets a 224x224 resize with ImageNet statistics. ``load_model(...)`` unpacks as
``model, preprocess``; ``preprocess(image)`` takes a PIL image, a uint8 array or a uint8 tensor. Region boxes in original-image pixels follow
the same resize and crop (:meth:`Preprocess.transform_boxes`).

The package is split by what it loads: :mod:`~camkit.modelload.spec` (the grammar and
:func:`load_model`), :mod:`~camkit.modelload.torchvision`, :mod:`~camkit.modelload.files`
(factories and pickles), :mod:`~camkit.modelload.statedict`, :mod:`~camkit.modelload.timm`,
:mod:`~camkit.modelload.hf` and :mod:`~camkit.modelload.preprocess`. The command-line
options that feed it are in :mod:`camkit.cli.models`.
"""

from ..errors import ModelLoadError
from .preprocess import Preprocess
from .spec import LoadedModel, load_model, resolve_device, warn_random_weights

__all__ = ["LoadedModel", "ModelLoadError", "Preprocess", "load_model", "resolve_device", "warn_random_weights"]
