"""The planning stage: how a bound training graph is tiled, and whether it fits.

:mod:`~dfdl.plan.compile` plans a training step (:func:`~dfdl.plan.compile.compile_step`)
from :mod:`~dfdl.plan.tiling` (the tiles of every value) and :mod:`~dfdl.plan.estimate`
(the bytes a task and a worker hold). Modules here import only :mod:`dfdl.training`,
:mod:`dfdl.ir`, :mod:`dfdl.ops` and :mod:`dfdl.errors`.
"""
