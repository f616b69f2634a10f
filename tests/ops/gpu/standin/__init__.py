"""The cupy stand-in's folder (:data:`PATH`): on ``sys.path`` (or ``PYTHONPATH``), it makes
``import cupy`` import the stand-in in ``cupy/``."""

import importlib.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

#: put this on sys.path to import the stand-in as cupy
PATH = Path(__file__).parent


@contextmanager
def as_cupy() -> Iterator:
    """The stand-in imported as ``cupy`` (in ``sys.modules``) while the block runs; the
    module before it (or none) afterwards."""
    spec = importlib.util.spec_from_file_location("cupy", PATH / "cupy" / "__init__.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    saved = sys.modules.get("cupy")
    sys.modules["cupy"] = module
    try:
        yield module
    finally:
        if saved is None:
            del sys.modules["cupy"]
        else:
            sys.modules["cupy"] = saved
