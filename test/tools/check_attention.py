#!/usr/bin/env python3
"""Runs a compiled attention library through moe-exec on random inputs and
compares its output with a float64 softmax attention of the same bf16
inputs.

Prints the relative error ||out - ref|| / ||ref|| and fails above --bound.
"""
import argparse
import ctypes
import json
import os
import subprocess
import sys

import numpy as np
from check_layer import write_inputs
from moe_compiler.safetensors_io import DTYPES, SafetensorsFile


def reference(q, k, v, causal, scale):
    """float64 attention: query [B, Sq, Hq, D], key/value [B, Skv, Hkv, *];
    query head h reads key/value head h // (Hq / Hkv); with `causal`, row i
    sees keys up to i + Skv - Sq; a row that sees no key gives zeros."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    b, sq, hq, _ = q.shape
    skv, hkv = k.shape[1], k.shape[2]
    group = hq // hkv
    out = np.zeros((b, sq, hq, v.shape[3]))
    visible = np.ones((sq, skv), bool)
    if causal:
        visible = np.arange(skv)[None, :] <= (np.arange(sq) + skv - sq)[:, None]
    for h in range(hq):
        kh, vh = k[:, :, h // group], v[:, :, h // group]
        s = np.einsum("bid,bjd->bij", q[:, :, h], kh) * scale
        s = np.where(visible[None], s, -np.inf)
        m = s.max(axis=2, keepdims=True, initial=-np.inf)
        m = np.where(np.isfinite(m), m, 0.0)
        p = np.exp(s - m)
        total = p.sum(axis=2, keepdims=True)
        o = np.einsum("bij,bjd->bid", p, vh)
        out[:, :, h] = np.where(total > 0, o / np.where(total > 0, total, 1), 0)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("library")
    ap.add_argument("--exec", dest="moe_exec", required=True)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--scale", type=float, help="default 1/sqrt(head size)")
    ap.add_argument("--bound", type=float, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", required=True)
    opts = ap.parse_args()

    lib = ctypes.CDLL(os.path.abspath(opts.library))
    lib.moe_layer_info.restype = ctypes.c_char_p
    info = json.loads(lib.moe_layer_info().decode())
    rng = np.random.default_rng(opts.seed)
    inputs, arrays = {}, {}
    for arg in info["args"]:
        if arg["output"]:
            continue
        values = rng.standard_normal(arg["shape"])
        arrays[arg["name"]] = values.astype(DTYPES[arg["dtype"]])
        inputs[arg["name"]] = (arg["dtype"], arrays[arg["name"]])
    os.makedirs(opts.workdir, exist_ok=True)
    given = os.path.join(opts.workdir, "in.safetensors")
    got = os.path.join(opts.workdir, "out.safetensors")
    write_inputs(given, inputs)
    subprocess.run([opts.moe_exec, opts.library, "--inputs", given,
                    "--outputs", got], check=True, stdout=subprocess.DEVNULL)
    out = SafetensorsFile(got).get("out").astype(np.float64)
    q, k, v = arrays["query"], arrays["key"], arrays["value"]
    scale = opts.scale or 1.0 / np.sqrt(q.shape[3])
    ref = reference(q, k, v, opts.causal, scale)
    # With nothing to attend to the output must be exactly zero.
    error = np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30) \
        if ref.any() else float(np.abs(out).max(initial=0.0))
    shape = "x".join(str(d) for d in q.shape) + " kv " + "x".join(
        str(d) for d in k.shape)
    print(f"{info['name']} {shape}{' causal' if opts.causal else ''}: "
          f"relative error {error:.2e} (bound {opts.bound})")
    return 0 if error <= opts.bound else 1


if __name__ == "__main__":
    sys.exit(main())
