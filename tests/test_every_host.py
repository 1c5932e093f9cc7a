"""Every host: interpreted runs keep JAX on the CPU, accelerator runs give each worker a device.

A GPU workstation or a TPU VM is told to the code through fake host facts (device nodes,
installed JAX plugins): this machine has no accelerator. The end-to-end runs check what a
CPU-only host can show: the controller, every worker and the tests see JAX restricted to
the CPU, and the user's own JAX_PLATFORMS wins.
"""

import os
import textwrap

import pytest

from pytest_pallas import hosts

GPU_NODES = ["nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "null"]


def gpu_host(environ=None, nodes=GPU_NODES, plugins=("xla_cuda12",)):
    return hosts.host_accelerators(
        environ or {}, listdir=lambda path: nodes if path == "/dev" else [],
        module_installed=lambda name: False, gpu_plugins=lambda: list(plugins))


def tpu_host(environ=None, accel=4, vfio=0):
    def listdir(path):
        if path == "/dev":
            return [f"accel{i}" for i in range(accel)] + ["null"]
        if path == "/dev/vfio":
            return [str(i) for i in range(vfio)] + ["vfio"]
        return []

    return hosts.host_accelerators(environ or {}, listdir=listdir,
                                   module_installed=lambda name: name == "libtpu",
                                   gpu_plugins=lambda: [])


# --- what JAX would see, read without JAX -------------------------------------------------


def test_a_gpu_workstation_is_seen_from_its_device_nodes_and_jax_plugin():
    host = gpu_host()
    assert (host.platform, host.devices, host.description) == ("gpu", ("0", "1"),
                                                               "2 NVIDIA GPUs")


def test_cuda_visible_devices_narrows_the_gpus_and_minus_one_hides_them():
    assert gpu_host({"CUDA_VISIBLE_DEVICES": "1"}).devices == ("1",)
    assert gpu_host({"CUDA_VISIBLE_DEVICES": "-1"}).platform is None


def test_an_nvidia_gpu_without_jax_cuda_plugin_is_no_accelerator_for_jax():
    assert gpu_host(plugins=()).platform is None


def test_a_tpu_vm_is_seen_from_its_accel_or_vfio_nodes_with_libtpu_installed():
    assert tpu_host().description == "4 TPU chips"
    assert tpu_host(accel=0, vfio=8).count == 8  # v5p, v6e: /dev/vfio/<group>
    assert tpu_host({"TPU_VISIBLE_CHIPS": "2,3"}).devices == ("2", "3")


def test_this_cpu_host_has_no_accelerator_for_jax():
    # The CI machine and this one: libtpu is installed (the compile check), no TPU node.
    assert hosts.host_accelerators().platform is None


# --- keeping JAX on the CPU ---------------------------------------------------------------


def test_an_interpreted_run_sets_jax_platforms_and_names_the_gpu_it_hides():
    environ = {}
    decision = hosts.keep_jax_on_cpu(environ, gpu_host())
    assert environ["JAX_PLATFORMS"] == "cpu"
    assert not decision.by_user
    assert decision.note == ("JAX kept on the CPU (JAX_PLATFORMS=cpu): it would have seen "
                             "2 NVIDIA GPUs; --pallas-gpu runs the kernels on it")
    assert hosts.keep_jax_on_cpu({}, tpu_host()).note.endswith(
        "4 TPU chips; --pallas-tpu runs the kernels on it")
    assert hosts.keep_jax_on_cpu({}, hosts.HostAccelerators(None)).note is None


def test_the_users_jax_platforms_wins_and_the_note_says_so():
    environ = {"JAX_PLATFORMS": "cuda"}
    decision = hosts.keep_jax_on_cpu(environ, gpu_host())
    assert environ == {"JAX_PLATFORMS": "cuda"}
    assert decision.by_user
    assert decision.note.startswith("JAX_PLATFORMS=cuda (set by you) decides where JAX runs; "
                                    "interpreted kernels run on the GPU")


def test_a_worker_tells_the_plugins_setting_from_the_users():
    controller = {}
    hosts.keep_jax_on_cpu(controller, gpu_host())
    worker = dict(controller)  # a pytest-xdist worker inherits its controller's environment
    assert not hosts.keep_jax_on_cpu(worker, gpu_host()).by_user


def test_the_end_of_a_run_puts_back_what_it_found():
    outer = {}
    outer_decision = hosts.keep_jax_on_cpu(outer, gpu_host())
    inner = hosts.keep_jax_on_cpu(outer, gpu_host())  # an inner run inside a test
    hosts.undo_keep_jax_on_cpu(outer, inner)
    assert outer["JAX_PLATFORMS"] == "cpu", "the outer run is still on the CPU"
    hosts.undo_keep_jax_on_cpu(outer, outer_decision)
    assert outer == {}


# --- one device per worker on an accelerator ----------------------------------------------


def test_each_worker_gets_its_own_gpu_or_tpu_chip():
    assert hosts.worker_device_environment(gpu_host({"CUDA_VISIBLE_DEVICES": "0,1"}), 1) == {
        "CUDA_VISIBLE_DEVICES": "1"}
    assert hosts.worker_device_environment(tpu_host(), 3) == {
        "TPU_VISIBLE_CHIPS": "3", "ALLOW_MULTIPLE_LIBTPU_LOAD": "true"}
    assert hosts.worker_device_environment(hosts.HostAccelerators(None), 0) == {}


def test_never_more_workers_than_devices():
    assert hosts.workers_for_devices(2, tpu_host()) == (2, None)
    count, note = hosts.workers_for_devices(16, tpu_host())
    assert count == 4
    assert note == "4 pytest-xdist workers, not 16: one TPU each (4 TPU chips)"


@pytest.mark.parametrize("workers, expected", [("8", 4), ("2", 2), ("auto", 4)])
def test_the_controller_caps_n_at_the_chips(pytester, workers, expected):
    from pytest_pallas.plugin import workers as workers_module

    config = pytester.parseconfig("--pallas-tpu", "-n", workers)
    assert workers_module.one_device_per_worker(config, host=tpu_host()) == expected
    assert config.option.numprocesses == expected
    assert workers_module.device_split_note(config).startswith(
        f"pallas: {expected} pytest-xdist workers")


def test_a_worker_of_an_accelerator_run_sees_only_its_device(pytester):
    from pytest_pallas.plugin import workers as workers_module

    config = pytester.parseconfig("--pallas-tpu")
    environ = {"PYTEST_XDIST_WORKER": "gw2"}
    workers_module.take_this_workers_device(config, host=tpu_host(), environ=environ)
    assert environ["TPU_VISIBLE_CHIPS"] == "2"
    interpreted = pytester.parseconfig()
    untouched = {"PYTEST_XDIST_WORKER": "gw2"}
    workers_module.take_this_workers_device(interpreted, host=tpu_host(), environ=untouched)
    assert untouched == {"PYTEST_XDIST_WORKER": "gw2"}


# --- end to end, on this CPU-only host ----------------------------------------------------

# Written by the test, by each process's conftest hook (the controller and the workers),
# and read back: what JAX was told in every process of the run.
RECORDING_CONFTEST = """
    import os, sys

    def pytest_sessionfinish(session):
        jax = sys.modules.get("jax")
        told = jax.config.jax_platforms if jax is not None else "not imported"
        workerinput = getattr(session.config, "workerinput", None)
        name = workerinput["workerid"] if workerinput else "main"
        with open(f"platforms-{name}.txt", "w") as handle:
            handle.write(f"{os.environ.get('JAX_PLATFORMS')} {told}")
    """

PALLAS_TEST = """
    import os
    import jax
    import pytest

    @pytest.mark.pallas
    @pytest.mark.parametrize("case", range(4))
    def test_sees_the_cpu(case, pallas_key, request):
        assert os.environ["JAX_PLATFORMS"] == "cpu"
        assert jax.config.jax_platforms == "cpu"
        device = jax.random.normal(pallas_key, (2,)).devices().pop()
        assert device in jax.devices("cpu")
        # The flag puts the run in device mode: the test's device objects answer as
        # the stand-in chip (contract section 9), while the work stays on the CPU.
        flagged = request.config.getoption("pallas_interpret") == "tpu"
        assert device.platform == ("tpu" if flagged else "cpu")
    """


@pytest.fixture
def host_environment(monkeypatch):
    """The environment of a user's shell: no JAX setting of the plugin's outer run."""
    for name in ("JAX_PLATFORMS", hosts.SET_BY_PLUGIN, "JAX_NUM_CPU_DEVICES", "XLA_FLAGS"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.mark.parametrize("args", [(), ("-n", "2"), ("--pallas-interpret=tpu", "-n", "2")],
                         ids=["marked-one-process", "marked-workers", "flag-workers"])
def test_the_controller_the_workers_and_the_tests_see_jax_kept_on_the_cpu(
        pytester, host_environment, args):
    pytester.makeconftest(textwrap.dedent(RECORDING_CONFTEST))
    pytester.makepyfile(test_host=textwrap.dedent(PALLAS_TEST))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *args, timeout=240)
    result.assert_outcomes(passed=4)
    recorded = {path.name: path.read_text() for path in pytester.path.glob("platforms-*.txt")}
    workers = [name for name in recorded if name != "platforms-main.txt"]
    assert len(workers) == (2 if "-n" in args else 0)
    for name in workers:
        assert recorded[name] == "cpu cpu", name
    controller, told = recorded["platforms-main.txt"].split(" ", 1)
    if args and args[0].startswith("--pallas"):
        # A Pallas flag: the controller's environment, which its workers and every
        # subprocess inherit, says the CPU before anything starts.
        assert controller == "cpu"
    else:
        # Marked tests only: the controller of workers collects nothing, so it cannot know
        # they are Pallas tests; it runs none and never starts JAX.
        assert controller == "cpu" or told == "not imported"


def test_the_users_jax_platforms_wins_in_the_header(pytester, host_environment):
    host_environment.setenv("JAX_PLATFORMS", "cpu")
    pytester.makepyfile(test_host=textwrap.dedent(PALLAS_TEST))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--pallas-interpret=tpu",
                                           timeout=240)
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["pallas: JAX_PLATFORMS=cpu (set by you) decides where JAX runs"])


