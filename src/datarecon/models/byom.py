"""Bring your own model: checks that a user's ``nn.Module`` fits the attacks, and loading one.

Pure checks (no state, nothing written), each raising a one-line :class:`DataReconError` that
names the problem and the fix:

* :func:`check_parameters`: every parameter a floating tensor.
* :func:`check_outputs`: the forward takes ``(m, *input_shape)`` and returns ``(m, k)`` floats.
* :func:`check_loss`: a registered loss name that fits the output size, or a callable
  ``loss(outputs, labels) -> scalar``.
* :func:`measure_homogeneity`: positive homogeneity in the parameters measured, not trusted
  (see below), naming the first layer that breaks it.

And the CLI's loaders: :func:`load_factory` (``package.module:factory``, the user's own code) and
:func:`load_weights` (a safetensors file, never a pickle; the first mismatching tensor named).

Homogeneity. The KKT attack rests on Lyu & Li (2020): gradient flow on an L-homogeneous network,
Φ(x; c·θ) = c^L Φ(x; θ) for c > 0, converges in direction to a KKT point of the max-margin
problem (Haim et al. 2022, §3; METHODS.md "KKT attack"). :func:`measure_homogeneity` scales every
parameter by c and compares, layer by layer in execution order, each leaf module's output with
c^k times its unscaled output, k the number of parametrised modules run so far (a chain of
Linear/Conv + ReLU gives k = 1, 1, 2, 2, ..., L). The first module off by more than ``rtol``
breaks homogeneity: a bias (c·W h + c·b scales as c^k only without b), a non-ReLU activation
(tanh(c^k z) ≠ c^k tanh z), a normalisation layer (BatchNorm divides the scale out). If no
module is off but the output is, a functional operation in ``forward`` (a residual sum of
branches of different degree, a constant) breaks it. The count k assumes the modules run as a chain
(a module called twice counts twice, which is right for weight sharing), so the verdict is taken at
the output alone (``rel_error``) and the layer walk only locates the break: parallel branches would
mislead the walk, not the verdict.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.func import functional_call

from datarecon.errors import DataReconError
from datarecon.kernel.losses import LOSSES
from datarecon.utils.io import load_tensors

#: relative error below which a layer counts as homogeneous (float64 arithmetic)
HOMOGENEITY_RTOL = 1e-8
#: the parameter scale c of the check
HOMOGENEITY_SCALE = 2.0
#: random inputs of the check
HOMOGENEITY_TRIALS = 4
#: seed of the check's random inputs
HOMOGENEITY_SEED = 0

_NORMS = (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm)


@dataclass(frozen=True)
class Homogeneity:
    """Result of :func:`measure_homogeneity`.

    Attributes:
        homogeneous: Φ(x; c·θ) = c^L Φ(x; θ) held at the output within ``rtol`` (relative, over all trial inputs).
        degree: L, the number of parametrised leaf modules run by the forward.
        rel_error: max over inputs of ‖Φ(x; cθ) − c^L Φ(x; θ)‖ / ‖c^L Φ(x; θ)‖ at the output.
        first_break: the first leaf module off by more than ``rtol`` ("name (Type): reason"),
            or a note on a functional operation, or None when homogeneous.
    """

    homogeneous: bool
    degree: int
    rel_error: float
    first_break: str | None


def _leaves(model: nn.Module) -> dict[str, nn.Module]:
    return {name: m for name, m in model.named_modules() if not list(m.children())}


def _why_not_homogeneous(module: nn.Module) -> str:
    if isinstance(module, _NORMS):
        return "a normalisation layer divides the scale out; remove it or fold it into the weights"
    if getattr(module, "bias", None) is not None and isinstance(getattr(module, "bias"), torch.Tensor):
        return "it has a bias; build the layer with bias=False"
    if not list(module.parameters(recurse=False)):
        return "this activation is not positively homogeneous; use ReLU (or LeakyReLU)"
    return ("its output does not scale as c^k with its parameters (its input mixes branches of different depth, "
            "e.g. a residual sum in forward)")


def measure_homogeneity(model: nn.Module, params: Mapping[str, torch.Tensor], input_shape: Sequence[int], *,
                        value_range: tuple[float, float] = (0.0, 1.0), scale: float = HOMOGENEITY_SCALE,
                        trials: int = HOMOGENEITY_TRIALS, rtol: float = HOMOGENEITY_RTOL,
                        seed: int = HOMOGENEITY_SEED) -> Homogeneity:
    """Measure positive homogeneity in the parameters, Φ(x; c·θ) = c^L Φ(x; θ), layer by layer.

    Runs in float64 on CPU on a copy of ``model`` in eval mode (``model`` is not changed).

    Args:
        model: the network (called functionally with ``params``; its buffers are used as they are).
        params: θ, name -> tensor.
        input_shape: (C, H, W) (or any shape) of one input.
        value_range: (lower, upper) of the uniform random inputs.
        scale: c > 0, c ≠ 1.
        trials: number of random inputs.
        rtol: relative error tolerated per layer.
        seed: seed of the random inputs.

    Returns:
        :class:`Homogeneity`.

    References:
        Lyu & Li 2020 (homogeneous networks, Thm 4.4); Haim et al. 2022 §3.
    """
    net = copy.deepcopy(model).to(device="cpu", dtype=torch.float64).eval()
    theta = {k: v.detach().to(device="cpu", dtype=torch.float64) for k, v in params.items()}
    scaled = {k: scale * v for k, v in theta.items()}
    lo, hi = value_range
    gen = torch.Generator().manual_seed(seed)
    x = lo + (hi - lo) * torch.rand((trials, *input_shape), generator=gen, dtype=torch.float64)
    leaves = _leaves(net)

    def record(p: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, list[tuple[str, int, torch.Tensor]]]:
        seen: list[tuple[str, int, torch.Tensor]] = []
        depth = [0]

        def hook(name: str) -> Callable[..., None]:
            def fn(module: nn.Module, args: Any, out: Any) -> None:
                if list(module.parameters(recurse=False)):
                    depth[0] += 1
                if isinstance(out, torch.Tensor):
                    seen.append((name, depth[0], out.detach()))
            return fn

        handles = [m.register_forward_hook(hook(n)) for n, m in leaves.items()]
        try:
            with torch.no_grad():
                out = functional_call(net, dict(p), (x,))
        finally:
            for h in handles:
                h.remove()
        return out, seen

    out, seen = record(theta)
    out_c, seen_c = record(scaled)
    degree = seen[-1][1] if seen else 0

    def rel(a: torch.Tensor, b: torch.Tensor) -> float:
        den = float(b.norm())
        return float((a - b).norm()) / den if den > 0 else float((a - b).norm())

    first = None
    for (name, k, a), (_, _, a_c) in zip(seen, seen_c, strict=True):
        if rel(a_c, scale ** k * a) > rtol:
            module = leaves[name]
            first = f"{name} ({type(module).__name__}): {_why_not_homogeneous(module)}"
            break
    err = rel(out_c, scale ** degree * out)
    homogeneous = err <= rtol  # judged at the output; the layers only say where it breaks
    if not homogeneous and first is None:
        first = ("the output (no single layer): a functional operation in forward breaks it, e.g. a sum of "
                 "branches of different depth or a constant")
    return Homogeneity(homogeneous=homogeneous, degree=degree, rel_error=err if math.isfinite(err) else math.inf,
                       first_break=None if homogeneous else first)


def check_parameters(params: Mapping[str, torch.Tensor]) -> None:
    """Every parameter a finite floating tensor (attacks differentiate through them; θ* with NaN or
    ±inf is not a trained model, and an attack on it would only report a divergence).

    Raises:
        DataReconError: no parameters, or the first non-float or non-finite one named.
    """
    if not params:
        raise DataReconError("the model has no parameters; an attack on the weights needs some")
    for name, p in params.items():
        if not p.dtype.is_floating_point:
            raise DataReconError(f"parameter {name!r} has dtype {str(p.dtype).replace('torch.', '')}; attacks need "
                                 "float parameters: convert the model with model.float()")
        if not bool(torch.isfinite(p).all()):
            bad = int((~torch.isfinite(p)).sum())
            raise DataReconError(f"parameter {name!r} holds {bad} NaN or infinite value(s); the weights are not a "
                                 "trained model: check the weights file or the training that wrote it")
    if not any(bool(p.any()) for p in params.values()):
        raise DataReconError("every parameter is zero: such a model carries nothing of its training data (and every "
                             "residual relative to θ* is 0/0); check the weights file")


def check_outputs(model: nn.Module, params: Mapping[str, torch.Tensor], input_shape: Sequence[int], *,
                  value_range: tuple[float, float] = (0.0, 1.0), batch: int = 2) -> int:
    """Run the forward on ``batch`` inputs and check it returns ``(batch, k)`` floats.

    Returns:
        k, the number of outputs.

    Raises:
        DataReconError: the forward fails on ``(batch, *input_shape)``, returns a non-tensor,
            non-float values, or a shape other than ``(batch, k)`` (``(m,)`` names the fix).
    """
    p0 = next(iter(params.values()))
    lo, hi = value_range
    x = lo + (hi - lo) * torch.rand((batch, *input_shape), generator=torch.Generator().manual_seed(0),
                                    dtype=torch.float64).to(device=p0.device, dtype=p0.dtype)
    try:
        with torch.no_grad():
            out = functional_call(model, dict(params), (x,))
    except Exception as exc:  # noqa: BLE001 - the user's forward; its failure becomes one line
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DataReconError(f"the model's forward fails on inputs of shape {(batch, *input_shape)} ({msg}); "
                             "pass the input_shape of one input, e.g. (3, 32, 32)") from None
    if not isinstance(out, torch.Tensor):
        raise DataReconError(f"the model returns {type(out).__name__}, not a tensor; return the logits (m, k)")
    if not out.dtype.is_floating_point:
        raise DataReconError(f"the model returns {str(out.dtype).replace('torch.', '')} outputs; return float logits")
    if tuple(out.shape) == (batch,):
        raise DataReconError(f"the model returns shape (m,) = {tuple(out.shape)} for m = {batch} inputs; attacks need "
                             "(m, 1) for a single-output model: end forward with .unsqueeze(-1)")
    if out.ndim != 2 or out.shape[0] != batch:
        raise DataReconError(f"the model returns shape {tuple(out.shape)} for {batch} inputs; attacks need (m, k) "
                             "logits: flatten the extra dimensions in forward")
    return int(out.shape[1])


def check_loss(loss: str | Callable[..., torch.Tensor], num_outputs: int) -> None:
    """A registered loss that fits ``num_outputs``, or a callable ``loss(outputs (m, k), labels (m,)) -> scalar``.

    Raises:
        DataReconError: unknown name (lists the registered ones), a loss of the wrong label kind,
            or a callable with the wrong signature / return value.
    """
    if isinstance(loss, str):
        entry = LOSSES.get(loss)
        kind = "binary" if num_outputs == 1 else "multiclass"
        if entry.label_kind not in ("any", kind):
            fits = [n for n in LOSSES.names() if LOSSES.get(n).label_kind in ("any", kind)]
            raise DataReconError(f"loss {loss!r} does not fit a model with {num_outputs} output(s); "
                                 f"use one of: {', '.join(fits)}")
        return
    if not callable(loss):
        raise DataReconError(f"loss must be a registered name or a callable, got {type(loss).__name__}")
    usage = "loss(outputs (m, k), labels (m,)) -> scalar tensor"
    try:
        inspect.signature(loss).bind(torch.zeros(1), torch.zeros(1))
    except TypeError:
        raise DataReconError(f"loss callable {getattr(loss, '__name__', loss)!r} must take two arguments: "
                             f"{usage}") from None
    except ValueError:  # builtins without a signature: try the call below
        pass
    out = torch.zeros(2, num_outputs, dtype=torch.float64, requires_grad=True)
    y = torch.tensor([1.0, -1.0], dtype=torch.float64) if num_outputs == 1 else torch.zeros(2, dtype=torch.int64)
    try:
        value = loss(out, y)
    except Exception as exc:  # noqa: BLE001 - the user's loss; its failure becomes one line
        raise DataReconError(f"loss callable failed on outputs (2, {num_outputs}) ({exc}); it must be {usage}") from None
    if not isinstance(value, torch.Tensor) or value.numel() != 1 or not value.dtype.is_floating_point:
        raise DataReconError(f"loss callable returned {type(value).__name__} "
                             f"{tuple(value.shape) if isinstance(value, torch.Tensor) else ''}; it must be {usage} "
                             "(take the mean over samples)")
    if not value.requires_grad:
        raise DataReconError(f"loss callable is not differentiable in the outputs; it must be {usage} built from torch ops")


def load_factory(spec: str) -> Callable[[], nn.Module]:
    """Import ``package.module:factory`` (the user's own code) and return the callable.

    Raises:
        DataReconError: malformed spec, unknown module or attribute, or not callable.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise DataReconError(f"--model {spec!r} is neither a model directory nor package.module:factory; "
                             "pass a directory from `datarecon train` or e.g. mypkg.nets:make_cnn")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise DataReconError(f"cannot import module {module_name!r} of --model {spec} ({exc}); "
                             "put its folder on PYTHONPATH or install the package") from None
    except SystemExit as exc:
        raise DataReconError(f"importing {module_name!r} (--model {spec}) called sys.exit({exc.code!r}); keep "
                             "command-line code under `if __name__ == '__main__':`") from None
    except Exception as exc:  # noqa: BLE001 - the user's module failed to import
        first = (str(exc).splitlines() or [""])[0]
        raise DataReconError(f"importing {module_name!r} (--model {spec}) raised {type(exc).__name__}: {first}; "
                             "fix the module") from None
    factory = module
    for part in attr.split("."):
        if not hasattr(factory, part):
            raise DataReconError(f"module {module_name!r} has no {attr!r} (--model {spec}); "
                                 "name a function that returns the nn.Module")
        factory = getattr(factory, part)
    if not callable(factory):
        raise DataReconError(f"{spec} is not callable; name a function that returns the nn.Module")
    return factory  # type: ignore[return-value]


def build_from_factory(spec: str) -> nn.Module:
    """Call the factory of ``spec`` with no arguments; it must return an ``nn.Module``."""
    factory = load_factory(spec)
    try:
        model = factory()
    except TypeError as exc:
        raise DataReconError(f"{spec}() failed ({exc}); the factory must take no arguments "
                             "(wrap it: def make(): return Net(width=64))") from None
    except SystemExit as exc:  # the user's code called sys.exit(): say so instead of ending silently
        raise DataReconError(f"{spec}() called sys.exit({exc.code!r}) instead of returning a model; make the factory "
                             "return the nn.Module (no sys.exit, argparse or CLI code in it)") from None
    except Exception as exc:  # noqa: BLE001 - the user's code: any exception is theirs to fix
        first = (str(exc).splitlines() or [""])[0]
        raise DataReconError(f"{spec}() raised {type(exc).__name__}: {first}; fix the factory (it is called with no "
                             "arguments and must return the nn.Module)") from None
    if not isinstance(model, nn.Module):
        raise DataReconError(f"{spec}() returned {type(model).__name__}, not a torch.nn.Module")
    return model


def load_weights(model: nn.Module, path: str | Path) -> dict[str, torch.Tensor]:
    """Load a safetensors state dict into ``model`` (strict); return the parameters θ*.

    Raises:
        CheckpointError: missing, pickled or corrupt file (from ``load_tensors``).
        DataReconError: the first tensor missing, unexpected, or of another shape, named.
    """
    path = Path(path)
    tensors = load_tensors(path)
    expected = model.state_dict()
    for name, t in expected.items():
        if name not in tensors:
            raise DataReconError(f"{path} does not match the model: tensor {name!r} {tuple(t.shape)} is missing; "
                                 "save the weights with safetensors.torch.save_file(model.state_dict(), ...)")
        if tuple(tensors[name].shape) != tuple(t.shape):
            raise DataReconError(f"{path} does not match the model: tensor {name!r} has shape "
                                 f"{tuple(tensors[name].shape)}, the model expects {tuple(t.shape)}")
        if t.is_floating_point() and not tensors[name].is_floating_point():
            raise DataReconError(f"{path}: tensor {name!r} has dtype {str(tensors[name].dtype).replace('torch.', '')}, "
                                 "the model expects floats; save the float weights")
    extra = [k for k in tensors if k not in expected]
    if extra:
        raise DataReconError(f"{path} does not match the model: unexpected tensor {extra[0]!r} "
                             f"({len(extra)} unexpected in all); is this the right factory?")
    with torch.no_grad():
        model.load_state_dict({k: v.to(expected[k].dtype) if v.is_floating_point() else v
                               for k, v in tensors.items()}, strict=True)
    return {k: v.detach() for k, v in model.named_parameters()}
