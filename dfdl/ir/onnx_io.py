"""ONNX in and out: load (path, bytes or ModelProto), check, convert to the IR and back.

Loading is strict and safe: a truncated or invalid file, a failing ``onnx.checker``, an
opset newer than the installed onnx knows, an unsupported dtype, or an external-data
location that is absolute, contains ``..`` or leaves the model's folder (also through a
symlink) is a :class:`dfdl.errors.ModelError` or :class:`~dfdl.errors.UnsupportedOpError`.
A model written for a default-domain opset older than :data:`MIN_OPSET` is converted to
it with ``onnx.version_converter`` (:func:`convert_opset`); the converted model records
the opset it was written for (:func:`converted_from`).

Example:
    >>> import dfdl.models
    >>> g = to_ir(load_model(dfdl.models.mlp((4, 3))))
    >>> [n.op_type for n in g.nodes]
    ['Gemm']
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import helper, numpy_helper, version_converter

from dfdl.errors import ModelError, UnsupportedOpError
from dfdl.ir.canonical import canonicalize_node, complete_conversion, untie_running_statistics
from dfdl.ir.graph import Graph, Node
from dfdl.ir.torch_folds import (
    TORCH_INPUT_KIND,
    UNFOLDED,
    folded_from,
    is_state_name,
    value_metadata,
)
from dfdl.ops.registry import ONNX_DOMAINS

#: default-domain opsets dfdl reads (13 is the oldest whose op semantics it implements);
#: older models are converted to it at load (:func:`convert_opset`)
MIN_OPSET = 13
MAX_OPSET = onnx.defs.onnx_opset_version()
#: ``metadata_props`` key of a converted model: the default-domain opset it was written for
CONVERTED_FROM = "dfdl.converted_from_opset"
#: tensor bytes past which a model is not serialized whole: protobuf cannot encode a
#: message of 2 GiB (``ByteSize`` raises), and the graph needs room beside the tensors.
#: Such a model skips the in-memory ``onnx.checker`` and is saved with external data
#: (:func:`dfdl.runtime.output.save_model`).
LARGE_MODEL_BYTES = int(1.8 * 2**30)

#: numpy-native element types dfdl tiles carry
_SUPPORTED_ELEM_TYPES = {
    onnx.TensorProto.FLOAT,
    onnx.TensorProto.DOUBLE,
    onnx.TensorProto.FLOAT16,
    onnx.TensorProto.INT8,
    onnx.TensorProto.INT16,
    onnx.TensorProto.INT32,
    onnx.TensorProto.INT64,
    onnx.TensorProto.UINT8,
    onnx.TensorProto.UINT16,
    onnx.TensorProto.UINT32,
    onnx.TensorProto.UINT64,
    onnx.TensorProto.BOOL,
}

ModelLike = str | os.PathLike | bytes | onnx.ModelProto


def np_dtype(elem_type: int, what: str) -> np.dtype:
    """numpy dtype for an ONNX element type, or UnsupportedOpError naming ``what``."""
    if elem_type not in _SUPPORTED_ELEM_TYPES:
        known = elem_type in onnx.TensorProto.DataType.values()
        name = onnx.TensorProto.DataType.Name(elem_type) if known else f"{elem_type} (unknown)"
        name = name if elem_type else "UNDEFINED"
        raise UnsupportedOpError(
            f"{what} has element type {name}; dfdl supports float16/32/64, "
            "(u)int8/16/32/64 and bool. Convert the model (e.g. export in float32)."
        )
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))


def _check_external_locations(model: onnx.ModelProto, base: Path) -> None:
    """Refuse external-data locations that could read outside the model's folder.

    Accepted locations are rewritten to the resolved file, relative to ``base.resolve()``.
    """
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    root = base.resolve()
    for t in _get_all_tensors(model):
        if not uses_external_data(t):
            continue
        info = {e.key: e.value for e in t.external_data}
        loc = info.get("location", "")
        bad = ""
        if not loc:
            bad = "has no location"
        elif os.path.isabs(loc) or loc.startswith(("/", "\\")):
            bad = "is an absolute path"
        elif ".." in Path(loc).parts or ".." in loc.replace("\\", "/").split("/"):
            bad = "contains '..'"
        else:
            target = (root / loc).resolve()
            if root != target and root not in target.parents:
                bad = f"resolves to {target}, outside the model's folder {root}"
            elif not target.is_file():
                bad = f"points to {target}, which does not exist"
            else:
                # read the resolved file: onnx's loader refuses every symlink, even one
                # that stays inside the folder
                for e in t.external_data:
                    if e.key == "location":
                        e.value = target.relative_to(root).as_posix()
        if bad:
            raise ModelError(
                f"initializer {t.name!r}: external data location {loc!r} {bad}. "
                "External data must be a file inside the model's folder; refusing to read it."
            )


def load_model(
    model: ModelLike, *, convert: bool = True, map_external: bool = False
) -> onnx.ModelProto:
    """Read and check a model from a path, bytes or a ModelProto.

    Args:
        model: path to an ``.onnx`` file (external data beside it is read), the file's
            bytes, or an ``onnx.ModelProto``.
        convert: convert a model older than opset :data:`MIN_OPSET` to it
            (:func:`convert_opset`); with False, return it as written.
        map_external: leave a file's external data unread: its tensors keep their
            ``external_data`` entries, with the location made the file's absolute path
            (:func:`mapped_location`), and :func:`to_ir` maps them read-only.

    Returns:
        The checked ModelProto with external data loaded or mapped (a converted copy,
        which :func:`converted_from` recognizes, when it was converted).

    Raises:
        ModelError: unreadable, truncated or invalid model, unsafe external data, or an
            old opset that ``onnx.version_converter`` cannot convert.

    Example:
        >>> m = load_model("model.onnx")  # doctest: +SKIP
        >>> converted_from(m)  # doctest: +SKIP
        9
    """
    if isinstance(model, onnx.ModelProto):
        proto = model
    elif isinstance(model, bytes | bytearray):
        proto = onnx.ModelProto()
        try:
            proto.ParseFromString(bytes(model))
        except DecodeError as e:
            raise ModelError(f"cannot parse the model bytes as ONNX ({e}); truncated?") from e
        if not proto.graph.node and not proto.graph.output:
            raise ModelError("the bytes given do not contain an ONNX model (empty graph)")
    elif isinstance(model, str | os.PathLike):
        path = Path(model).absolute()
        if not path.is_file():
            raise ModelError(f"model file {path} does not exist")
        try:
            proto = onnx.load(str(path), load_external_data=False)
        except (DecodeError, ValueError, OSError) as e:
            raise ModelError(f"cannot read {path} as ONNX ({e}); is it truncated?") from e
        if not proto.graph.node and not proto.graph.output:
            raise ModelError(f"{path} does not contain an ONNX model (empty graph)")
        _check_external_locations(proto, path.parent)
        from onnx.external_data_helper import load_external_data_for_model

        if map_external:
            folder = path.parent.resolve()
        else:
            try:
                load_external_data_for_model(proto, str(path.parent.resolve()))
            except Exception as e:  # onnx raises several types here
                raise ModelError(f"cannot load external data of {path}: {e}") from e
    else:
        raise ModelError(
            f"model must be a path, bytes or onnx.ModelProto, not {type(model).__name__}"
        )
    try:
        if map_external and isinstance(model, str | os.PathLike):
            # the file's checker finds its external data beside it, without loading it
            onnx.checker.check_model(str(path))
        elif tensor_bytes(proto) <= LARGE_MODEL_BYTES:
            onnx.checker.check_model(proto)
    except onnx.checker.ValidationError as e:
        raise ModelError(f"the model fails onnx.checker: {str(e).strip()}") from e
    proto = convert_opset(proto) if convert else proto
    if map_external and isinstance(model, str | os.PathLike):
        _map_locations(proto, folder)
    return proto


def _map_locations(model: onnx.ModelProto, folder: Path) -> None:
    """Make the (checked, relative) external locations of ``model`` absolute paths."""
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    for t in _get_all_tensors(model):
        if uses_external_data(t):
            for e in t.external_data:
                if e.key == "location":
                    e.value = str(folder / e.value)
            where = mapped_location(t)
            if where is not None and not os.access(where[0], os.R_OK):
                raise ModelError(f"initializer {t.name!r}: cannot read {where[0]}")


def mapped_location(t: onnx.TensorProto) -> tuple[str, int, int] | None:
    """``(path, offset, length)`` of a tensor whose external data :func:`load_model`
    left in its file (an absolute location), else None.

    Example:
        >>> mapped_location(numpy_helper.from_array(np.zeros(2, np.float32))) is None
        True
    """
    if t.data_location != onnx.TensorProto.EXTERNAL:
        return None
    info = {e.key: e.value for e in t.external_data}
    loc = info.get("location", "")
    if not os.path.isabs(loc):
        return None
    offset = int(info.get("offset", 0))
    length = int(info["length"]) if "length" in info else raw_nbytes(t)
    return loc, offset, length


def tensor_array(t: onnx.TensorProto) -> np.ndarray:
    """The value of an initializer: a read-only memory map of its file for external data
    that :func:`load_model` left unread, else the array it holds.

    Example:
        >>> tensor_array(numpy_helper.from_array(np.ones(2, np.float32)))
        array([1., 1.], dtype=float32)
    """
    where = mapped_location(t)
    if where is None:
        return numpy_helper.to_array(t)
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)).newbyteorder("<")
    shape = tuple(int(d) for d in t.dims)
    path, offset, length = where
    if length != math.prod(shape) * dtype.itemsize:
        raise ModelError(
            f"initializer {t.name!r}: its external data holds {length} bytes, not the "
            f"{math.prod(shape) * dtype.itemsize} of a {dtype} tensor of shape {shape}"
        )
    if length == 0:
        return np.zeros(shape, dtype)
    if os.path.getsize(path) < offset + length:
        raise ModelError(
            f"initializer {t.name!r}: {path} ends before the tensor's {length} bytes at "
            f"offset {offset}; is it truncated?"
        )
    return np.memmap(path, dtype, "r", offset, shape)


def file_tensor_bytes(path: str | os.PathLike) -> int:
    """Bytes of the initializers of the model file at ``path``, its external data
    included, read from the file's tensor headers (no data is read).

    Raises:
        ModelError: the file cannot be read as ONNX.

    Example:
        >>> file_tensor_bytes("model.onnx")  # doctest: +SKIP
        4294967296
    """
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except (DecodeError, ValueError, OSError) as e:
        raise ModelError(f"cannot read {path} as ONNX ({e}); is it truncated?") from e
    total = 0
    for t in proto.graph.initializer:
        info = {e.key: e.value for e in t.external_data}
        external = t.data_location == onnx.TensorProto.EXTERNAL
        if external and "length" in info:
            total += int(info["length"])
        elif external or t.HasField("raw_data"):
            total += raw_nbytes(t)
        else:  # typed fields (float_data, ...)
            total += t.ByteSize()
    return total


def tensor_bytes(model: onnx.ModelProto) -> int:
    """Bytes of tensor data a model holds (initializers and tensor attributes, subgraphs
    included; external data not loaded counts 0), counted without serializing or
    copying them: ``ModelProto.ByteSize`` encodes the whole model, and fails past 2 GiB.

    Example:
        >>> import dfdl.models
        >>> tensor_bytes(dfdl.models.mlp((4, 3)))
        60
    """
    from onnx.external_data_helper import _get_all_tensors

    total = 0
    for t in _get_all_tensors(model):
        if t.data_location == onnx.TensorProto.EXTERNAL:
            continue
        total += raw_nbytes(t) if t.HasField("raw_data") else t.ByteSize()
    return total


def raw_nbytes(t: onnx.TensorProto) -> int:
    """Bytes of a tensor's ``raw_data``, from its dims and element type where it has a
    fixed size (reading the field copies it).

    Example:
        >>> raw_nbytes(numpy_helper.from_array(np.zeros((2, 3), np.float32)))
        24
    """
    try:
        itemsize = helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    except (KeyError, ValueError, TypeError):  # an undefined or unknown element type
        return len(t.raw_data)
    return int(np.prod(t.dims, dtype=np.int64)) * itemsize


def _default_opset(model: onnx.ModelProto) -> int | None:
    opsets = {o.domain: o.version for o in model.opset_import}
    return opsets.get("", opsets.get("ai.onnx"))


def converted_from(model: onnx.ModelProto) -> int | None:
    """The default-domain opset a model converted by :func:`convert_opset` was written
    for, or None when it was not converted.

    Example:
        >>> converted_from(load_model("alexnet-opset9.onnx"))  # doctest: +SKIP
        9
    """
    for p in model.metadata_props:
        if p.key == CONVERTED_FROM:
            return int(p.value)
    return None


def convert_opset(model: onnx.ModelProto) -> onnx.ModelProto:
    """A model older than default-domain opset :data:`MIN_OPSET`, converted to it with
    ``onnx.version_converter``; any other model unchanged.

    The converted copy records the opset it was written for in its ``metadata_props``
    (:func:`converted_from`) and is checked again; its IR version is raised to the
    oldest one opset :data:`MIN_OPSET` allows (the converter keeps the file's, and
    IR versions below 4 forbid the initializers it adds), and what the converter leaves
    in an older form is rewritten (:func:`dfdl.ir.canonical.complete_conversion`).

    Raises:
        ModelError: the converter has no adapter for an op of the model, or fails
            otherwise; the message names the op and its nodes.

    Example:
        >>> old = onnx.load("squeezenet-opset9.onnx")  # doctest: +SKIP
        >>> [o.version for o in convert_opset(old).opset_import]  # doctest: +SKIP
        [13]
    """
    version = _default_opset(model)
    if version is None or version >= MIN_OPSET:
        return model
    try:
        out = version_converter.convert_version(model, MIN_OPSET)
    except Exception as e:  # the converter raises RuntimeError, ValidationError, InferenceError
        raise ModelError(_conversion_failure(model, version, e)) from e
    out.ir_version = max(
        out.ir_version, helper.find_min_ir_version_for(list(out.opset_import), True)
    )
    complete_conversion(out, version)
    try:
        if tensor_bytes(out) <= LARGE_MODEL_BYTES:
            onnx.checker.check_model(out)
    except onnx.checker.ValidationError as e:
        raise ModelError(
            f"onnx.version_converter converted the model from opset {version} to "
            f"{MIN_OPSET}, but the result fails onnx.checker: {str(e).strip()}. Re-export "
            f"the model at opset {MIN_OPSET} or newer (torch.onnx.export(..., "
            "opset_version=18))."
        ) from e
    kept = [p for p in out.metadata_props if p.key != CONVERTED_FROM]
    del out.metadata_props[:]
    out.metadata_props.extend(kept)
    out.metadata_props.add(key=CONVERTED_FROM, value=str(version))
    return out


def _conversion_failure(model: onnx.ModelProto, version: int, e: Exception) -> str:
    """What failed in ``onnx.version_converter`` (op, nodes, why) and what to do."""
    # the converter's message is a C++ assertion: drop the source location before it
    detail = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    detail = re.sub(r"^.*?Assertion `.*?` failed: ", "", detail)
    nodes: dict[str, list[str]] = {}
    for i, n in enumerate(model.graph.node):
        if n.domain in ONNX_DOMAINS:
            nodes.setdefault(n.op_type, []).append(n.name or f"{n.op_type}_{i}")
    m = re.search(r"No Adapter (?:From|To) Version \$(\d+) for (\w+)", detail)
    ops = [m.group(2)] if m else [op for op in nodes if re.search(rf"\b{op}\b", detail)]
    named = "; ".join(f"{op} ({node_list(nodes.get(op, []))})" for op in ops)
    if m:
        what = f"it has no adapter that takes {named} past opset {m.group(1)}"
    elif ops:
        what = f"it failed at {named}: {detail}"
    else:
        what = f"it failed: {detail}"
    fix = f", or rewrite the {'/'.join(ops)} nodes in their opset-{MIN_OPSET} form" if ops else ""
    return (
        f"cannot convert the model from default-domain opset {version} to {MIN_OPSET} (the "
        f"oldest dfdl reads) with onnx.version_converter: {what}. Re-export the model at "
        f"opset {MIN_OPSET} or newer (torch.onnx.export(..., opset_version=18)){fix}."
    )


def node_list(names: list[str], shown: int = 3) -> str:
    """Nodes named for a message: the first ``shown`` and a count of the rest.

    Example:
        >>> node_list(["a"]), node_list(["a", "b", "c", "d", "e"])
        ("node 'a'", "5 nodes: 'a', 'b', 'c' and 2 more")
    """
    if not names:
        return "no node"
    listed = ", ".join(repr(n) for n in names[:shown])
    if len(names) == 1:
        return f"node {listed}"
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return f"{len(names)} nodes: {listed}{more}"


def _attr_value(a: onnx.AttributeProto) -> Any:
    if a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
        # kept as protos: no registry op takes a subgraph, so binding lists the node's
        # op (If/Loop/Scan) among the unsupported ones
        return a.g if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)
    if a.type == onnx.AttributeProto.TENSOR:
        return numpy_helper.to_array(a.t)
    v = helper.get_attribute_value(a)
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, list):
        return [x.decode() if isinstance(x, bytes) else x for x in v]
    return v


def _default_attrs(op_type: str, opset: int, domain: str) -> dict[str, Any]:
    try:
        schema = onnx.defs.get_schema(op_type, opset, domain)
    except onnx.defs.SchemaError:
        return {}
    out = {}
    for name, a in schema.attributes.items():
        if a.default_value.type != onnx.AttributeProto.UNDEFINED:
            out[name] = _attr_value(a.default_value)
    return out


def _declared(vi: onnx.ValueInfoProto) -> tuple[tuple, np.dtype]:
    tt = vi.type.tensor_type
    if not vi.type.HasField("tensor_type"):
        raise UnsupportedOpError(
            f"graph input {vi.name!r} is not a tensor (sequence/map/optional inputs are "
            "not supported)"
        )
    dtype = np_dtype(tt.elem_type, f"graph input {vi.name!r}")
    if not tt.HasField("shape"):
        return None, dtype
    dims = []
    for d in tt.shape.dim:
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        elif d.HasField("dim_param"):
            dims.append(d.dim_param)
        else:
            dims.append(None)
    return tuple(dims), dtype


def model_opset(model: onnx.ModelProto) -> int:
    """The default-domain opset the model imports, checked against the range dfdl reads
    (:data:`MIN_OPSET` after :func:`convert_opset`, to the newest the installed onnx
    knows)."""
    version = _default_opset(model)
    if version is None:
        raise ModelError("the model imports no default-domain (ai.onnx) opset")
    if version > MAX_OPSET:
        raise UnsupportedOpError(
            f"the model uses default-domain opset {version}, newer than the newest the "
            f"installed onnx {onnx.__version__} knows ({MAX_OPSET}); dfdl reads opsets up to "
            f"{MAX_OPSET}. Upgrade onnx, or re-export the model at opset {MAX_OPSET} or "
            "older (torch.onnx.export(..., opset_version=18)).",
            opset=version,
        )
    if version < MIN_OPSET:
        raise UnsupportedOpError(
            f"the model uses default-domain opset {version}; dfdl reads opsets "
            f"{MIN_OPSET} to {MAX_OPSET}: convert it first (convert_opset, or load it with "
            "load_model, which does).",
            opset=version,
        )
    return version


def to_ir(model: onnx.ModelProto) -> Graph:
    """Convert a checked ModelProto to dfdl's IR (canonical, latest-opset form).

    A model older than opset :data:`MIN_OPSET` is converted first (:func:`convert_opset`;
    :func:`load_model` has already done so). Nodes get unique names (``f"{op_type}_{i}"``
    where the file has none), attributes get their schema defaults, and older-opset
    forms are rewritten to the latest one (for example ReduceMean's ``axes`` attribute
    becomes its second input), and BatchNorm running statistics an exporter aliased to
    other initializers get their own (:func:`dfdl.ir.canonical.untie_running_statistics`).
    Nodes of ops dfdl lacks (other domains, control flow)
    are kept: :func:`dfdl.ir.bind.bind` lists them all in one UnsupportedOpError.
    """
    model = convert_opset(model)
    opset = model_opset(model)
    domains = {o.domain: o.version for o in model.opset_import}
    g = model.graph
    graph = Graph(
        name=g.name or "graph",
        opset=opset,
        producer=model.producer_name,
        constants=frozenset(exporter_constants(model)),
    )
    for t in g.initializer:
        dtype = np_dtype(t.data_type, f"initializer {t.name!r}")
        graph.initializers[t.name] = tensor_array(t).astype(dtype, copy=False)
    for t in g.sparse_initializer:
        raise UnsupportedOpError(f"sparse initializer {t.values.name!r} is not supported")
    for vi in g.input:
        if vi.name in graph.initializers:
            continue
        graph.inputs.append(vi.name)
        graph.declared[vi.name] = _declared(vi)
    graph.outputs = [o.name for o in g.output]
    for vi in g.output:
        # kept for export (from_ir): an unbound graph knows its outputs only from here
        if vi.name not in graph.declared and vi.type.tensor_type.elem_type in _SUPPORTED_ELEM_TYPES:
            graph.declared[vi.name] = _declared(vi)
    used = set()
    for i, n in enumerate(g.node):
        name = n.name or f"{n.op_type}_{i}"
        while name in used:
            name = f"{name}_{i}"
        used.add(name)
        domain = "" if n.domain in ONNX_DOMAINS else n.domain
        version = domains.get(n.domain, opset) if domain else opset
        attrs = _default_attrs(n.op_type, version, n.domain)
        attrs.update({a.name: _attr_value(a) for a in n.attribute})
        node = Node(name, n.op_type, list(n.input), list(n.output), attrs, domain)
        graph.nodes.extend(canonicalize_node(node, version, graph))
    untie_running_statistics(graph)
    return graph


def exporter_constants(model: onnx.ModelProto) -> list[str]:
    """Float initializers that torch's exporter lifted from constants, not parameters.

    torch's exporter marks the value of every parameter and buffer with
    :data:`TORCH_INPUT_KIND`; its optimizer (``optimize=True``, the default) also stores
    constants as initializers: a GELU's ``0.5`` and exponent ``3.0`` (whose gradient,
    ``x**3 * log(x)``, is NaN for negative ``x``), a causal mask of ``-3.4e38``, an
    attention mask of zeros. In a file that has the marks, an unmarked float initializer
    that is a scalar, holds a non-finite or ``+-finfo.max`` value, or was folded from
    program nodes alone (its ``folded_from`` list names no parameter or buffer,
    :func:`dfdl.ir.torch_folds.is_state_name`) is such a constant. Other unmarked tensors
    (a transposed weight, ``val_12``) stay trainable; files without the marks give ``[]``.

    Example:
        >>> exporter_constants(onnx.load("gpt2.onnx"))  # doctest: +SKIP
        ['val_7', 'val_154', 'val_198', 'val_160']
    """
    g = model.graph
    meta = value_metadata(g)
    marked = _torch_marked(meta)
    if not marked:
        return []
    out = []
    for t in g.initializer:
        if t.name in marked or t.data_type not in _FLOAT_ELEM_TYPES:
            continue
        sources = folded_from(meta[t.name]) if t.name in meta else None
        if sources is not None and not any(is_state_name(s) for s in sources):
            out.append(t.name)
            continue
        if mapped_location(t) is not None:  # a large tensor left in its file: not read here
            if raw_nbytes(t) <= np.dtype(np.float64).itemsize:
                out.append(t.name)
            continue
        a = numpy_helper.to_array(t)
        if a.size <= 1 or not np.all(np.abs(a) < np.finfo(a.dtype).max):
            out.append(t.name)
    return out


def exporter_folded(model: onnx.ModelProto) -> list[str]:
    """Float initializers that torch's optimizing exporter made from parameters.

    With ``optimize=True`` (the default) torch's exporter folds what it can compute
    ahead: a weight is stored transposed, a class token already expanded to the example's
    batch, each as a new, unmarked initializer. Training such a file trains those copies
    as parameters of their own: a different network than PyTorch's.
    :func:`dfdl.ir.torch_folds.unfold` undoes what it can explain and marks what it made;
    what is left, in a file with torch's parameter marks (:data:`TORCH_INPUT_KIND`), are
    the unmarked float initializers that are not :func:`exporter_constants` and carry a
    name the optimizer makes up; files without the marks give ``[]``.

    Example:
        >>> exporter_folded(onnx.load("vit-default.onnx"))  # doctest: +SKIP
        ['expand', 'val_14']
    """
    g = model.graph
    marked = _torch_marked(value_metadata(g))
    if not marked:
        return []
    constants = set(exporter_constants(model))
    names = {t.name for t in g.initializer}
    return [
        t.name
        for t in g.initializer
        if t.name not in marked
        and t.name not in constants
        and t.data_type in _FLOAT_ELEM_TYPES
        and _made_by_exporter(t.name, names)
    ]


def _made_by_exporter(name: str, initializers: set[str]) -> bool:
    """Whether an unmarked initializer's name is one torch's optimizer gives a value it
    made (``val_12``, ``expand``, ``embedding_1``): no module path. Unmarked module paths
    are the parameters themselves (``stem.0.weight``: the optimizer rewrote the Conv and
    dropped the mark) or a BatchNormalization folded into the convolution before it
    (``conv1.weight_bias``), which PyTorch's fused eval-mode module trains the same way."""
    return "." not in name


