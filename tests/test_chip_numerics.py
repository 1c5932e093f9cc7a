"""The chip's numbers on the CPU (--pallas-numerics): a default-precision float32 matmul rounds
its operands to bfloat16 as the TPU's MXU does, in the kernel and in the test's own XLA dots;
precision=HIGHEST keeps float32; a failure says which kernel's dot the chip rounds."""

import textwrap

import pytest

PROJECTION = textwrap.dedent('''
    import jax, jax.numpy as jnp, numpy as np, pytest
    from jax import lax
    from jax.experimental import pallas as pl

    def projection(x, w, precision=None):
        def kernel(x_ref, w_ref, o_ref):
            o_ref[...] = jnp.dot(x_ref[...], w_ref[...], precision=precision,
                                 preferred_element_type=jnp.float32)
        return pl.pallas_call(kernel, name="projection",
                              out_shape=jax.ShapeDtypeStruct((128, 128), jnp.float32))(x, w)

    def inputs(dtype=np.float32):
        rng = np.random.default_rng(0)
        return (rng.standard_normal((128, 128)).astype(dtype),
                rng.standard_normal((128, 128)).astype(dtype))

    def float64_reference(x, w):
        return np.asarray(x, np.float64) @ np.asarray(w, np.float64)

    @pytest.mark.pallas
    def test_holds_only_in_float32():
        x, w = inputs()
        np.testing.assert_allclose(projection(x, w), float64_reference(x, w),
                                   rtol=1e-5, atol=1e-4)

    @pytest.mark.pallas
    def test_highest_keeps_float32():
        x, w = inputs()
        np.testing.assert_allclose(projection(x, w, lax.Precision.HIGHEST),
                                   float64_reference(x, w), rtol=1e-5, atol=1e-4)

    @pytest.mark.pallas
    def test_bfloat16_kernel():
        x, w = (jnp.asarray(a, jnp.bfloat16) for a in inputs())
        expected = float64_reference(np.asarray(x, np.float32), np.asarray(w, np.float32))
        np.testing.assert_allclose(projection(x, w), expected, rtol=1e-5, atol=1e-4)

    @pytest.mark.pallas
    def test_against_xla_dot():
        x, w = inputs()
        np.testing.assert_allclose(projection(x, w), jnp.dot(x, w), rtol=1e-6, atol=1e-5)
        np.testing.assert_allclose(projection(x, w), jax.jit(jnp.dot)(x, w),
                                   rtol=1e-6, atol=1e-5)
''')


@pytest.mark.parametrize("interpreter", ["tpu", "plain"])
def test_a_float32_only_kernel_fails_as_on_the_chip_and_the_others_pass(
        pytester, run_pytest, interpreter):
    pytester.makepyfile(test_projection=PROJECTION)
    result = run_pytest(f"--pallas-interpret={interpreter}", "-p", "no:xdist")
    result.assert_outcomes(passed=3, failed=1)
    result.stdout.fnmatch_lines([
        "*test_holds_only_in_float32*",
        "pallas: kernel 'projection' had a default-precision float32 dot: the chip rounds "
        "these operands to bfloat16; precision=HIGHEST keeps float32*",
    ])
    result.stdout.fnmatch_lines(["pallas: CPU, *; numbers: TPU v5e's, default-precision "
                                 "float32 matmuls with bfloat16 operands*"])
    assert result.stdout.str().count("had a default-precision float32 dot") == 1


def test_exact_numerics_compute_in_float32(pytester, run_pytest):
    pytester.makepyfile(test_projection=PROJECTION)
    result = run_pytest("--pallas-interpret=tpu", "--pallas-numerics=exact", "-p", "no:xdist")
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["pallas: CPU, *; numbers: float32 matmul products*"])


def test_without_a_pallas_flag_nothing_rounds(pytester, run_pytest):
    # No flag: the marked tests run (interpreted) but the session was not asked for the chip;
    # without the plugin the float32-only test passes, and the XLA dot keeps float32 outside.
    pytester.makepyfile(test_plain=textwrap.dedent('''
        import jax.numpy as jnp, numpy as np

        def test_xla_dot_in_float32():
            rng = np.random.default_rng(0)
            x = rng.standard_normal((64, 64)).astype(np.float32)
            np.testing.assert_allclose(jnp.dot(x, x), np.asarray(x, np.float64) @ x,
                                       rtol=1e-5, atol=1e-4)
    '''))
    result = run_pytest("-p", "no:xdist")
    result.assert_outcomes(passed=1)
    result = run_pytest("-p", "no:xdist", "-p", "no:pallas")
    result.assert_outcomes(passed=1)


