"""Index maps evaluated over a grid in NumPy (pytest_pallas.checks.index_maps) give JAX's
own results, integer rounding and remainders of negative numbers included; what NumPy does
not model is left to JAX."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pytest_pallas.checks import index_maps
from pytest_pallas.checks.kernel_model import _evaluate_index_map_in_jax

INDEX_MAPS = {
    "identity": lambda i, j: (i, j),
    "constant": lambda i, j: (0, 0),
    "floor division and modulo of negatives": lambda i, j: ((i - 3) // 2, (j - 5) % 3),
    "lax.div and lax.rem of negatives": lambda i, j: (jax.lax.div(i - 4, 3),
                                                     jax.lax.rem(j - 7, 4)),
    "causal clamp": lambda i, j: (i, jnp.minimum(j, (i * 2 + 1) // 3)),
    "where": lambda i, j: (jnp.where(i > j, i - j, j - i), jnp.maximum(i, 1)),
    "nested jit": lambda i, j: jax.jit(lambda a, b: (a * 3 + b, -b))(i, j),
    "clip and power": lambda i, j: (jnp.clip(i - 2, 0, 3), j ** 2),
    "bool logic": lambda i, j: ((i > 1) & (j < 3) | (i == j), jnp.logical_not(i > 0)),
    "int16": lambda i, j: (i.astype(jnp.int16) * 300, j.astype(jnp.uint8) - 1),
}


def _grid(first: int, second: int) -> np.ndarray:
    return np.array(list(itertools.product(range(first), range(second))), dtype=np.int32)


@pytest.mark.parametrize("name", INDEX_MAPS)
def test_numpy_gives_jaxs_block_indices(name):
    closed = jax.make_jaxpr(INDEX_MAPS[name])(np.int32(0), np.int32(0))
    points = _grid(7, 9)
    ours = index_maps.evaluate(closed.jaxpr, closed.consts, [points[:, 0], points[:, 1]])
    theirs = _evaluate_index_map_in_jax(closed, 2, points)
    assert len(ours) == len(theirs)
    for mine, jaxs in zip(ours, theirs):
        np.testing.assert_array_equal(np.broadcast_to(mine, (len(points),)),
                                      np.broadcast_to(jaxs, (len(points),)))


@pytest.mark.parametrize("index_map", [
    lambda i, j: (jnp.float32(i) * 0.5).astype(jnp.int32),  # a float on the way
    lambda i, j: jnp.arange(4)[i % 4],  # an array, not a scalar
])
def test_what_numpy_does_not_model_is_left_to_jax(index_map):
    closed = jax.make_jaxpr(index_map)(np.int32(0), np.int32(0))
    points = _grid(2, 2)
    with pytest.raises(index_maps.NotEvaluated):
        index_maps.evaluate(closed.jaxpr, closed.consts, [points[:, 0], points[:, 1]])
