"""The cupy stand-in's folder (:data:`PATH`): on ``sys.path`` (or ``PYTHONPATH``), it makes
``import cupy`` import the stand-in in ``cupy/``."""

from pathlib import Path

#: put this on sys.path to import the stand-in as cupy
PATH = Path(__file__).parent