def test_numerics_option_is_validated(pytester, run_pytest):
    pytester.makepyfile(test_nothing="def test_nothing():\n    pass\n")
    result = run_pytest("--pallas-numerics=bf16", "-p", "no:xdist")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["*--pallas-numerics='bf16' is not a choice; use chip*"])


def test_rounding_is_the_chips_bit_for_bit_and_undone_after():
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax

    from pytest_pallas._compat.chip_matmuls import float32_dots_exact, float32_dots_rounded

    rng = np.random.default_rng(1)
    x = rng.standard_normal((32, 48)).astype(np.float32)
    y = rng.standard_normal((48, 16)).astype(np.float32)

    def as_bfloat16(a):
        return np.asarray(jnp.asarray(a).astype(jnp.bfloat16).astype(jnp.float32), np.float64)

    exact = np.asarray(x, np.float64) @ y
    chip = as_bfloat16(x) @ as_bfloat16(y)
    dot = jax.jit(jnp.dot)
    before = np.asarray(dot(x, y))
    with float32_dots_rounded():
        np.testing.assert_allclose(dot(x, y), chip, rtol=1e-6, atol=1e-5)
        np.testing.assert_allclose(jnp.dot(x, y), chip, rtol=1e-6, atol=1e-5)
        assert np.abs(np.asarray(dot(x, y)) - exact).max() > 1e-3
        highest = jnp.dot(x, y, precision=lax.Precision.HIGHEST)
        np.testing.assert_allclose(highest, exact, rtol=1e-5, atol=1e-5)
        # A one-pass bfloat16 dot algorithm rounds as the default precision does.
        one_pass = jnp.dot(x, y, precision=lax.DotAlgorithmPreset.BF16_BF16_F32,
                           preferred_element_type=jnp.float32)
        np.testing.assert_allclose(one_pass, chip, rtol=1e-6, atol=1e-5)
        with jax.default_matmul_precision("float32"):  # the user's own setting wins
            np.testing.assert_allclose(jax.jit(lambda a, b: a @ b)(x, y), exact,
                                       rtol=1e-5, atol=1e-5)
        with float32_dots_exact():  # a test's own float32 inside: no rounded program reused
            np.testing.assert_allclose(dot(x, y), exact, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(dot(x, y), chip, rtol=1e-6, atol=1e-5)
    np.testing.assert_array_equal(dot(x, y), before)
    assert jax.config.jax_default_matmul_precision is None


@pytest.mark.parametrize("chip", ["v4", "v5e", "v5p", "v6e", "7x"])
def test_the_table_is_what_libtpu_emits(chip, tmp_path, monkeypatch):
    # numerics.CHIP_MATMULS, read again from the TPU compiler's own dumps of a float32 dot.
    pytest.importorskip("libtpu", reason="the TPU compiler (pip install 'pytest-pallas[tpu]')")
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.experimental import pallas as pl

    import pytest_pallas
    from pytest_pallas._compat.libtpu_dump import matmul_modes
    from pytest_pallas.numerics import chip_matmuls

    def projection(precision):
        def kernel(x_ref, y_ref, o_ref):
            o_ref[...] = jnp.dot(x_ref[...], y_ref[...], precision=precision)
        return lambda x, y: pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct((128, 128), jnp.float32))(x, y)

    x = jnp.ones((128, 128), jnp.float32)
    modes = {}
    for name, precision in (("default", None), ("highest", lax.Precision.HIGHEST)):
        monkeypatch.setenv("PYTEST_PALLAS_KEEP_DUMP", str(tmp_path / name))
        pytest_pallas.estimate(projection(precision), x, x, chip=chip)
        modes[name] = matmul_modes(str(tmp_path / name))
    facts = chip_matmuls(chip)
    assert facts.default_rounding == "bfloat16" and set(modes["default"]) == {"round"}
    assert set(modes["highest"]) == set(facts.highest_modes)
    one_pass = modes["default"]["round"]
    assert sum(modes["highest"].values()) == facts.highest_passes * one_pass
    assert facts.default_passes == 1


def test_a_matrix_vector_dot_is_not_an_mxu_pass(tmp_path, monkeypatch):
    # An (8, 8) @ (8,) float32 dot in a kernel compiles to llo.vmul.f32 and vadd.xlane: float32
    # products on the chip (JAX's tpu_ops_test.py test_sum_of_two_matmuls holds it to 1e-5
    # of a HIGHEST reference), so the CPU computes it in float32 too.
    pytest.importorskip("libtpu", reason="the TPU compiler (pip install 'pytest-pallas[tpu]')")
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    import pytest_pallas
    from pytest_pallas._compat.libtpu_dump import matmul_modes

    def dot_kernel(x_ref, y_ref, o_ref):
        o_ref[...] = jnp.dot(x_ref[...], y_ref[...])

    def call(out_shape):
        return lambda x, y: pl.pallas_call(
            dot_kernel, out_shape=jax.ShapeDtypeStruct(out_shape, jnp.float32))(x, y)

    matrix, vector = jnp.ones((128, 128), jnp.float32), jnp.ones((128,), jnp.float32)
    modes = {}
    for name, y, out_shape in (("matrix", matrix, (128, 128)), ("vector", vector, (128,))):
        monkeypatch.setenv("PYTEST_PALLAS_KEEP_DUMP", str(tmp_path / name))
        pytest_pallas.estimate(call(out_shape), matrix, y, chip="v5e")
        modes[name] = matmul_modes(str(tmp_path / name))
    assert modes["matrix"] == {"round": 16}  # the dump's format is still read
    assert modes["vector"] == {}


