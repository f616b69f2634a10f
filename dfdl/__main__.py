"""``python -m dfdl``: the ``dfdl`` command line (see :mod:`dfdl.cli`)."""

from __future__ import annotations

from dfdl.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
