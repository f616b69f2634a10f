"""Model zoo: ONNX builders (pure ``onnx.helper``) with PyTorch twins in :mod:`.torch_twins`.

:data:`ZOO` maps a name to its builder (:func:`mlp`, :func:`resnet`, :func:`unet3d`,
:func:`transformer`); each returns a checked ``onnx.ModelProto`` whose weights a seed
fixes, with PyTorch's initial weight distributions and ``state_dict`` names.
:func:`example_inputs` gives random inputs of the right shapes for any of them. The
benchmarks, the tests and the documentation's examples train these models.

Example:
    >>> {name: arr.shape for name, arr in example_inputs("resnet").items()}
    {'x': (2, 3, 32, 32)}
"""

from __future__ import annotations

import inspect

import numpy as np

from dfdl.models.mlp import mlp
from dfdl.models.resnet import resnet
from dfdl.models.transformer import transformer
from dfdl.models.unet3d import unet3d

ZOO = {"mlp": mlp, "resnet": resnet, "unet3d": unet3d, "transformer": transformer}

__all__ = ["ZOO", "example_inputs", "mlp", "resnet", "transformer", "unet3d"]


def example_inputs(
    name: str, *, batch: int = 2, seed: int = 0, **model_kwargs
) -> dict[str, np.ndarray]:
    """Random inputs for ``ZOO[name](**model_kwargs)``, keyed by graph input name.

    Args:
        name: a key of :data:`ZOO`.
        batch: batch size.
        seed: seed of the input data (independent of the model's weight seed).
        **model_kwargs: the builder's arguments (defaults filled in); only shapes matter.

    Returns:
        ``{"x": float32 array}`` or, for the transformer, ``{"tokens": int64 array}``.
    """
    bound = inspect.signature(ZOO[name]).bind(**model_kwargs)
    bound.apply_defaults()
    kw = bound.arguments
    rng = np.random.default_rng(seed)
    if name == "transformer":
        return {"tokens": rng.integers(0, kw["vocab"], size=(batch, kw["seq"]), dtype=np.int64)}
    if name == "mlp":
        shape = (batch, kw["sizes"][0])
    elif name == "resnet":
        shape = (batch, kw["in_channels"], kw["image_size"], kw["image_size"])
    else:
        shape = (batch, kw["in_channels"], *[kw["volume"]] * 3)
    return {"x": rng.standard_normal(shape).astype(np.float32)}