MATRIX_VECTOR = textwrap.dedent('''
    import jax, jax.numpy as jnp, numpy as np, pytest
    from jax.experimental import pallas as pl

    @pytest.mark.pallas
    def test_matrix_vector_dot_in_float32():
        rng = np.random.default_rng(0)
        a, b = rng.standard_normal((8, 8), np.float32), rng.standard_normal(8, np.float32)
        def kernel(a_ref, b_ref, o_ref):
            o_ref[:] = jnp.dot(a_ref[:], b_ref[:])
        out = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8,), jnp.float32))(a, b)
        expected = jnp.dot(a, b, precision=jax.lax.Precision.HIGHEST)
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
''')


def test_a_matrix_vector_dot_keeps_float32_on_the_cpu(pytester, run_pytest):
    pytester.makepyfile(test_matvec=MATRIX_VECTOR)
    run_pytest("--pallas-interpret=tpu", "-p", "no:xdist").assert_outcomes(passed=1)


# JAX's pipeline tests (tpu_pallas_pipeline_test.py's test_matmul, test_pipeline_matmul): a
# kernel that accumulates 128-deep K blocks, held to `x @ y` at atol=5e-5 (about three float32
# ulps of sums near 128). On the chip both sum K a pass at a time; XLA's CPU dot summed all
# 512 at once and 1.4% of elements missed.
K_BLOCKS = textwrap.dedent('''
    import jax, jax.numpy as jnp, numpy as np, pytest
    from jax.experimental import pallas as pl

    @pytest.mark.pallas
    def test_k_blocks_accumulated_match_the_tests_own_dot():
        x = jax.random.uniform(jax.random.key(0), (512, 512))
        y = jax.random.uniform(jax.random.key(1), (512, 512))
        def kernel(x_ref, y_ref, o_ref):
            @pl.when(pl.program_id(2) == 0)
            def _():
                o_ref[...] = jnp.zeros(o_ref.shape, jnp.float32)
            o_ref[...] += jnp.dot(x_ref[...], y_ref[...])
        out = pl.pallas_call(
            kernel, grid=(4, 4, 4),
            in_specs=[pl.BlockSpec((128, 128), lambda i, j, k: (i, k)),
                      pl.BlockSpec((128, 128), lambda i, j, k: (k, j))],
            out_specs=pl.BlockSpec((128, 128), lambda i, j, k: (i, j)),
            out_shape=jax.ShapeDtypeStruct((512, 512), jnp.float32))(x, y)
        np.testing.assert_allclose(out, x @ y, atol=5e-5)
''')


def test_a_kernels_k_blocks_sum_as_the_tests_own_dot_does(pytester, run_pytest):
    pytester.makepyfile(test_k_blocks=K_BLOCKS)
    run_pytest("--pallas-interpret=tpu", "-p", "no:xdist").assert_outcomes(passed=1)


def test_a_deep_dot_sums_its_passes_in_order_and_a_shallow_one_at_once():
    import jax
    import jax.numpy as jnp
    import numpy as np

    from pytest_pallas._compat import chip_matmuls

    x = jax.random.uniform(jax.random.key(0), (16, 300))
    y = jax.random.uniform(jax.random.key(1), (300, 16))
    rounded = [a.astype(jnp.bfloat16).astype(jnp.float32) for a in (x, y)]
    highest = jax.lax.Precision.HIGHEST
    in_passes = sum((jnp.dot(rounded[0][:, s:s + 128], rounded[1][s:s + 128],
                             precision=highest) for s in (128, 256)),
                    start=jnp.dot(rounded[0][:, :128], rounded[1][:128], precision=highest))
    with chip_matmuls.float32_dots_rounded():
        deep, shallow = jnp.dot(x, y), jnp.dot(x[:, :128], y[:128])
    np.testing.assert_array_equal(deep, in_passes)  # 128 + 128 + 44, in that order
    np.testing.assert_array_equal(
        shallow, jnp.dot(rounded[0][:, :128], rounded[1][:128], precision=highest))
