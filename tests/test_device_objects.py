"""Opted in, JAX's device objects answer for the stand-in chip to a test and its libraries, and
for the CPU to JAX's machinery (contract §12): a library's gate on ``device.platform``, its
``get_tpu_version()`` on ``device_kind``, its mesh builder on ``coords`` all see the chip, while
meshes, shardings, ``device_put`` and ``jit`` keep working on the CPU devices underneath."""

import textwrap

import pytest

from pytest_pallas.chip_topology import slice_topology


@pytest.mark.parametrize("chip, devices, per_chip, bounds", [
    ("v5e", 1, 1, (1, 1, 1)), ("v5e", 8, 1, (2, 4, 1)), ("v6e", 16, 1, (4, 4, 1)),
    ("v5p", 8, 1, (2, 2, 2)), ("v4", 4, 1, (2, 2, 1)), ("7x", 8, 2, (2, 2, 1)),
    ("7x", 16, 2, (2, 2, 2)), ("v5e", 6, 1, (2, 3, 1)),
])
def test_a_slice_places_every_device_once_in_its_torus(chip, devices, per_chip, bounds):
    topology = slice_topology(chip, devices, devices_per_chip=per_chip)
    assert topology.bounds == bounds and topology.device_count == devices
    places = {(topology.coords(i), topology.core_on_chip(i)) for i in range(devices)}
    assert len(places) == devices
    for coords, core in places:
        assert all(0 <= c < b for c, b in zip(coords, bounds)) and 0 <= core < per_chip
    with pytest.raises(ValueError, match="not in a"):
        topology.coords(devices)


def test_devices_are_numbered_as_jax_s_fake_tpu_devices_number_them():
    # JAX's mock_tpu_devices: the core on the chip fastest, then x, then y.
    topology = slice_topology("7x", 8, devices_per_chip=2)
    assert [(topology.coords(i), topology.core_on_chip(i)) for i in range(4)] == [
        ((0, 0, 0), 0), ((0, 0, 0), 1), ((1, 0, 0), 0), ((1, 0, 0), 1)]


@pytest.fixture
def v5e_devices():
    import jax

    from pytest_pallas._compat.device_objects import ChipDevices, devices_answering_for

    topology = slice_topology("v5e", jax.device_count())
    chip = ChipDevices(device_kind="TPU v5 lite", num_cores=1, coords=topology.coords,
                       core_on_chip=topology.core_on_chip, bytes_limit=17_200_000_000)
    with devices_answering_for(chip):
        yield jax.devices()


def _read_as(module_name: str, expression: str, **names):
    """``expression`` evaluated by code of module ``module_name``."""
    return eval(expression, {"__name__": module_name, **names})


def test_a_test_sees_the_chip_and_jax_s_machinery_the_cpu(v5e_devices):
    device = v5e_devices[0]
    assert (device.platform, device.device_kind, device.num_cores) == ("tpu", "TPU v5 lite", 1)
    assert device.coords == (0, 0, 0) and device.core_on_chip == 0
    assert device.memory_stats()["bytes_limit"] == 17_200_000_000
    # JAX's machinery (meshes, shardings, dispatch) reads the CPU device it is...
    assert _read_as("jax._src.sharding_impls", "d.platform", d=device) == "cpu"
    assert _read_as("jaxlib.xla_client", "d.device_kind", d=device) == "cpu"
    assert not _read_as("jax._src.mesh_utils", "hasattr(d, 'coords')", d=device)
    assert _read_as("jax._src.xla_bridge", "d.memory_stats()", d=device) is None
    # ...while Pallas's own modules and JAX's kernel library ask for the chip they run for.
    assert _read_as("jax._src.pallas.mosaic.core", "d.num_cores", d=device) == 1
    assert _read_as("jax.experimental.pallas.ops.tpu.megablox.common",
                    "d.device_kind", d=device) == "TPU v5 lite"


