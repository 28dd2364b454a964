"""The grouped matmul alone: checked against float64 and timed beside
torch._grouped_mm (bf16) and torch._scaled_grouped_mm (FP8 rowwise).

  python3 -m bench.matmul_check prepare DIR
        on the build machine: writes one function holding one
        moe.grouped_matmul per shape and scheme and compiles it for sm_90a
        into DIR, with the moe-compile flags in MM_FLAGS
  python3 -m bench.matmul_check run DIR[,DIR...] [ONLY]
        on the GPU machine: for each library (those whose name holds ONLY),
        the activations times MM_INPUT_SCALE (default 1),
        random operands (FP8 codes and scales for the quantized schemes), the
        output poisoned with NaN, one call checked against float64, then
        timed beside the PyTorch peers; one JSON line per result. Several
        directories (say, two commits' libraries) are timed one after the
        other on the same operands, each line naming its directory

The shapes are the expert matmuls of DeepSeek-V3 (one expert-parallel
shard's 32 experts, at decode and prefill), Mixtral-8x7B and Qwen3-30B-A3B:
E experts x M rows each, N weight rows, K; "up" shapes have no activation,
so every scheme computes the same product as the peers.
"""
import json
import os
import subprocess
import sys

from bench.common import ROOT, bench, dequantized, emit, quantize

SHAPES = {
    "dsv3_up_decode": (32, 128, 4096, 7168),
    "dsv3_down_decode": (32, 128, 7168, 2048),
    "dsv3_up_prefill": (32, 2048, 4096, 7168),
    "dsv3_down_prefill": (32, 2048, 7168, 2048),
    "mixtral_up": (8, 4096, 28672, 4096),
    "mixtral_down": (8, 4096, 4096, 14336),
    "qwen3_30b_up": (128, 512, 1536, 2048),
    "qwen3_30b_down": (128, 512, 2048, 768),
    # DeepGEMM's grouped shapes (contiguous layout).
    "e4_m8192_n4096_k7168": (4, 8192, 4096, 7168),
    "e4_m8192_n7168_k2048": (4, 8192, 7168, 2048),
    "e8_m4096_n4096_k7168": (8, 4096, 4096, 7168),
    "e4_m256_n4096_k7168": (4, 256, 4096, 7168),
}
# MM_SCHEMES=bf16,fp8_block128 limits a run to some schemes.
SCHEMES = [s for s in os.environ.get("MM_SCHEMES", "bf16,fp8_block128,mxfp8")
           .split(",") if s]


def function(name, scheme, e, n, k):
    """The .mlir of one grouped matmul [?, K] x [E, N, K]^T."""
    if scheme == "bf16":
        elem, scales, types = "bf16", "", ""
    else:
        elem = "f8E4M3FN"
        if scheme == "fp8_block128":
            sa = f"tensor<?x{-(-k // 128)}xf32>"
            sb = f"tensor<{e}x{-(-n // 128)}x{-(-k // 128)}xf32>"
        else:
            sa = f"tensor<?x{-(-k // 32)}xf8E8M0FNU>"
            sb = f"tensor<{e}x{n}x{-(-k // 32)}xf8E8M0FNU>"
        scales = " scales(%sa, %sb)"
        types = f", {sa}, {sb}"
    a, b = f"tensor<?x{k}x{elem}>", f"tensor<{e}x{n}x{k}x{elem}>"
    c, o = f"tensor<{e}xi32>", f"tensor<{e + 1}xi32>"
    args = [f"%a: {a} {{moe.name = \"lhs\"}}", f"%b: {b} {{moe.name = \"rhs\"}}",
            f"%c: {c} {{moe.name = \"counts\"}}",
            f"%o: {o} {{moe.name = \"offsets\"}}"]
    if scales:
        args += [f"%sa: {sa} {{moe.name = \"lhs_scale\"}}",
                 f"%sb: {sb} {{moe.name = \"rhs_scale\"}}"]
    out = f"tensor<?x{n}xbf16>"
    return (f"func.func @{name}({', '.join(args)}) -> {out} {{\n"
            f"  %0 = moe.grouped_matmul %a, %b groups(%c, %o){scales}\n"
            f"      : ({a}, {b}, {c}, {o}{types}) -> {out}\n"
            f"  return %0 : {out}\n}}\n")


def prepare(out_dir):
    compile_ = os.path.join(ROOT, "build", "bin", "moe-compile")
    # MM_FLAGS: more moe-compile flags (say, --matmul-config=...).
    flags = os.environ.get("MM_FLAGS", "").split()
    os.makedirs(out_dir, exist_ok=True)
    for shape, (e, m, n, k) in SHAPES.items():
        for scheme in SCHEMES:
            name = f"mm_{shape}_{scheme}"
            src = os.path.join(out_dir, name + ".mlir")
            with open(src, "w") as f:
                f.write(function(name, scheme, e, n, k))
            subprocess.run([compile_, src, "--target=sm_90a", "-o",
                            os.path.join(out_dir, f"lib{name}.so")] + flags,
                           check=True)
    with open(os.path.join(out_dir, "shapes.json"), "w") as f:
        json.dump(SHAPES, f)


