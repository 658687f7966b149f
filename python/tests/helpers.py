"""Input generators shared by the Python tests."""
import numpy as np

import oracle


def rng(seed=0):
    return np.random.default_rng(seed)


def random_e4m3(r, shape, max_code=0x60):
    """Random e4m3fn codes, both signs, never NaN; magnitudes up to code max_code."""
    mag = r.integers(0, max_code + 1, size=shape).astype(np.uint8)
    sign = (r.integers(0, 2, size=shape) * 0x80).astype(np.uint8)
    return mag | sign


def bf16_bits(x):
    return oracle.f32_to_bf16_bits(np.asarray(x, dtype=np.float32))


def cos_sin_table(max_pos, base=10000.0):
    inv = base ** (-np.arange(32) / 32.0)
    ang = np.arange(max_pos)[:, None] * inv[None, :]
    return np.concatenate([np.cos(ang), np.sin(ang)], axis=1).astype(np.float32)


def e4m3_ordinal(codes):
    """Position of each code on the number line (adjacent values differ by 1; +0 and -0 are 0)."""
    c = np.asarray(codes, dtype=np.int64)
    mag = c & 0x7F
    return np.where(c & 0x80, -mag, mag)


def assert_logits_close(got, ref, absum, terms):
    """Positions of -inf exact; elsewhere the f32 accumulation bound terms * 2^-24 * sum|terms|."""
    assert got.shape == ref.shape
    inf_ref = np.isneginf(ref)
    np.testing.assert_array_equal(np.isneginf(got), inf_ref)
    bound = terms * 2.0 ** -24 * absum + 1e-30
    err = np.where(inf_ref, 0.0, np.abs(got.astype(np.float64) - np.where(inf_ref, 0.0, ref)))
    assert np.all(err <= bound), "max error / bound = %g" % np.max(err / bound)


def paged_mla_cache(r, num_blocks, page, fp8=False):
    """An MLA cache poisoned with NaN bytes (0xFF) in every slot."""
    width = 656 if fp8 else 1152
    return np.full((num_blocks, page, width), 0xFF, dtype=np.uint8)


def decode_mla_cache_token(tok, fp8):
    """Independent decode of one cache token's bytes to float64 [576]."""
    tok = np.asarray(tok, dtype=np.uint8)
    if not fp8:
        return oracle.bf16_bits_to_f64(tok.view(np.uint16))
    codes = tok[:512]
    scales = tok[512:528].view(np.float32).astype(np.float64)
    c_kv = oracle.e4m3_to_f64(codes) * np.repeat(scales, 128)
    k_pe = oracle.bf16_bits_to_f64(tok[528:656].view(np.uint16))
    return np.concatenate([c_kv, k_pe])
