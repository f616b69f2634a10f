"""Output files: checked before the work starts, written atomically.

:func:`check_output_path` runs before training (``dfdl train -o``) or graph building
(``dfdl export-training-graph -o``): the path is not empty, not a folder, its folder
exists, and a file can be created there (a probe file is created and removed), so a
run never ends with a model it cannot write.

:func:`save_model` writes an ONNX model under a temporary name in the target's folder,
flushes and fsyncs it and renames it into place (``os.replace``): a failed write (a full
disk) leaves the previous file untouched and no partial file behind. A model whose
tensors pass :data:`EXTERNAL_DATA_THRESHOLD` bytes (protobuf cannot serialize 2 GiB)
is written with ONNX external data: its large initializers go to one file beside it,
``<name>.data`` (written the same way, before the model), which
:func:`dfdl.ir.onnx_io.load_model` and onnxruntime read.

Example:
    >>> import tempfile, dfdl.models
    >>> path = os.path.join(tempfile.mkdtemp(), "mlp.onnx")
    >>> _ = check_output_path(path)
    >>> [p.name for p in save_model(dfdl.models.mlp((4, 3)), path)]
    ['mlp.onnx']
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import onnx

from dfdl.errors import ModelError, OutputError
from dfdl.ir.onnx_io import LARGE_MODEL_BYTES, mapped_location, raw_nbytes, tensor_bytes
from dfdl.plan.estimate import format_bytes

#: tensor bytes above which :func:`save_model` writes external data (protobuf's limit on
#: one serialized message is 2 GiB; this leaves room for the graph itself)
EXTERNAL_DATA_THRESHOLD = LARGE_MODEL_BYTES
#: initializers smaller than this stay inside the model file when the rest goes external
EXTERNAL_MIN_TENSOR = 1024
#: offsets of tensors in the external data file are multiples of this (page-aligned, so
#: a reader can map them)
EXTERNAL_ALIGN = 4096


def check_output_path(path: str | os.PathLike, what: str = "-o", size: int = 0) -> Path:
    """Check that a file can be written at ``path``, before any work is done.

    A file can be created in the folder (a temporary probe file is created there and
    removed, which also catches read-only and special file systems such as ``/proc``),
    and the folder's disk has ``size`` bytes free.

    Args:
        path: the file to be written.
        what: how the error names the path: the flag (``"-o"``) or a phrase.
        size: bytes the file will need (0: do not check free space).

    Returns:
        The absolute path.

    Raises:
        OutputError: the path is empty or a folder, an existing file there is read-only
            or not a regular file, the folder is missing or not writable, or its disk
            has less than ``size`` bytes free. The message names the path and what to do.

    Example:
        >>> check_output_path("trained.onnx")  # doctest: +SKIP
        PosixPath('/home/me/trained.onnx')
    """
    target = _check_target(path, what)
    folder = _written(target).parent
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=f".{target.name}.", suffix=".probe")
    except OSError as e:
        raise OutputError(
            f"{what} {os.fspath(path)}: cannot create a file in {folder} ({_reason(e)}); "
            "choose a folder you can write to"
        ) from e
    os.close(fd)
    os.unlink(probe)
    if size > 0:
        free = shutil.disk_usage(folder).free
        if free < size:
            raise OutputError(
                f"{what} {os.fspath(path)}: the output needs about {format_bytes(size)}, "
                f"but the disk of {folder} has {format_bytes(free)} free; free some space "
                "or choose another folder"
            )
    return target


def save_model(
    proto: onnx.ModelProto,
    path: str | os.PathLike,
    *,
    external_threshold: int = EXTERNAL_DATA_THRESHOLD,
) -> list[Path]:
    """Write ``proto`` to ``path`` atomically, with external data when it is large.

    The model is written to a temporary file in the same folder, flushed, fsynced and
    renamed over ``path`` (over the file it links to, where ``path`` is a symbolic
    link: external data then goes beside that file). When its tensors hold more than
    ``external_threshold`` bytes, every initializer of :data:`EXTERNAL_MIN_TENSOR` bytes
    or more goes to one external data file, ``<name>.data`` beside the model (location
    relative to the model's folder), written and renamed into place first; a
    ``<name>.data`` that only the replaced model used is removed when the new one has
    none. ``proto`` is not modified.

    Args:
        proto: the model (with its tensor data loaded).
        path: the ``.onnx`` file to write.
        external_threshold: tensor bytes above which external data is written.

    Returns:
        The files written: the model, then its external data file if any.

    Raises:
        OutputError: the path is not writable, the write failed (a full disk: the
            message says "No space left on device"), or what stays in the model file
            passes protobuf's 2 GiB. The previous file at ``path`` (and its data file) is left as
            it was, and no temporary file is left behind.
        ModelError: ``proto`` refers to external data that is not loaded.

    Example:
        >>> save_model(result.model, "trained.onnx")  # doctest: +SKIP
        [PosixPath('/home/me/trained.onnx')]
    """
    shown = _check_target(path, "cannot write the model to")
    target = _written(shown)
    folder = target.parent
    data_path = folder / f"{target.name}.data"
    _refuse_unloaded(proto)
    mapped = _mapped_bytes(proto)
    # tensors left in their files are copied a piece at a time, never loaded
    external = mapped > 0 or tensor_bytes(proto) > external_threshold
    stale = not external and _uses_data_file(target, data_path)
    mode = _new_file_mode(target)
    temps: list[str] = []
    try:
        if external:
            shells: list[onnx.ModelProto] = []

            def write_data(f: BinaryIO) -> None:
                shells.append(_write_external(proto, data_path.name, f))

            data_tmp = _write_temp(data_path, mode, temps, write_data)
            model_bytes = _serialize(shells.pop(), shown)
        else:
            model_bytes = _serialize(proto, shown)
        model_tmp = _write_temp(target, mode, temps, lambda f: f.write(model_bytes))
        if external:
            _install_pair(data_tmp, data_path, model_tmp, target, temps)
        else:
            os.replace(model_tmp, target)
            if stale:
                with contextlib.suppress(OSError):
                    os.unlink(data_path)
        _sync_folder(folder)
    except OSError as e:
        if isinstance(e, OutputError):
            raise
        full = e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
        raise OutputError(
            f"cannot write the model to {shown} ({_reason(e)}); the previous file there "
            "(if any) is unchanged. "
            + ("Free some space or choose another folder" if full else "Choose another folder")
            + ", then save again"
        ) from e
    finally:
        for tmp in temps:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
    return [target, data_path] if external else [target]


def _refuse_unloaded(proto: onnx.ModelProto) -> None:
    """ModelError where a tensor refers to external data not loaded: its bytes are not in
    ``proto`` and its location is relative to a folder ``save_model`` does not know."""
    from onnx.external_data_helper import _get_all_tensors

    for t in _get_all_tensors(proto):
        if t.data_location == onnx.TensorProto.EXTERNAL and mapped_location(t) is None:
            raise ModelError(
                f"tensor {t.name!r} refers to external data that is not loaded; load the "
                "model with its data (onnx.load(path) or dfdl.ir.onnx_io.load_model) first"
            )


# ------------------------------------------------------------------------------ checks


def _check_target(path: str | os.PathLike, what: str) -> Path:
    """The absolute path, once it is known not to be empty, a folder, a special or
    read-only file, or in a missing folder; errors start with ``what`` and the path."""
    text = os.fspath(path)
    if not text:
        raise OutputError(f"{what} is empty: give the file to write, e.g. trained.onnx")
    lead = f"{what} {text}"
    target = Path(text).absolute()
    if os.path.isdir(target):
        raise OutputError(
            f"{lead}: that is a folder; give a file name inside it, e.g. {target / 'trained.onnx'}"
        )
    if os.path.lexists(target) and not os.path.isfile(target):
        raise OutputError(
            f"{lead}: that is not a regular file (a device, pipe, socket or broken link); "
            "give the path of a file"
        )
    if os.path.isfile(target) and not os.access(target, os.W_OK):
        raise OutputError(
            f"{lead}: that file is read-only; make it writable (chmod u+w) or choose another name"
        )
    folder = target.parent
    if not os.path.exists(folder):
        raise OutputError(
            f"{lead}: the folder {folder} does not exist; create it first "
            f"(mkdir -p {folder}) or choose another folder"
        )
    if not os.path.isdir(folder):
        raise OutputError(f"{lead}: {folder} is not a folder; choose a path inside one")
    return target


def _written(target: Path) -> Path:
    """The file a write to ``target`` replaces: the one a symbolic link points to."""
    return Path(os.path.realpath(target)) if os.path.islink(target) else target


def _uses_data_file(target: Path, data_path: Path) -> bool:
    """Whether the model now at ``target`` keeps tensors in ``data_path`` (read without
    its data; a model file of 64 MiB or more is taken to hold its own)."""
    if not os.path.isfile(data_path) or not os.path.isfile(target):
        return False
    if os.path.getsize(target) >= 64 * 2**20:
        return False
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    try:
        old = onnx.load(str(target), load_external_data=False)
    except Exception:  # not an ONNX file: it cannot refer to the data file
        return False
    for t in _get_all_tensors(old):
        if uses_external_data(t):
            info = {e.key: e.value for e in t.external_data}
            if info.get("location") == data_path.name:
                return True
    return False


def _reason(e: OSError) -> str:
    return e.strerror or str(e) or type(e).__name__


# ------------------------------------------------------------------------------ writing


def _new_file_mode(target: Path) -> int:
    """The existing file's permissions, or those a new file gets (0o666 less the umask):
    ``mkstemp`` creates its files with 0o600."""
    with contextlib.suppress(OSError):
        return os.stat(target).st_mode & 0o7777
    umask = 0o022
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Umask:"):
                umask = int(line.split()[1], 8)
    return 0o666 & ~umask


def _write_temp(target: Path, mode: int, temps: list[str], write: Callable[[BinaryIO], object]):
    """Write a temporary file beside ``target`` (recorded in ``temps``), flushed and
    fsynced; returns its path."""
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    temps.append(tmp)
    with os.fdopen(fd, "wb") as f:
        os.fchmod(f.fileno(), mode)
        write(f)
        f.flush()
        os.fsync(f.fileno())
    return tmp


def _serialize(proto: onnx.ModelProto, target: Path) -> bytes:
    try:
        return proto.SerializeToString()
    except Exception as e:  # upb raises ValueError or EncodeError past 2 GiB
        raise OutputError(
            f"cannot write the model to {target}: protobuf cannot serialize it ({e}); "
            "what stays in the model file (tensors in node attributes or subgraphs, and "
            "the graph) must be under 2 GiB"
        ) from e


def _install_pair(data_tmp: str, data_path: Path, model_tmp: str, target: Path, temps: list):
    """Rename the data file, then the model into place; if the model's rename fails, the
    previous data file comes back (kept through a hard link) or the new one goes."""
    backup = None
    if os.path.isfile(data_path):
        backup = f"{data_tmp}.old"
        try:
            os.link(data_path, backup)
            temps.append(backup)
        except OSError:  # no hard links on this file system: nothing to restore from
            backup = None
    os.replace(data_tmp, data_path)
    try:
        os.replace(model_tmp, target)
    except BaseException:
        if backup is not None:
            os.replace(backup, data_path)
        else:
            with contextlib.suppress(OSError):
                os.unlink(data_path)
        raise


def _sync_folder(folder: Path) -> None:
    """fsync the folder, so the renames survive a crash (not every system allows it)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def copy_fields_except(src, dst, skip: str) -> None:
    """Copy every set field of message ``src`` into ``dst`` except ``skip``."""
    for fd, value in src.ListFields():
        if fd.name == skip:
            continue
        if fd.is_repeated:
            getattr(dst, fd.name).extend(value)
        elif fd.type == fd.TYPE_MESSAGE:
            getattr(dst, fd.name).CopyFrom(value)
        else:
            setattr(dst, fd.name, value)


def _write_external(proto: onnx.ModelProto, location: str, f: BinaryIO) -> onnx.ModelProto:
    """Write the large initializers of ``proto`` to ``f`` and return the model without
    their data, pointing at ``location`` (one tensor's bytes are copied at a time)."""
    shell = onnx.ModelProto()
    copy_fields_except(proto, shell, "graph")
    copy_fields_except(proto.graph, shell.graph, "initializer")
    offset = 0
    for t in proto.graph.initializer:
        where = mapped_location(t)
        if where is not None and where[2] < EXTERNAL_MIN_TENSOR:
            out = shell.graph.initializer.add()
            copy_fields_except(t, out, "external_data")
            out.data_location = onnx.TensorProto.DEFAULT
            with open(where[0], "rb") as src:
                src.seek(where[1])
                out.raw_data = src.read(where[2])
            continue
        if where is None and (not t.HasField("raw_data") or raw_nbytes(t) < EXTERNAL_MIN_TENSOR):
            shell.graph.initializer.add().CopyFrom(t)
            continue
        pad = -offset % EXTERNAL_ALIGN
        f.write(b"\0" * pad)
        offset += pad
        out = shell.graph.initializer.add()
        if where is None:
            data = t.raw_data
            f.write(data)
            length = len(data)
            del data
            copy_fields_except(t, out, "raw_data")
        else:
            length = _copy_range(where, f)
            copy_fields_except(t, out, "external_data")
        out.data_location = onnx.TensorProto.EXTERNAL
        for key, value in (("location", location), ("offset", offset), ("length", length)):
            out.external_data.add(key=key, value=str(value))
        offset += length
    return shell


def _mapped_bytes(proto: onnx.ModelProto) -> int:
    """Bytes of the initializers left in their files (:func:`~dfdl.ir.onnx_io.
    mapped_location`)."""
    return sum(
        where[2] for t in proto.graph.initializer if (where := mapped_location(t)) is not None
    )


#: bytes :func:`_copy_range` holds at a time
COPY_BLOCK = 64 * 2**20


def _copy_range(where: tuple[str, int, int], f: BinaryIO) -> int:
    """Copy ``length`` bytes at ``offset`` of the file ``path`` to ``f``, a block at a
    time; the bytes copied."""
    path, offset, length = where
    left = length
    with open(path, "rb") as src:
        src.seek(offset)
        while left:
            block = src.read(min(COPY_BLOCK, left))
            if not block:
                raise OSError(f"{path} ends {left} bytes before the tensor at offset {offset}")
            f.write(block)
            left -= len(block)
    return length
