"""Undo what torch's optimizing exporter folded into a file's parameters.

``torch.onnx.export`` (dynamo, ``optimize=True``: torch's default) runs onnxscript's
optimizer, which rewrites the parameters a file holds: equal parameters (fresh
LayerNorm scales, zero biases) are stored once and read by every layer, a Linear's
weight is stored transposed under a made-up name (``val_12``), a class token is stored
already expanded to the batch, zero biases are dropped. The forward is unchanged, but
training such a file trains another network than PyTorch's: tied LayerNorms, one copy of
a class token per sample, no biases.

The exporter leaves enough behind to undo it: every value of a parameter is marked with
its kind and its name in the exported program (:data:`ORIGINAL_NAME`, ``p_<path>``),
every node names the program node it came from (:data:`FX_NODE`, which lists the
parameters it read) and its module (:data:`NAME_SCOPES`), and every folded value lists
what it was folded from (:data:`FOLDED_FROM`). :func:`unfold` uses them to give each
layer its own parameter again (named as in PyTorch), to store transposed weights as
PyTorch's weight behind a Transpose node, to store an expanded parameter once behind an
Expand node, and to restore dropped zero biases. Each value it made is marked with
:data:`UNFOLDED`: what it did (``untied``, ``bias restored``, ``transposed``, ``expanded``,
``entries``), a colon, and from what. Values it cannot explain stay as they are:
:func:`dfdl.ir.onnx_io.exporter_folded` lists them and ``dfdl.train`` warns.

Example:
    >>> model = unfold(onnx.load("vit-default.onnx"))  # doctest: +SKIP
    >>> unfolded(model)["class_token"]  # doctest: +SKIP
    'expanded: to (8, 1, 32), was expand'
"""

from __future__ import annotations

import ast
import copy
import re

import numpy as np
import onnx
from onnx import helper, numpy_helper

#: metadata key of a value's kind (PARAMETER, BUFFER, USER_INPUT) in torch's exports
TORCH_INPUT_KIND = "pkg.torch.export.graph_signature.InputSpec.kind"
#: metadata key of a parameter's name in the exported program (``p_encoder_ln_weight``)
ORIGINAL_NAME = "pkg.torch.onnx.original_node_name"
#: metadata key of a node's program node, as text (its arguments name the parameters)
FX_NODE = "pkg.torch.onnx.fx_node"
#: metadata key of a node's module path, outermost first, the node's own name last
NAME_SCOPES = "pkg.torch.onnx.name_scopes"
#: metadata key of a folded value: the names of the values it was computed from
FOLDED_FROM = "pkg.onnxscript.optimizer.folded_from"
#: metadata key of a node onnxscript's rewriter made, naming the rule
RULE_NAME = "pkg.onnxscript.rewriter.rule_name"
#: metadata key of a value :func:`unfold` made: what it did, and from what
UNFOLDED = "pkg.dfdl.unfolded"

_FLOAT_TYPES = (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16)

#: aten ops whose program nodes appear in :data:`FOLDED_FROM` lists (a program node is
#: named after its op, ``arange_2``); other names there are the module's parameters and
#: buffers (``class_token``, ``embeddings.position_ids``)
_ATEN_NAMES = frozenset(
    """abs add alias all any arange argmax argmin baddbmm bitwise_and bitwise_not
    bitwise_or bitwise_xor bmm cat ceil chunk clamp clamp_max clamp_min clone contiguous
    convert_element_type copy cos cumprod cumsum detach diagonal div embedding empty eq
    exp expand expand_as fill flatten flip floor floor_divide fmod full full_like gather
    ge gelu gt index index_select le lift_fresh_copy linear log log_softmax
    logical_and logical_not logical_or lt masked_fill matmul max maximum mean meshgrid
    min minimum mm mul narrow ne neg new_full new_ones new_zeros ones ones_like permute
    pow relu remainder repeat reshape roll round rsqrt rsub scalar_tensor select sigmoid
    sign sin slice softmax split sqrt squeeze stack sub sum t tanh tile to transpose
    tril triu type_as unsqueeze view where zeros zeros_like""".split()
)
#: program nodes that broadcast a value (a parameter expanded to the batch)
_BROADCASTS = frozenset({"expand", "expand_as", "repeat", "tile"})


