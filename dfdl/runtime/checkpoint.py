"""Checkpoints: weights, optimizer state and position, written atomically.

:func:`save` writes one ``.npz`` file (the arrays and a JSON ``meta`` with the step)
under a temporary name and renames it into place (``os.replace`` is atomic on POSIX),
then replaces the ``latest`` pointer the same way; :func:`load_latest` reads the
checkpoint it points to. Guarantee: a crash mid-write leaves the previous checkpoint
as the latest, and arrays come back with the values and dtypes they were saved with.

Example:
    >>> import tempfile, numpy as np
    >>> d = tempfile.mkdtemp()
    >>> _ = save(d, 100, {"w": np.ones(2, "float32")}, {"seed": 0})
    >>> step, arrays, meta = load_latest(d)
    >>> step, arrays["w"].dtype, meta["seed"]
    (100, dtype('float32'), 0)
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import numpy as np


def _atomic_write(path: Path, write) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def save(directory: str | os.PathLike, step: int, arrays: dict, meta: dict) -> Path:
    """Write checkpoint ``step`` (arrays by name plus JSON metadata); returns its path.

    Example:
        >>> save("ckpt", 100, {"w": w}, {"seed": 0})  # doctest: +SKIP
    """
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"step-{step:09d}.npz"
    payload = {f"a/{k}": np.asarray(v) for k, v in arrays.items()}
    payload["meta"] = np.frombuffer(json.dumps({**meta, "step": step}).encode(), dtype=np.uint8)
    _atomic_write(path, lambda f: np.savez(f, **payload))
    _atomic_write(d / "latest", lambda f: f.write(path.name.encode()))
    return path


def load_latest(directory: str | os.PathLike) -> tuple[int, dict, dict] | None:
    """``(step, arrays, meta)`` of the latest checkpoint in ``directory``, or None."""
    d = Path(directory)
    pointer = d / "latest"
    if not pointer.is_file():
        return None
    path = d / pointer.read_text().strip()
    with np.load(path) as z:
        meta = json.loads(bytes(z["meta"]).decode())
        arrays = {k[2:]: z[k] for k in z.files if k.startswith("a/")}
    return int(meta["step"]), arrays, meta
