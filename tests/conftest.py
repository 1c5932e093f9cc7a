"""Shared helpers for the plugin's own tests."""

import pytest

# pytester's in-process runs restore sys.modules afterwards; JAX's native
# runtime cannot be imported twice in one process, so keep it imported here.
import jax  # noqa: F401
import jax.experimental.pallas  # noqa: F401
import jax.experimental.pallas.tpu  # noqa: F401

pytest_plugins = ["pytester"]


@pytest.fixture
def run_pytest(pytester):
    """Run pytest in a subprocess (fresh JAX, fresh device count) in pytester's tmp dir."""

    def run(*args, timeout=240):
        return pytester.runpytest_subprocess("-p", "no:cacheprovider", *args, timeout=timeout)

    return run
