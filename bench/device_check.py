"""Checks and times GPU layers compiled by moe-compile --target=sm_90a.

    python3 -m bench.device_check LIB [--cpu CPU_LIB] [--tokens N...] [--time]

For each layer and token count: fresh random inputs, the output poisoned with
NaN, one forward on the current stream, then the relative error
||out - ref|| / ||ref|| against a reference, asserted below a bound:
  --cpu LIB   the same layer compiled for the CPU (the backend that defines
              the numerics), run on the host: any layer, quantized included;
  otherwise   a float32 PyTorch reference on the GPU (bf16 layers).
With --time, the layer, its kernels (torch.profiler) and the PyTorch peer (the
grouped-mm layer of bench/common.py, same shapes) are timed in the same run.
Prints one JSON line per result.
"""
import argparse
import sys

import torch
from moe_compiler import Layer

from bench.common import (bench, emit, kernel_times, make_inputs, peer_layer,
                          route_reference)


def reference(info, named):
    """The layer in float32 (no intermediate rounding) for bf16 layers."""
    c = info["config"]
    x = named["hidden_states"].float()
    w, ids = route_reference(info, named, x)
    if c["quant"] is not None or c["activation"] != "swiglu":
        raise NotImplementedError("float32 reference covers bf16 SwiGLU")
    def swiglu(h):
        g, u = h.chunk(2, -1)
        return torch.nn.functional.silu(g) * u

    y = torch.zeros_like(x)
    w13, w2 = named["w13"], named["w2"]
    for e in range(w13.shape[0]):
        tok, slot = (ids == e).nonzero(as_tuple=True)
        if tok.numel() == 0:
            continue
        h = swiglu(x[tok] @ w13[e].float().t()) @ w2[e].float().t()
        y.index_add_(0, tok, h * w[tok, slot, None])
    if "shared_w13" in named:
        s = swiglu(x @ named["shared_w13"].float().t()) @ \
            named["shared_w2"].float().t()
        if "shared_gate" in named:
            s = s * (x @ named["shared_gate"].float().t()).sigmoid()
        y = y + s
    return y


def layer_flops(info, tokens):
    c = info["config"]
    f = 2 * tokens * c["top_k"] * 3 * c["hidden"] * c["intermediate"]
    return f + 2 * tokens * 3 * c["hidden"] * c["shared_intermediate"]


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("library")
    ap.add_argument("--cpu", help="the same layer compiled for the CPU")
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 128, 4096])
    ap.add_argument("--cpu-tokens", type=int, default=None,
                    help="with --cpu, compare only token counts up to this "
                         "(the CPU backend is slow on full-size layers); "
                         "larger ones are checked finite and timed")
    ap.add_argument("--bound", type=float, default=1e-2)
    ap.add_argument("--time", action="store_true")
    ap.add_argument("--graph", action="store_true",
                    help="also capture the forward in a CUDA graph and "
                         "replay it")
    ap.add_argument("--label", default=None)
    ap.add_argument("--seed", type=int, default=0)
    opts = ap.parse_args()

    torch.backends.cuda.matmul.allow_tf32 = False
    layer = Layer(opts.library)
    label = opts.label or layer.info["name"]
    cpu = Layer(opts.cpu) if opts.cpu else None
    dev = torch.device("cuda")
    failed = False
    for tokens in opts.tokens:
        gen = torch.Generator(device=dev).manual_seed(opts.seed + tokens)
        tensors = make_inputs(layer, tokens, gen, dev)
        named = {a["name"]: t for a, t in zip(layer.args, tensors)}
        layer.forward(*tensors)
        torch.cuda.synchronize()
        got = tensors[-1].float()
        finite = bool(torch.isfinite(got).all())
        if cpu and opts.cpu_tokens is not None and tokens > opts.cpu_tokens:
            ok = finite
            emit(what="check", layer=label, tokens=tokens,
                reference="none (finite only)", finite=finite, ok=ok)
        else:
            if cpu:
                host = [t.cpu() for t in tensors]
                host[-1] = torch.zeros_like(host[-1])
                cpu.forward(*host)
                ref = host[-1].float().to(dev)
            else:
                ref = reference(layer.info, named)
            norm = ref.norm().item()
            err = (got - ref).norm().item() / norm if norm > 0 else 0.0
            ok = finite and err <= opts.bound
            emit(what="check", layer=label, tokens=tokens,
                reference="cpu backend" if cpu else "torch float32",
                rel_error=err, bound=opts.bound, finite=finite, ok=ok)
        failed |= not ok
        if layer.token_buckets and ok:
            # A bucket's call replays its graph (captured at the bucket's
            # size, the count read from device memory); launched eagerly
            # instead, the same kernels give the same bits.
            replayed = tensors[-1].clone()
            layer.set_graphs(False)
            tensors[-1].fill_(float("nan"))
            layer.forward(*tensors)
            torch.cuda.synchronize()
            layer.set_graphs(True)
            same = bool(torch.equal(tensors[-1], replayed))
            failed |= not same
            emit(what="buckets", layer=label, tokens=tokens,
                eager_equal=same, ok=same)
        if opts.graph and ok and tokens > 0:
            # The forward neither waits nor copies: it can be captured in a
            # CUDA graph, and replays give the same output.
            first = tensors[-1].clone()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                layer.forward(*tensors)
            tensors[-1].fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            same = bool(torch.equal(tensors[-1], first))
            failed |= not same
            emit(what="graph", layer=label, tokens=tokens, replay_equal=same,
                ok=same)
        if not opts.time or not ok:
            continue
        iters = 20 if tokens <= 128 else 10
        us = bench(lambda: layer.forward(*tensors), iters)
        flops = layer_flops(layer.info, tokens)
        emit(what="time", layer=label, tokens=tokens, us=us,
            tflops=flops / us / 1e6)
        if hasattr(torch, "_grouped_mm"):
            try:
                peer = bench(peer_layer(named, layer.info), iters)
                emit(what="peer", layer=label, tokens=tokens, us=peer,
                    peer="torch grouped_mm layer")
            except Exception as ex:  # the peer's own limits, not ours
                emit(what="peer", layer=label, tokens=tokens,
                    error=repr(ex)[:200])
        if tokens == max(opts.tokens):
            emit(what="kernels", layer=label, tokens=tokens,
                us=kernel_times(layer, tensors))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
