"""A training library whose activations' quantization is fused into the
kernels that produce them (moe-compile's default) against one built
without (--fuse-quantization=false), on the CPU backend: the training
forward's output and every gradient, bit for bit, on random inputs.

    check_train_fused.py FUSED.so STEPS.so [--tokens T]

The libraries take a layer's tokens and bf16 weights (router, gate/up,
down) as moe-compile --train builds them. Prints "fused = unfused" or what
differs, and exits 1 then.
"""
import argparse
import sys

import torch
from moe_compiler import Layer


def step(path, inputs, dy):
    layer = Layer(path)
    tokens = inputs[0].shape[0]
    saved = torch.zeros(layer.saved_size(tokens), dtype=torch.uint8)
    grads = [torch.full(shape, float("nan"), dtype=dtype)
             for _, dtype, shape in layer.gradient_shapes(tokens)]
    out = torch.full_like(inputs[0], float("nan"))
    layer.forward_train(*inputs, out, saved=saved)
    layer.backward(list(inputs), dy, saved, grads)
    names = ["output"] + [name for name, _, _ in
                          layer.gradient_shapes(tokens)]
    return dict(zip(names, [out] + grads))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("fused")
    parser.add_argument("steps")
    parser.add_argument("--tokens", type=int, default=45)
    args = parser.parse_args()
    gen = torch.Generator().manual_seed(0)
    # Every argument but the last (the output) is an input.
    inputs = []
    for spec in Layer(args.fused).args[:-1]:
        shape = [args.tokens if d < 0 else d for d in spec["shape"]]
        inputs.append((torch.randn(*shape, generator=gen) /
                       shape[-1] ** 0.5).bfloat16())
    dy = torch.randn(*inputs[0].shape, generator=gen).bfloat16()
    fused = step(args.fused, inputs, dy)
    steps = step(args.steps, inputs, dy)
    differ = [name for name in fused
              if not torch.equal(fused[name].view(torch.uint8),
                                 steps[name].view(torch.uint8))]
    if differ:
        print("fused and unfused differ in: " + ", ".join(differ))
        sys.exit(1)
    print(f"fused = unfused ({len(fused)} tensors)")


if __name__ == "__main__":
    main()
