#!/usr/bin/env python3
"""Checks of an installed wheel (wheel.test, wheel-layer.test), run with the
Python it is installed into.

  where            the package's file, version and native moe-compile
  ldd              what the loader resolves for the native tools, with no
                   LD_LIBRARY_PATH
  layer CFG CONSOLE OTHER
                   CFG compiled (target cpu) by CONSOLE (the wheel's
                   moe-compile command) and by OTHER (another moe-compile);
                   both run through moe_compiler.Layer on the same random
                   inputs
"""
import os
import subprocess
import sys
import tempfile

import moe_compiler
from moe_compiler.tools import native_tool


def where():
    print(f"package: {moe_compiler.__file__}")
    print(f"version: {moe_compiler.__version__}")
    print(f"native: {native_tool('moe-compile')}")


def ldd():
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    for tool in ("moe-compile", "moe-opt"):
        print(f"{tool}:")
        sys.stdout.flush()
        subprocess.run(["ldd", native_tool(tool)], env=env, check=True)


def compile_layer(compiler, config, out):
    subprocess.run([compiler, "--from-hf-config", config, "--target=cpu",
                    "-o", out], check=True)
    return moe_compiler.Layer(out)


def layer(config, console, other):
    import torch
    from moe_compiler.module import find_compiler
    print(f"find_compiler: {find_compiler()}")
    print(f"console: {console}")
    with tempfile.TemporaryDirectory() as tmp:
        layers = [compile_layer(console, config, f"{tmp}/libwheel.so"),
                  compile_layer(other, config, f"{tmp}/libother.so")]
        dtypes = {"BF16": torch.bfloat16, "F32": torch.float32}
        tokens = 33
        outputs = []
        for lib in layers:
            # The same draws for both; outputs poisoned first.
            generator = torch.Generator().manual_seed(0)
            tensors = []
            for arg in lib.args:
                shape = [tokens if d < 0 else d for d in arg["shape"]]
                dtype = dtypes[arg["dtype"]]
                if arg["output"]:
                    tensors.append(torch.full(shape, float("nan"),
                                              dtype=dtype))
                else:
                    draw = torch.randn(shape, generator=generator)
                    tensors.append((draw / shape[-1] ** 0.5).to(dtype))
            outputs.append(lib.forward(*tensors).clone())
        same = torch.equal(outputs[0], outputs[1])
        finite = bool(torch.isfinite(outputs[0]).all())
        norm = outputs[0].float().norm().item()
        print(f"layer: {tokens} tokens, output norm {norm:.3f}, finite "
              f"{finite}, bit-identical to the other build's: {same}")
        return 0 if same and finite and norm > 0 else 1


def main():
    what = sys.argv[1]
    if what == "where":
        where()
    elif what == "ldd":
        ldd()
    elif what == "layer":
        return layer(*sys.argv[2:5])
    return 0


if __name__ == "__main__":
    sys.exit(main())
