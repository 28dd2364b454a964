"""Attention (moe.attention) compiled for sm_90a: checked and timed.

  python3 -m bench.attention_check prepare --compile BIN/moe-compile --dir DIR
      on the build machine: writes one .mlir per shape and compiles it for
      sm_90a (and the small ones for the CPU) into DIR, with manifest.json.
  python3 -m bench.attention_check run --dir DIR [--time]
      on the GPU machine: for each shape, random inputs, the output poisoned
      with NaN, one forward, and the relative error ||out - ref|| / ||ref||
      against a float64 reference (every row of the small shapes, 256 rows
      of two heads of the big ones) and, for the small ones, against the CPU
      backend run on the host. With --time, the library and
      torch.nn.functional.scaled_dot_product_attention (its fastest backend
      for the shape) are timed in the same run. One JSON line per shape.
"""
import argparse
import json
import math
import os
import subprocess
import sys

from bench.common import bench, emit

# name, batch, query positions, key positions, query heads, kv heads, head
# size, value head size, causal, ping-pong, small (checked on the CPU too).
CHECKS = [
    ("gqa4_d64_causal", 2, 100, 300, 8, 2, 64, 64, True),
    ("d128_257", 1, 257, 257, 4, 4, 128, 128, False),
    ("gqa3_d128_sq_gt_skv", 1, 200, 130, 6, 2, 128, 128, True),
    ("d256_causal", 2, 64, 1000, 8, 8, 256, 256, True),
    ("decode_d128", 4, 1, 4100, 32, 8, 128, 128, False),
    ("decode16_gqa8_causal", 2, 16, 2000, 16, 2, 128, 128, True),
    ("d64_dv128", 1, 100, 100, 2, 1, 64, 128, False),
    ("d192", 1, 128, 300, 2, 2, 192, 192, True),
    ("no_keys", 1, 5, 0, 2, 2, 64, 64, True),
]


def shapes():
    """(name, B, Sq, Skv, Hq, Hkv, D, Dv, causal, ping_pong, small)."""
    out = [c + (True, True) for c in CHECKS]
    out.append(("d128_257_serial",) + CHECKS[1][1:] + (False, True))
    for d in (64, 128):
        for seq in (512, 1024, 2048, 4096, 8192, 16384):
            for causal in (False, True):
                out.append((f"prefill_d{d}_s{seq}{'_causal' if causal else ''}",
                            16384 // seq, seq, seq, 16, 16, d, d, causal, True,
                            False))
    for seq in (4096, 8192):
        for causal in (False, True):
            out.append((f"gqa8_d128_s{seq}{'_causal' if causal else ''}",
                        16384 // seq, seq, seq, 32, 4, 128, 128, causal, True,
                        False))
    for skv in (4096, 8192, 16384, 32768):
        out.append((f"decode_d128_kv{skv}", 8, 1, skv, 32, 8, 128, 128,
                    False, True, False))
    for d, seq, causal in ((128, 8192, False), (128, 8192, True),
                           (64, 4096, False)):
        out.append((f"prefill_d{d}_s{seq}{'_causal' if causal else ''}_serial",
                    16384 // seq, seq, seq, 16, 16, d, d, causal, False,
                    False))
    return out


def mlir(name, b, sq, skv, hq, hkv, d, dv, causal):
    q = f"tensor<{b}x{sq}x{hq}x{d}xbf16>"
    k = f"tensor<{b}x{skv}x{hkv}x{d}xbf16>"
    v = f"tensor<{b}x{skv}x{hkv}x{dv}xbf16>"
    o = f"tensor<{b}x{sq}x{hq}x{dv}xbf16>"
    attrs = " {causal}" if causal else ""
    return (f"func.func @{name}(%q: {q}, %k: {k}, %v: {v}) -> {o} {{\n"
            f"  %o = moe.attention %q, %k, %v{attrs} : ({q}, {k}, {v}) -> {o}\n"
            f"  return %o : {o}\n}}\n")


