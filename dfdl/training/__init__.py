"""The training graph: a model, its loss, gradients and optimizer updates as one graph.

:mod:`~dfdl.training.graph` builds a :class:`~dfdl.training.graph.TrainingGraph` from a
model with :mod:`~dfdl.training.losses`, :mod:`~dfdl.training.autodiff` and
:mod:`~dfdl.training.optimizers`; :mod:`dfdl.training.passes` holds its rewrites.
Modules here import only :mod:`dfdl.ir`, :mod:`dfdl.ops` and :mod:`dfdl.errors`.
"""
