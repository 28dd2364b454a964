"""What the GPU checks and benchmarks share: the repository's root, JSON
lines, CUDA-event timing, random inputs for a compiled layer (FP8 weights
quantized by moe_compiler.quantize), dequantization, the PyTorch peer layer
and per-kernel times.

PyTorch is imported by the functions that use it, so that the scripts'
`prepare` steps run on a build machine without it.
"""
import json
import math
import os

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The quantization scheme of FP8 data, told by its scales' dtype.
SCHEMES = {"F32": "fp8-block128", "F8_E8M0": "mxfp8"}


def emit(**fields):
    """Prints one JSON line, flushed so a log written through tee keeps up."""
    print(json.dumps(fields), flush=True)


def read_lines(path):
    """The JSON lines of a results file (comment lines skipped)."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.startswith("{")]


def torch_dtype(name):
    import torch
    return {"BF16": torch.bfloat16, "F32": torch.float32,
            "F8_E4M3": torch.float8_e4m3fn, "I32": torch.int32}[name]


def quantize(values, scale_dtype, rows_per_scale=128):
    """E4M3 codes and scales of the float tensor `values` ([E,] N, K) as a
    quantized layer takes them, on its device. `scale_dtype` F32 is FP8
    block-128 (128 x 128 blocks, 1 x 128 with `rows_per_scale` 1), F8_E8M0
    is MXFP8 (1 x 32 blocks, the scales as bytes). The numerics are
    moe_compiler.quantize's, run on the host."""
    import torch
    from moe_compiler.quantize import quantize_weight
    codes, scales = quantize_weight(values.float().cpu().numpy(),
                                    SCHEMES[scale_dtype], rows_per_scale)
    codes = torch.from_numpy(codes.view(np.uint8)).view(torch.float8_e4m3fn)
    return codes.to(values.device), torch.from_numpy(scales).to(values.device)


def make_inputs(layer, tokens, gen, device):
    """Random inputs in ABI order, outputs poisoned."""
    import torch
    dtypes = {a["name"]: a["dtype"] for a in layer.args}
    made = {}
    for arg in layer.args:
        name = arg["name"]
        if arg["output"] or name in made:
            continue
        shape = [tokens if d < 0 else d for d in arg["shape"]]
        scale = 1.0 if name == "hidden_states" else (
            0.3 if "bias" in name else 1.0 / math.sqrt(shape[-1]))
        values = torch.randn(shape, generator=gen, device=device) * scale
        if arg["dtype"] == "F8_E4M3":
            made[name], made[name + "_scale"] = quantize(
                values, dtypes[name + "_scale"])
            continue
        made[name] = values.to(torch_dtype(arg["dtype"]))
    # Every output poisoned ("out", and "router_logits" where the layer
    # returns them).
    for res in layer.args:
        if res["output"]:
            made[res["name"]] = torch.full(
                [tokens if d < 0 else d for d in res["shape"]], float("nan"),
                dtype=torch_dtype(res["dtype"]), device=device)
    return [made[a["name"]] for a in layer.args]


def dequantized(named, name, dtype=None):
    """FP8 data ([E,] N, K) times its block scales, in `dtype` (float32 by
    default; float64 holds every product exactly)."""
    import torch
    dtype = dtype or torch.float32
    w = named[name]
    s = named[name + "_scale"]
    s = torch.exp2(s.to(dtype) - 127) if s.dtype == torch.uint8 else s.to(dtype)
    squeeze = w.dim() == 2
    if squeeze:
        w, s = w[None], s[None]
    e, n, k = w.shape
    rb = 1 if s.shape[1] == n else 128
    kb = 32 if named[name + "_scale"].dtype == torch.uint8 else 128
    full = s.repeat_interleave(rb, 1)[:, :n].repeat_interleave(kb, 2)
    out = w.to(dtype) * full[:, :, :k]
    return out[0] if squeeze else out


