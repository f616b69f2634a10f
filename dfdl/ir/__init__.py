"""The first stage: ONNX models in and out, the graph IR, canonical op forms, binding.

:mod:`~dfdl.ir.onnx_io` loads and writes ONNX, :mod:`~dfdl.ir.graph` is the IR every later
stage works on, :mod:`~dfdl.ir.canonical` rewrites ops into their canonical forms and
:mod:`~dfdl.ir.bind` gives every value a static type for a batch. Modules here import
only :mod:`dfdl.ops` and :mod:`dfdl.errors`.
"""
