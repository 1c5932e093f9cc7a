"""SparseCore kernels (pytest_pallas._compat.sparsecore): every instance of a kernel over a
vector or scalar subcore mesh runs in JAX's TPU interpreter with the SparseCore's memories and
barriers; the SparseCore's primitives compute what they compute on the chip; a kernel the
interpreter cannot run as the chip does skips naming the limit. Through Pallas tests as a
user writes them, on a chip with SparseCores (v6e: 2 SparseCores of 16 subcores, 8 lanes)."""

import textwrap

CHIP = ("--pallas-chip=v6e", "--pallas-compile=none", "-p", "no:xdist", "-rs")

# Each subcore of both SparseCores writes its own row; VMEM_SHARED is one per SparseCore,
# filled by its subcores and read by its first after a barrier; a scalar subcore mesh runs
# one instance per SparseCore; fetch_and_add counts the subcores of a SparseCore in the
# first one's SMEM. Before, the interpreter ran one instance: only row 0 was written.
INSTANCES = textwrap.dedent('''
    import jax, jax.numpy as jnp, numpy as np, pytest
    from jax import lax
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu
    from jax.experimental.pallas import tpu_sc as plsc

    def vector_mesh(cores):
        return plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore",
                                      num_cores=cores)

    @pytest.mark.pallas
    def test_each_subcore_writes_its_row():
        mesh = vector_mesh(2)
        rows = mesh.num_cores * mesh.num_subcores

        @jax.jit
        @pl.kernel(out_type=jax.ShapeDtypeStruct((rows, 8), jnp.int32), mesh=mesh,
                   scratch_types=[pltpu.VMEM((8,), jnp.int32), pltpu.SemaphoreType.DMA(())])
        def kernel(o_hbm, row, sem):
            index = lax.axis_index("core") * mesh.num_subcores + lax.axis_index("subcore")
            row[...] = jnp.full((8,), index, jnp.int32)
            pltpu.async_copy(row, o_hbm.at[index], sem).wait()

        np.testing.assert_array_equal(kernel(), np.repeat(np.arange(rows), 8).reshape(rows, 8))

    @pytest.mark.pallas
    def test_vmem_shared_is_one_per_sparsecore_after_a_barrier():
        mesh = vector_mesh(2)
        subcores = mesh.num_subcores

        @jax.jit
        @pl.kernel(out_type=jax.ShapeDtypeStruct((2, subcores, 8), jnp.int32), mesh=mesh,
                   scratch_types=[pltpu.VMEM((8,), jnp.int32),
                                  pltpu.VMEM_SHARED((subcores, 8), jnp.int32)])
        def kernel(o_hbm, row, shared):
            core, subcore = lax.axis_index("core"), lax.axis_index("subcore")
            row[...] = jnp.full((8,), 100 * core + subcore, jnp.int32)
            pltpu.sync_copy(row, shared.at[subcore])
            plsc.subcore_barrier()

            @pl.when(subcore == 0)
            def _():
                pltpu.sync_copy(shared, o_hbm.at[core])

        expected = 100 * np.arange(2)[:, None] + np.arange(subcores)[None, :]
        np.testing.assert_array_equal(kernel(), np.repeat(expected[..., None], 8, axis=-1))

    @pytest.mark.pallas
    def test_a_scalar_subcore_mesh_runs_once_per_sparsecore():
        mesh = plsc.ScalarSubcoreMesh(axis_name="core", num_cores=2)

        @jax.jit
        @pl.kernel(out_type=jax.ShapeDtypeStruct((2, 8), jnp.int32), mesh=mesh,
                   scratch_types=[pltpu.VMEM_SHARED((8,), jnp.int32)])
        def kernel(x_hbm, o_hbm, shared):
            core = lax.axis_index("core")
            pltpu.sync_copy(x_hbm.at[core], shared)
            pltpu.sync_copy(shared, o_hbm.at[core])

        x = jnp.arange(16, dtype=jnp.int32).reshape(2, 8)
        np.testing.assert_array_equal(kernel(x), x)

    @pytest.mark.pallas
    def test_fetch_and_add_counts_the_subcores_of_a_sparsecore():
        mesh = vector_mesh(1)

        @jax.jit
        @pl.kernel(out_type=jax.ShapeDtypeStruct((mesh.num_subcores,), jnp.int32), mesh=mesh,
                   scratch_types=[pltpu.SMEM((1,), jnp.int32), pltpu.SMEM((1,), jnp.int32)])
        def kernel(o_hbm, counter, seen):
            subcore = lax.axis_index("subcore")
            counter[0] = 0
            plsc.subcore_barrier()
            seen[0] = plsc.fetch_and_add(counter.at[0], 1, subcore_id=0)
            plsc.subcore_barrier()

            @pl.when(subcore == 0)
            def _():
                seen[0] = counter[0]
            pltpu.sync_copy(seen, o_hbm.at[pl.ds(subcore, 1)])

        out = np.asarray(kernel())
        # Subcore 0 reads the total; the others each saw a different count before theirs.
        assert out[0] == mesh.num_subcores
        assert sorted(out[1:]) == sorted(set(out[1:])) and set(out[1:]) < set(range(16))
''')