def is_state_name(name: str) -> bool:
    """Whether a :data:`FOLDED_FROM` name is a parameter or buffer of the module, not a
    program node or an onnxscript temporary (``val_12``).

    Example:
        >>> [is_state_name(n) for n in ("class_token", "arange_2", "val_7", "ln.weight")]
        [True, False, False, True]
    """
    return "." in name or (
        re.fullmatch(r"val_\d+", name) is None and _op_stem(name) not in _ATEN_NAMES
    )


def _op_stem(name: str) -> str:
    return re.sub(r"(_default)?(_\d+)?$", "", name)


def folded_from(meta: dict[str, str]) -> list[str] | None:
    """The :data:`FOLDED_FROM` names of a value's metadata, or None."""
    text = meta.get(FOLDED_FROM)
    if text is None:
        return None
    try:
        names = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return None
    return [str(n) for n in names] if isinstance(names, list | tuple) else None


def value_metadata(g: onnx.GraphProto) -> dict[str, dict[str, str]]:
    """Each graph input's and value_info's metadata props, by value name."""
    return {
        vi.name: {p.key: p.value for p in vi.metadata_props}
        for vi in (*g.input, *g.value_info)
        if vi.metadata_props
    }


def unfolded(model: onnx.ModelProto) -> dict[str, str]:
    """What :func:`unfold` did, by the name of each value it made.

    Example:
        >>> unfolded(onnx.ModelProto())
        {}
    """
    return {k: m[UNFOLDED] for k, m in value_metadata(model.graph).items() if UNFOLDED in m}


