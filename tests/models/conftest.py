"""Fixtures of the model-family tests: torchvision and transformers, imported so they load.

torchvision's wheels are built against one torch release and load their compiled ops
(``torchvision::nms`` and the other detection ops) at import: ``torchvision/__init__``
imports ``torchvision._meta_registrations``, which registers fake kernels for those ops
and fails with ``RuntimeError: operator torchvision::nms does not exist`` when the
compiled library did not load (PyPI's torchvision 0.28.0, a CUDA build, beside a CPU-only
torch 2.13.0+cpu). Classification models use none of the compiled ops, so
:func:`import_torchvision` first tries the plain import and, only when it fails with that
error, puts an empty module in place of ``torchvision._meta_registrations`` and imports
again. ``transformers`` imports torchvision itself when it is installed (its image
utilities), so the ``transformers`` fixture applies the same workaround first.
``tests/models/test_family_imports.py`` shows both failures and the fix, in fresh
interpreters.

This is the one place of the workaround; ``bench/model_families.py`` imports
:func:`import_torchvision` from here.

Example:
    >>> tv = import_torchvision()  # doctest: +SKIP
    >>> tv.models.resnet18(num_classes=5)  # doctest: +SKIP
"""

from __future__ import annotations

import importlib
import sys
import types

import pytest

#: the error of ``import torchvision`` when its compiled ops did not load beside torch
MISSING_OPS_ERROR = "operator torchvision::nms does not exist"
#: the module whose import registers fake kernels for the compiled ops
META_REGISTRATIONS = "torchvision._meta_registrations"


def import_torchvision() -> types.ModuleType:
    """``import torchvision``, with the compiled ops' fake kernels left out if they fail.

    Returns:
        The torchvision module (its ``models`` subpackage imported).

    Raises:
        ImportError: torchvision is not installed.
        RuntimeError: the import fails for another reason than :data:`MISSING_OPS_ERROR`.

    Example:
        >>> import_torchvision().models.mobilenet_v2(width_mult=0.25)  # doctest: +SKIP
    """
    try:
        importlib.import_module("torchvision.models")
        return sys.modules["torchvision"]
    except RuntimeError as e:
        if MISSING_OPS_ERROR not in str(e):
            raise
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]  # the half-imported package
    sys.modules[META_REGISTRATIONS] = types.ModuleType(META_REGISTRATIONS)
    importlib.import_module("torchvision.models")
    return sys.modules["torchvision"]


@pytest.fixture(scope="session")
def torchvision():
    """torchvision (see the module docstring), or the test is skipped if not installed."""
    pytest.importorskip("torch", reason="torch not installed")
    try:
        return import_torchvision()
    except ImportError:
        pytest.skip("torchvision not installed")


@pytest.fixture(scope="session")
def transformers():
    """transformers, imported after torchvision's workaround (it imports torchvision)."""
    pytest.importorskip("torch", reason="torch not installed")
    try:
        import_torchvision()
    except ImportError:
        pass  # transformers works without torchvision
    return pytest.importorskip("transformers", reason="transformers not installed")


@pytest.fixture(scope="session", autouse=True)
def _one_export_per_family():
    """A family's forward and training tests share one export per exporter (each takes
    5-9 s here): ``tests/models/families.py``'s ``EXPORT_CACHE``."""
    from tests.models import families

    families.EXPORT_CACHE = {}
    yield
    families.EXPORT_CACHE = None
