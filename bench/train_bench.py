"""A layer's training step on the GPU: our training forward and backward
(moe-compile --train --target=sm_90a) timed beside the PyTorch peer of
../shared/bench/train_peer.py (router, sort, torch._grouped_mm with
autograd, SwiGLU, index_add), the same layer sizes and token counts, in
the same run, and each of our kernels' time.

  python3 -m bench.train_bench prepare DIR [--quant=fp8_block128|mxfp8]
        on the build machine: each layer's training library (quantized:
        bf16 weights, quantized in each call, as patch(model, quant=...)
        trains)
  python3 -m bench.train_bench run DIR PEER [--tokens 4096,16384] [ONLY]
        on the GPU machine (PEER: the peer script's path); one JSON line
        per layer and token count: our forward and forward+backward, the
        peer's, TFLOP/s as the peer counts them, peak memory of each
  python3 -m bench.train_bench step DIR LAYER TOKENS [--graph]
        one training step of ours, for a profiler (ncu) to look at; with
        --graph, the step captured in a CUDA graph and replayed, its
        output and gradients compared with an eager step's

The peer's GPT-OSS shard has no biases and a softmax router: here it is
that layer (not the bias-carrying model), so both sides do the same work.
"""
import json
import os
import subprocess
import sys

from bench.common import ROOT, bench, emit, profiled_kernels

# name: (experts, top-k, hidden, intermediate, shared intermediate,
# router as the peer names it); the peer's LAYERS.
LAYERS = {
    "qwen3_30b_a3b": (128, 8, 2048, 768, 0, "softmax"),
    "dsv3_ep8_shard": (32, 8, 7168, 2048, 2048, "sigmoid"),
    "mixtral_8x7b": (8, 2, 4096, 14336, 0, "softmax"),
    "gptoss_120b_ep4": (32, 4, 2880, 2880, 0, "softmax"),
}


def layer_mlir(name, e, k, h, i, shared, router, quant=None):
    """The peer's layer as moe.layer: softmax over every expert then the
    top k renormalized, or (DeepSeek-V3) sigmoid scores, the top k
    renormalized, one shared expert."""
    x = f"tensor<?x{h}xbf16>"
    args = [f"%x: {x}", f"%wr: tensor<{e}x{h}xbf16>",
            f"%w13: tensor<{e}x{2 * i}x{h}xbf16>",
            f"%w2: tensor<{e}x{h}x{i}xbf16>"]
    types = [x, f"tensor<{e}x{h}xbf16>", f"tensor<{e}x{2 * i}x{h}xbf16>",
             f"tensor<{e}x{h}x{i}xbf16>"]
    operands = "router(%wr) experts(%w13, %w2)"
    config = (f"experts = {e}, top_k = {k}, hidden = {h}, "
              f"intermediate = {i}, ")
    if router == "softmax":
        config += ("router = #moe.router<kind = softmax_topk, "
                   "renormalize = true>, ")
    else:
        config += ("router = #moe.router<kind = sigmoid_grouped_topk, "
                   "renormalize = true>, ")
    if shared:
        args += [f"%ws13: tensor<{2 * shared}x{h}xbf16>",
                 f"%ws2: tensor<{h}x{shared}xbf16>"]
        types += [f"tensor<{2 * shared}x{h}xbf16>",
                  f"tensor<{h}x{shared}xbf16>"]
        operands += " shared(%ws13, %ws2)"
    config += "activation = #moe.activation<kind = swiglu>"
    if shared:
        config += f", shared_intermediate = {shared}"
    if quant:
        config += f", quant = #moe.quant<kind = {quant}>"
    return (f"func.func @{name}({', '.join(args)}) -> {x} {{\n"
            f"  %out = moe.layer %x {operands} {{config = #moe.config<"
            f"{config}>}}\n      : ({', '.join(types)}) -> {x}\n"
            f"  return %out : {x}\n}}\n")