def peer_layer(named, info):
    """The PyTorch peer: a grouped-mm MoE layer (softmax top-k, sort, two
    torch._grouped_mm, weighted combine) on the same weights."""
    import torch
    c = info["config"]
    x, wr = named["hidden_states"], named["router_weight"]

    # FP8 layers are timed beside the same layer in bf16.
    def bf16(name):
        w = named[name]
        if w.dtype == torch.float8_e4m3fn:
            w = dequantized(named, name).bfloat16()
        return w
    w13t = bf16("w13").transpose(-2, -1)
    w2t = bf16("w2").transpose(-2, -1)
    E, k, T, H = wr.shape[0], c["top_k"], x.shape[0], x.shape[1]

    def fwd():
        probs = (x @ wr.t()).float().softmax(-1)
        topw, topi = probs.topk(k, -1)
        topw = topw / topw.sum(-1, keepdim=True)
        flat = topi.flatten()
        order = flat.argsort()
        counts = torch.bincount(flat, minlength=E)
        xs = x.repeat_interleave(k, 0)[order]
        offs = counts.cumsum(0).to(torch.int32)
        h = torch._grouped_mm(xs, w13t, offs=offs)
        g, u = h.chunk(2, -1)
        y = torch._grouped_mm(torch.nn.functional.silu(g) * u, w2t, offs=offs)
        o = torch.zeros(T * k, H, device=x.device, dtype=torch.float32)
        o[order] = y.float()
        return (o.view(T, k, H) * topw.unsqueeze(-1)).sum(1).to(torch.bfloat16)
    return fwd


def bench(fn, iters, warm=3, ahead=False):
    """us per call, by CUDA events around `iters` calls. With `ahead`, the
    calls are enqueued behind a spin kernel, so the host gets ahead and the
    time is the GPU's alone (kernels and the gaps between them)."""
    import torch
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    s = torch.cuda.Event(enable_timing=True)
    e = torch.cuda.Event(enable_timing=True)
    if ahead:
        torch.cuda._sleep(int(2e8))  # ~100 ms
    s.record()
    for _ in range(iters):
        fn()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) / iters * 1e3


def kernel_times(layer, tensors):
    """Mean device time of each kernel of one forward, from torch.profiler."""
    return profiled_kernels(lambda: layer.forward(*tensors))


def profiled_kernels(fn, repeats=3, keep=None):
    """Mean device time (us) of each of our kernels (or of those whose names
    `keep` accepts) in one call of `fn`, from torch.profiler."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(repeats):
            fn()
        torch.cuda.synchronize()
    times = {}
    for ev in prof.key_averages():
        # Our kernels: moe_<family>[_<step>] (k<N>_<family> before they
        # had stable names).
        ours = ev.key.startswith("moe_") or (ev.key.startswith("k")
                                             and "_" in ev.key)
        if keep(ev.key) if keep else ours:
            t = getattr(ev, "device_time", None) or ev.cuda_time
            times[ev.key] = times.get(ev.key, 0) + t * ev.count / repeats
    return times


def route_reference(info, named, x):
    """The layer's routing of tokens `x` in f32 PyTorch (docs/numerics.md):
    (weights, expert ids), [T, k], the weights renormalized and scaled as
    the config says; DeepSeek-V3's grouped sigmoid top-k follows HF (a
    dropped group's choices become 0)."""
    import torch
    c = info["config"]
    logits = x.float() @ named["router_weight"].float().t()
    kind, k = c["router"], c["top_k"]
    bias = named.get("router_bias")
    if kind == "softmax_topk":
        if bias is not None:
            logits = logits + bias.float()
        w, ids = logits.softmax(-1).topk(k, -1)
        if c["renormalize"]:
            w = w / w.sum(-1, keepdim=True)
    elif kind == "sigmoid_grouped_topk":
        s = logits.sigmoid()
        choice = s + (bias.float() if bias is not None else 0)
        g = c["n_group"]
        if g > 1:
            grouped = choice.view(x.shape[0], g, -1)
            gscore = grouped.topk(2, -1).values.sum(-1)
            keep = torch.zeros_like(gscore).scatter_(
                1, gscore.topk(c["topk_group"], -1).indices, 1.0)
            mask = keep[:, :, None].expand_as(grouped).reshape_as(choice)
            choice = choice.masked_fill(mask == 0, 0.0)
        ids = choice.topk(k, -1).indices
        w = s.gather(1, ids)
        if c["renormalize"]:
            w = w / (w.sum(-1, keepdim=True) + 1e-20)
    else:
        raise NotImplementedError(f"reference for router {kind}")
    return w * c["scaling"], ids