def prepare(opts):
    os.makedirs(opts.dir, exist_ok=True)
    manifest = []
    for (name, b, sq, skv, hq, hkv, d, dv, causal, ping_pong,
         small) in shapes():
        source = os.path.join(opts.dir, name + ".mlir")
        with open(source, "w") as f:
            f.write(mlir(name, b, sq, skv, hq, hkv, d, dv, causal))
        flags = [] if ping_pong else ["--attention-ping-pong=false"]
        subprocess.run([opts.compile, "--target=sm_90a", source, "-o",
                        os.path.join(opts.dir, f"gpu_{name}.so")] + flags,
                       check=True)
        if small:
            subprocess.run([opts.compile, source, "-o",
                            os.path.join(opts.dir, f"cpu_{name}.so")],
                           check=True)
        manifest.append(dict(name=name, b=b, sq=sq, skv=skv, hq=hq, hkv=hkv,
                             d=d, dv=dv, causal=causal, ping_pong=ping_pong,
                             small=small))
    with open(os.path.join(opts.dir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)


def reference(q, k, v, causal, rows=None, heads=None):
    """float64 attention of [B, S, H, D] tensors for query rows `rows` of
    heads `heads` (all by default): [B, len(rows), len(heads), Dv]."""
    import torch
    b, sq, hq, d = q.shape
    skv, hkv = k.shape[1], k.shape[2]
    rows = torch.arange(sq, device=q.device) if rows is None else rows
    heads = list(range(hq)) if heads is None else heads
    out = []
    for h in heads:
        kh = k[:, :, h // (hq // hkv)].double()
        vh = v[:, :, h // (hq // hkv)].double()
        s = torch.einsum("bid,bjd->bij", q[:, rows, h].double(), kh)
        s = s / math.sqrt(d)
        if causal:
            keys = torch.arange(skv, device=q.device)
            seen = keys[None, :] <= (rows + skv - sq)[:, None]
            s = s.masked_fill(~seen[None], float("-inf"))
        m = s.amax(-1, keepdim=True) if skv else torch.full(
            s.shape[:-1] + (1,), float("-inf"), dtype=s.dtype, device=s.device)
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        p = torch.exp(s - m)
        total = p.sum(-1, keepdim=True)
        o = torch.einsum("bij,bjd->bid", p, vh)
        out.append(torch.where(total > 0, o / total.clamp(min=1e-300),
                               torch.zeros_like(o)))
    return torch.stack(out, 2)


def sdpa_peer(q, k, v, causal):
    """The fastest of SDPA's backends that runs this shape: (us, name)."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    F = torch.nn.functional
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    gqa = q.shape[2] != k.shape[2]
    # SDPA's causal mask is aligned to the start; ours to the end of the
    # keys. They agree when Sq == Skv; a decode step (Sq = 1) sees all.
    is_causal = causal and q.shape[1] == k.shape[1]
    best = None
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION,
                    SDPBackend.EFFICIENT_ATTENTION):
        def run():
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(
                    qt, kt, vt, is_causal=is_causal, enable_gqa=gqa)
        try:
            run()
            torch.cuda.synchronize()
        except Exception:  # the backend does not take this shape
            continue
        t = bench(run, 20)
        if best is None or t < best[0]:
            best = (t, backend.name.lower())
    return best


def flops(e):
    """Attention's matmul FLOPs: 4 x visible (query, key) pairs x D."""
    b, sq, skv, hq, d = e["b"], e["sq"], e["skv"], e["hq"], e["d"]
    if e["causal"]:
        pairs = sum(max(0, min(skv, i + skv - sq + 1)) for i in range(sq))
    else:
        pairs = sq * skv
    return 2 * b * hq * pairs * (d + e["dv"])


def run(opts):
    import torch
    from moe_compiler import Layer
    manifest = json.load(open(os.path.join(opts.dir, "manifest.json")))
    gen = torch.Generator(device="cuda").manual_seed(0)
    failed = 0
    for e in manifest:
        if opts.only and opts.only not in e["name"]:
            continue
        layer = Layer(os.path.join(opts.dir, f"gpu_{e['name']}.so"))
        b, sq, skv, hq, hkv, d, dv = (e[x] for x in
                                      ("b", "sq", "skv", "hq", "hkv", "d",
                                       "dv"))

        def rand(*shape):
            return torch.randn(*shape, generator=gen, device="cuda").to(
                torch.bfloat16)
        q, k, v = rand(b, sq, hq, d), rand(b, skv, hkv, d), rand(b, skv, hkv,
                                                                 dv)
        o = torch.full((b, sq, hq, dv), float("nan"), device="cuda",
                       dtype=torch.bfloat16)
        layer.forward(q, k, v, o)
        torch.cuda.synchronize()
        result = dict(name=e["name"], shape=[b, sq, skv, hq, hkv, d, dv],
                      causal=e["causal"], ping_pong=e["ping_pong"])
        if e["small"]:
            ref = reference(q, k, v, e["causal"])
            got = o.double()
        else:
            rows = torch.linspace(0, sq - 1, min(sq, 256),
                                  device="cuda").long()
            heads = [0, hq - 1]
            ref = reference(q, k, v, e["causal"], rows, heads)
            got = o[:, rows][:, :, heads].double()
        result["nan"] = bool(torch.isnan(o).any())
        # With no key to attend to the output must be exactly zero.
        result["error"] = float((got - ref).norm() / ref.norm().clamp(
            min=1e-30)) if ref.abs().sum() > 0 else float(got.abs().max())
        # bf16 bound: docs/numerics.md.
        ok = not result["nan"] and result["error"] <= 1e-2
        if e["small"]:
            cpu = Layer(os.path.join(opts.dir, f"cpu_{e['name']}.so"))
            oc = torch.empty(b, sq, hq, dv, dtype=torch.bfloat16)
            cpu.forward(q.cpu(), k.cpu(), v.cpu(), oc)
            result["error_vs_cpu"] = float(
                (o.cpu().double() - oc.double()).norm() /
                oc.double().norm().clamp(min=1e-30))
            ok = ok and result["error_vs_cpu"] <= 1e-2
        result["ok"] = ok
        failed += not ok
        if opts.time and not e["small"]:
            t = bench(lambda: layer.forward(q, k, v, o), 20)
            peer = sdpa_peer(q, k, v, e["causal"])
            f = flops(e)
            result["us"] = t
            result["tflops"] = f / t / 1e6
            if peer:
                result["peer_us"], result["peer"] = peer
                result["peer_tflops"] = f / peer[0] / 1e6
            if sq <= 16:
                kv_bytes = 2 * b * skv * hkv * (d + dv)
                result["kv_gbps"] = kv_bytes / t / 1e3
        emit(**result)
    return 1 if failed else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("mode", choices=["prepare", "run"])
    ap.add_argument("--dir", required=True)
    ap.add_argument("--compile")
    ap.add_argument("--time", action="store_true")
    ap.add_argument("--only", help="shapes whose name contains this")
    opts = ap.parse_args()
    if opts.mode == "prepare":
        return prepare(opts)
    return run(opts)


if __name__ == "__main__":
    sys.exit(main())
