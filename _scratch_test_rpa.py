import sys, numpy as np, jax, jax.numpy as jnp, pytest
sys.path.insert(0, "tests")
from real_kernels import tpu_inference_corpus as c

@pytest.mark.pallas
def test_dump():
    args = c._rpa_args()
    out, cache = c._ragged_paged_attention_v3(*args)
    ref_out, ref_cache = c._rpa_reference(*args)
    out, cache = np.asarray(out), np.asarray(cache)
    old = np.asarray(args[3])
    keys, values = np.asarray(args[1]), np.asarray(args[2])
    p = cache[29]  # (16, 4, 1, 128)
    print("page29 == old page29:", np.abs(p - old[29]).max())
    print("page29 == ref:", np.abs(p - ref_cache[29]).max())
    for name, arr in (("keys", keys), ("values", values)):
        for h in range(2):
            for start in range(0, 17):
                d = np.abs(p[:, 2*h if name=="keys" else 2*h+1, 0] - arr[start:start+16, h]).max()
                if d < 1e-6: print("page29 head", h, name, "== tokens", start)
    for pg in range(32):
        d = np.abs(cache[pg] - ref_cache[pg]).max()
        if d > 1e-6: print("page", pg, "differs", d)
    # rows of output
    for t in range(25):
        d = np.abs(out[t] - ref_out[t]).max()
        print(t, round(float(d), 4), end="; ")
