import os, sys
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ["JAX_PLATFORMS"] = "cpu"
import jax, jax.numpy as jnp, numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec as P

def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] + 1

def add_one_kernel(x):
    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                          interpret=pltpu.InterpretParams())(x)

@custom_partitioning
def add_one(x):
    return add_one_kernel(x)

def infer(mesh, arg_shapes, result_shape):
    return arg_shapes[0].sharding

def partition(mesh, arg_shapes, result_shape):
    sharding = arg_shapes[0].sharding
    return mesh, add_one_kernel, sharding, (sharding,)

add_one.def_partition(infer_sharding_from_operands=infer, partition=partition,
                      sharding_rule="i j -> i j")

mesh = jax.sharding.Mesh(np.array(jax.devices()[:int(sys.argv[1])]), ("x",))
x = jnp.arange(64 * 128, dtype=jnp.float32).reshape(64, 128)
x = jax.device_put(x, NamedSharding(mesh, P("x")))
y = jax.jit(add_one)(x)
np.testing.assert_array_equal(y, x + 1)
print("ok")
