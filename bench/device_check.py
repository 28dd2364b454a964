#!/usr/bin/env python3
"""Checks and times GPU layers compiled by moe-compile --target=sm_90a.

For each layer and token count: fresh random inputs, the output poisoned with
NaN, one forward on the current stream, then the relative error
||out - ref|| / ||ref|| against a reference, asserted below a bound:
  --cpu LIB   the same layer compiled for the CPU (the backend that defines
              the numerics), run on the host: any layer, quantized included;
  otherwise   a float32 PyTorch reference on the GPU (bf16 layers).
With --time, the layer, its kernels (torch.profiler) and the PyTorch peer (the
grouped-mm layer of ../shared/bench/torch_peers.py, same shapes) are timed in
the same run. Prints one JSON line per result.
"""
import argparse
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
from moe_compiler import Layer  # noqa: E402

DTYPES = {"BF16": torch.bfloat16, "F32": torch.float32,
          "F8_E4M3": torch.float8_e4m3fn, "I32": torch.int32}


def out(**kw):
    print(json.dumps(kw), flush=True)


def quantize_blocks(values, scale_shape, scale_dtype):
    """FP8 weights ([E,] N, K) as a quantized layer takes them: E4M3 codes
    and f32 scales per 128 x 128 (or 1 x 128) block as DeepSeek-V3 stores
    them, or E8M0 scales (as bytes) per 1 x 32 block for MXFP8."""
    squeeze = values.dim() == 2
    if squeeze:
        values, scale_shape = values[None], [1] + list(scale_shape)
    e, n, k = values.shape
    if scale_dtype == "F8_E8M0":
        pad = (-k) % 32
        b = torch.nn.functional.pad(values.float(), (0, pad))
        b = b.view(e, n, -1, 32)
        amax = b.abs().amax(-1, keepdim=True)
        exp = (torch.floor(torch.log2(amax.clamp(min=2.0 ** -126))) - 8
               ).clamp(-127, 127)
        exp = torch.where(amax > 0, exp, torch.full_like(exp, -127.0))
        codes = (b / torch.exp2(exp)).clamp(-448, 448)
        codes = codes.view(e, n, -1)[:, :, :k].contiguous().to(
            torch.float8_e4m3fn)
        scales = (exp.squeeze(-1) + 127).to(torch.uint8)
    else:
        rb = 1 if scale_shape[1] == n else 128
        padded = torch.zeros(e, scale_shape[1] * rb, scale_shape[2] * 128,
                             dtype=torch.float32, device=values.device)
        padded[:, :n, :k] = values
        blocks = padded.view(e, scale_shape[1], rb, scale_shape[2], 128)
        amax = blocks.abs().amax(dim=(2, 4)).clamp(min=1e-4)
        scales = amax / 448.0
        codes = (blocks / scales[:, :, None, :, None]).view_as(padded)
        codes = codes[:, :n, :k].contiguous().to(torch.float8_e4m3fn)
    if squeeze:
        codes, scales = codes[0], scales[0]
    return codes, scales.contiguous()


def make_inputs(layer, tokens, gen, device):
    """Random inputs in ABI order, output last (poisoned)."""
    shapes = {a["name"]: a["shape"] for a in layer.args}
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
            scale_shape = shapes[name + "_scale"]
            made[name], made[name + "_scale"] = quantize_blocks(
                values, scale_shape, dtypes[name + "_scale"])
            continue
        made[name] = values.to(DTYPES[arg["dtype"]])
    res = layer.args[-1]
    made["out"] = torch.full([tokens if d < 0 else d for d in res["shape"]],
                             float("nan"), dtype=DTYPES[res["dtype"]],
                             device=device)
    return [made[a["name"]] for a in layer.args]


def dequantized(named, name, dtype=torch.float32):
    """FP8 data ([E,] N, K) times its block scales, in `dtype` (float64
    holds every product exactly)."""
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


def reference(info, named):
    """The layer in float32 (no intermediate rounding) for bf16 layers."""
    c = info["config"]
    x = named["hidden_states"].float()
    logits = x @ named["router_weight"].float().t()
    kind, k = c["router"], c["top_k"]
    bias = named.get("router_bias")
    if kind == "softmax_topk":
        if bias is not None:
            logits = logits + bias.float()
        probs = logits.softmax(-1)
        w, ids = probs.topk(k, -1)
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
        w = w * c["scaling"]
    else:
        raise NotImplementedError(f"reference for router {kind}")
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


def peer_layer(named, info):
    """torch_peers.py's grouped-mm layer (softmax top-k, sort, two
    torch._grouped_mm, weighted combine) on the same weights."""
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


def layer_flops(info, tokens):
    c = info["config"]
    f = 2 * tokens * c["top_k"] * 3 * c["hidden"] * c["intermediate"]
    return f + 2 * tokens * 3 * c["hidden"] * c["shared_intermediate"]


def kernel_times(layer, tensors):
    """Mean device time of each kernel of one forward, from torch.profiler."""
    from torch.profiler import ProfilerActivity, profile
    layer.forward(*tensors)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            layer.forward(*tensors)
        torch.cuda.synchronize()
    times = {}
    for ev in prof.key_averages():
        # Our kernels: moe_<family>[_<step>] (k<N>_<family> before they
        # had stable names).
        if ev.key.startswith("moe_") or (ev.key.startswith("k") and "_" in ev.key):
            t = getattr(ev, "device_time", None) or ev.cuda_time
            times[ev.key] = times.get(ev.key, 0) + t * ev.count / 3
    return times


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
            out(what="check", layer=label, tokens=tokens,
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
            out(what="check", layer=label, tokens=tokens,
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
            out(what="buckets", layer=label, tokens=tokens,
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
            out(what="graph", layer=label, tokens=tokens, replay_equal=same,
                ok=same)
        if not opts.time or not ok:
            continue
        iters = 20 if tokens <= 128 else 10
        us = bench(lambda: layer.forward(*tensors), iters)
        flops = layer_flops(layer.info, tokens)
        out(what="time", layer=label, tokens=tokens, us=us,
            tflops=flops / us / 1e6)
        if hasattr(torch, "_grouped_mm"):
            try:
                peer = bench(peer_layer(named, layer.info), iters)
                out(what="peer", layer=label, tokens=tokens, us=peer,
                    peer="torch grouped_mm layer")
            except Exception as ex:  # the peer's own limits, not ours
                out(what="peer", layer=label, tokens=tokens,
                    error=repr(ex)[:200])
        if tokens == max(opts.tokens):
            out(what="kernels", layer=label, tokens=tokens,
                us=kernel_times(layer, tensors))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
