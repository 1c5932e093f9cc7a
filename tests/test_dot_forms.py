"""Every form a dot takes rounds on the CPU where the chip rounds it, on the kernel's side and
on the test's: ``pytest_pallas.numerics.DOT_FORMS``, held to the CPU's numbers under the
chip's rounding and to libtpu's own dump of each form (tests/dot_battery.py)."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import dot_battery as battery
import numpy as np
import pytest

BATTERY = os.path.join(os.path.dirname(__file__), "dot_battery.py")
DUMP = os.path.join(os.path.dirname(__file__), "data", "libtpu_dump_dots_v5e")


def test_the_table_and_the_battery_hold_the_same_forms():
    from pytest_pallas.numerics import DOT_FORMS

    assert set(DOT_FORMS) == set(battery.FORMS)
    for name, form in battery.FORMS.items():
        assert DOT_FORMS[name].side == form.side, name
        assert DOT_FORMS[name].operands in ("bfloat16", "float32"), name


@pytest.mark.parametrize("name", list(battery.FORMS))
def test_each_form_rounds_on_the_cpu_where_the_chip_does(name):
    # Where the chip rounds the operands to bfloat16, the CPU's result is the float64 result
    # of the rounded operands (to float32's accumulation) and far from float32 products;
    # where the chip computes float32 products, the reverse.
    import jax
    from jax.experimental.pallas import tpu as pltpu

    from pytest_pallas._compat.chip_matmuls import float32_dots_rounded
    from pytest_pallas.numerics import DOT_FORMS

    form = battery.FORMS[name]
    x, y = battery.inputs(form)
    with float32_dots_rounded():
        out = battery.as_float64(form.build(pltpu.InterpretParams(), jax.devices())(x, y))
    rounded, float32 = battery.references(form, x, y)
    expected, other = ((rounded, float32) if DOT_FORMS[name].operands == "bfloat16"
                       else (float32, rounded))
    np.testing.assert_allclose(out, expected, rtol=0, atol=5e-5)
    assert np.abs(out - other).max() > 1e-3


def test_the_dump_reader_tells_a_kernels_matmuls_from_xlas(tmp_path):
    # Lines of libtpu 0.0.42.1's dumps (v5e): a Pallas kernel's jnp.dot (its LLO, call.1, and
    # Mosaic's own post-lower-to-llo), XLA's jnp.dot of two float32 (128, 128) arrays, and
    # XLA's lax.dot of two vectors. The kernel's vmatmul.f32 is no XLA dot.
    from pytest_pallas._compat.libtpu_dump import DotInstructions, dot_instructions

    assert dot_instructions(DUMP) == DotInstructions(
        kernel_modes={"round": 16}, xla_formats={"bf16": 8}, float32_multiplies=1)
    # Without the program's HLO, the kernel's LLO unit would pass for one of XLA's fusions.
    for name in os.listdir(DUMP):
        if not name.endswith("TLP-hlo.txt"):
            shutil.copy(os.path.join(DUMP, name), tmp_path)
    assert dot_instructions(str(tmp_path)).xla_formats == {"bf16": 8, "f32": 16}
    assert dot_instructions(str(DUMP) + "-missing") == DotInstructions({}, {}, 0)


@pytest.fixture(scope="module")
def emitted(tmp_path_factory):
    """What libtpu emits for each form of the battery, compiled for v5e in a process of its
    own (libtpu reads its dump flags once, when it starts)."""
    pytest.importorskip("libtpu", reason="the TPU compiler (pip install 'pytest-pallas[tpu]')")
    directory = tmp_path_factory.mktemp("dot-forms")
    dump, out = directory / "dump", directory / "emitted.json"
    dump.mkdir()
    env = dict(os.environ, LIBTPU_INIT_ARGS=" ".join(filter(None, [
        os.environ.get("LIBTPU_INIT_ARGS", ""),
        f"--xla_jf_dump_to={dump} --xla_mosaic_dump_to={dump}"])))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.dirname(BATTERY),
                                                      env.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, BATTERY, str(out), str(dump), "v5e"], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("name", list(battery.FORMS))
def test_each_form_is_what_libtpu_emits(name, emitted):
    from pytest_pallas.numerics import CHIP_MATMULS, DOT_FORMS

    fact, seen = DOT_FORMS[name], emitted["forms"][name]
    default, highest = seen["default"], seen.get("highest")
    chip = CHIP_MATMULS[emitted["chip"]]
    if fact.operands == "float32":  # off the MXU: float32 vector products
        assert not default["kernel_modes"] and not default["xla_formats"], default
        assert default["float32_multiplies"] > 0, default
    elif fact.side == "kernel":  # Mosaic's one bfloat16 pass
        assert set(default["kernel_modes"]) == {"round"}, default
        if highest is not None:
            assert set(highest["kernel_modes"]) == set(chip.highest_modes), highest
    else:  # XLA: bfloat16 data, or float32 data in one pass where HIGHEST takes six
        formats = default["xla_formats"]
        assert formats and set(formats) <= {"bf16", "f32"} and not default["kernel_modes"]
        if "f32" in formats:
            assert formats["f32"] * chip.highest_passes == highest["xla_formats"]["f32"]


# tpu_fusible_matmul_test.py's test_matmul_rhs_transpose_then_add, in small: a kernel whose
# rhs block is transposed and added to before its dot, against the same expression in XLA.
# On the chip both sides round the sum to bfloat16; on the CPU XLA fused the transpose and
# the add into the kernel's dot and kept the sum in float32, while the reference (K in two
# passes) rounded it: 99.8% of elements missed.
TRANSPOSED_OPERANDS = textwrap.dedent('''
    import jax, jax.numpy as jnp, numpy as np, pytest
    from jax.experimental import pallas as pl

    def matmul(x, y, rhs):
        def kernel(x_ref, y_ref, o_ref):
            @pl.when(pl.program_id(2) == 0)
            def _():
                o_ref[...] = jnp.zeros(o_ref.shape, jnp.float32)
            o_ref[...] += rhs(x_ref[...], y_ref[...])
        m, k = x.shape
        n = y.shape[0]
        return pl.pallas_call(
            kernel, grid=(m // 128, n // 128, k // 128),
            in_specs=[pl.BlockSpec((128, 128), lambda i, j, k: (i, k)),
                      pl.BlockSpec((128, 128), lambda i, j, k: (j, k))],
            out_specs=pl.BlockSpec((128, 128), lambda i, j, k: (i, j)),
            out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32))(x, y)

    FORMS = {
        "then_add": lambda x, y: jnp.dot(x, y.T + 1.0, preferred_element_type=jnp.float32),
        "dot_general": lambda x, y: jax.lax.dot_general(
            x, y, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32),
        "matmul": lambda x, y: jnp.matmul(x, y.T, preferred_element_type=jnp.float32),
    }

    @pytest.mark.pallas
    @pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
    @pytest.mark.parametrize("form", list(FORMS))
    def test_rhs_transposed(form, dtype):
        k0, k1 = jax.random.split(jax.random.key(0))
        x = jax.random.normal(k0, (128, 256), dtype)
        y = jax.random.normal(k1, (256, 256), dtype)
        np.testing.assert_allclose(matmul(x, y, FORMS[form]), jax.jit(FORMS[form])(x, y),
                                   atol=5e-5)
''')


def test_a_transposed_operand_rounds_on_both_sides(pytester, run_pytest):
    pytester.makepyfile(test_transposed=TRANSPOSED_OPERANDS)
    run_pytest("--pallas-interpret=tpu", "-p", "no:xdist").assert_outcomes(passed=6)
