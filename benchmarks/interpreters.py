"""What each CPU interpreter costs: median call time of reference kernels, plain vs TPU.

    python benchmarks/interpreters.py [--repeats 5]

Prints, per kernel, the first call (trace + compile + run) and the median of
the following calls in each interpreter, and the ratio TPU / plain. The
table of docs/interpreters.md comes from this script.
"""

from __future__ import annotations

import argparse
import statistics
import time


def kernels():
    import jax.numpy as jnp
    import numpy as np

    from pytest_pallas.reference_kernels import attention, elementwise, matmul, reduction, softmax

    rng = np.random.default_rng(0)

    def normal(*shape, dtype=jnp.float32):
        return jnp.asarray(rng.standard_normal(shape), dtype)

    return [
        ("add 512x1024 f32", elementwise.add, (normal(512, 1024), normal(512, 1024))),
        ("sum 8x256x512 f32", reduction.sum_leading_axis, (normal(8, 256, 512),)),
        ("matmul 256x512x256 bf16", matmul.matmul,
         (normal(256, 512, dtype=jnp.bfloat16), normal(512, 256, dtype=jnp.bfloat16))),
        ("softmax 256x1024 f32", softmax.softmax, (normal(256, 1024),)),
        ("attention s=t=512 d=128 f32", attention.attention,
         (normal(512, 128), normal(512, 128), normal(512, 128))),
    ]


def measure(function, args, params, repeats: int) -> tuple[float, float]:
    import jax
    from jax.experimental.pallas import tpu as pltpu

    with pltpu.force_tpu_interpret_mode(params):
        compiled = jax.jit(function)
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        first = time.perf_counter() - start
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            jax.block_until_ready(compiled(*args))
            times.append(time.perf_counter() - start)
    return first, statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    arguments = parser.parse_args()
    from jax.experimental.pallas import tpu as pltpu

    interpreters = {"plain": True, "tpu": pltpu.InterpretParams(uninitialized_memory="nan")}
    print(f"{'kernel':30} {'plain first':>12} {'plain median':>13} {'tpu first':>10} "
          f"{'tpu median':>11} {'tpu/plain':>10}")
    for name, function, args in kernels():
        results = {mode: measure(function, args, params, arguments.repeats)
                   for mode, params in interpreters.items()}
        (pf, pm), (tf, tm) = results["plain"], results["tpu"]
        print(f"{name:30} {pf:11.3f}s {pm:12.4f}s {tf:9.3f}s {tm:10.4f}s {tm / pm:9.1f}x")


if __name__ == "__main__":
    main()