def test_every_instance_of_a_sparsecore_kernel_runs_with_the_sparsecores_memories(
        pytester, run_pytest):
    pytester.makepyfile(test_instances=INSTANCES)
    run_pytest(*CHIP).assert_outcomes(passed=4)


# The SparseCore's value primitives, which JAX gives no CPU rule, against NumPy: each
# reference states what the primitive's docstring and JAX's own SparseCore tests say.
VALUES = textwrap.dedent('''
    import jax, jax.numpy as jnp, numpy as np, pytest
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu
    from jax.experimental.pallas import tpu_sc as plsc

    LANES = 8

    def run(body, out_shapes, *inputs):
        """``body`` of the inputs' values on one vector subcore: its results."""
        mesh = plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore",
                                      num_cores=1, num_subcores=1)
        outs = [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in out_shapes]
        n, m = len(inputs), len(outs)

        @pl.kernel(out_type=tuple(outs), mesh=mesh,
                   scratch_types=[pltpu.VMEM(x.shape, x.dtype) for x in [*inputs, *outs]],
                   compiler_params=pltpu.CompilerParams(needs_layout_passes=False))
        def kernel(*refs):
            ins_hbm, outs_hbm = refs[:n], refs[n:n + m]
            ins, results = refs[n + m:2 * n + m], refs[2 * n + m:]
            for hbm, vmem in zip(ins_hbm, ins):
                pltpu.sync_copy(hbm, vmem)
            for ref, value in zip(results, body(*(ref[...] for ref in ins))):
                ref[...] = value
            for vmem, hbm in zip(results, outs_hbm):
                pltpu.sync_copy(vmem, hbm)

        return [np.asarray(out) for out in kernel(*inputs)]

    rng = np.random.default_rng(0)
    keys = rng.permutation(LANES).astype(np.int32) - 3
    keys[5] = keys[2]
    values = rng.permutation(LANES).astype(np.int32)
    mask = np.array([1, 0, 1, 1, 0, 1, 0, 1], bool)

    @pytest.mark.pallas
    @pytest.mark.parametrize("descending", [False, True])
    def test_sort_key_val_sorts_valid_lanes_first_stably(descending):
        sorted_keys, sorted_values, out_mask = run(
            lambda k, v, m: (lambda k, v, m: (k, v, m.astype(jnp.int32)))(
                *plsc.sort_key_val(k, v, mask=m != 0, descending=descending)),
            [((LANES,), jnp.int32)] * 3,
            keys, values, mask.astype(np.int32))
        order = sorted(range(LANES), key=lambda i: (not mask[i],
                                                    (-1 if descending else 1) * keys[i]
                                                    if mask[i] else 0))
        np.testing.assert_array_equal(sorted_keys, keys[order])
        np.testing.assert_array_equal(sorted_values, values[order])
        np.testing.assert_array_equal(out_mask, np.arange(LANES) < mask.sum())

    @pytest.mark.pallas
    def test_scan_count_counts_repeats():
        x = np.array([3, 1, 3, 3, 2, 1, 7, 2], np.int32)
        counts, last = run(lambda x: (lambda c, m: (c, m.astype(jnp.int32)))(*plsc.scan_count(x)),
                           [((LANES,), jnp.int32)] * 2, x)
        np.testing.assert_array_equal(counts, [1, 1, 2, 3, 1, 2, 1, 2])
        np.testing.assert_array_equal(last, [0, 0, 0, 1, 0, 1, 1, 1])

    @pytest.mark.pallas
    @pytest.mark.parametrize("op, combine", [(plsc.cummax, np.maximum),
                                             (plsc.cumsum, np.add)])
    def test_masked_scans_pass_lanes_before_the_first_valid_through(op, combine):
        x = np.array([5, -2, 7, 1, 9, -4, 3, 0], np.int32)
        valid = np.array([0, 0, 1, 0, 1, 1, 0, 1], bool)
        (out,) = run(lambda x, m: (op(x, mask=m != 0),), [((LANES,), jnp.int32)],
                     x, valid.astype(np.int32))
        expected, total = [], None
        for value, ok in zip(x, valid):
            if ok:
                total = value if total is None else combine(total, value)
            expected.append(value if total is None else total)
        np.testing.assert_array_equal(out, expected)

    @pytest.mark.pallas
    @pytest.mark.parametrize("format", list(plsc.PackFormat))
    def test_unpack_gives_back_what_pack_narrowed(format):
        a = np.arange(LANES, dtype=np.float32) + 0.5
        b = -a
        out_a, out_b = run(
            lambda a, b: plsc.unpack(plsc.pack(a, b, format=format), format=format),
            [((LANES,), jnp.float32)] * 2, a, b)
        np.testing.assert_array_equal(out_a, a)
        np.testing.assert_array_equal(out_b, b)

    @pytest.mark.pallas
    def test_pack_interleaves():
        a = np.arange(LANES, dtype=np.float32) + 0.5
        (packed,) = run(lambda a, b: (plsc.pack(a, b, format=plsc.PackFormat.INTERLEAVED),),
                        [((2 * LANES,), jnp.bfloat16)], a, -a)
        np.testing.assert_array_equal(packed.astype(np.float32),
                                      np.stack([a, -a], -1).reshape(-1))

    @pytest.mark.pallas
    def test_bitcast_splits_each_word_little_end_first():
        x = np.arange(LANES, dtype=np.int32) * 0x01020304
        (out,) = run(lambda x: (plsc.bitcast(x, jnp.int8),), [((4 * LANES,), jnp.int8)], x)
        np.testing.assert_array_equal(out, x.view(np.int8))

    @pytest.mark.pallas
    def test_population_count_and_first_set_lane():
        x = np.array([0, 0, 1, 0, 1, 1, 0, 0], np.int32)
        count, first = run(lambda x: (plsc.all_reduce_population_count(x != 0),
                                      plsc.all_reduce_ffs(x != 0)),
                           [((LANES,), jnp.int32)] * 2, x)
        np.testing.assert_array_equal(count, np.full(LANES, 3))
        np.testing.assert_array_equal(first, np.full(LANES, 2))
''')


