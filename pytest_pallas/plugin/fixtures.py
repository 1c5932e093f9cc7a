"""The fixtures pytest-pallas adds: backend, seeded key, device meshes, benchmarks, conformance.

The plugin imports them, and pytest finds them there; nothing heavy is imported at load.
"""

from __future__ import annotations

import pytest

from ..suite.membership import class_binding
from .run_state import benchmark_run, run_state
from .session import session_of as _session
from .skips import device_shortfall


@pytest.fixture
def pallas_backend(request: pytest.FixtureRequest):
    """The backend this test's kernels run on: platform, chip and its facts, interpreter params.

    Example::

        def test_fits_vmem(pallas_backend):
            assert my_block_bytes() < pallas_backend.tpu_info.vmem_capacity_bytes
    """
    return _session(request.config).item_backend(request.node)


@pytest.fixture
def pallas_key(request: pytest.FixtureRequest):
    """A ``jax.random`` key derived from ``--pallas-seed`` and the test id."""
    import jax

    return jax.random.key(_session(request.config).key_seed(request.node.nodeid))


@pytest.fixture
def device_mesh(request: pytest.FixtureRequest):
    """A factory: ``device_mesh(n, axis_name="x")`` is a 1-D ``jax.sharding.Mesh`` of n devices.

    Skips the test, saying why, when fewer than n devices are available.
    """
    import jax
    import numpy as np

    backend = _session(request.config).item_backend(request.node)

    def make(count: int, axis_name: str = "x") -> jax.sharding.Mesh:
        devices = jax.devices(backend.platform)
        if count > len(devices):
            pytest.skip(device_shortfall(count, backend))
        return jax.sharding.Mesh(np.array(devices[:count]), (axis_name,))

    return make


@pytest.fixture
def pallas_benchmark(request: pytest.FixtureRequest, benchmark):
    """pytest-benchmark's ``benchmark`` for kernels: compile excluded, XLA timed beside, roofline.

    Example::

        def test_speed(pallas_benchmark):
            x = pallas_benchmark.random((1024, 1024))
            pallas_benchmark("softmax", my_softmax, x)

    See ``pytest_pallas.bench.fixture.PallasBenchmark`` for what lands in ``extra_info``.
    """
    from ..bench.fixture import PallasBenchmark

    pallas = _session(request.config)
    return PallasBenchmark.for_test(request, benchmark, pallas.item_backend(request.node),
                                    pallas.key_seed(request.node.nodeid),
                                    benchmark_run(request.config),
                                    estimate_chips=pallas.options.compile_chips)


@pytest.fixture
def conformance(request: pytest.FixtureRequest):
    """The conformance harness: draws inputs for an op and checks the chosen implementation."""
    from ..strategies import PROFILE_MOST_DEVICES
    from ..suite.harness import Conformance

    pallas = _session(request.config)
    # The door: the implementation comes from the class (``conformance_tests``) or, for a
    # packaged test, from the run's binding of the op record the test is parametrized by.
    run_state(request.config).conformance_ran = True  # the suite's state, forgotten at the end
    implementation = class_binding(getattr(request, "cls", None))
    if implementation is None:
        if not (pallas.options.conformance or pallas.options.implementations):
            pytest.skip("conformance tests run with --pallas-conformance")
        callspec = getattr(request.node, "callspec", None)
        operation = callspec.params.get("op") if callspec is not None else None
        if operation is None or getattr(operation, "name", None) not in pallas.implementations:
            pytest.fail("the conformance fixture serves the conformance suite's own tests; "
                        "check an implementation with pytest_pallas.conformance_tests(op, fn).",
                        pytrace=False)
        implementation = pallas.implementations[operation.name]
    return Conformance(implementation, pallas.item_backend(request.node), pallas.recorder,
                       interpreter_chosen=pallas.options.interpreter_chosen,
                       sweep_first=pallas.options.sweep_first, judge=pallas.options.judge,
                       row_per_chip=pallas.options.several_chips,
                       most_drawn_devices=PROFILE_MOST_DEVICES[pallas.options.profile])