def test_the_header_names_the_gpu_that_jax_would_have_seen(pytester, monkeypatch):
    fake = gpu_host()
    monkeypatch.setattr(hosts, "host_accelerators", lambda *args, **kwargs: fake)
    # The outer run's own setting is put back when this inner run ends.
    before = os.environ.get("JAX_PLATFORMS")
    pytester.makepyfile(test_host=textwrap.dedent(PALLAS_TEST))
    result = pytester.runpytest("-p", "no:cacheprovider", "--pallas-interpret=tpu")
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines([
        "pallas: JAX kept on the CPU (JAX_PLATFORMS=cpu): it would have seen 2 NVIDIA GPUs; "
        "--pallas-gpu runs the kernels on it"])
    assert os.environ.get("JAX_PLATFORMS") == before


def test_a_run_of_marked_tests_without_flags_says_where_jax_runs(pytester, monkeypatch):
    fake = tpu_host()
    monkeypatch.setattr(hosts, "host_accelerators", lambda *args, **kwargs: fake)
    pytester.makepyfile(test_host=textwrap.dedent(PALLAS_TEST))
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["pallas: JAX kept on the CPU (JAX_PLATFORMS=cpu): it would "
                                 "have seen 4 TPU chips; --pallas-tpu runs the kernels on it"])


def test_jax_started_on_an_accelerator_by_a_conftest_gets_a_clear_line(pytester, monkeypatch):
    from pytest_pallas._compat import jax_internals

    # This process's JAX started long ago, on the CPU: stand in for one that started on a GPU.
    monkeypatch.setattr(jax_internals, "restrict_imported_jax_to_cpu", lambda: "gpu")
    pytester.makepyfile(test_host=textwrap.dedent(PALLAS_TEST))
    result = pytester.runpytest("-p", "no:cacheprovider", "--pallas-interpret=tpu")
    result.stdout.fnmatch_lines(["pallas: JAX had started on the GPU before pytest-pallas could "
                                 "keep it on the CPU*set JAX_PLATFORMS=cpu before pytest*"])


def test_the_default_workers_follow_the_work_not_a_constant():
    from pytest_pallas.plugin.workers import workers_for_the_work

    assert workers_for_the_work(16, 18, 64 * 2**30) == 9  # the main job on a 16-core host
    assert workers_for_the_work(2, 18, None) == 2  # this 2-core machine: unchanged
    assert workers_for_the_work(16, 4, None) == 2  # a suite of four ops
    assert workers_for_the_work(16, 18, 3 * 2**30) == 3  # no more than the memory holds