def test_the_sparsecores_value_primitives_compute_what_they_compute(pytester, run_pytest):
    pytester.makepyfile(test_values=VALUES)
    run_pytest(*CHIP).assert_outcomes(passed=10)


# The SparseCore's loads and stores, and its copies indexed by a ref or adding: what JAX's
# interpreter could not run (no rule) or ran wrongly (an index ref read as its buffer's id,
# add= ignored), against NumPy.
MEMORY = textwrap.dedent('''
    import jax, jax.numpy as jnp, numpy as np, pytest
    from jax import lax
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu
    from jax.experimental.pallas import tpu_sc as plsc

    LANES = 8
    x = np.arange(LANES, dtype=np.int32) * 10 + 1
    indices = np.array([3, 0, 7, 1, 6, 2, 5, 4], np.int32)
    mask = np.array([1, 0, 1, 1, 0, 1, 0, 1], bool)

    def one_subcore(out_shape, scratch, cores=1, subcores=1):
        mesh = plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore",
                                      num_cores=cores, num_subcores=subcores)
        return pl.kernel(out_type=jax.ShapeDtypeStruct(*out_shape), mesh=mesh,
                         scratch_types=scratch,
                         compiler_params=pltpu.CompilerParams(needs_layout_passes=False))

    @pytest.mark.pallas
    def test_gather_and_scatter_loads_and_stores():
        @one_subcore(((2, LANES), jnp.int32), [pltpu.VMEM((LANES,), jnp.int32)] * 3)
        def kernel(x_hbm, i_hbm, o_hbm, x_v, i_v, o_v):
            pltpu.sync_copy(x_hbm, x_v)
            pltpu.sync_copy(i_hbm, i_v)
            o_v[...] = plsc.load_gather(x_v, [i_v[...]])
            pltpu.sync_copy(o_v, o_hbm.at[0])
            o_v[...] = jnp.zeros((LANES,), jnp.int32)
            plsc.store_scatter(o_v, [i_v[...]], x_v[...], mask=i_v[...] < 4)
            pltpu.sync_copy(o_v, o_hbm.at[1])

        out = np.asarray(kernel(x, indices))
        np.testing.assert_array_equal(out[0], x[indices])
        scattered = np.zeros(LANES, np.int32)
        scattered[indices[indices < 4]] = x[indices < 4]
        np.testing.assert_array_equal(out[1], scattered)

    @pytest.mark.pallas
    def test_expanded_loads_and_compressed_stores():
        @one_subcore(((3, LANES), jnp.int32), [pltpu.VMEM((LANES,), jnp.int32)] * 2)
        def kernel(x_hbm, o_hbm, x_v, o_v):
            pltpu.sync_copy(x_hbm, x_v)
            m = ((0b10101101 >> lax.iota(jnp.int32, LANES)) & 1) == 1  # = mask
            o_v[...] = jnp.where(m, plsc.load_expanded(x_v.at[...], mask=m), -1)
            pltpu.sync_copy(o_v, o_hbm.at[0])
            o_v[...] = jnp.full((LANES,), -1, jnp.int32)
            plsc.store_compressed(o_v.at[...], x_v[...], mask=m)
            pltpu.sync_copy(o_v, o_hbm.at[1])
            o_v[...] = jnp.ones((LANES,), jnp.int32)
            plsc.addupdate_compressed(o_v.at[...], x_v[...], mask=m)
            plsc.addupdate(o_v.at[...], x_v[...])
            pltpu.sync_copy(o_v, o_hbm.at[2])

        out = np.asarray(kernel(x))
        expanded = np.full(LANES, -1, np.int32)
        expanded[mask] = x[:mask.sum()]
        np.testing.assert_array_equal(out[0], expanded)
        compressed = np.full(LANES, -1, np.int32)
        compressed[:mask.sum()] = x[mask]
        np.testing.assert_array_equal(out[1], compressed)
        added = np.ones(LANES, np.int32) + x
        added[:mask.sum()] += x[mask]
        np.testing.assert_array_equal(out[2], added)

    @pytest.mark.pallas
    def test_a_parallel_loop_runs_every_iteration_with_its_carry():
        @one_subcore(((4 * LANES,), jnp.int32), [pltpu.VMEM((4 * LANES,), jnp.int32)])
        def kernel(o_hbm, o_v):
            @plsc.parallel_loop(0, 4 * LANES, LANES, carry=jnp.int32(7))
            def body(i, carry):
                o_v[pl.ds(i, LANES)] = jnp.full((LANES,), carry, jnp.int32)
                return carry + 1
            pltpu.sync_copy(o_v, o_hbm)

        np.testing.assert_array_equal(kernel(), np.repeat(np.arange(7, 11), LANES))

    @pytest.mark.pallas
    def test_copies_gather_and_scatter_rows_by_an_index_ref():
        table = np.arange(LANES * 16, dtype=np.int32).reshape(LANES, 16)

        @one_subcore(((2, LANES, 16), jnp.int32),
                     [pltpu.VMEM((LANES,), jnp.int32), pltpu.VMEM((LANES, 16), jnp.int32)])
        def kernel(t_hbm, i_hbm, o_hbm, i_v, rows):
            pltpu.sync_copy(i_hbm, i_v)
            pltpu.sync_copy(t_hbm.at[i_v], rows)
            pltpu.sync_copy(rows, o_hbm.at[0])
            pltpu.sync_copy(t_hbm, rows)
            pltpu.sync_copy(rows, o_hbm.at[1].at[i_v])

        out = np.asarray(kernel(table, indices))
        np.testing.assert_array_equal(out[0], table[indices])
        scattered = np.empty_like(table)
        scattered[indices] = table
        np.testing.assert_array_equal(out[1], scattered)

    @pytest.mark.pallas
    def test_adding_copies_of_all_subcores_into_vmem_shared_lose_nothing():
        mesh = plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore",
                                      num_cores=1)

        @pl.kernel(out_type=jax.ShapeDtypeStruct((LANES,), jnp.int32), mesh=mesh,
                   scratch_types=[pltpu.VMEM((LANES,), jnp.int32)] * 2
                   + [pltpu.VMEM_SHARED((LANES,), jnp.int32)])
        def kernel(i_hbm, o_hbm, i_v, ones, total):
            subcore = lax.axis_index("subcore")
            pltpu.sync_copy(i_hbm, i_v)
            ones[...] = jnp.full((LANES,), subcore + 1, jnp.int32)

            @pl.when(subcore == 0)
            def _():
                pltpu.sync_copy(ones, total)
            plsc.subcore_barrier()
            pltpu.sync_copy(ones, total.at[i_v], add=True)
            plsc.subcore_barrier()

            @pl.when(subcore == 0)
            def _():
                pltpu.sync_copy(total, o_hbm)

        n = mesh.num_subcores
        np.testing.assert_array_equal(kernel(indices), np.full(LANES, 1 + n * (n + 1) // 2))
''')


