"""Decode latency of compiled layers beside vLLM 0.33.0's Triton fused-MoE
kernels: the same inputs, the same method, the same run.

For each layer and token count, --inputs sets of random hidden states share
the layer's weights (bench.common.make_inputs). Different tokens route to
different experts, so forwards cycled over the sets do not find their
experts' weights in L2 from the forward before, as a small batch would if
one input were replayed. Each side's forwards, one per set, are captured in
one CUDA graph, replayed (3 warm, then --replays timed by CUDA events with
the host ahead of the GPU) and the time divided by the sets:
  ours_us          our layer's whole forward (routing, experts, shared
                   experts, combine), its own graphs off so that the capture
                   holds its kernels; ours_kernels_us the sum of its
                   kernels' device times per forward (torch.profiler, eager),
                   per_kernel_us each, ours_gap_us the difference;
  vllm_us          vLLM's two fused_moe_kernel launches per forward (gate/up
                   into [T, k, 2I]; down, weighted by the router, into
                   [T, k, H]). What they read (routing, expert assignment,
                   FP8 activation quantization, silu_and_mul of the real
                   gate/up output) is made before the capture; neither that
                   nor moe_sum is timed, so vllm_us is a lower bound on
                   vLLM's layer. vllm_kernels_us and vllm_gap_us as ours;
  vllm_config      the config vLLM picks (its tuned file for this GPU's name,
                   else its default), SWAP_AB and the naive assignment;
  bound_us         the weights a forward reads at --hbm TB/s (bench.latency's
                   weight_bytes, mean over the sets); shared_bound_us the
                   shared experts' part, for a layer that has them;
  peer_rel_err     max |vLLM - ours| / max |ours| on the first set. The peer
                   has no shared experts: a layer's are added to vLLM's
                   output in float32 PyTorch (peer_shared says so). bf16
                   layers should agree to bf16's rounding; FP8 ones to a few
                   percent (each side quantizes its activations from its own
                   intermediates).
The peer takes the layer's own weights: our w13 [E, 2I, H] (gate rows, then
up rows), w2 [E, H, I] and FP8 block-128 scales (f32, [E, N/128, K/128],
dequantized = code x scale) are vLLM's layouts. MXFP8 weights, which vLLM's
Triton kernel cannot take, and bf16 weights of a layer that quantizes them
itself are quantized to FP8 block-128 for it (peer_weights says so). Needs
bench/vllm-peer.sh's folder (--peer-dir) and triton; prints one JSON line
per layer and token count, after one describing the run.

    PYTHONPATH=$PWD/python:$PWD python3 -m bench.decode LIB... \\
        [--peer-dir build/vllm-peer] [--tokens 1 8 64 128 512] [--inputs 8]
        [--replays 20] [--hbm 3.35]
"""
import argparse
import os

import torch

from bench.common import ROOT, bench, dequantized, emit, make_inputs, \
    profiled_kernels, route_reference, torch_dtype
from bench import vllm_peer


def input_sets(layer, named, tokens, count, gen, dev):
    """`count` argument lists of `tokens` new random hidden states (scaled
    as make_inputs scales them) and the layer's weights in `named`, outputs
    poisoned with NaN."""
    sets = []
    for _ in range(count):
        tensors = []
        for a in layer.args:
            shape = [tokens if d < 0 else d for d in a["shape"]]
            if a["output"]:
                tensors.append(torch.full(shape, float("nan"), device=dev,
                                          dtype=torch_dtype(a["dtype"])))
            elif a["name"] == "hidden_states":
                tensors.append(torch.randn(shape, generator=gen, device=dev)
                               .to(torch_dtype(a["dtype"])))
            else:
                tensors.append(named[a["name"]])
        sets.append(tensors)
    return sets


