"""Float32 training accuracy against float64: a DenseNet-style network trained 3 steps.

The same exported model is trained with SGD-momentum (train mode, the same batches, no
shuffling) four ways: PyTorch in float64 (the reference), PyTorch in float32, dfdl in
float32 and dfdl on the float64 export (which checks the formulas: it must agree with
the reference to ~1e-8). Each float32 run's error is its distance from the float64
reference: per step, the relative loss difference; at the end, the trained weights'
difference relative to how far the reference moved them (``|w - w64| / |w64 - w0|``
over all parameters, and the worst tensor).

The error of one batch is a lottery (a few ReLU and max-pool ties that float32 decides
the other way), so ``--seeds N`` measures one SGD step on each of N batches instead
(seeds 0 to N-1, one export shared by all, as ``tests/models/test_float32_accuracy.py``
does for three) and prints each batch's gradient and first-loss errors of PyTorch and dfdl
in float32, their geometric means and dfdl's over PyTorch's.

Usage::

    python bench/float32_accuracy.py            # the table
    python bench/float32_accuracy.py --workers 1 --threads 2
    python bench/float32_accuracy.py --densenet121 --seeds 12 --json out.json

Measurements and the decisions they led to: ``docs/design/float32-accuracy.md``.
"""

from __future__ import annotations

import argparse
import copy
import json
import time

import numpy as np

#: the network: stem channels, growth rate, bottleneck factor, layers per dense block,
#: ImageNet stem (7x7 stride-2 conv and 3x3 stride-2 max pool) or a 3x3 conv
NET = dict(stem=64, growth=32, bottleneck=4, blocks=(3, 3), classes=10, imagenet_stem=False)
#: image size, batch, steps, SGD hyperparameters
RUN = dict(image=16, batch=16, steps=3, lr=0.1, momentum=0.9)
#: DenseNet-121's layout (blocks of 6, 12, 24, 16 layers, ImageNet stem) on 64x64 images
DENSENET121 = dict(NET, blocks=(6, 12, 24, 16), imagenet_stem=True)