def test_the_sparsecores_loads_stores_and_copies_compute_what_they_compute(
        pytester, run_pytest):
    pytester.makepyfile(test_memory=MEMORY)
    run_pytest(*CHIP).assert_outcomes(passed=5)


# A VMEM_SHARED buffer a vector subcore kernel allocates itself (pl.run_scoped): one per
# SparseCore on the chip, which the interpreter, allocating per core, cannot share; the test
# skips naming that, before the kernel computes anything. Before, it ran one instance and its
# subcores' rows were missing: the test failed.
SHARED_IN_RUN_SCOPED = textwrap.dedent('''
    import functools
    import jax, jax.numpy as jnp, numpy as np, pytest
    from jax import lax
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu
    from jax.experimental.pallas import tpu_sc as plsc

    @pytest.mark.pallas
    def test_shared_scratch_of_its_own():
        mesh = plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore",
                                      num_cores=1)

        @pl.kernel(out_type=jax.ShapeDtypeStruct((mesh.num_subcores, 8), jnp.int32),
                   mesh=mesh, scratch_types=[pltpu.VMEM((8,), jnp.int32)])
        def kernel(o_hbm, row):
            subcore = lax.axis_index("subcore")

            @functools.partial(pl.run_scoped,
                               shared=pltpu.VMEM_SHARED((mesh.num_subcores, 8), jnp.int32))
            def _(shared):
                row[...] = jnp.full((8,), subcore, jnp.int32)
                pltpu.sync_copy(row, shared.at[subcore])
                plsc.subcore_barrier()

                @pl.when(subcore == 0)
                def _():
                    pltpu.sync_copy(shared, o_hbm)

        expected = np.repeat(np.arange(mesh.num_subcores), 8).reshape(-1, 8)
        np.testing.assert_array_equal(kernel(), expected)
''')


