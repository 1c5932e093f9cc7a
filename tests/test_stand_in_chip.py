"""The chip a run stands in for (--pallas-chip) is JAX's device for Pallas: TensorCore meshes,
pl.kernel and pltpu.get_tpu_info see it and its TensorCores, and every check runs a kernel on
all of them (megacore chips: 2)."""

import textwrap

MESH_ON_THE_CHIP = textwrap.dedent('''
    import dataclasses, functools
    import jax, jax.numpy as jnp, numpy as np, pytest
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu
    from pytest_pallas import check_kernel, check_uninitialized_reads

    def default_mesh():
        # As a kernel library writes it: the chip's own TensorCore count (jax 0.11 and later
        # spell it TensorCoreMesh(axis_name=...), jax 0.10 create_tensorcore_mesh(...)).
        mesh_class = getattr(pltpu, "TensorCoreMesh", None)
        if dataclasses.is_dataclass(mesh_class) and "num_cores" in {
                f.name for f in dataclasses.fields(mesh_class)}:
            return mesh_class(axis_name="core")
        return pltpu.create_tensorcore_mesh("core")

    def per_core_copy(x):
        mesh = default_mesh()
        rows = x.shape[0] // mesh.shape["core"]

        @functools.partial(pl.kernel, out_type=jax.ShapeDtypeStruct(x.shape, x.dtype), mesh=mesh)
        def copy(x_hbm, o_hbm):
            core = jax.lax.axis_index("core")
            pltpu.sync_copy(x_hbm.at[pl.ds(core * rows, rows)], o_hbm.at[pl.ds(core * rows, rows)])

        return copy(x)

    @pytest.mark.pallas
    def test_the_chip_and_its_cores(pallas_backend):
        assert dict(default_mesh().shape) == {"core": pallas_backend.tpu_info.num_cores}
        assert pltpu.get_tpu_info().num_cores == pallas_backend.tpu_info.num_cores
        x = jnp.arange(16 * 128, dtype=jnp.float32).reshape(16, 128)
        np.testing.assert_array_equal(per_core_copy(x), x)
        np.testing.assert_array_equal(check_uninitialized_reads(per_core_copy, x), x)
        assert check_kernel(per_core_copy, x) is not None
''')


def test_tensorcore_meshes_and_pl_kernel_see_the_stand_in_chip(pytester, run_pytest):
    pytester.makepyfile(test_mesh=MESH_ON_THE_CHIP)
    for chip, cores in (("v5p", 2), ("v5e", 1)):
        result = run_pytest(f"--pallas-chip={chip}", "--pallas-interpret=tpu", "-p", "no:xdist")
        result.assert_outcomes(passed=1)
        result.stdout.fnmatch_lines([f"pallas: CPU, tpu interpreter, standing in for TPU {chip} "
                                     f"({cores} TensorCore*)*"])


# JAX's paged attention split over the chip's two TensorCores: each core prefetches the next
# step's pages for itself, so run on one core the second half waits for a prefetch only the
# other core issues. check_uninitialized_reads ran it on one core and hung.
MEGACORE_PAGED_ATTENTION = textwrap.dedent('''
    import jax, jax.numpy as jnp, numpy as np, pytest
    from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention
    from pytest_pallas import assert_allclose, check_uninitialized_reads

    def inputs():
        rng = np.random.default_rng(0)
        b, h, g, d, pages, page_size = 2, 4, 2, 128, 16, 16
        q = jnp.asarray(rng.standard_normal((b, h, d)), jnp.float32)
        k = jnp.asarray(rng.standard_normal((g, pages, page_size, d)), jnp.float32)
        v = jnp.asarray(rng.standard_normal((g, pages, page_size, d)), jnp.float32)
        lengths = jnp.asarray([37, 64], jnp.int32)
        page_indices = jnp.asarray(rng.permutation(pages)[:8].reshape(b, 4), jnp.int32)
        return q, k, v, lengths, page_indices

    @pytest.mark.pallas
    @pytest.mark.parametrize("mode", ["kv_head", "batch"])
    def test_megacore_mode(mode):
        args = inputs()
        run = lambda *a: paged_attention(*a, pages_per_compute_block=2, megacore_mode=mode)
        out = check_uninitialized_reads(run, *args)
        assert_allclose(out, paged_attention(*args, pages_per_compute_block=2))
''')


def test_megacore_paged_attention_runs_on_both_cores_in_every_check(pytester, run_pytest):
    pytester.makepyfile(test_megacore=MEGACORE_PAGED_ATTENTION)
    result = run_pytest("--pallas-chip=v5p", "--pallas-interpret=tpu", "--pallas-timeout=60",
                        "-p", "no:xdist", timeout=300)
    result.assert_outcomes(passed=2)
