"""The 2026 corpus: every case of tpu-inference, tokamax 0.0.17, MaxText and JAX 0.12."""

import pytest

from .jax_kernels_2026 import JAX_2026_CASES
from .maxtext_corpus import MAXTEXT_CASES
from .tokamax_2026_corpus import TOKAMAX_2026_CASES
from .tpu_inference_corpus import TPU_INFERENCE_CASES, V3_DONATION

CASES_2026 = [*TPU_INFERENCE_CASES, *TOKAMAX_2026_CASES, *MAXTEXT_CASES, *JAX_2026_CASES]

# What tpu-inference 0.32's kernels do that jax 0.12 warns about (`device_id_type=` on their
# semaphore signals and remote copies, through `pltpu.async_remote_copy` too; the v3 ragged
# paged attention's donated buffers) is theirs to change; the tests that run them do not
# repeat it in every run's summary.
THIRD_PARTY_WARNINGS = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning:tpu_inference.*"),
    pytest.mark.filterwarnings(
        "ignore:device_id_type is deprecated:DeprecationWarning:jax._src.pallas.mosaic.primitives"),
    V3_DONATION,
]