def unfold(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of a torch export whose parameters are PyTorch's again (module docstring);
    ``model`` itself when it has nothing to undo (no torch marks, nothing folded).

    What is undone, each only where the metadata says so and the values agree:

    * a parameter read by layers whose program node names another, absent parameter of
      that layer's module (equal parameters merged): the layer gets its own copy, named
      as in PyTorch (``encoder.layers.1.ln_2.weight``);
    * a zero bias a rewrite rule dropped from a Conv or Gemm (``RemoveOptionalBias*``):
      restored as zeros under PyTorch's name;
    * a weight stored transposed for a Linear's MatMul (folded from that one parameter):
      stored as PyTorch's weight, read through a Transpose node (which ties it again to
      the parameter's other readers, such as GPT-2's embedding);
    * a parameter folded with an ``expand`` and equal along leading axes (a class token
      expanded to the batch, token-type embeddings to the batch and sequence): stored
      once, read through an Expand node, so its gradient sums over the copies;
    * a folded value of distinct entries of parameters (a slice of position
      embeddings): marked as training the way those entries do.

    Tensors left in their external data file are not read, and stay as they are.

    Example:
        >>> m = unfold(onnx.load("gpt2-default.onnx"))  # doctest: +SKIP
    """
    meta = value_metadata(model.graph)
    if not any(TORCH_INPUT_KIND in m for m in meta.values()):
        return model
    out = copy.deepcopy(model)
    changed = _Unfolder(out.graph).run()
    return out if changed else model


class _Unfolder:
    """The rules of :func:`unfold`, applied in order to one graph (modified in place)."""

    def __init__(self, g: onnx.GraphProto):
        self.g = g
        self.meta = value_metadata(g)
        self.inits = {t.name: t for t in g.initializer}
        self.names = set(self.inits) | {o for n in g.node for o in n.output}
        self.names |= {vi.name for vi in g.input}
        self.present = {m[ORIGINAL_NAME].lower() for m in self.meta.values() if ORIGINAL_NAME in m}
        self.value_info = {vi.name: vi for vi in g.value_info}
        self.made: dict[str, str] = {}
        self.prepend: list[onnx.NodeProto] = []

    def run(self) -> bool:
        self._untie()
        self._restore_biases()
        self._untranspose()
        self._unexpand()
        self._mark_distinct()
        if self.prepend:
            nodes = [*self.prepend, *self.g.node]
            del self.g.node[:]
            self.g.node.extend(nodes)
        return bool(self.made)

    # ------------------------------------------------------------------ helpers

    def _add(
        self, name: str, array: np.ndarray, how: str, original: str | None, source: str = ""
    ) -> None:
        """A new initializer, marked (:meth:`_mark`)."""
        self.g.initializer.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        self.inits[name] = self.g.initializer[-1]
        self.names.add(name)
        self._mark(name, array, how, original, source)

    def _mark(
        self, name: str, array: np.ndarray, how: str, original: str | None, source: str = ""
    ) -> None:
        """Mark a value :func:`unfold` made (a parameter: with its program name), keeping
        the :data:`FOLDED_FROM` list of the folded value ``source`` it replaces."""
        props = {UNFOLDED: how}
        if source and FOLDED_FROM in self.meta.get(source, {}):
            props[FOLDED_FROM] = self.meta[source][FOLDED_FROM]
        if original is not None:
            props |= {TORCH_INPUT_KIND: "PARAMETER", ORIGINAL_NAME: original}
            self.present.add(original)
        vi = self.value_info.get(name)
        if vi is None:
            elem = helper.np_dtype_to_tensor_dtype(array.dtype)
            self.g.value_info.append(helper.make_tensor_value_info(name, elem, list(array.shape)))
            vi = self.value_info[name] = self.g.value_info[-1]
        for k, v in props.items():
            if k not in {p.key for p in vi.metadata_props}:
                vi.metadata_props.add(key=k, value=v)
        self.meta[name] = {**self.meta.get(name, {}), **props}
        self.made[name] = how

    def _in_memory(self, name: str) -> np.ndarray | None:
        t = self.inits.get(name)
        if t is None or t.data_location == onnx.TensorProto.EXTERNAL:
            return None
        return numpy_helper.to_array(t)

    def _remove_initializer(self, name: str) -> None:
        for i, t in enumerate(self.g.initializer):
            if t.name == name:
                del self.g.initializer[i]  # in place: the others' data is not copied
                break
        del self.inits[name]

    def _folded(self) -> list[tuple[str, list[str]]]:
        """Unmarked float initializers with a :data:`FOLDED_FROM` list that names a
        parameter or buffer, with that list."""
        out = []
        for name, t in list(self.inits.items()):
            m = self.meta.get(name, {})
            if TORCH_INPUT_KIND in m or UNFOLDED in m or t.data_type not in _FLOAT_TYPES:
                continue
            sources = folded_from(m)
            if sources and any(is_state_name(s) for s in sources):
                out.append((name, sources))
        return out

    # ------------------------------------------------------------------ rules

    def _untie(self) -> None:
        for node in self.g.node:
            wanted = _placeholders(node)
            if not wanted:
                continue
            scope = _module(node)
            for i, name in enumerate(node.input):
                m = self.meta.get(name, {})
                own = m.get(ORIGINAL_NAME, "").lower()
                if m.get(TORCH_INPUT_KIND) not in ("PARAMETER", "BUFFER") or not own:
                    continue
                if own in wanted:
                    continue
                attr = name.rsplit(".", 1)[-1]
                dotted = f"{scope}.{attr}" if scope else attr
                program = _program_name(dotted, own[:2])
                if program not in wanted or (program in self.present and dotted not in self.made):
                    continue
                if dotted not in self.made:
                    value = self._in_memory(name)
                    if value is None or dotted in self.names:
                        continue
                    self._add(dotted, value.copy(), f"untied: from {name}", program)
                node.input[i] = dotted

    def _restore_biases(self) -> None:
        for node in self.g.node:
            rule = _node_meta(node).get(RULE_NAME, "")
            if not rule.startswith("RemoveOptionalBias") or node.op_type not in ("Conv", "Gemm"):
                continue
            if len(node.input) != 2:
                continue
            # named after the weight's module (F.linear(x, self.out_proj.weight) runs in
            # the attention module's forward), else the node's module
            scope = _module(node)
            owners = [node.input[1].rpartition(".")[0], scope]
            wanted = _placeholders(node)
            named = [f"{o}.bias" if o else "bias" for o in owners]
            named = [d for d in named if _program_name(d, "p_") in wanted]
            if not named or _program_name(named[0], "p_") in self.present:
                continue
            dotted, program = named[0], _program_name(named[0], "p_")
            weight = self._in_memory(node.input[1])
            if weight is None or weight.ndim < 2 or dotted in self.names:
                continue
            trans_b = any(a.name == "transB" and a.i for a in node.attribute)
            width = weight.shape[0] if node.op_type == "Conv" or trans_b else weight.shape[1]
            self._add(
                dotted,
                np.zeros(width, weight.dtype),
                f"bias restored: zeros, of {node.name}",
                program,
            )
            node.input.append(dotted)

    def _untranspose(self) -> None:
        readers_of: dict[str, list[onnx.NodeProto]] = {}
        for node in self.g.node:
            for i in set(node.input):
                readers_of.setdefault(i, []).append(node)
        for name, sources in self._folded():
            if len(sources) != 1 or not is_state_name(sources[0]):
                continue
            source = sources[0]
            program = _program_name(source, "p_")
            readers = readers_of.get(name, [])
            linear = all(
                "aten.linear" in _node_meta(n).get(FX_NODE, "") and program in _placeholders(n)
                for n in readers
            )
            value = self._in_memory(name)
            if not readers or not linear or value is None or value.ndim != 2:
                continue
            if source in self.inits:  # a tie the fold broke (GPT-2's lm_head): restore it
                kept = self._in_memory(source)
                if kept is None or not np.array_equal(kept.T, value):
                    continue
                self._mark(name, value, f"transposed: reads {source}", None)
            elif source in self.names:
                continue
            else:
                self._add(
                    source, value.T, f"transposed: stored as PyTorch's, was {name}", program, name
                )
            self._remove_initializer(name)
            self.prepend.append(
                helper.make_node(
                    "Transpose", [source], [name], name=f"{name}__unfolded", perm=[1, 0]
                )
            )

    def _unexpand(self) -> None:
        for name, sources in self._folded():
            if not ({_op_stem(s) for s in [name, *sources]} & _BROADCASTS):
                continue
            value = self._in_memory(name)
            if value is None or value.ndim < 2:
                continue
            axes = [
                k
                for k in range(value.ndim - 1)
                if value.shape[k] > 1 and np.array_equal(value, _first(value, k, value.shape))
            ]
            if not axes:
                continue
            once = value[
                tuple(slice(0, 1) if k in axes else slice(None) for k in range(value.ndim))
            ]
            state = [s for s in sources if is_state_name(s)]
            single = len(state) == 1 and state[0] not in self.names
            stored = state[0] if single else f"{name}__once"
            if stored in self.names:
                continue
            how = f"expanded: to {tuple(value.shape)}, was {name}"
            self._add(stored, once, how, _program_name(stored, "p_") if single else None, name)
            shape = f"{name}__shape"
            self.g.initializer.append(
                numpy_helper.from_array(np.asarray(value.shape, np.int64), shape)
            )
            self._remove_initializer(name)
            self.inits[shape] = self.g.initializer[-1]
            self.names.add(shape)
            self.prepend.append(
                helper.make_node("Expand", [stored, shape], [name], name=f"{name}__unfolded")
            )

    def _mark_distinct(self) -> None:
        for name, sources in self._folded():
            value = self._in_memory(name)
            if value is None or value.size < 2 or np.unique(value).size != value.size:
                continue
            state = ", ".join(s for s in sources if is_state_name(s))
            self._mark(name, value, f"entries: distinct, of {state}", None, name)


def _first(value: np.ndarray, axis: int, shape: tuple[int, ...]) -> np.ndarray:
    """``value``'s first slice along ``axis``, broadcast back to ``shape``."""
    return np.broadcast_to(np.take(value, [0], axis=axis), shape)


def _node_meta(node: onnx.NodeProto) -> dict[str, str]:
    return {p.key: p.value for p in node.metadata_props}


def _placeholders(node: onnx.NodeProto) -> set[str]:
    """The parameters and buffers (``p_...``, ``b_...``) the node's program node read."""
    return {p.lower() for p in re.findall(r"%([pb]_\w+)", _node_meta(node).get(FX_NODE, ""))}


def _module(node: onnx.NodeProto) -> str:
    """The path of the module whose forward made the node (``""``: the top module)."""
    try:
        scopes = ast.literal_eval(_node_meta(node).get(NAME_SCOPES, "[]"))
    except (ValueError, SyntaxError):
        return ""
    return str(scopes[-2]) if isinstance(scopes, list) and len(scopes) >= 2 else ""


def _program_name(dotted: str, prefix: str) -> str:
    """A parameter's (``p_``) or buffer's (``b_``) name in the exported program."""
    return prefix + re.sub(r"\W", "_", dotted).lower()
