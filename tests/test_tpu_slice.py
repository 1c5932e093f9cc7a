"""pytest --pallas-tpu on every host of a multi-host slice: the hosts read from the TPU
environment (fake facts here), process 0's seed and tests taken by every host (two CPU
processes joined by jax.distributed stand in for two hosts)."""

import subprocess
import sys
import textwrap

import pytest

from pytest_pallas.slice_hosts import SliceHosts, slice_hosts


@pytest.mark.parametrize(("environ", "expected"), [
    ({}, None),
    ({"TPU_WORKER_HOSTNAMES": "t1k-0", "TPU_WORKER_ID": "0"}, None),  # one host
    ({"TPU_WORKER_HOSTNAMES": "h0,h1,h2,h3", "TPU_WORKER_ID": "2"},
     SliceHosts(process=2, processes=4, hosts=("h0", "h1", "h2", "h3"))),
    ({"TPU_PROCESS_ADDRESSES": "a:1,b:1", "TPU_WORKER_HOSTNAMES": "x,y,z",
      "TPU_WORKER_ID": "1"}, SliceHosts(process=1, processes=2, hosts=("a:1", "b:1"))),
    ({"TPU_WORKER_HOSTNAMES": "h0,h1", "TPU_WORKER_ID": "1", "MEGASCALE_NUM_SLICES": "2",
      "MEGASCALE_SLICE_ID": "1"}, SliceHosts(process=3, processes=4, hosts=("h0", "h1"))),
    ({"TPU_WORKER_HOSTNAMES": "h0,h1", "TPU_WORKER_ID": "unknown"}, None),
    ({"TPU_WORKER_HOSTNAMES": "h0,h1", "TPU_WORKER_ID": "5"}, None),
])
def test_the_slice_is_read_from_the_tpu_environment(environ, expected):
    assert slice_hosts(environ) == expected


HOST = textwrap.dedent('''
    import json, sys
    from pytest_pallas.plugin.processes import join_processes
    from pytest_pallas.plugin.tpu_slice import agreed_order, agreed_seed

    process, port = int(sys.argv[1]), sys.argv[2]
    join_processes(f"127.0.0.1:{port}", 2, process)
    mine = ["t.py::a", "t.py::b", "t.py::c"] if process == 0 else ["t.py::c", "t.py::a"]
    print(json.dumps([agreed_seed(str(1000 + process)), *agreed_order(mine)]), flush=True)
''')


def test_every_host_takes_process_0s_seed_and_tests(tmp_path):
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    script = tmp_path / "host.py"
    script.write_text(HOST)
    hosts = [subprocess.Popen([sys.executable, str(script), str(process), str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for process in range(2)]
    try:
        outputs = [host.communicate(timeout=120) for host in hosts]
    finally:
        for host in hosts:
            host.kill()
    import json

    answers = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    # Process 0's seed and order everywhere; host 1 lacks one of process 0's tests.
    assert answers == [[1000, ["t.py::a", "t.py::b", "t.py::c"], [0, 1]]] * 2