def test_jax_s_machinery_keeps_working_on_the_devices_a_test_sees_as_the_chip(v5e_devices):
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    devices = v5e_devices
    mesh = Mesh(np.array(devices).reshape(2, -1), ("x", "y"))
    x = jax.device_put(jnp.arange(32.0).reshape(4, 8),
                       NamedSharding(mesh, PartitionSpec("x", "y")))
    y = jax.jit(lambda a: a * 2)(x)
    summed = jax.shard_map(lambda a: jax.lax.psum(a, "x"), mesh=mesh,
                           in_specs=PartitionSpec("x", "y"), out_specs=PartitionSpec(None, "y"))(x)
    np.testing.assert_array_equal(y, np.arange(32.0).reshape(4, 8) * 2)
    np.testing.assert_array_equal(summed, np.arange(32.0).reshape(4, 8)[:2]
                                  + np.arange(32.0).reshape(4, 8)[2:])
    # The array's devices are the same objects: the test sees the chip in them too.
    assert {d.platform for d in y.devices()} == {"tpu"}
    assert {d.platform for d in y.sharding.device_set} == {"tpu"}
    # A library that asks JAX for the TPU's devices gets the CPU devices standing in.
    assert jax.devices("tpu") == jax.devices() and jax.device_count("tpu") == len(devices)
    from jax.experimental import mesh_utils

    assert mesh_utils.create_device_mesh((2, len(devices) // 2)).shape == (2, len(devices) // 2)


def test_a_tensorcore_mesh_in_a_shard_map_counts_the_chip_s_cores(v5e_devices):
    # Inside a shard_map the abstract mesh names a device, which JAX builds from the CPU
    # devices (no num_cores); Pallas's create_tensorcore_mesh and get_tpu_info read it there.
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental.pallas import tpu as pltpu
    from jax.sharding import Mesh, PartitionSpec

    seen = {}

    def body(a):
        abstract = jax.sharding.get_abstract_mesh().abstract_device
        seen["test"] = abstract.num_cores
        seen["jax"] = _read_as("jax._src.mesh", "d.num_cores", d=abstract)
        seen["mesh"] = dict(pltpu.create_tensorcore_mesh("core").shape)
        return a

    mesh = Mesh(np.array(v5e_devices), ("x",))
    jax.shard_map(body, mesh=mesh, in_specs=PartitionSpec("x"),
                  out_specs=PartitionSpec("x"))(jnp.zeros(len(v5e_devices)))
    assert seen == {"test": 1, "jax": None, "mesh": {"core": 1}}


def test_every_answer_is_undone_on_exit():
    import jax

    from pytest_pallas._compat.device_objects import ChipDevices, devices_answering_for

    device = jax.devices()[0]
    chip = ChipDevices(device_kind="TPU7x", num_cores=1, coords=lambda i: (0, 0, 0),
                       core_on_chip=lambda i: 0, bytes_limit=1)
    with devices_answering_for(chip):
        assert device.platform == "tpu" and device.client.platform == "tpu"
    assert (device.platform, device.device_kind, device.client.platform) == ("cpu",) * 3
    assert not any(hasattr(device, name) for name in ("coords", "core_on_chip", "num_cores"))
    assert device.memory_stats() is None
    with pytest.raises(RuntimeError):
        jax.devices("tpu")
    abstract = jax.sharding.AbstractDevice(device_kind="cpu", num_cores=None, platform="cpu")
    assert abstract.num_cores is None and not isinstance(
        vars(jax.sharding.AbstractDevice)["num_cores"], property)


# A kernel library as libraries are written: an op that dispatches on its device object, a
# generation read from the device kind, a mesh built from the devices' coordinates.
LIBRARY = textwrap.dedent('''
    import jax, numpy as np
    from jax.experimental import pallas as pl

    def tpu_version():
        kind = jax.devices()[0].device_kind
        if not kind.startswith("TPU"):
            return -1
        return int(kind.removeprefix("TPU").strip().lstrip("v").split()[0].rstrip("x"))

    def supported_on(device):
        return device.platform == "tpu"

    def mesh_by_coords():
        devices = sorted(jax.devices(), key=lambda d: (d.coords[1], d.coords[0], d.core_on_chip))
        return jax.sharding.Mesh(np.array(devices).reshape(2, -1), ("x", "y"))

    def add_one(x):
        if not supported_on(x.devices().pop()):
            raise NotImplementedError(f"Not supported on {jax.devices()[0].platform}.")
        def kernel(x_ref, o_ref):
            o_ref[...] = x_ref[...] + 1.0
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
''')

LIBRARY_TESTS = textwrap.dedent('''
    import jax, jax.numpy as jnp, numpy as np, pytest
    import mylib

    def test_the_op_runs_where_its_device_says_tpu():
        if mylib.tpu_version() < 5:
            pytest.skip(f"Unsupported tpu_version={mylib.tpu_version()}")
        x = jnp.ones((8, 128), jnp.float32)
        np.testing.assert_array_equal(mylib.add_one(x), x + 1.0)

    def test_a_mesh_from_coordinates():
        if jax.devices()[0].platform != "tpu":
            pytest.skip("TPU only")
        mesh = mylib.mesh_by_coords()
        print("MESH", dict(mesh.shape), sorted({d.coords for d in jax.devices()})[-1],
              {d.core_on_chip for d in jax.devices()}, mylib.tpu_version())
        x = jax.device_put(jnp.arange(16.0).reshape(2, 8), jax.sharding.NamedSharding(
            mesh, jax.sharding.PartitionSpec("x", "y")))
        np.testing.assert_array_equal(jax.jit(lambda a: a + 1)(x),
                                      np.arange(16.0).reshape(2, 8) + 1)
''')


def test_a_library_that_asks_its_device_objects_runs_as_on_the_chip(pytester, run_pytest):
    pytester.makepyfile(mylib=LIBRARY, test_mylib=LIBRARY_TESTS)
    result = run_pytest("--pallas-interpret=tpu", "-p", "no:xdist", "-s")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*MESH {'x': 2, 'y': 4} (1, 3, 0) {0} 5"])
    # A 7x: two devices on each chip, its generation from the device kind.
    result = run_pytest("--pallas-chip=7x", "-p", "no:xdist", "-s")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*MESH *(1, 1, 0) {0, 1} 7"])


def test_without_opting_in_the_library_sees_the_cpu(pytester, run_pytest):
    pytester.makepyfile(mylib=LIBRARY, test_mylib=LIBRARY_TESTS)
    result = run_pytest("-p", "no:xdist", "-rs")
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines(["*Unsupported tpu_version=-1*"])


# A test of the chip's info API as JAX's own are written: asked in setUp, before any kernel.
INFO_TESTS = textwrap.dedent('''
    import jax
    from absl.testing import absltest
    from jax._src import test_util as jtu
    from jax.experimental.pallas import tpu as pltpu
    from jax.experimental.pallas import tpu_sc as plsc

    class InfoTest(jtu.JaxTestCase):
        def setUp(self):
            super().setUp()
            if not jtu.is_device_tpu():
                self.skipTest("not a TPU")
            self.assertTrue(pltpu.is_tpu_device())
            self.info = pltpu.get_tpu_info()

        def test_the_info_is_the_chip_s(self):
            info = self.info
            version = info.chip_version
            self.assertEqual(info, pltpu.get_tpu_info_for_chip(version, info.num_cores))
            self.assertEqual(jax.devices()[0].num_cores, info.num_cores)
            sparse = plsc.get_sparse_core_info() if info.sparse_core else None
            print("INFO", version, info.generation, info.num_cores, info.is_lite,
                  info.is_megacore, info.is_split_chip, info.vmem_capacity_bytes // 2**20,
                  info.mxu_column_size, sparse and sparse.num_subcores,
                  info.is_matmul_supported("bfloat16", "bfloat16"))
''')


@pytest.mark.parametrize("chip, line", [
    ("v5e", "*INFO v5e 5 1 True False False 128 128 None True"),
    ("v5p", "*INFO v5p 5 2 False True False 64 128 16 True"),
    ("7x", "*INFO 7x 7 1 False False True 64 256 16 True"),
])
def test_the_chip_s_info_answers_for_the_whole_test(pytester, run_pytest, chip, line):
    pytester.makepyfile(test_info=INFO_TESTS)
    result = run_pytest(f"--pallas-chip={chip}", "-p", "no:xdist", "-s")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([line])
