#!/usr/bin/env python3
"""Runs a layer compiled with ep_size N through moe-exec --ep-ranks N and
checks that its output is bit for bit that of the same layer compiled with
ep_size 1, on the same random inputs.

Compiles both from an HF config (--quant as given), writes the inputs the
one-rank layer takes (all experts' weights), runs both, and compares the
output bytes. --route-to R makes every token choose experts of rank R only
(positive tokens, router rows positive for R's experts and negative for the
others). Prints one line per rank count.
"""
import argparse
import ctypes
import json
import os
import subprocess
import sys

import numpy as np
from check_layer import random_inputs, write_inputs
from moe_compiler.safetensors_io import SafetensorsFile


def layer_info(path):
    lib = ctypes.CDLL(os.path.abspath(path))
    lib.moe_layer_info.restype = ctypes.c_char_p
    return json.loads(lib.moe_layer_info().decode())


def make_inputs(info, tokens, seed, route_to, ranks):
    """check_layer's random inputs; with `route_to`, every token chooses
    experts of that rank only."""
    experts = info["config"]["experts"]

    def adjust(name, values):
        if route_to is None:
            return values
        if name == "hidden_states":
            return np.abs(values) + 0.1
        if name == "router_weight":
            local = experts // ranks
            mine = np.zeros(experts, bool)
            mine[route_to * local:(route_to + 1) * local] = True
            return np.abs(values) * np.where(mine, 1.0, -1.0)[:, None]
        if name == "router_bias":
            return np.zeros(values.shape)
        return values
    return random_inputs(info, tokens, seed, adjust)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("config")
    ap.add_argument("--compile", dest="moe_compile", required=True)
    ap.add_argument("--exec", dest="moe_exec", required=True)
    ap.add_argument("--ranks", required=True, help="comma-separated N")
    ap.add_argument("--tokens", type=int, required=True)
    ap.add_argument("--quant", default="auto")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--route-to", type=int)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--domain", help="libfabric domain (lo for tcp)")
    opts = ap.parse_args()

    os.makedirs(opts.workdir, exist_ok=True)
    name = os.path.splitext(os.path.basename(opts.config))[0]
    tag = f"{name}-{opts.quant}"
    lib1 = os.path.join(opts.workdir, f"lib{tag}-ep1.so")
    base = [opts.moe_compile, "--from-hf-config", opts.config,
            f"--quant={opts.quant}", "--name", "layer"]
    if not os.path.exists(lib1):
        subprocess.run(base + ["-o", lib1], check=True)
    info = layer_info(lib1)
    ranks = [int(n) for n in opts.ranks.split(",")]
    inputs = make_inputs(info, opts.tokens, opts.seed, opts.route_to,
                         max(ranks))
    paths = {k: os.path.join(opts.workdir, f"{tag}-{opts.tokens}-{k}"
                             ".safetensors") for k in ("in", "ep1")}
    write_inputs(paths["in"], inputs)
    subprocess.run([opts.moe_exec, lib1, "--inputs", paths["in"],
                    "--outputs", paths["ep1"]], check=True)
    expected = SafetensorsFile(paths["ep1"]).get("out")
    if opts.tokens and not np.any(expected.astype(np.float32)):
        print(f"FAIL: {tag}: the one-rank output is all zeros")
        return 1
    provider = os.environ.get("FI_PROVIDER", "shm")
    status = 0
    for n in ranks:
        lib = os.path.join(opts.workdir, f"lib{tag}-ep{n}.so")
        if not os.path.exists(lib):
            subprocess.run(base + ["--ep-size", str(n), "-o", lib],
                           check=True)
        out = os.path.join(opts.workdir, f"{tag}-{opts.tokens}-ep{n}"
                           ".safetensors")
        cmd = [opts.moe_exec, lib, "--ep-ranks", str(n), "--inputs",
               paths["in"], "--outputs", out]
        if opts.domain:
            cmd += ["--ep-domain", opts.domain]
        subprocess.run(cmd, check=True)
        got = SafetensorsFile(out).get("out")
        same = got.shape == expected.shape and \
            got.tobytes() == expected.tobytes()
        differ = 0 if same else int(np.sum(
            got.view(np.uint16) != expected.view(np.uint16)))
        where = "" if opts.route_to is None else \
            f", every token to rank {opts.route_to}"
        print(f"{tag}, {opts.tokens} tokens{where}, {n} ranks over "
              f"{provider}: " +
              ("bit-identical to one rank" if same else
               f"DIFFERS in {differ} values"))
        status |= 0 if same else 1
    return status


if __name__ == "__main__":
    sys.exit(main())