def densenet(
    stem: int,
    growth: int,
    bottleneck: int,
    blocks: tuple[int, ...],
    classes: int,
    imagenet_stem: bool = False,
):
    """A DenseNet-style torch module: a 3x3 stem, dense blocks of BN-ReLU-Conv1x1-BN-
    ReLU-Conv3x3 layers whose outputs are concatenated to their inputs, transitions of
    BN-ReLU-Conv1x1-AvgPool halving the channels, BN-ReLU, global average pool, a
    linear classifier (DenseNet-BC, Huang et al. 2017, at a small size)."""
    import torch
    from torch import nn

    class Layer(nn.Module):
        def __init__(self, c: int):
            super().__init__()
            mid = bottleneck * growth
            self.bn1, self.conv1 = nn.BatchNorm2d(c), nn.Conv2d(c, mid, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(mid)
            self.conv2 = nn.Conv2d(mid, growth, 3, padding=1, bias=False)

        def forward(self, x):
            y = self.conv1(torch.relu(self.bn1(x)))
            y = self.conv2(torch.relu(self.bn2(y)))
            return torch.cat([x, y], 1)

    class Transition(nn.Module):
        def __init__(self, c: int):
            super().__init__()
            self.bn, self.conv = nn.BatchNorm2d(c), nn.Conv2d(c, c // 2, 1, bias=False)

        def forward(self, x):
            return nn.functional.avg_pool2d(self.conv(torch.relu(self.bn(x))), 2)

    class DenseNet(nn.Module):
        def __init__(self):
            super().__init__()
            layers: list[nn.Module] = [nn.Conv2d(3, stem, 3, padding=1, bias=False)]
            if imagenet_stem:
                layers = [
                    nn.Conv2d(3, stem, 7, stride=2, padding=3, bias=False),
                    nn.BatchNorm2d(stem),
                    nn.ReLU(),
                    nn.MaxPool2d(3, stride=2, padding=1),
                ]
            c = stem
            for i, n in enumerate(blocks):
                for _ in range(n):
                    layers.append(Layer(c))
                    c += growth
                if i + 1 < len(blocks):
                    layers.append(Transition(c))
                    c //= 2
            self.features = nn.Sequential(*layers)
            self.norm = nn.BatchNorm2d(c)
            self.fc = nn.Linear(c, classes)

        def forward(self, x):
            y = torch.relu(self.norm(self.features(x)))
            return self.fc(y.mean(dim=(2, 3)))

    torch.manual_seed(0)
    return DenseNet()


def data(image: int, batch: int, steps: int, classes: int, seed: int = 0, **_):
    """``steps * batch`` float64 images and integer labels drawn with ``seed``."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((steps * batch, 3, image, image))
    y = rng.integers(0, classes, steps * batch)
    return x, y


def torch_train(
    module, x: np.ndarray, y: np.ndarray, dtype, batch: int, lr: float, momentum: float, **_
):
    """Per-step losses and the trained parameters of a copy of ``module`` in ``dtype``."""
    import torch

    m = copy.deepcopy(module).to(dtype).train()
    opt = torch.optim.SGD(m.parameters(), lr=lr, momentum=momentum)
    losses = []
    for k in range(len(x) // batch):
        xb = torch.from_numpy(x[k * batch : (k + 1) * batch]).to(dtype)
        yb = torch.from_numpy(y[k * batch : (k + 1) * batch])
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(m(xb), yb)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    params = {k: p.detach().double().numpy() for k, p in m.named_parameters()}
    return losses, params


def export(module, dtype, image: int, exporter: str = "dynamo"):
    """The ONNX export of a copy of ``module`` in ``dtype``: dynamo with
    ``optimize=False``, or ``exporter="torchscript"`` in training mode without constant
    folding (1 s where dynamo takes 25 s for DenseNet-121; in eval mode it would store
    the fresh BatchNorms' equal scales and shifts once, tying them)."""
    import io

    import onnx
    import torch

    from dfdl.models.torch_twins import export as torch_export

    m = copy.deepcopy(module).to(dtype)
    example = torch.zeros((2, 3, image, image), dtype=dtype)
    if exporter == "dynamo":
        return torch_export(m, example)
    buf = io.BytesIO()
    torch.onnx.export(
        m,
        (example,),
        buf,
        dynamo=False,
        input_names=["x"],
        output_names=["logits"],
        dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}},
        training=torch.onnx.TrainingMode.TRAINING,
        do_constant_folding=False,
        opset_version=18,
    )
    return onnx.load_from_string(buf.getvalue())


def dfdl_train(
    model,
    x: np.ndarray,
    y: np.ndarray,
    client,
    batch: int,
    lr: float,
    momentum: float,
    train_kwargs=None,
    **_,
):
    """Per-step losses and trained parameters of ``dfdl.train`` on ``model``."""
    import dfdl

    kwargs = train_kwargs or {}
    result = dfdl.train(
        model,
        (x, y),
        loss="cross_entropy",
        optimizer=dfdl.optim.SGD(lr=lr, momentum=momentum),
        batch_size=batch,
        epochs=1,
        shuffle=False,
        client=client,
        progress=False,
        **kwargs,
    )
    return list(result.history["loss"]), {
        k: np.asarray(v, np.float64) for k, v in result.params.items()
    }


def errors(run, ref, start) -> dict:
    """A run's distance from the reference: per-step relative loss error; the weights'
    ``|w - w64| / |w64 - w0|`` over all parameters (``weights``) and the worst tensor's
    (``worst``, named in ``worst_name``)."""
    losses, params = run
    ref_losses, ref_params = ref
    step = [abs(a - b) / abs(b) for a, b in zip(losses, ref_losses)]
    keys = sorted(ref_params)
    diff = np.sqrt(sum(np.sum((params[k] - ref_params[k]) ** 2) for k in keys))
    moved = np.sqrt(sum(np.sum((ref_params[k] - start[k]) ** 2) for k in keys))
    per = {
        k: np.linalg.norm(params[k] - ref_params[k]) / np.linalg.norm(ref_params[k] - start[k])
        for k in keys
    }
    worst = max(per, key=per.get)
    return dict(step=step, weights=float(diff / moved), worst=float(per[worst]), worst_name=worst)


def measure(client, net: dict = NET, run: dict = RUN, f64: bool = True, **train_kwargs) -> dict:
    """The errors of PyTorch float32, dfdl float32 and (``f64``) dfdl float64 against
    PyTorch float64 (name -> :func:`errors`), and the float64 reference losses
    (``"losses"``); ``train_kwargs`` go to ``dfdl.train``."""
    import torch

    torch.set_num_threads(1)
    module = densenet(**net)
    x, y = data(classes=net["classes"], **run)
    start = {k: p.detach().double().numpy() for k, p in module.named_parameters()}
    ref = torch_train(module, x, y, torch.float64, **run)
    runs = {"torch f32": torch_train(module, x, y, torch.float32, **run)}
    m32 = export(module, torch.float32, run["image"])
    runs["dfdl f32"] = dfdl_train(
        m32, x.astype(np.float32), y, client, train_kwargs=train_kwargs, **run
    )
    if f64:
        m64 = export(module, torch.float64, run["image"])
        runs["dfdl f64"] = dfdl_train(m64, x, y, client, train_kwargs=train_kwargs, **run)
    out = {name: errors(run, ref, start) for name, run in runs.items()}
    out["losses"] = ref[0]
    return out


#: a float32 ulp relative to a value in [1, 2): loss errors below it count as one ulp
ULP = 2.0**-23


def lottery(client, net: dict, run: dict, seeds: int) -> dict:
    """One step on each of the batches of seeds ``0..seeds-1`` from the same weights:
    per seed, the trained weights' error (``|w - w64| / |w64 - w0|``, the gradient's) and
    the first loss's (floored at :data:`ULP`) of PyTorch float32 and dfdl float32 against
    PyTorch float64, and their geometric means (over all seeds, and for more than three
    the gradient's over the first three, the test's)."""
    import torch

    torch.set_num_threads(1)
    run = dict(run, steps=1)
    module = densenet(**net)
    start = {k: p.detach().double().numpy() for k, p in module.named_parameters()}
    model = export(module, torch.float32, run["image"], exporter="torchscript")
    rows = []
    for seed in range(seeds):
        x, y = data(classes=net["classes"], seed=seed, **run)
        ref = torch_train(module, x, y, torch.float64, **run)
        theirs = errors(torch_train(module, x, y, torch.float32, **run), ref, start)
        ours = errors(dfdl_train(model, x.astype(np.float32), y, client, **run), ref, start)
        rows.append(
            dict(
                seed=seed,
                torch_weights=theirs["weights"],
                dfdl_weights=ours["weights"],
                torch_loss=max(theirs["step"][0], ULP),
                dfdl_loss=max(ours["step"][0], ULP),
            )
        )

    def gm(key, n=None):
        return float(np.exp(np.mean(np.log([r[key] for r in rows[:n]]))))

    means = {f"{k}_gm": gm(k) for k in ("torch_weights", "dfdl_weights", "torch_loss", "dfdl_loss")}
    means["weights_ratio"] = means["dfdl_weights_gm"] / means["torch_weights_gm"]
    means["loss_ratio"] = means["dfdl_loss_gm"] / means["torch_loss_gm"]
    if seeds > 3:
        means["weights_ratio_first3"] = gm("dfdl_weights", 3) / gm("torch_weights", 3)
    return dict(seeds=rows, **means)


def lottery_table(result: dict) -> str:
    """:func:`lottery`'s measurement as a text table."""
    lines = ["seed  weights: PyTorch     dfdl   first loss: PyTorch     dfdl"]
    for r in result["seeds"]:
        lines.append(
            f"{r['seed']:4d}  {r['torch_weights']:17.3e} {r['dfdl_weights']:8.3e}"
            f"  {r['torch_loss']:20.3e} {r['dfdl_loss']:8.3e}"
        )
    first3 = result.get("weights_ratio_first3")
    lines.append(
        f"geometric means: weights {result['torch_weights_gm']:.3e} / "
        f"{result['dfdl_weights_gm']:.3e} (dfdl {result['weights_ratio']:.3f}x PyTorch"
        + (f"; seeds 0-2, the test's: {first3:.3f}x" if first3 else "")
        + f"), first loss {result['torch_loss_gm']:.3e} / {result['dfdl_loss_gm']:.3e} "
        f"({result['loss_ratio']:.3f}x)"
    )
    return "\n".join(lines)


def table(result: dict) -> str:
    """The measurement as a text table."""
    steps = len(result["losses"])
    lines = [f"{'run':10s} " + " ".join(f"step {i}   " for i in range(steps)) + " weights   worst"]
    for name, e in result.items():
        if name == "losses":
            continue
        steps = " ".join(f"{v:9.2e}" for v in e["step"])
        lines.append(
            f"{name:10s} {steps}  {e['weights']:8.2e}  {e['worst']:8.2e} {e['worst_name']}"
        )
    return "\n".join(lines)


def main() -> None:
    from distributed import Client

    import dfdl

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--densenet121", action="store_true", help="DenseNet-121's layout")
    parser.add_argument("--image", type=int, default=None)
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--lr", type=float, default=None)
    parser.add_argument("--no-f64", action="store_true", help="skip dfdl's float64 run")
    parser.add_argument(
        "--seeds", type=int, default=None, help="one step on each of this many batches"
    )
    parser.add_argument("--json", default=None, help="write the results to this file")
    args = parser.parse_args()
    net = DENSENET121 if args.densenet121 else NET
    run = dict(RUN, image=64) if args.densenet121 else dict(RUN)
    for key in ("image", "batch", "lr"):
        if getattr(args, key) is not None:
            run[key] = getattr(args, key)
    t0 = time.perf_counter()
    with dfdl.LocalCluster(args.workers, threads_per_worker=args.threads) as cluster:
        with Client(cluster) as client:
            if args.seeds:
                result = lottery(client, net, run, args.seeds)
            else:
                result = measure(client, net, run, f64=not args.no_f64)
    if args.seeds:
        print(lottery_table(result))
        print(f"{time.perf_counter() - t0:.1f} s")
    else:
        print(table(result))
        print(f"reference losses {result['losses']}; {time.perf_counter() - t0:.1f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(net=net, run=run, result=result), f, indent=1)


if __name__ == "__main__":
    main()
