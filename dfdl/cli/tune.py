"""``dfdl tune``: search a model's hyperparameters and write the best trained model.

The space is a YAML file: each key a :func:`dfdl.tune` space key, each value a
distribution (``{loguniform: [LOW, HIGH]}``, ``{uniform: [LOW, HIGH]}``, ``{intuniform:
[LOW, HIGH]}``, ``{choice: [A, B, ...]}``) or a fixed value:

.. code-block:: yaml

    lr: {loguniform: [1.0e-3, 0.3]}
    momentum: {uniform: [0.5, 0.95]}
    batch_size: {choice: [16, 32, 64]}
    epochs: 9

Example:
    .. code-block:: console

        $ dfdl tune model.onnx --data train.npz --validation val.npz --space space.yaml \\
              --trials 32 --pruner asha --storage sqlite:///study.db -o best.onnx
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from dfdl.cli.common import OPTIMIZERS, load_data, positive_int

#: the YAML space's distribution names
DISTRIBUTIONS = ("loguniform", "uniform", "intuniform", "choice")


def add_parser(sub) -> argparse.ArgumentParser:
    """Add ``tune`` to the ``dfdl`` subcommands (``sub``: ``add_subparsers()``'s result).

    Example:
        >>> add_parser(Parser(prog="dfdl").add_subparsers())  # doctest: +SKIP
    """
    p = sub.add_parser(
        "tune",
        help="search hyperparameters and write the best trained model",
        description="Train many configurations of MODEL drawn from SPACE at once on one "
        "Dask cluster (an embedded local one unless --scheduler is given), stop the bad "
        "ones early on the validation metric, and write the best trained model as ONNX. "
        "The study is kept in --storage (optuna-dashboard opens it); --resume finishes a "
        "study a killed run left.",
    )
    p.add_argument("model", metavar="MODEL.onnx")
    p.add_argument("--data", required=True, metavar="DATA", help=".npz file with X and y")
    p.add_argument(
        "--validation", required=True, metavar="VAL", help=".npz file with X and y to compare on"
    )
    p.add_argument("--space", required=True, metavar="SPACE.yaml", help="the search space")
    p.add_argument("--trials", type=positive_int, default=20, metavar="N", help="default 20")
    p.add_argument(
        "--pruner", choices=("asha", "hyperband", "median", "none"), default="asha",
        help="stop bad trials early at epoch rungs (default asha)",
    )  # fmt: skip
    p.add_argument("--sampler", choices=("tpe", "random"), default="tpe", help="default tpe")
    p.add_argument(
        "--metric", choices=("val_loss", "val_accuracy"), default="val_loss",
        help="what trials are compared on (default val_loss)",
    )  # fmt: skip
    p.add_argument("--storage", metavar="URL", help="Optuna RDB URL (default sqlite:///NAME.db)")
    p.add_argument("--study-name", default="dfdl-tune", metavar="NAME", help="default dfdl-tune")
    p.add_argument("--trials-dir", metavar="DIR", help="checkpoints and models of the trials")
    p.add_argument("--resume", action="store_true", help="finish the study a killed run left")
    p.add_argument("--concurrency", type=positive_int, metavar="N", help="trials at once")
    p.add_argument(
        "--wave", type=positive_int, default=8, metavar="N", help="trials asked together"
    )
    p.add_argument("--seed", type=int, default=0, metavar="N", help="the study's seed (default 0)")
    p.add_argument("--epochs", type=positive_int, metavar="N", help="epochs per trial")
    p.add_argument("--batch-size", type=positive_int, metavar="N", help="samples per step")
    p.add_argument("--loss", help="cross_entropy (default), mse, bce_with_logits, dice, ...")
    p.add_argument("--optimizer", choices=OPTIMIZERS, help="sgd (default), adam or adamw")
    p.add_argument("--scheduler", metavar="ADDRESS", help="a running Dask scheduler to use")
    p.add_argument("-o", "--output", required=True, metavar="OUT.onnx", help="best model")
    p.set_defaults(func=cmd_tune)
    return p


def _number(value, where: str) -> float:
    """YAML 1.1 reads ``1e-4`` as a string: accept it as the number it says."""
    from dfdl.errors import ConfigError

    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"--space {where}: {value!r} is not a number")
    return value


def read_space(path: str) -> dict[str, Any]:
    """The space of a YAML file (see the module docstring).

    Raises:
        ConfigError: the file is missing, not YAML, not a mapping, or a distribution
            is malformed (the message names the key).

    Example:
        >>> read_space("space.yaml")  # doctest: +SKIP
        {'lr': loguniform(0.001, 0.3), 'epochs': 9}
    """
    import yaml

    import dfdl.space
    from dfdl.errors import ConfigError

    try:
        with open(path) as f:
            raw = yaml.safe_load(f)
    except OSError as e:
        raise ConfigError(f"--space {path}: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"--space {path} is not valid YAML: {' '.join(str(e).split())}") from None
    if not isinstance(raw, dict) or not raw:
        raise ConfigError(
            f"--space {path} must map argument names to distributions, e.g. "
            "'lr: {loguniform: [1.0e-4, 0.1]}'"
        )
    space = {}
    for key, value in raw.items():
        if not (isinstance(value, dict) and len(value) == 1):
            space[key] = value
            continue
        ((kind, args),) = value.items()
        if kind not in DISTRIBUTIONS:
            raise ConfigError(
                f"--space {path}: {key}: unknown distribution {kind!r} (use one of "
                f"{', '.join(DISTRIBUTIONS)})"
            )
        if not isinstance(args, list) or not args:
            raise ConfigError(f"--space {path}: {key}: {kind} takes a list, e.g. [LOW, HIGH]")
        try:
            if kind == "choice":
                space[key] = dfdl.space.choice(args)
            elif kind == "intuniform":
                space[key] = dfdl.space.intuniform(*args)
            else:
                low, high = (_number(v, key) for v in args) if len(args) == 2 else (None, None)
                if low is None:
                    raise ConfigError(f"{kind} takes [LOW, HIGH]")
                space[key] = getattr(dfdl.space, kind)(low, high)
        except (ConfigError, TypeError) as e:
            raise ConfigError(f"--space {path}: {key}: {e}") from None
    return space


def cmd_tune(args: argparse.Namespace) -> int:
    """``dfdl tune``: search the space and write the best trained model.

    Example:
        >>> main(["tune", "m.onnx", "--data", "d.npz", "--validation", "v.npz",  # doctest: +SKIP
        ...       "--space", "space.yaml", "-o", "best.onnx"])
        0
    """
    import contextlib

    from dfdl.cli.train import save_trained
    from dfdl.errors import DataError
    from dfdl.runtime.output import check_output_path
    from dfdl.tuning.tuner import Tuner

    check_output_path(args.output, "-o")
    space = read_space(args.space)
    X, y = load_data(args.data, None)
    Xv, yv = load_data(args.validation, None)
    if y is None or yv is None:
        raise DataError("--data and --validation need labels: an array 'y' in each .npz file")
    fixed = {
        k: v
        for k, v in (
            ("epochs", args.epochs),
            ("batch_size", args.batch_size),
            ("loss", args.loss),
            ("optimizer", args.optimizer),
        )
        if v is not None
    }
    start = time.perf_counter()
    tuner = Tuner(
        args.model,
        data=(X, y),
        validation=(Xv, yv),
        space=space,
        trials=args.trials,
        metric=args.metric,
        pruner=args.pruner,
        sampler=args.sampler,
        seed=args.seed,
        concurrency=args.concurrency,
        wave=args.wave,
        storage=args.storage,
        study_name=args.study_name,
        trials_dir=args.trials_dir,
        resume=args.resume,
        **fixed,
    )  # every check made: only now connect
    with contextlib.ExitStack() as stack:
        client = None
        if args.scheduler:
            from dfdl.runtime.cluster import open_client

            client = stack.enter_context(open_client(args.scheduler))
        result = tuner.run(client)
    save_trained(result, args.output)
    counts = result.counts()
    shown = ", ".join(f"{k}={v!r}" for k, v in result.best_params.items())
    print(
        f"{len(result.trials)} trials in {time.perf_counter() - start:.1f} s: "
        f"{counts['complete']} finished, {counts['pruned']} pruned, {counts['failed']} failed"
    )
    print(f"best: trial {result.best_trial}, {result.metric} {result.best_value:.6g} ({shown})")
    print(f"wrote {args.output}")
    return 0
