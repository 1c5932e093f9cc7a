#!/usr/bin/env bash
# The project's checks on a host whose JAX sees an accelerator (a GPU workstation, a TPU VM),
# with JAX_PLATFORMS unset, as a user runs them. Prints one table; docs/hardware.md records
# what it showed, with the machine and versions.
#
#   bash benchmarks/accelerator_host.sh [OUT_DIR]
#
# On a 16-core host the steps take a few minutes together (a lent machine gives a command
# ten); each step's limit stops it if it hangs, and each finished step's row is written to
# OUT_DIR/steps.txt as soon as it ends.
#
# Run from a clone of the repository, in an environment where jax (with its CUDA plugin or
# libtpu), pytest, hypothesis, pytest-xdist and pytest-benchmark are installed. The project
# is installed from the clone with --no-deps (nothing is downloaded), or from a wheel given
# as PALLAS_WHEEL=path.whl. Each step has a time limit; a step that fails is recorded and
# the next one runs.
#
# It checks, in order:
#   1. what JAX sees (its devices), with the plugin not involved, and how long JAX takes to
#      start on the CPU alone (JAX_PLATFORMS=cpu, what every interpreting worker pays);
#   2. the README's main job, `pytest --pallas-conformance --pallas-seed=0`, on the default
#      workers, then -n 8 and -n 16: all must pass, and the accelerator's memory in use
#      (nvidia-smi, sampled every 0.5 s) must not grow: the interpreted kernels and every
#      worker stay on the CPU; then each worker's CPU seconds on 16 workers
#      (benchmarks/worker_seconds.py, its table in OUT_DIR);
#   3. a Pallas test of the user's kind (the README's test_add.py): interpreted, and, where
#      the plugin has --pallas-gpu / --pallas-tpu, on the accelerator; a GPU kernel author's
#      module (tests/data/gpu_kernels) interpreted and on the GPU; the reference Mosaic GPU
#      matmul through the conformance suite on the GPU;
#   4. the project's own tests (`pytest -n 14`), which must start and pass as on a CPU host.
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
out=${1:-$(mktemp -d)}
mkdir -p "$out"
unset JAX_PLATFORMS PYTEST_PALLAS_SET_JAX_PLATFORMS
python=${PYTHON:-python3}

if [ -n "${PALLAS_WHEEL:-}" ]; then
    "$python" -m pip install --quiet --no-deps --force-reinstall "$PALLAS_WHEEL"
else
    "$python" -m pip install --quiet --no-deps --no-build-isolation -e "$repo" \
        || "$python" -m pip install --quiet --no-deps -e "$repo"
fi
if ! (cd / && "$python" -c 'import pytest_pallas') 2>/dev/null; then  # not the clone's source
    # An editable install builds with setuptools >= 77, which an offline host may lack.
    echo "pytest-pallas did not install here: build its wheel where pip can download" \
         "(python -m pip wheel --no-deps -w dist .) and run with PALLAS_WHEEL=dist/<wheel>" >&2
    exit 2
fi

rows=()
record() {  # record NAME SECONDS STATUS SUMMARY (also kept in OUT_DIR at once: a run cut
            # short by a lent machine's time limit still leaves the steps it finished)
    rows+=("$(printf '%-34s %7s s  %-6s %s' "$1" "$2" "$3" "$4")")
    printf '%s\n' "${rows[-1]}" >>"$out/steps.txt"
}

gpu_memory_used() {  # MiB in use on every GPU, summed; empty when nvidia-smi is missing
    command -v nvidia-smi >/dev/null || return 0
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null \
        | awk '{s += $1} END {print s}'
}

# run NAME LIMIT DIR COMMAND...: time a command in DIR, sample the GPU's memory meanwhile.
run() {
    local name=$1 limit=$2 dir=$3; shift 3
    local log="$out/${name// /_}.log" sampler peak start end status summary before
    before=$(gpu_memory_used)
    ( while :; do gpu_memory_used; sleep 0.5; done ) >"$log.memory" 2>/dev/null &
    sampler=$!
    start=$(date +%s.%N)
    (cd "$dir" && timeout -k 10 "$limit" "$@") >"$log" 2>&1
    status=$?
    end=$(date +%s.%N)
    kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null
    peak=$(sort -n "$log.memory" | tail -1)
    summary=$(grep -E '(passed|failed|error|no tests ran)' "$log" | tail -1 | tr -s '=' | sed 's/^ *//')
    [ -n "$before" ] && summary="$summary; GPU memory ${before} -> peak ${peak:-?} MiB"
    record "$name" "$(awk "BEGIN {printf \"%.1f\", $end - $start}")" \
        "$([ $status = 0 ] && echo ok || echo "rc=$status")" "$summary"
}