def run(lib_dirs, only=None):
    import torch

    dirs = lib_dirs.split(",")
    shapes = json.load(open(os.path.join(dirs[0], "shapes.json")))
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    failed = False
    for shape, (e, m, n, k) in shapes.items():
        if only and only not in shape and not any(
                only in f"{shape}_{s}" for s in SCHEMES):
            continue
        rows = e * m
        counts = torch.full((e,), m, dtype=torch.int32, device=dev)
        offsets = torch.arange(0, rows + 1, m, dtype=torch.int32, device=dev)
        # MM_INPUT_SCALE (a power of two) moves the activations' block
        # scales, say out of the window a converting kernel keeps in f16.
        a = torch.randn(rows, k, generator=gen, device=dev) * float(
            os.environ.get("MM_INPUT_SCALE", "1"))
        b = torch.randn(e, n, k, generator=gen, device=dev) / k ** 0.5
        for scheme in SCHEMES:
            if only and only not in f"{shape}_{scheme}":
                continue
            failed |= not check_and_time(dirs, shape, scheme, a, b, counts,
                                         offsets, (e, m, n, k))
        if not only:
            peers(shape, a, b, offsets[1:], 2.0 * rows * n * k, e, n, k)
    return 1 if failed else 0


def check_and_time(dirs, shape, scheme, a, b, counts, offsets, dims):
    """Checks and times one shape and scheme in each directory's library;
    whether every check passed."""
    import torch
    from moe_compiler import Layer

    e, m, n, k = dims
    rows, dev = e * m, a.device
    if scheme == "bf16":
        operands = [a.bfloat16(), b.bfloat16()]
        deq_a, deq_b = operands[0].double(), operands[1].double()
        scales = []
    else:
        # E4M3 codes with the scales as the ABI takes them (E8M0 as bytes):
        # the activations' per row (1 x 128 or 1 x 32), the weights' as a
        # layer's.
        kind = "F32" if scheme == "fp8_block128" else "F8_E8M0"
        named = {}
        named["a"], named["a_scale"] = quantize(a, kind, 1)
        named["b"], named["b_scale"] = quantize(b, kind)
        deq_a = dequantized(named, "a", torch.float64)
        deq_b = dequantized(named, "b", torch.float64)
        operands = [named["a"], named["b"]]
        scales = [named["a_scale"], named["b_scale"]]
    ref = torch.empty(rows, n, dtype=torch.float64, device=dev)
    for x in range(e):
        ref[x * m:(x + 1) * m] = deq_a[x * m:(x + 1) * m] @ deq_b[x].t()
    # What rounding the exact product to bf16 alone costs.
    floor = ((ref.bfloat16().double() - ref).norm() / ref.norm()).item()
    del deq_a, deq_b
    passed = True
    for lib_dir in dirs:
        layer = Layer(os.path.join(lib_dir, f"libmm_{shape}_{scheme}.so"))
        result = torch.full((rows, n), float("nan"), dtype=torch.bfloat16,
                            device=dev)
        args = operands + [counts, offsets] + scales + [result]
        layer.forward(*args)
        torch.cuda.synchronize()
        got = result.double()
        err = ((got - ref).norm() / ref.norm()).item()
        ok = bool(torch.isfinite(got).all()) and err <= 2 * floor + 1e-3
        passed &= ok
        del got
        emit(what="check", lib=lib_dir, shape=shape, scheme=scheme,
             rel_error=err, bf16_rounding=floor, ok=ok)
        us = bench(lambda: layer.forward(*args), 10 if m >= 1024 else 20)
        wbytes = e * n * k * (2 if scheme == "bf16" else 1)
        emit(what="time", lib=lib_dir, shape=shape, scheme=scheme, us=us,
             tflops=2.0 * rows * n * k / us / 1e6,
             weight_tbps=wbytes / us / 1e6)
    return passed


def peers(shape, a, b, ends, flops, e, n, k):
    import torch
    iters = 10 if a.shape[0] // e >= 1024 else 20
    a16, bt16 = a.bfloat16(), b.bfloat16().transpose(-2, -1)
    try:
        us = bench(lambda: torch._grouped_mm(a16, bt16, offs=ends), iters)
        emit(what="peer", shape=shape, peer="torch._grouped_mm bf16", us=us,
            tflops=flops / us / 1e6, weight_tbps=2 * e * n * k / us / 1e6)
    except Exception as ex:  # the peer's own limits
        emit(what="peer", shape=shape, peer="torch._grouped_mm bf16",
            error=repr(ex)[:200])
    try:
        fp8 = torch.float8_e4m3fn
        sa = a.abs().amax(-1).clamp(min=1e-4) / 448
        sb = b.abs().amax(-1).clamp(min=1e-4) / 448
        qa = (a / sa[:, None]).to(fp8)
        qbt = (b / sb[:, :, None]).to(fp8).transpose(-2, -1)
        us = bench(lambda: torch._scaled_grouped_mm(
            qa, qbt, sa, sb, offs=ends, out_dtype=torch.bfloat16), iters)
        emit(what="peer", shape=shape, peer="torch._scaled_grouped_mm fp8 "
            "rowwise", us=us, tflops=flops / us / 1e6,
            weight_tbps=e * n * k / us / 1e6)
    except Exception as ex:
        emit(what="peer", shape=shape, peer="torch._scaled_grouped_mm fp8 "
            "rowwise", error=repr(ex)[:200])


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4) or sys.argv[1] not in ("prepare", "run"):
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    if sys.argv[1] == "prepare":
        prepare(sys.argv[2])
    else:
        sys.exit(run(sys.argv[2], sys.argv[3] if len(sys.argv) == 4 else None))