def prepare(out_dir, quant=None):
    compile_ = os.path.join(ROOT, "build", "bin", "moe-compile")
    os.makedirs(out_dir, exist_ok=True)
    for name, spec in LAYERS.items():
        src = os.path.join(out_dir, name + ".mlir")
        with open(src, "w") as f:
            f.write(layer_mlir(name, *spec, quant=quant))
        # Weight gradients in bf16, as the weights (and the peer's) are:
        # what patch(model) builds for the GPU.
        subprocess.run([compile_, src, "--target=sm_90a", "--train",
                        "--train-bf16-grads", "-o",
                        os.path.join(out_dir, f"lib{name}.so")], check=True)


def ours(layer, tensors, dy):
    """Our forward and forward+backward (us), peak memory (GB) of the
    step, and each kernel's time (us) in one step."""
    import torch
    tokens = tensors[0].shape[0]
    inputs, out = tensors[:-1], tensors[-1]
    dev = out.device
    saved = torch.empty(layer.saved_size(tokens), dtype=torch.uint8,
                        device=dev)
    grads = [torch.empty(shape, dtype=dtype, device=dev)
             for _, dtype, shape in layer.gradient_shapes(tokens)]
    workspace = torch.empty(max(layer.workspace_size(tokens), 1),
                            dtype=torch.uint8, device=dev)

    def forward():
        layer.forward_train(*inputs, out, saved=saved, workspace=workspace)

    def step():
        forward()
        layer.backward(list(inputs), dy, saved, grads, workspace=workspace)

    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fwd = bench(forward, 10)
    both = bench(step, 10)
    kernels = profiled_kernels(step)
    # What the step holds beyond its inputs: the output, the saved
    # tensors, the workspace and the gradients (as the peer's peak counts
    # its activations and gradients).
    peak = (torch.cuda.max_memory_allocated() - base + sum(
        t.numel() * t.element_size() for t in [out, saved, workspace,
                                               *grads])) / 1e9
    return fwd, both, peak, kernels


def run(lib_dir, peer_path, tokens, only=None):
    import torch
    from moe_compiler import Layer
    sys.path.insert(0, os.path.dirname(peer_path))
    argv, sys.argv = sys.argv, [peer_path, "--tokens=1"]
    # The peer's module runs its own loop at import; take its functions
    # from its source instead.
    source = open(peer_path).read().split("\nf = torch.compile")[0]
    sys.argv = argv
    peer = {}
    exec(compile(source, peer_path, "exec"), peer)
    dev = torch.device("cuda")
    emit(device=torch.cuda.get_device_name(), torch=torch.__version__)
    for name, (e, k, h, i, shared, router) in LAYERS.items():
        if only and name != only:
            continue
        layer = Layer(os.path.join(lib_dir, f"lib{name}.so"))
        g = torch.Generator(device=dev).manual_seed(0)

        def p(*s):
            return (torch.randn(*s, device=dev, generator=g) /
                    s[-1] ** 0.5).bfloat16()
        wr, w13, w2 = p(e, h), p(e, 2 * i, h), p(e, h, i)
        ws13, ws2 = (p(2 * shared, h), p(h, shared)) if shared else \
            (None, None)
        weights = [t for t in (wr, w13, w2, ws13, ws2) if t is not None]
        for t in tokens:
            x = torch.randn(t, h, device=dev, generator=g).bfloat16()
            dy = torch.randn(t, h, device=dev, generator=g).bfloat16()
            flop = 6 * t * k * h * i + (6 * t * h * shared if shared else 0)
            out = torch.empty_like(x)
            fwd, both, peak, kernels = ours(layer, [x, *weights, out], dy)
            params = [w.clone().requires_grad_() for w in weights]
            xp = x.clone().requires_grad_()
            full = params + [None] * (5 - len(params))
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            with torch.no_grad():
                pf = bench(lambda: peer["moe"](xp, *full[:3], full[3],
                                               full[4], k, router), 10)

            def peer_step():
                for q in params + [xp]:
                    q.grad = None
                peer["moe"](xp, *full[:3], full[3], full[4], k,
                            router).backward(dy)
            pb = bench(peer_step, 10)
            peer_peak = (torch.cuda.max_memory_allocated() - base) / 1e9
            emit(layer=name, T=t, fwd_us=round(fwd, 1),
                 fwd_bwd_us=round(both, 1),
                 fwd_bwd_tflops=round(3 * flop / both / 1e6, 1),
                 peer_fwd_us=round(pf, 1), peer_fwd_bwd_us=round(pb, 1),
                 peer_fwd_bwd_tflops=round(3 * flop / pb / 1e6, 1),
                 speedup_fwd_bwd=round(pb / both, 2),
                 peak_gb=round(peak, 2), peer_peak_gb=round(peer_peak, 2))
            emit(layer=name, T=t, kernels_us={
                k: round(v, 1) for k, v in sorted(kernels.items(),
                                                  key=lambda kv: -kv[1])})
            del params, xp
            torch.cuda.empty_cache()


