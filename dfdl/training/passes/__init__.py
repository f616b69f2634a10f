"""Rewrites of a training graph, each one module with one entry point.

Every pass computes the same values as the graph it rewrites (the same numbers,
bit for bit, unless its module says otherwise) and changes only how they are computed:
:mod:`~.split_norm`, :mod:`~.fuse_norm_relu`, :mod:`~.group_updates`,
:mod:`~.fold_transpose` and :mod:`~.recompute`.
"""