def captured(calls):
    """One CUDA graph of `calls` in order, after a warm-up of them on a side
    stream (as torch.cuda.graphs asks)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for call in calls:
            call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    torch.cuda.synchronize()
    return graph


def per_call(calls, replays):
    """us per call of `calls` replayed as one graph."""
    graph = captured(calls)
    us = bench(graph.replay, replays, warm=3, ahead=True) / len(calls)
    del graph
    return us


def kernels_named(fn, name, repeats=3):
    """Device us of the kernels whose names hold `name` in one call of `fn`
    (torch.profiler, the mean of `repeats`); None if the profiler saw
    none."""
    times = profiled_kernels(fn, repeats, keep=lambda key: name in key)
    return sum(times.values()) if times else None


def route(info, named, x):
    """Our layer's routing (bench.common.route_reference) as vLLM's kernel
    takes it: f32 weights (scaled, as the kernel multiplies them into the
    down output) and int32 expert ids, [T, k], contiguous."""
    torch.backends.cuda.matmul.allow_tf32 = False
    w, ids = route_reference(info, named, x)
    return w.contiguous(), ids.int().contiguous()


def shared_expert(named, x):
    """The layer's shared experts in f32 PyTorch (FP8 weights
    dequantized): what the peer's output lacks."""
    def weight(name):
        w = named[name]
        return dequantized(named, name) if w.dtype == torch.float8_e4m3fn \
            else w.float()
    g, u = (x.float() @ weight("shared_w13").t()).chunk(2, -1)
    s = (torch.nn.functional.silu(g) * u) @ weight("shared_w2").t()
    if "shared_gate" in named:
        s = s * (x.float() @ named["shared_gate"].float().t()).sigmoid()
    return s


def requantized(named, name):
    """FP8 block-128 codes and f32 scales of an expert weight, from its
    MXFP8 or bf16 values, one expert at a time (the f32 copy stays small)."""
    w = named[name]
    codes = torch.empty(w.shape, dtype=torch.float8_e4m3fn, device=w.device)
    scales = None
    for e in range(w.shape[0]):
        if w.dtype == torch.float8_e4m3fn:
            values = dequantized({"w": w[e], "w_scale": named[name +
                                                              "_scale"][e]},
                                 "w")
        else:
            values = w[e].float()
        q, s = vllm_peer.quantize_block128(values[None])
        if scales is None:
            scales = torch.empty((w.shape[0],) + s.shape[1:],
                                 dtype=torch.float32, device=w.device)
        codes[e], scales[e] = q[0], s[0]
    return codes, scales


