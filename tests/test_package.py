"""Package-level promises: dfdl imports and runs without optional dependencies."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_import_and_plan_without_cupy_torch_or_onnxruntime():
    # block the optional packages, as on a CPU machine without the extras
    code = textwrap.dedent(
        """
        import sys
        for name in ("cupy", "torch", "onnxruntime"):
            sys.modules[name] = None
        import dfdl, dfdl.models
        plan = dfdl.plan(dfdl.models.mlp((8, 16, 4)), batch_size=4)
        assert plan.n_tasks() > 0
        assert "cupy" not in sys.modules or sys.modules["cupy"] is None
        print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_public_api():
    import dfdl

    for name in ("run", "plan", "load", "backend", "errors"):
        assert hasattr(dfdl, name), name
    assert issubclass(dfdl.errors.UnsupportedOpError, dfdl.errors.DfdlError)
