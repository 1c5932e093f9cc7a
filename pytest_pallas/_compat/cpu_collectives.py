"""JAX's gloo CPU collectives bound to the loopback interface, for processes of one host.

JAX makes its gloo collectives with ``_jax.make_gloo_tcp_collectives(distributed_client=...)``
(``jax/_src/xla_bridge.py``), and gloo then listens on the address of the machine's hostname.
Where that name does not resolve (a container with its own hostname, measured with jax
0.12.0.1: "gloo/transport/tcp/device.cc:99 rv == 0. -2 vs 0" as the CPU backend starts),
every process fails. Processes that all run on this host need nothing but 127.0.0.1, which
the function's own ``hostname`` argument (jaxlib 0.10 and 0.12 alike) selects.
"""

from __future__ import annotations

import functools

from jax._src.lib import _jax

from .jax_internals import JaxInternalsChanged

_LOOPBACK = "127.0.0.1"


def gloo_on_loopback() -> None:
    """Make JAX's gloo collectives of this process listen on 127.0.0.1 (once)."""
    make = getattr(_jax, "make_gloo_tcp_collectives", None)
    if make is None:
        raise JaxInternalsChanged(
            "jaxlib no longer has make_gloo_tcp_collectives; pytest-pallas cannot start CPU "
            "collectives for --pallas-processes on this JAX: run with --pallas-processes=1.")
    if getattr(make, "_pytest_pallas_loopback", False):
        return
    loopback = functools.partial(make, hostname=_LOOPBACK)
    loopback._pytest_pallas_loopback = True  # type: ignore[attr-defined]
    _jax.make_gloo_tcp_collectives = loopback
