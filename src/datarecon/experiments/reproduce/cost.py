"""Wall-time estimates of reproduction pieces (for ``datarecon reproduce ... --dry-run``).

A deliberately small cost model: full-batch training and KKT steps of an MLP are dominated by
matrix products whose cost is proportional to (rows) × (parameters), so

    seconds ≈ max(floor, rate · rows · parameters) per epoch / step

with ``rows`` = n training images (training) or m candidates (KKT), and (rate, floor) per device kind
and dtype, calibrated from measurements recorded in docs/PERFORMANCE.md:

* CPU (2 cores, 2026-11-23): D-1000-1000-1 float64 training on n = 100 CIFAR images, 0.045 s/epoch;
  KKT step m = 200 float32, 0.079 s (3000 steps in 238 s).
* CUDA (one NVIDIA H100, 2026-11-23, issue 12): n = 500 float64 training 168 s / 100 000 epochs
  (1.7 ms/epoch); KKT step m = 1000, 3.2 ms (float32) / 4.1 ms (float64), launch-bound.

Other dtypes are scaled by :data:`DTYPE_FACTOR` (float32 ≈ half the float64 time on CPU). These are
estimates with perhaps ±50 % error on other machines, printed as such; they never gate anything.
"""

from __future__ import annotations

from collections.abc import Sequence

#: (seconds per row·parameter, floor seconds) of one full-batch training epoch, float64.
TRAIN_RATE = {"cpu": (1.1e-10, 0.0), "cuda": (8.3e-13, 5e-4)}
#: (seconds per candidate·parameter, floor seconds) of one KKT step, float32.
KKT_RATE = {"cpu": (9.7e-11, 0.0), "cuda": (2.9e-13, 3.0e-3)}
#: time relative to the calibrated dtype (training: float64; KKT: float32).
DTYPE_FACTOR = {"train": {"float64": 1.0, "float32": 0.5}, "kkt": {"float32": 1.0, "float64": 1.5}}


def device_kind(device: str) -> str:
    """``cpu`` or ``cuda`` (``cuda:1`` → ``cuda``; anything else is costed as ``cpu``)."""
    return "cuda" if device.startswith("cuda") else "cpu"


def mlp_parameters(input_dim: int, hidden: Sequence[int], outputs: int = 1, *, bias: bool = False) -> int:
    """Number of parameters of a fully connected network input_dim-hidden...-outputs."""
    widths = [int(input_dim), *map(int, hidden), int(outputs)]
    return sum(a * b + (b if bias else 0) for a, b in zip(widths, widths[1:]))


def _seconds(table: dict[str, tuple[float, float]], factor: float, device: str, rows: int, params: int,
             count: int) -> float:
    rate, floor = table[device_kind(device)]
    return count * factor * max(floor, rate * rows * params)


def train_seconds(device: str, *, dtype: str, n: int, params: int, epochs: int, ascent_steps: int = 0) -> float:
    """Estimated seconds of ``epochs`` full-batch epochs (+ margin-ascent steps, one forward/backward each)."""
    return _seconds(TRAIN_RATE, DTYPE_FACTOR["train"].get(dtype, 1.0), device, n, params,
                    epochs + ascent_steps)


def kkt_seconds(device: str, *, dtype: str, m: int, params: int, steps: int) -> float:
    """Estimated seconds of ``steps`` KKT attack steps with m candidates."""
    return _seconds(KKT_RATE, DTYPE_FACTOR["kkt"].get(dtype, 1.0), device, m, params, steps)


def input_dim(dataset: str) -> int:
    """Flattened input size of a dataset's images (MNIST 784, CIFAR-10 3072, digits 64)."""
    return {"mnist": 784, "cifar10": 3072, "digits": 64}.get(dataset, 784)

