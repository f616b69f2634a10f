"""The last stage: clusters, the training loop and what runs on the workers.

:mod:`~dfdl.runtime.session` (``dfdl.train``) runs :mod:`~dfdl.runtime.trainer` on a
cluster from :mod:`~dfdl.runtime.cluster`; :mod:`~dfdl.runtime.worker_setup` prepares
every worker, :mod:`~dfdl.runtime.recovery` and :mod:`~dfdl.runtime.checkpoint` keep a
run going, :mod:`~dfdl.runtime.monitor` and :mod:`~dfdl.runtime.dashboard` report on it.
"""
