"""The 2026 corpus: every case of tpu-inference, tokamax 0.0.17, MaxText and JAX 0.12."""

from .jax_kernels_2026 import JAX_2026_CASES
from .maxtext_corpus import MAXTEXT_CASES
from .tokamax_2026_corpus import TOKAMAX_2026_CASES
from .tpu_inference_corpus import TPU_INFERENCE_CASES

CASES_2026 = [*TPU_INFERENCE_CASES, *TOKAMAX_2026_CASES, *MAXTEXT_CASES, *JAX_2026_CASES]