def test_a_kernel_the_interpreter_cannot_run_as_the_chip_does_skips_naming_the_limit(
        pytester, run_pytest):
    pytester.makepyfile(test_shared_scoped=SHARED_IN_RUN_SCOPED)
    result = run_pytest(*CHIP)
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines([
        "SKIPPED [[]1[]] test_shared_scoped.py:*: pallas: JAX's TPU interpreter cannot run "
        "SparseCore kernel 'kernel' as the chip does: a VMEM_SHARED buffer allocated inside "
        "the kernel (pl.run_scoped), one per SparseCore for its subcores"])


# What the chip does before running a SparseCore kernel: JAX lowers it for Mosaic, which
# refuses a copy indexing both its ends (the test expects Mosaic's ValueError; before, the
# interpreter read the index ref as a buffer id and its wait never returned), and a test
# reading the lowered program gets the chip's Mosaic call (before: "needs to set tokens_out").
AS_THE_CHIP_LOWERS = textwrap.dedent('''
    import jax, jax.numpy as jnp, numpy as np, pytest
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu
    from jax.experimental.pallas import tpu_sc as plsc

    def mesh():
        return plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore",
                                      num_cores=1, num_subcores=1)

    @pytest.mark.pallas
    def test_mosaic_refuses_a_copy_indexed_at_both_ends():
        @pl.kernel(out_type=jax.ShapeDtypeStruct((8,), jnp.int32), mesh=mesh(),
                   scratch_types=[pltpu.VMEM((8,), jnp.int32)] * 2)
        def kernel(x_hbm, i_hbm, o_hbm, i_v, o_v):
            pltpu.sync_copy(i_hbm, i_v)
            pltpu.sync_copy(x_hbm.at[i_v], o_v.at[i_v])
            pltpu.sync_copy(o_v, o_hbm)

        with pytest.raises(ValueError, match="Only the source ref can be indexed"):
            kernel(jnp.arange(8, dtype=jnp.int32), jnp.arange(8, dtype=jnp.int32)[::-1])

    @pytest.mark.pallas
    def test_the_lowered_program_is_the_chips():
        @jax.jit
        @pl.kernel(out_type=jax.ShapeDtypeStruct((8,), jnp.int32), mesh=mesh())
        def kernel(o_hbm):
            del o_hbm

        assert "tpu_custom_call" in kernel.lower().as_text("hlo")
''')


def test_a_sparsecore_kernel_is_lowered_as_the_chip_lowers_it(pytester, run_pytest):
    pytester.makepyfile(test_lowering=AS_THE_CHIP_LOWERS)
    run_pytest(*CHIP, "--pallas-timeout=60").assert_outcomes(passed=2)
