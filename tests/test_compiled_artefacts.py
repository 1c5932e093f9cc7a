"""What a test reads of a lowering or a compile is the chip's (contract §12): opted in, a
test's ``Lowered`` and ``Compiled`` texts and analyses are those of its program lowered for
the TPU and compiled by libtpu, while the same objects still compute on the CPU."""

import textwrap

import pytest

from pytest_pallas.checks.compile_check import libtpu_version

needs_libtpu = pytest.mark.skipif(libtpu_version() is None,
                                  reason="the TPU compiler (libtpu) is not installed")

# As JAX's test_cost_analysis, test_metadata_is_preserved and memory-space tests read them.
READS_THE_COMPILED_PROGRAM = textwrap.dedent('''
    import json
    import jax, jax.numpy as jnp, numpy as np, pytest
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    def copy_kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] + 1

    def add_one(x):
        return pl.pallas_call(
            copy_kernel, out_shape=jax.typeof(x), metadata={"owner": "me"},
            cost_estimate=pl.CostEstimate(flops=1234, transcendentals=21,
                                          bytes_accessed=12345))(x)

    @jax.jit
    def in_hbm(x):
        return add_one(pltpu.with_memory_space_constraint(x, pltpu.HBM))

    def test_the_compiled_program_is_the_chip_s():
        x = jnp.zeros((8, 128), jnp.float32)
        compiled = in_hbm.lower(x).compile()
        text = compiled.as_text()
        assert "tpu_custom_call" in text
        assert json.dumps({"owner": "me"}, sort_keys=True, indent=0,
                          separators=(",", ":")) in text
        analysis = compiled.cost_analysis()
        assert (analysis["flops"], analysis["transcendentals"]) == (1234, 21)
        assert compiled.memory_analysis().argument_size_in_bytes == 8 * 128 * 4
        # The test's own compiled program still computes, on the CPU.
        np.testing.assert_array_equal(compiled(x), x + 1)

    def test_the_lowered_program_is_the_chip_s():
        x = jnp.zeros((8, 128), jnp.float32)
        lowered = jax.jit(add_one).lower(x)
        assert "tpu_custom_call" in lowered.as_text()
        assert "jit_add_one" in lowered.as_text()
        np.testing.assert_array_equal(lowered.compile()(x), x + 1)

    @pytest.mark.skipif(jax.device_count() < 2, reason="needs 2 devices")
    def test_a_sharded_program_compiles_for_the_chip_s_devices():
        mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("x",))
        spec = jax.sharding.PartitionSpec("x")
        f = jax.jit(jax.shard_map(add_one, mesh=mesh, in_specs=spec, out_specs=spec))
        x = jnp.zeros((16, 128), jnp.float32)
        compiled = f.lower(x).compile()
        assert "tpu_custom_call" in compiled.as_text()
        np.testing.assert_array_equal(compiled(x), x + 1)
''')


@needs_libtpu
def test_a_test_reads_the_chip_s_compiled_program(pytester, run_pytest):
    pytester.makepyfile(test_compiled=READS_THE_COMPILED_PROGRAM)
    result = run_pytest("--pallas-interpret=tpu", "-p", "no:xdist")
    result.assert_outcomes(passed=3)


def test_without_opting_in_a_failure_says_it_read_the_interpreter_s_program(pytester,
                                                                             run_pytest):
    marked = READS_THE_COMPILED_PROGRAM.replace(
        "def test_the_compiled_program_is_the_chip_s",
        "@pytest.mark.pallas\ndef test_the_compiled_program_is_the_chip_s")
    pytester.makepyfile(test_compiled=marked)
    result = run_pytest("-p", "no:xdist", "-k", "compiled_program")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*pallas: this test read the compiled program (Compiled.as_text);"
                                 " on the CPU its Pallas kernels are compiled as JAX's "
                                 "interpreter, not as the chip's Mosaic kernel*"])


def test_without_libtpu_a_compiled_artefact_is_a_one_line_skip():
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    from pytest_pallas._compat import compiled_artefacts
    from pytest_pallas.checks.chip_tracing import chip_compiler

    with_libtpu = chip_compiler("v5e", jax.devices()[0].device_kind)
    without = compiled_artefacts.ChipCompiler(chip="v5e", lowering=with_libtpu.lowering,
                                              devices=None)

    def add_one(x):
        return pl.pallas_call(lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...] + 1),
                              out_shape=jax.typeof(x), interpret=True)(x)

    x = jnp.zeros((8, 128), jnp.float32)
    read = []
    with compiled_artefacts.chip_artefacts_read(read, without):
        lowered = jax.jit(add_one).lower(x)
        assert "tpu_custom_call" in lowered.as_text()  # a lowering needs no libtpu
        with pytest.raises(compiled_artefacts.ChipArtefactUnavailable,
                           match=r"pip install 'pytest-pallas\[tpu\]'"):
            lowered.compile().as_text()
    assert read == ["Lowered.as_text", "Compiled.as_text"]
    # Outside the block, the test's objects read as JAX made them.
    assert "tpu_custom_call" not in jax.jit(add_one).lower(x).as_text()


def test_a_program_holding_jax_s_empty_mesh_needs_no_device():
    # JAX's empty mesh (no axes, as its resource environment starts) holds one None for a
    # device; a program's params can carry it. Counting its devices raised AttributeError
    # inside a test's .lower() (tokamax's gmm_v2 perf test).
    import jax
    import numpy as np

    from pytest_pallas._compat.compiled_artefacts import _devices_needed

    empty = jax.sharding.Mesh(np.empty((), dtype=object), ())
    one = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("x",))
    assert _devices_needed((empty,)) == 0
    assert _devices_needed(({"mesh": empty}, [one])) == 1
