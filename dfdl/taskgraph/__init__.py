"""The task-graph stage: a plan becomes the Dask graph of one submission.

:mod:`~dfdl.taskgraph.lower` makes one task per tile (each running
:mod:`~dfdl.taskgraph.tile_exec`), and :mod:`~dfdl.taskgraph.optimize` groups those tasks
(:mod:`~dfdl.taskgraph.fuse`, step tasks, gangs, :mod:`~dfdl.taskgraph.pack`) without
changing a value. Modules here import only :mod:`dfdl.plan`, :mod:`dfdl.ops` and
:mod:`dfdl.errors`.
"""
