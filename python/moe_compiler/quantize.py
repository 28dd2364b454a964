"""moe-quantize: a layer's bf16 expert weights quantized once, offline, into
the FP8 arguments a quantized layer takes.

    moe-quantize --scheme fp8-block128 layer.safetensors -o layer-fp8.safetensors

`w13`, `w2`, `shared_w13` and `shared_w2` become E4M3 codes with their
scales beside them (`w13_scale`, ...): f32 per 128 x 128 block for FP8
block-128 (as DeepSeek-V3 ships its weights), E8M0 per row and 32 of K for
MXFP8. Every other tensor is copied. The codes and scales are bit for bit
those of the reference quantizers (docs/numerics.md), so a layer fed them
computes what it would have computed quantizing the same weights itself.
Needs numpy and ml_dtypes only.
"""
import argparse
import sys

import ml_dtypes
import numpy as np

from .safetensors_io import SafetensorsError, SafetensorsFile, \
    write_safetensors

SCHEMES = ("fp8-block128", "mxfp8", "mxfp8-ceil")
WEIGHTS = ("w13", "w2", "shared_w13", "shared_w2")
E4M3 = ml_dtypes.float8_e4m3fn


class QuantizeError(ValueError):
    pass


def _encode_e4m3(values):
    """E4M3 codes of f32 values: round to nearest even, magnitudes past 448
    saturate (NaN stays NaN), as docs/numerics.md says."""
    return np.clip(values, np.float32(-448), np.float32(448)).astype(E4M3)


def _mx_exponent(amax, ceil):
    """The MXFP8 scale exponent of blocks whose largest magnitudes are the
    finite f32 `amax`: floor(log2 amax) - 8, or the least e with
    amax <= 448 * 2^e; -127 for an all-zero block; clamped to [-127, 127]."""
    _, exp = np.frexp(amax)  # amax in [2^(exp-1), 2^exp)
    e = exp.astype(np.int64) - 1 - 8
    if ceil:
        e = np.where(amax > np.ldexp(448.0, e), e + 1, e)
        e = np.where(amax <= np.ldexp(448.0, e - 1), e - 1, e)
    e = np.where(amax == 0, -127, e)
    return np.clip(e, -127, 127)


def quantize_weight(weight, scheme, rows_per_scale=128):
    """E4M3 codes and scales of `weight` ([E,] N, K; any float dtype numpy
    reads exactly into f32, bf16 included) under `scheme`. Returns (codes as
    float8_e4m3fn, scales as f32 [..., ceil(N/rows_per_scale), ceil(K/128)]
    or E8M0 codes as uint8 [..., N, ceil(K/32)]). FP8 block-128 scales
    blocks of 128 x 128, or of 1 x 128 with `rows_per_scale` 1 (how
    activations are scaled); MXFP8 blocks are always 1 x 32."""
    if scheme not in SCHEMES:
        raise QuantizeError(f"unknown scheme '{scheme}' (one of "
                            f"{', '.join(SCHEMES)})")
    w = np.asarray(weight).astype(np.float32)
    if w.ndim not in (2, 3):
        raise QuantizeError(f"a weight of rank {w.ndim}: expected [N, K] or "
                            f"[E, N, K]")
    squeeze = w.ndim == 2
    if squeeze:
        w = w[None]
    e, n, k = w.shape
    if scheme == "fp8-block128":
        rb = rows_per_scale
        nb, kb = -(-n // rb), -(-k // 128)
        padded = np.zeros((e, nb * rb, kb * 128), np.float32)
        padded[:, :n, :k] = np.abs(w)
        blocks = padded.reshape(e, nb, rb, kb, 128)
        # fmax skips NaN, as the reference's running max does.
        amax = np.fmax.reduce(blocks, axis=(2, 4))
        scales = np.maximum(amax, np.float32(1e-4)) / np.float32(448)
        per_element = np.repeat(np.repeat(scales, rb, 1), 128, 2)[:, :n, :k]
        codes = _encode_e4m3(w / per_element)
    else:
        kb = -(-k // 32)
        padded = np.zeros((e, n, kb * 32), np.float32)
        padded[:, :, :k] = w
        blocks = padded.reshape(e, n, kb, 32)
        special = ~np.isfinite(blocks).all(axis=-1)
        amax = np.where(special, 0, np.abs(np.nan_to_num(blocks)).max(-1))
        exp = _mx_exponent(amax, scheme == "mxfp8-ceil")
        exp = np.where(special, 0, exp)
        # Exact in f32 but below its normal range, where ldexp rounds once,
        # far below E4M3's least step.
        scaled = np.ldexp(blocks, -exp[..., None])
        codes = _encode_e4m3(scaled.reshape(e, n, kb * 32)[:, :, :k])
        scales = np.where(special, 255, exp + 127).astype(np.uint8)
    if squeeze:
        codes, scales = codes[0], scales[0]
    return codes, scales


def quantize_tensors(tensors, scheme):
    """The layer arguments `tensors` (name -> array) with their bf16 or f32
    expert and shared-expert weights quantized; returns (tensors, dtypes) for
    write_safetensors."""
    out, dtypes = {}, {}
    for name, array in tensors.items():
        if name not in WEIGHTS:
            if name.endswith("_scale") and name[:-6] in WEIGHTS:
                raise QuantizeError(f"'{name}': the weights are quantized "
                                    f"already")
            out[name] = array
            continue
        if array.dtype not in (ml_dtypes.bfloat16, np.float32):
            raise QuantizeError(f"'{name}' is {array.dtype}: moe-quantize "
                                f"takes bf16 or f32 weights")
        codes, scales = quantize_weight(array, scheme)
        out[name], out[name + "_scale"] = codes, scales
        if scales.dtype == np.uint8:
            dtypes[name + "_scale"] = "F8_E8M0"
    if not any(w in tensors for w in WEIGHTS):
        raise QuantizeError(f"no expert weights to quantize (expected "
                            f"{', '.join(WEIGHTS)})")
    return out, dtypes


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="moe-quantize",
        description="Quantize a layer's bf16 expert weights once into the "
                    "FP8 arguments of a layer compiled with --quant.")
    ap.add_argument("--scheme", required=True, choices=SCHEMES,
                    help="as moe-compile --quant names it")
    ap.add_argument("input", help="layer arguments (.safetensors)")
    ap.add_argument("-o", "--output", required=True,
                    help="the .safetensors file to write")
    opts = ap.parse_args(argv)
    try:
        source = SafetensorsFile(opts.input)
        tensors = {name: source.get(name) for name in source.keys()}
        out, dtypes = quantize_tensors(tensors, opts.scheme)
        write_safetensors(opts.output, out, dtypes)
    except (QuantizeError, SafetensorsError, OSError) as e:
        print(f"moe-quantize: {e}", file=sys.stderr)
        return 1
    done = ", ".join(w for w in WEIGHTS if w in tensors)
    print(f"moe-quantize: {done} as {opts.scheme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
