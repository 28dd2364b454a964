#!/usr/bin/env python3
"""Checks the reference quantizers bit for bit against ml_dtypes.

Random matrices (normal, wide-range and special values: zeros, float32 and
E4M3 subnormals, values at and past +-448, ties, all-equal blocks) go through
moe-quantize-reference; every E4M3 and E8M0 code must equal what ml_dtypes'
float8_e4m3fn and float8_e8m0fnu conversions give for the same arithmetic.
Values past 448 are compared after clamping to +-448 (ml_dtypes turns them
into NaN; the quantizers saturate, as docs/numerics.md says).
"""
import argparse
import json
import subprocess
import sys
import tempfile

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

E4M3 = ml_dtypes.float8_e4m3fn
E8M0 = ml_dtypes.float8_e8m0fnu


def e4m3_codes(values):
    clamped = np.clip(values, -448.0, 448.0)
    return clamped.astype(E4M3).view(np.uint8)


def mx_reference(x, rounding):
    rows, cols = x.shape
    blocks = -(-cols // 32)
    data = np.zeros((rows, cols), np.uint8)
    scales = np.zeros((rows, blocks), np.uint8)
    for b in range(blocks):
        block = x[:, b * 32:(b + 1) * 32].astype(np.float64)
        amax = np.abs(block).max(axis=1)
        _, exp = np.frexp(amax)
        e = exp.astype(np.int64) - 1 - 8
        if rounding == "ceil":
            for i in np.flatnonzero(amax):
                while amax[i] > 448.0 * 2.0 ** e[i]:
                    e[i] += 1
                while amax[i] <= 448.0 * 2.0 ** (e[i] - 1):
                    e[i] -= 1
        e = np.where(amax == 0, -127, np.clip(e, -127, 127))
        scales[:, b] = np.array([np.float32(2.0 ** int(v)) for v in e],
                                np.float32).astype(E8M0).view(np.uint8)
        data[:, b * 32:(b + 1) * 32] = e4m3_codes(block / (2.0 ** e[:, None]))
    return data, scales


def block128_reference(x, block_rows):
    rows, cols = x.shape
    data = np.zeros((rows, cols), np.uint8)
    scales = np.zeros((-(-rows // block_rows), -(-cols // 128)), np.float32)
    for rb in range(scales.shape[0]):
        for cb in range(scales.shape[1]):
            tile = x[rb * block_rows:(rb + 1) * block_rows, cb * 128:(cb + 1) * 128]
            scale = np.maximum(np.abs(tile).max(), np.float32(1e-4)) / np.float32(448.0)
            scales[rb, cb] = scale
            data[rb * block_rows:(rb + 1) * block_rows, cb * 128:(cb + 1) * 128] = \
                e4m3_codes((tile / scale).astype(np.float32))
    return data, scales


def load_raw(path):
    """Reads a safetensors file without numpy's dtype registry (it lacks
    float8): one-byte tensors come back as uint8 codes."""
    with open(path, "rb") as f:
        raw = f.read()
    size = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + size])
    kinds = {"F8_E4M3": np.uint8, "F8_E8M0": np.uint8, "F32": np.float32}
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        out[name] = np.frombuffer(raw[8 + size + begin:8 + size + end],
                                  kinds[info["dtype"]]).reshape(info["shape"])
    return out


def matrices(rng):
    yield "normal", rng.standard_normal((64, 256)).astype(np.float32)
    yield "wide range", (rng.standard_normal((32, 100)) *
                         2.0 ** rng.integers(-40, 40, (32, 100))).astype(np.float32)
    special = rng.standard_normal((16, 160)).astype(np.float32)
    special[0, :] = 0.0                                  # all-zero rows
    special[1, :] = 3.0                                  # all-equal blocks
    special[2, :32] = np.float32(1e-45)                  # float32 subnormals
    special[3, :] = 448.0 * np.sign(rng.standard_normal(160))
    special[4, :] = rng.choice([464.0, 480.0, 1e6, -1e30], 160)
    special[5, :] = 2.0 ** -9 * rng.integers(0, 17, 160) / 2.0  # E4M3 subnormal ties
    special[6, :] = -0.0
    special[7, :] = (1.0 + rng.integers(0, 16, 160) / 16.0) * 2.0 ** rng.integers(-6, 8, 160)
    yield "special values", special
    yield "ragged", rng.standard_normal((130, 33)).astype(np.float32) * 1e3
    # Tiny amax: scales at the bottom of the E8M0 and f32 ranges.
    yield "tiny", (rng.standard_normal((4, 64)) * 1e-38).astype(np.float32)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("tool")
    ap.add_argument("--seed", type=int, default=0)
    opts = ap.parse_args()
    rng = np.random.default_rng(opts.seed)
    passed = failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, x in matrices(rng):
            save_file({"x": x}, f"{tmp}/in.safetensors")
            subprocess.run([opts.tool, f"{tmp}/in.safetensors", f"{tmp}/out.safetensors"],
                           check=True)
            got = load_raw(f"{tmp}/out.safetensors")
            expected = {}
            expected["mx_floor_data"], expected["mx_floor_scales"] = mx_reference(x, "floor")
            expected["mx_ceil_data"], expected["mx_ceil_scales"] = mx_reference(x, "ceil")
            expected["b128_data"], expected["b128_scales"] = block128_reference(x, 1)
            expected["b128w_data"], expected["b128w_scales"] = block128_reference(x, 128)
            for key, want in expected.items():
                have = got[key]
                same = np.array_equal(have.view(np.uint8), want.view(np.uint8))
                if same:
                    passed += 1
                else:
                    failed += 1
                    bad = np.argwhere(have.view(np.uint8) != want.view(np.uint8))[:5]
                    print(f"FAIL {name} {key}: first differences at {bad.tolist()}: "
                          f"ours {[have[tuple(i)] for i in bad]} "
                          f"ml_dtypes {[want[tuple(i)] for i in bad]}")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