def peer_weights(named, info):
    """vLLM's w1, w2, w1_scale, w2_scale (None for bf16) from the layer's
    arguments, and how they were made."""
    c = info["config"]
    if c["activation"] != "swiglu" or "w13_bias" in named:
        raise NotImplementedError(f"activation {c['activation']}, expert "
                                  f"biases: no vLLM peer")
    e, h, i = c["experts"], c["hidden"], c["intermediate"]
    w13, w2 = named["w13"], named["w2"]
    if tuple(w13.shape) != (e, 2 * i, h) or tuple(w2.shape) != (e, h, i):
        raise NotImplementedError(f"w13 {list(w13.shape)}, w2 "
                                  f"{list(w2.shape)}: not all {e} experts")
    if w13.dtype == torch.bfloat16 and not c["quant"]:
        return (w13, w2, None, None), "bf16"
    s13 = named.get("w13_scale")
    blocks = (e, -(-2 * i // 128), -(-h // 128))
    if s13 is not None and s13.dtype == torch.float32:
        s2 = named["w2_scale"]
        if tuple(s13.shape) != blocks or \
                tuple(s2.shape) != (e, -(-h // 128), -(-i // 128)):
            raise NotImplementedError(f"FP8 scales {list(s13.shape)}, "
                                      f"{list(s2.shape)}: not 128 x 128")
        return (w13, w2, s13, s2), "fp8-block128"
    w1, s1 = requantized(named, "w13")
    w2q, s2 = requantized(named, "w2")
    source = "mxfp8" if s13 is not None else "bf16"
    return (w1, w2q, s1, s2), f"fp8-block128 requantized from {source}"


def ours(layer, sets, replays):
    """Our forward's graph us per forward, and its kernels' eager device us
    per forward by name."""
    calls = [lambda t=t: layer.forward(*t) for t in sets]
    us = per_call(calls, replays)
    times = profiled_kernels(lambda: [call() for call in calls])
    return us, {k: v / len(sets) for k, v in times.items()}


def measure(layer, named, peer, tokens, opts, gen, dev):
    """One JSON row: our layer and the peer on --inputs sets of `tokens`."""
    from bench.latency import weight_bytes
    info = layer.info
    sets = input_sets(layer, named, tokens, opts.inputs, gen, dev)
    names = [a["name"] for a in layer.args]
    x_at, out_at = names.index("hidden_states"), names.index("out")
    row = dict(layer=info["name"], label=opts.label, tokens=tokens,
               inputs=len(sets))
    bytes_read = [weight_bytes(layer, dict(named, hidden_states=t[x_at]),
                               tokens) for t in sets]
    row["bound_us"] = sum(bytes_read) / len(sets) / opts.hbm / 1e6
    shared = sum(t.numel() * t.element_size() for n, t in named.items()
                 if n.startswith("shared_"))
    if shared:
        row["shared_bound_us"] = shared / opts.hbm / 1e6

    layer.forward(*sets[0])  # the check's output, before any timing
    expected = sets[0][out_at].float()
    row["ours_us"], per_kernel = ours(layer, sets, opts.replays)
    row["ours_kernels_us"] = sum(per_kernel.values())
    row["ours_gap_us"] = row["ours_us"] - row["ours_kernels_us"]
    row["per_kernel_us"] = {k: round(v, 2) for k, v in per_kernel.items()}
    if peer is None:
        return row
    fused, made = peer
    row["peer_weights"] = made
    try:
        prepared = []
        for t in sets:
            w, ids = route(info, named, t[x_at])
            prepared.append(fused.prepare(t[x_at], w, ids))
        got = prepared[0].output().float()
        if shared:
            got = got + shared_expert(named, sets[0][x_at])
            row["peer_shared"] = "float32 PyTorch, not timed"
        row["peer_rel_err"] = float((got - expected).abs().max()
                                    / expected.abs().max())
        row["vllm_config"] = prepared[0].config
        launches = [p.launch for p in prepared]
        row["vllm_us"] = per_call(launches, opts.replays)
        kernels = kernels_named(lambda: [launch() for launch in launches],
                                vllm_peer.KERNEL)
        if kernels is not None:
            row["vllm_kernels_us"] = kernels / len(sets)
            row["vllm_gap_us"] = row["vllm_us"] - row["vllm_kernels_us"]
    except Exception as ex:  # the peer's own limits; ours is still reported
        row["vllm_error"] = repr(ex)[:300]
    return row


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("libraries", nargs="+")
    ap.add_argument("--peer-dir",
                    default=os.path.join(ROOT, "build", "vllm-peer"),
                    help="bench/vllm-peer.sh's folder")
    ap.add_argument("--tokens", type=int, nargs="+",
                    default=[1, 8, 64, 128, 512])
    ap.add_argument("--inputs", type=int, default=8,
                    help="input sets cycled in one graph")
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--hbm", type=float, default=3.35,
                    help="TB/s (H100 SXM's 3.35)")
    ap.add_argument("--label", default="")
    ap.add_argument("--seed", type=int, default=0)
    opts = ap.parse_args()
    if not os.path.exists(os.path.join(opts.peer_dir, "fused_moe.py")):
        ap.error(f"{opts.peer_dir} has no fused_moe.py: run "
                 f"bench/vllm-peer.sh WHEEL first (and carry the folder)")
    from moe_compiler import Layer
    import triton
    dev = torch.device("cuda")
    version = "unknown"
    try:
        with open(os.path.join(opts.peer_dir, "VERSION")) as f:
            version = f.readline().split()[-1]
    except OSError:
        pass
    emit(what="env", device=torch.cuda.get_device_name(dev),
         capability=list(torch.cuda.get_device_capability(dev)),
         torch=torch.__version__, triton=triton.__version__, vllm=version,
         hbm_tbps=opts.hbm)
    for path in opts.libraries:
        layer = Layer(path)
        layer.set_graphs(False)  # our captures hold the kernels themselves
        gen = torch.Generator(device=dev).manual_seed(opts.seed)
        # The weights once per layer (FP8 ones are quantized on the host).
        tensors = make_inputs(layer, 1, gen, dev)
        named = {a["name"]: t for a, t in zip(layer.args, tensors)
                 if not a["output"] and a["name"] != "hidden_states"}
        try:
            weights, made = peer_weights(named, layer.info)
            peer = (vllm_peer.FusedExperts(opts.peer_dir, *weights), made)
            error = None
        except NotImplementedError as ex:
            peer, error = None, str(ex)
        for tokens in opts.tokens:
            row = measure(layer, named, peer, tokens, opts, gen, dev)
            if error:
                row["vllm_error"] = error
            emit(**row)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