def step(lib_dir, name, tokens, graph=False):
    """One training step of layer `name` at `tokens` tokens; with `graph`,
    again captured in a CUDA graph and replayed, checked against it."""
    import torch
    from moe_compiler import Layer
    e, k, h, i, shared, _ = LAYERS[name]
    layer = Layer(os.path.join(lib_dir, f"lib{name}.so"))
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    shapes = [(e, h), (e, 2 * i, h), (e, h, i)]
    if shared:
        shapes += [(2 * shared, h), (h, shared)]
    weights = [(torch.randn(*s, device=dev, generator=g) / s[-1] ** 0.5)
               .bfloat16() for s in shapes]
    x = torch.randn(tokens, h, device=dev, generator=g).bfloat16()
    dy = torch.randn(tokens, h, device=dev, generator=g).bfloat16()
    saved = torch.empty(layer.saved_size(tokens), dtype=torch.uint8,
                        device=dev)
    grads = [torch.empty(s, dtype=d, device=dev)
             for _, d, s in layer.gradient_shapes(tokens)]
    out = torch.empty_like(x)
    layer.forward_train(x, *weights, out, saved=saved)
    layer.backward([x, *weights], dy, saved, grads)
    torch.cuda.synchronize()
    if not graph:
        return
    eager = [t.clone() for t in [out, *grads]]
    for t in [out, saved, *grads]:
        t.fill_(255 if t.dtype == torch.uint8 else float("nan"))
    workspace = torch.empty(max(layer.workspace_size(tokens), 1),
                            dtype=torch.uint8, device=dev)
    stream = torch.cuda.Stream()
    captured = torch.cuda.CUDAGraph()
    with torch.cuda.graph(captured, stream=stream):
        layer.forward_train(x, *weights, out, saved=saved,
                            workspace=workspace)
        layer.backward([x, *weights], dy, saved, grads, workspace=workspace)
    captured.replay()
    torch.cuda.synchronize()
    # An expert's rows may come in another order (the dispatch places them
    # with atomics), so the weights' f32 sums may differ in their last
    # bits, and a bf16 gradient rounded from them by one unit in the last
    # place; each token's output and gradient do not.
    diffs = [((a.double() - b.double()).norm() /
              max(b.double().norm(), 1e-30)).item()
             for a, b in zip([out, *grads], eager)]

    def same_sums(a, b, diff):
        # bf16: within one unit in the last place of each element; f32:
        # the sums' order shows in their last bits alone.
        if b.dtype != torch.bfloat16:
            return diff <= 1e-5
        a, b = a.double(), b.double()
        return bool(((a - b).abs() <= b.abs() * 2.0 ** -7).all())
    ulps = [same_sums(a, b, d) for a, b, d in zip([out, *grads], eager, diffs)]
    ok = diffs[0] == 0 and diffs[1] == 0 and all(ulps)
    emit(layer=name, T=tokens, graph_replay_vs_eager=diffs,
         same_up_to_sum_order=ulps, ok=ok)


def main():
    if sys.argv[1] == "prepare":
        quant = [a.split("=")[1] for a in sys.argv[3:]
                 if a.startswith("--quant=")]
        prepare(sys.argv[2], quant[0] if quant else None)
        return
    if sys.argv[1] == "step":
        step(sys.argv[2], sys.argv[3], int(sys.argv[4]),
             "--graph" in sys.argv[5:])
        return
    tokens = [4096, 16384]
    rest = []
    for a in sys.argv[4:]:
        if a.startswith("--tokens="):
            tokens = [int(v) for v in a.split("=")[1].split(",")]
        else:
            rest.append(a)
    run(sys.argv[2], sys.argv[3], tokens, rest[0] if rest else None)


if __name__ == "__main__":
    main()
