"""Checkpoints: weights, optimizer state and position, written atomically and checked
before they are used.

:func:`save` writes one ``.npz`` file (the arrays and a JSON ``meta``: the step, what
the run was, the name, shape and dtype of every array) under a temporary name, flushes
it to disk and renames it into place (``os.replace`` is atomic on POSIX), then replaces
the ``latest`` pointer the same way, syncing the folder after each rename.
:func:`save_stored` writes a checkpoint whose tensors the workers write
(``weights_dir``): a folder of ``.npy`` files and a ``meta.json``, under a temporary
name renamed into place the same way; :func:`load` maps its files read-only.
:func:`prepare` checks a folder before a run writes to it and, in a folder without
checkpoints, writes an empty pointer ("a run writes here, no checkpoint yet"), so that a
kill between the first checkpoint's file and its pointer leaves a folder that resumes
from step 0, not one that looks like foreign files; :func:`find` and :func:`load`
read the checkpoint the pointer names, and :func:`mismatch` compares it with a run.

Guarantees: a crash or kill mid-write leaves the previous checkpoint as the latest;
arrays come back with the values and dtypes they were saved with; a folder that cannot
be written, a pointer that leaves the folder or names a missing file, and a file that
is truncated, edited or incomplete are a :class:`~dfdl.errors.CheckpointError` naming
the file, what is wrong and what to do, never a raw ``KeyError`` or ``BadZipFile``.

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
import re
import shutil
import tempfile
import zipfile
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from dfdl.errors import CheckpointError

#: the name of the file that names the latest checkpoint
POINTER = "latest"
#: version of the meta layout written by :func:`save` (absent: written before there was one)
FORMAT = 1
#: temporary files :func:`save` (and folders :func:`save_stored`) leave only when killed
#: mid-write (``mkstemp``'s and ``mkdtemp``'s suffix)
_LEFTOVER = re.compile(r"^\.(step-\d+(\.npz)?|latest)\.[A-Za-z0-9_]{8}$")
#: the file of a folder checkpoint (:func:`save_stored`) that lists its arrays
FOLDER_META = "meta.json"
_READ_ERRORS = (OSError, EOFError, ValueError, KeyError, zipfile.BadZipFile, zlib.error)


def _fsync_dir(directory: Path) -> None:
    """Make a rename in ``directory`` durable (a no-op where folders cannot be opened)."""
    if not hasattr(os, "O_DIRECTORY"):
        return
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
    _fsync_dir(path.parent)


def prepare(directory: str | os.PathLike) -> Path:
    """Check that checkpoints can be written to ``directory``: create it if missing,
    write and remove a probe file, remove temporary files a killed write left and, when
    the folder holds neither a pointer nor checkpoint files, write an empty pointer.

    Raises:
        CheckpointError: the path is a file, or the folder cannot be created or written.

    Example:
        >>> import tempfile
        >>> prepare(tempfile.mkdtemp()).is_dir()
        True
    """
    d = Path(directory)
    fix = "give a writable folder as checkpoint_dir (--checkpoint-dir)"
    if d.exists() and not d.is_dir():
        raise CheckpointError(f"checkpoint_dir {d} is a file, not a folder: {fix}", path=str(d))
    try:
        d.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=d, prefix=".dfdl-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        why = e.strerror or type(e).__name__
        raise CheckpointError(
            f"checkpoint_dir {d} cannot be written ({why}): {fix}", path=str(d)
        ) from e
    for leftover in d.iterdir():
        if _LEFTOVER.match(leftover.name) and leftover.is_file():
            leftover.unlink(missing_ok=True)
        elif _LEFTOVER.match(leftover.name) and leftover.is_dir():
            shutil.rmtree(leftover, ignore_errors=True)
    if not (d / POINTER).exists() and not _checkpoints(d):
        _atomic_write(d / POINTER, lambda f: None)
    return d


def _checkpoints(d: Path) -> list[Path]:
    """The checkpoint files and folders in ``d``, by name."""
    return sorted([*d.glob("step-*.npz"), *(p for p in d.glob("step-*") if p.is_dir())])


def save(
    directory: str | os.PathLike, step: int, arrays: Mapping[str, Any], meta: Mapping[str, Any]
) -> Path:
    """Write checkpoint ``step`` (arrays by name plus JSON metadata); returns its path.

    The meta written adds ``step``, ``format`` and ``arrays`` (each array's shape and
    dtype, so a file missing one is detected) to ``meta``.

    Example:
        >>> save("ckpt", 100, {"w": w}, {"seed": 0})  # doctest: +SKIP
    """
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"step-{step:09d}.npz"
    values = {k: np.asarray(v) for k, v in arrays.items()}
    payload = {f"a/{k}": v for k, v in values.items()}
    listing = {k: [list(v.shape), v.dtype.str] for k, v in values.items()}
    full = {**meta, "format": FORMAT, "step": step, "arrays": listing}
    payload["meta"] = np.frombuffer(json.dumps(full).encode(), dtype=np.uint8)
    _atomic_write(path, lambda f: np.savez(f, **payload))
    _atomic_write(d / POINTER, lambda f: f.write(path.name.encode()))
    return path


def save_stored(
    directory: str | os.PathLike,
    step: int,
    write: Callable[[Path], Mapping[str, Any]],
    meta: Mapping[str, Any],
) -> dict[str, Any]:
    """Write checkpoint ``step`` as a folder of ``.npy`` files that ``write`` has the
    workers write (``write(folder)`` returns the :class:`~dfdl.runtime.stored.Stored`
    tensors it wrote there), then its meta; returns the tensors where they are once the
    checkpoint is in place.

    The folder is written under a temporary name, synced, and renamed into place before
    the ``latest`` pointer names it: a kill mid-write leaves the previous checkpoint the
    latest, as :func:`save` does.

    Example:
        >>> save_stored("ckpt", 100, lambda f: state.store(client, f, types), {})  # doctest: +SKIP
    """
    from dfdl.runtime.stored import Stored

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    name = f"step-{step:09d}"
    tmp = Path(tempfile.mkdtemp(dir=d, prefix=f".{name}."))
    try:
        written = write(tmp)
        listing = {
            k: [list(v.shape), np.dtype(v.dtype).str, Path(v.path).name] for k, v in written.items()
        }
        full = {**meta, "format": FORMAT, "step": step, "arrays": listing}
        _atomic_write(tmp / FOLDER_META, lambda f: f.write(json.dumps(full).encode()))
        final = d / name
        if final.exists():  # written by a run killed before its pointer named it
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync_dir(d)
    _atomic_write(d / POINTER, lambda f: f.write(name.encode()))
    return {
        k: Stored(str(final / Path(v.path).name), v.offset, tuple(v.shape), v.dtype)
        for k, v in written.items()
    }


def find(directory: str | os.PathLike) -> Path | None:
    """The checkpoint file that ``directory``'s ``latest`` pointer names, or None when
    there is no folder, no pointer, or an empty pointer (:func:`prepare` wrote it and
    no checkpoint was committed since).

    Raises:
        CheckpointError: the pointer is unreadable, names a path outside the folder, or
            names a file that does not exist; or there is no pointer but there are
            checkpoint files (which one to resume from is the user's choice).

    Example:
        >>> import tempfile
        >>> find(tempfile.mkdtemp()) is None
        True
    """
    d = Path(directory)
    pointer = d / POINTER
    if not pointer.exists():
        if d.is_dir() and _checkpoints(d):
            raise CheckpointError(
                f"{d} holds checkpoint files but no '{POINTER}' pointer: write the name of "
                f"the one to resume from (e.g. {_checkpoints(d)[-1].name}) into "
                f"{pointer}, or use another checkpoint_dir",
                path=str(pointer),
            )
        return None
    fix = f"write the name of a checkpoint file of {d} into it, or use another checkpoint_dir"
    try:
        name = pointer.read_bytes().decode().strip()
    except (OSError, UnicodeDecodeError) as e:
        raise CheckpointError(f"checkpoint pointer {pointer} is unreadable ({e}): {fix}") from e
    if not name:
        return None
    if "/" in name or "\\" in name or name in (".", "..") or Path(name).is_absolute():
        raise CheckpointError(
            f"checkpoint pointer {pointer} names {name!r}, not a file in {d}: {fix}",
            path=str(pointer),
        )
    path = d / name
    if not (path.is_file() or path.is_dir()):
        raise CheckpointError(
            f"checkpoint pointer {pointer} names {name}, which does not exist: {fix}",
            path=str(pointer),
        )
    if path.resolve().parent != d.resolve():  # a link out of the folder
        raise CheckpointError(
            f"checkpoint pointer {pointer} names {name}, a link out of {d}: {fix}",
            path=str(pointer),
        )
    return path


def load(path: str | os.PathLike) -> tuple[int, dict[str, np.ndarray], dict[str, Any]]:
    """``(step, arrays, meta)`` of the checkpoint at ``path``: a file written by
    :func:`save`, or a folder written by :func:`save_stored` (whose arrays come back as
    read-only memory maps of its ``.npy`` files: nothing is read until it is used).

    Raises:
        CheckpointError: the file is not a complete checkpoint (truncated or not a
            zip archive, no or bad meta, an array listed in the meta missing or of
            another shape or dtype).

    Example:
        >>> step, arrays, meta = load("ckpt/step-000000100.npz")  # doctest: +SKIP
    """
    path = Path(path)
    fix = (
        f"write its name into {path.parent / POINTER} to resume from an earlier checkpoint "
        "of that folder, or start without resume"
    )

    def bad(what: str) -> CheckpointError:
        return CheckpointError(f"checkpoint {path} {what}: {fix}", path=str(path))

    try:
        meta, arrays = _load_folder(path, bad) if path.is_dir() else _load_npz(path, bad)
    except CheckpointError:
        raise
    except _READ_ERRORS as e:
        raise bad(f"is unreadable: truncated or not a checkpoint ({type(e).__name__}: {e})") from e
    if not isinstance(meta, dict):
        raise bad("has meta that is not a JSON object")
    step = meta.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise bad(f"has no valid step in its meta (step: {step!r})")
    listing = meta.get("arrays", {})
    if not isinstance(listing, dict):
        raise bad("has a meta 'arrays' entry that is not a JSON object")
    for name, spec in listing.items():
        if name not in arrays:
            raise bad(f"lacks array {name!r} that its meta lists")
        try:
            shape, dtype = tuple(spec[0]), np.dtype(spec[1])
        except (TypeError, ValueError, IndexError) as e:
            raise bad(f"has a bad meta entry for array {name!r} ({spec!r})") from e
        if arrays[name].shape != shape or arrays[name].dtype != dtype:
            raise bad(
                f"has array {name!r} of shape {arrays[name].shape} {arrays[name].dtype}, "
                f"but its meta says {shape} {dtype}"
            )
    if not arrays:
        raise bad("holds no arrays")
    return step, arrays, meta


def _load_npz(path: Path, bad) -> tuple[Any, dict[str, np.ndarray]]:
    """The meta and the arrays of a checkpoint file."""
    with np.load(path) as z:
        if "meta" not in z.files:
            raise bad("has no meta (not a dfdl checkpoint, or an incomplete one)")
        raw = z["meta"]
        try:
            meta = json.loads(bytes(raw).decode())
        except (ValueError, TypeError) as e:
            raise bad(f"has unreadable meta ({e})") from e
        return meta, {k[2:]: z[k] for k in z.files if k.startswith("a/")}


def _load_folder(path: Path, bad) -> tuple[Any, dict[str, np.ndarray]]:
    """The meta and the arrays (read-only memory maps) of a folder checkpoint."""
    if not (path / FOLDER_META).is_file():
        raise bad(f"has no {FOLDER_META} (not a dfdl checkpoint, or an incomplete one)")
    try:
        meta = json.loads((path / FOLDER_META).read_bytes().decode())
    except (ValueError, TypeError) as e:
        raise bad(f"has an unreadable {FOLDER_META} ({e})") from e
    listing = meta.get("arrays") if isinstance(meta, dict) else None
    if not isinstance(listing, dict):
        raise bad(f"has a {FOLDER_META} without an 'arrays' object")
    arrays = {}
    for name, spec in listing.items():
        file = spec[2] if isinstance(spec, list) and len(spec) == 3 else None
        if not isinstance(file, str) or "/" in file or "\\" in file or file in (".", ".."):
            raise bad(f"has a bad meta entry for array {name!r} ({spec!r})")
        if not (path / file).is_file():
            raise bad(f"lacks {file}, the file of array {name!r}")
        arrays[name] = np.load(path / file, mmap_mode="r", allow_pickle=False)
    return meta, arrays


def load_latest(
    directory: str | os.PathLike,
) -> tuple[int, dict[str, np.ndarray], dict[str, Any]] | None:
    """``(step, arrays, meta)`` of the latest checkpoint in ``directory``, or None when
    it has none (:func:`find`, :func:`load`; their errors).

    Example:
        >>> step, arrays, meta = load_latest("ckpt")  # doctest: +SKIP
    """
    path = find(directory)
    return None if path is None else load(path)


#: what :func:`mismatch` compares, in order, besides the arrays: meta key -> how to
#: resume with the checkpoint's value ``{v}``
_SETTINGS = {
    "loss": "loss={v!r} (--loss {v})",
    "batch_size": "batch_size={v} (--batch-size {v})",
    "seed": "seed={v} (--seed {v})",
    "samples": "the same data ({v} samples)",
    "shuffle": "shuffle={v}",
    "drop_last": "drop_last={v}",
}


def mismatch(
    path: str | os.PathLike,
    meta: Mapping[str, Any],
    arrays: Mapping[str, np.ndarray],
    run: Mapping[str, Any],
    expected: Mapping[str, tuple[tuple[int, ...], np.dtype]],
) -> str | None:
    """The first difference between a checkpoint and the run that would resume from it,
    as one line naming the file and what to do; None when they agree.

    Compared in order: the model's parameters (``meta["params"]`` against
    ``run["params"]``), the optimizer's kind and state (``"optimizer"``), every array's
    name, shape and dtype (``expected``), then the settings that decide the numbers and
    the data order (loss, batch size, seed, number of samples, shuffle, drop_last). A
    key a checkpoint lacks (written by an older dfdl) is not compared.

    Example:
        >>> w = {"w": np.zeros(2, np.float32)}
        >>> line = mismatch("c.npz", {"seed": 1}, w, {"seed": 2}, {"w": ((2,), "float32")})
        >>> line.split(": ")[0]
        'checkpoint c.npz was written with seed 1; this run has 2'
    """
    head = f"checkpoint {path} was written"
    other = "or use another checkpoint_dir"
    if "params" in meta and sorted(meta["params"]) != sorted(run["params"]):
        theirs, ours = set(meta["params"]), set(run["params"])
        return (
            f"{head} for another model: "
            f"{_both(theirs - ours, 'this run does not train', ours - theirs, 'this run trains')}"
            f": resume with the model (and frozen names) it was written for {other}"
        )
    if "optimizer" in meta and meta["optimizer"] != run["optimizer"]:
        theirs, ours = meta["optimizer"], run["optimizer"]
        flag = (
            f" (--optimizer {str(theirs.get('kind', '')).lower()})"
            if isinstance(theirs, Mapping)
            else ""
        )
        return (
            f"{head} with optimizer {_optimizer(theirs)}; this run has {_optimizer(ours)}: "
            f"resume with the optimizer it was written with{flag} {other}"
        )
    if set(arrays) != set(expected):
        lacks, extra = set(expected) - set(arrays), set(arrays) - set(expected)
        return (
            f"{head} for another model or optimizer: "
            f"{_both(extra, 'this run does not have', lacks, 'this run needs')}: resume with "
            f"the model and optimizer it was written for {other}"
        )
    for name in sorted(expected):
        shape, dtype = expected[name]
        have = arrays[name]
        if tuple(have.shape) != tuple(shape) or have.dtype != np.dtype(dtype):
            return (
                f"{head} with {name!r} of shape {tuple(have.shape)} {have.dtype}; this run's "
                f"is {tuple(shape)} {np.dtype(dtype)}: resume with the model it was written "
                f"for {other}"
            )
    for key, fix in _SETTINGS.items():
        if key in meta and key in run and meta[key] != run[key]:
            v = meta[key]
            return (
                f"{head} with {key} {_show(v)}; this run has {_show(run[key])}: resume with "
                f"{fix.format(v=v)} {other}"
            )
    return None


def _both(extra: set[str], extra_why: str, lacks: set[str], lacks_why: str) -> str:
    """``it holds 'a', 'b' that <extra_why>; it lacks 'c' that <lacks_why>``."""
    parts = []
    if extra:
        parts.append(f"it holds {_names(extra)}, which {extra_why}")
    if lacks:
        parts.append(f"it lacks {_names(lacks)}, which {lacks_why}")
    return "; ".join(parts)


def _names(names: set[str], most: int = 3) -> str:
    shown = sorted(names)[:most]
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return f"{', '.join(map(repr, shown))}{more}"


def _optimizer(spec: Any) -> str:
    if not isinstance(spec, Mapping):
        return repr(spec)
    states = spec.get("states") or []
    kept = f" (state {', '.join(states)})" if states else " (no state)"
    return f"{spec.get('kind')}{kept}"


def _show(v: Any) -> str:
    return repr(v) if isinstance(v, str) else str(v)