work=$(mktemp -d)
cat >"$work/test_add.py" <<'EOF'
import jax
import pytest
from jax.experimental import pallas as pl

from pytest_pallas import assert_allclose


def add_kernel(x_ref, y_ref, o_ref):
    o_ref[...] = x_ref[...] + y_ref[...]


def add(x, y):
    return pl.pallas_call(add_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x, y)


@pytest.mark.pallas
def test_add(pallas_key):
    x, y = jax.random.normal(pallas_key, (2, 256, 512))
    assert_allclose(add(x, y), x + y)
EOF

run "jax devices (no plugin)" 60 "$work" "$python" -c \
    'import jax, jaxlib; print(jax.__version__, jaxlib.__version__, jax.devices()); print("1 passed")'
# What every interpreting worker pays to start JAX on the CPU: JAX_PLATFORMS=cpu still loads
# the installed accelerator plugins (the CUDA libraries). On the 2-core CPU-only machine:
# 0.40 s, and 0.53 s with JAX's CUDA 13 plugin installed (docs/hardware.md).
run "JAX started on the CPU alone" 60 "$work" env JAX_PLATFORMS=cpu "$python" -c \
    'import jax; print(jax.devices()); print("1 passed")'
run "main job, default workers" 120 "$work" "$python" -m pytest -p no:cacheprovider \
    --pallas-conformance --pallas-seed=0
run "main job, -n 8" 120 "$work" "$python" -m pytest -p no:cacheprovider \
    --pallas-conformance --pallas-seed=0 -n 8
run "main job, -n 16" 120 "$work" "$python" -m pytest -p no:cacheprovider \
    --pallas-conformance --pallas-seed=0 -n 16
# Each worker's CPU seconds on 16 workers (cold): with a core each, the busiest worker's is
# the run's wall time; docs/main-job.md has the 2-core machine's table to compare.
run "main job, -n 16, CPU per worker" 120 "$repo" "$python" benchmarks/worker_seconds.py -n 16
run "user's test, interpreted" 120 "$work" "$python" -m pytest -p no:cacheprovider test_add.py
for flag in --pallas-gpu --pallas-tpu; do
    if "$python" -m pytest --help 2>/dev/null | grep -q -- "$flag"; then
        run "user's test, $flag" 120 "$work" "$python" -m pytest -p no:cacheprovider \
            "$flag" test_add.py
    fi
done
# A GPU kernel author's module (Mosaic GPU and Triton kernels): interpreted on the CPU, then
# compiled for the GPU.
cp "$repo/tests/data/gpu_kernels/gpu_author_tests.py" "$work/test_gpu_author.py"
run "GPU author's tests, interpreted" 180 "$work" "$python" -m pytest -p no:cacheprovider \
    test_gpu_author.py
if "$python" -c 'import jax, sys; sys.exit(not jax.devices("gpu"))' 2>/dev/null; then
    run "GPU author's tests, --pallas-gpu" 180 "$work" "$python" -m pytest -p no:cacheprovider \
        --pallas-gpu test_gpu_author.py
    run "GPU reference matmul, --pallas-gpu" 180 "$work" "$python" -m pytest -p no:cacheprovider \
        --pallas-gpu --pallas-seed=0 \
        --pallas-impl matmul=pytest_pallas.reference_kernels.gpu_matmul:matmul
fi
# Last, and within a lent machine's ten minutes a command: 16 cores take the suite in
# about two (a 2-core machine, -n 2: about ten).
run "project's tests, -n 14" 420 "$repo" "$python" -m pytest -p no:cacheprovider -n 14 -q

{
    echo "# $(date -u +%Y-%m-%dT%H:%MZ) on $(hostname), $(nproc) cores"
    command -v nvidia-smi >/dev/null && nvidia-smi -L
    "$python" -c 'import jax, sys; print("python", sys.version.split()[0], "jax", jax.__version__)'
    # Where it is set, every pytest process rewrites the plugins' modules again (about a
    # second each, docs/main-job.md#time): the times above are read with it.
    echo "PYTHONDONTWRITEBYTECODE=${PYTHONDONTWRITEBYTECODE:-(unset)}"
    printf '%-34s %9s  %-6s %s\n' step wall status summary
    printf '%s\n' "${rows[@]}"
} | tee "$out/summary.txt"
echo "logs: $out"
