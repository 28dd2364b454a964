"""The latency curve of GPU layers: time per forward against token count.

For each layer and token count, with random inputs:
  graph_us   GPU time per forward with the host ahead of the GPU (forwards
             enqueued behind a spin kernel, then timed by CUDA events): a
             layer with token buckets replays its bucket's CUDA graph;
  eager_us   the same with the layer's graphs off (its kernels launched one
             by one, as a layer without buckets always is);
  *_b2b_us   back-to-back forwards timed the same way, host cost included;
  kernels_us the sum of the layer's kernels' device times (torch.profiler,
             eager), per_kernel_us each;
  bound_us   the bytes of weights the forward must read (router, the
             distinct experts the tokens chose, shared experts) at --hbm TB/s.
With --peer the PyTorch grouped-mm layer of bench/common.py runs on the same
inputs in the same run. A layer with buckets also reports its warm-up (every
bucket's graph captured) and first-call capture times. One JSON line per
layer and token count.

    python3 -m bench.latency LIB... [--tokens N...] [--peer] [--kernels]
"""
import argparse
import time

import torch
from moe_compiler import Layer

from bench.common import bench, emit, kernel_times, make_inputs, peer_layer


def weight_bytes(layer, named, tokens):
    """Bytes of weights a forward of `tokens` reads: the router, each expert
    some token chose (from the inputs' own routing, as softmax or sigmoid
    top-k picks the largest logits), and the shared experts."""
    c = layer.info["config"]
    per_byte = {"BF16": 2, "F32": 4, "F8_E4M3": 1, "F8_E8M0": 1, "I32": 4}
    total, per_expert = 0, 0
    experts = c["experts"]
    for a in layer.args:
        if a["output"] or a["shape"] and a["shape"][0] < 0:
            continue
        n = per_byte[a["dtype"]]
        for d in a["shape"]:
            n *= d
        if a["shape"] and a["shape"][0] == experts and "router" not in a["name"]:
            per_expert += n // experts
        else:
            total += n
    if tokens == 0:
        return total
    x = named["hidden_states"].float()
    logits = x @ named["router_weight"].float().t()
    chosen = logits.topk(c["top_k"], dim=-1).indices.unique().numel()
    return total + chosen * per_expert


def queued(fn, iters):
    """GPU us per call with the host enqueuing ahead of the GPU."""
    return bench(fn, iters, warm=1, ahead=True)


def back_to_back(fn, iters):
    """us per call, host cost included."""
    return bench(fn, iters, warm=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("libraries", nargs="+")
    ap.add_argument("--tokens", type=int, nargs="+",
                    default=[1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024,
                             2048, 4096])
    ap.add_argument("--hbm", type=float, default=3.0, help="TB/s")
    ap.add_argument("--label", default="")
    ap.add_argument("--peer", action="store_true")
    ap.add_argument("--kernels", action="store_true")
    opts = ap.parse_args()
    dev = torch.device("cuda")
    for path in opts.libraries:
        layer = Layer(path)
        name = layer.info["name"]
        buckets = layer.token_buckets
        if buckets:
            gen = torch.Generator(device=dev).manual_seed(0)
            tensors = make_inputs(layer, buckets[-1], gen, dev)
            took = layer.warmup(*tensors)
            emit(layer=name, label=opts.label, what="warmup",
                 buckets=buckets, seconds=took)
        for tokens in opts.tokens:
            gen = torch.Generator(device=dev).manual_seed(tokens)
            tensors = make_inputs(layer, tokens, gen, dev)
            named = {a["name"]: t for a, t in zip(layer.args, tensors)}
            iters = 50 if tokens <= 256 else 10
            fwd = lambda: layer.forward(*tensors)  # noqa: E731
            row = dict(layer=name, label=opts.label, tokens=tokens,
                       bound_us=weight_bytes(layer, named, tokens)
                       / opts.hbm / 1e6)
            if buckets:
                # The first call on new tensors captures (or updates) the
                # bucket's graph.
                torch.cuda.synchronize()
                start = time.perf_counter()
                fwd()
                torch.cuda.synchronize()
                row["first_call_us"] = (time.perf_counter() - start) * 1e6
                row["graph_us"] = queued(fwd, iters)
                row["graph_b2b_us"] = back_to_back(fwd, iters)
                layer.set_graphs(False)
            row["eager_us"] = queued(fwd, iters)
            row["eager_b2b_us"] = back_to_back(fwd, iters)
            if opts.kernels:
                times = kernel_times(layer, tensors)
                row["kernels_us"] = sum(times.values())
                row["per_kernel_us"] = {k: round(v, 1)
                                        for k, v in times.items()}
            layer.set_graphs(True)
            if opts.peer and hasattr(torch, "_grouped_mm"):
                try:
                    peer = peer_layer(named, layer.info)
                    row["peer_us"] = queued(peer, iters)
                except Exception as ex:  # the peer's own limits
                    row["peer_error"] = repr(ex)[:200]
            emit(**row)


if __name__ == "__main__":
    main()
