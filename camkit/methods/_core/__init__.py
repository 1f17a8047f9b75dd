"""The shared core of the explainers (private): the base classes (``explainer``: :class:`Explainer`;
``cam_base``: :class:`CAMExplainer`, :class:`GradientCAM`), how a call feeds the model (``binding``),
where a wrapped model runs (``placement``), the output contract (``output``) and the forward-only
plumbing shared by the CAM, perturbation and layer methods (``forward``).

The public classes are exported by :mod:`camkit.methods`.
"""