def _torch_marked(meta: dict[str, dict[str, str]]) -> set[str]:
    """Names of the values torch's exporter marked with :data:`TORCH_INPUT_KIND`, and
    those :func:`dfdl.ir.torch_folds.unfold` made (:data:`UNFOLDED`), from
    :func:`dfdl.ir.torch_folds.value_metadata`."""
    return {name for name, m in meta.items() if TORCH_INPUT_KIND in m or UNFOLDED in m}


_FLOAT_ELEM_TYPES = (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16)


def _value_info(name: str, shape, dtype) -> onnx.ValueInfoProto:
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    return helper.make_tensor_value_info(name, elem, None if shape is None else list(shape))


def _onnx_attr(v: Any) -> Any:
    if isinstance(v, np.ndarray):
        return numpy_helper.from_array(v)
    return v


def from_ir(graph: Graph, *, symbolic: bool = True) -> onnx.ModelProto:
    """Write the IR as an ONNX model (checked), keeping declared symbolic input dims.

    Args:
        graph: the IR graph.
        symbolic: keep the declared symbolic dimensions ("batch") on inputs; with
            False, write the bound static shapes.
    """
    nodes = [
        helper.make_node(
            n.op_type,
            n.inputs,
            n.outputs,
            name=n.name,
            domain=n.domain,
            **{k: _onnx_attr(v) for k, v in n.attrs.items() if not k.startswith("_")},
        )
        for n in graph.nodes
    ]
    inputs = []
    for name in graph.inputs:
        t = graph.types.get(name)
        dims, dtype = graph.declared.get(name, (None, None))
        if not symbolic and t is not None:
            dims = t.shape
        inputs.append(_value_info(name, dims, dtype if dtype is not None else t.dtype))
    outputs = []
    for name in graph.outputs:
        t = graph.types.get(name)
        dims, dtype = graph.declared.get(name, (None, None))
        if t is not None:
            if not symbolic:
                dims = t.shape
            elif dims is None or len(dims) != t.rank:
                dims = [None] * t.rank
            dtype = t.dtype
        if dtype is None:
            outputs.append(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
        else:
            outputs.append(_value_info(name, dims, dtype))
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in graph.initializers.items()]
    g = helper.make_graph(nodes, graph.name, inputs, outputs, inits)
    opsets = [helper.make_opsetid("", max(graph.opset, 21))]
    if any(n.domain == "dfdl" for n in graph.nodes):
        opsets.append(helper.make_opsetid("dfdl", 1))
    model = helper.make_model(g, opset_imports=opsets, producer_name="dfdl")
    model.ir_version = min(model.ir_version, 10)
    return model
