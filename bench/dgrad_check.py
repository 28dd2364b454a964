"""The backward's input-gradient matmul (moe.grouped_matmul_dgrad) on the
GPU: checked against float64 and timed beside torch._grouped_mm on the same
operands. sm_90a reads the weights as they lie (the grouped matmul's
transpose_rhs); weights whose rows are not whole 16-byte units take a
transposed copy first (moe.transpose), timed alone here.

  python3 -m bench.dgrad_check prepare DIR
        on the build machine: one function per shape holding one bf16
        moe.grouped_matmul_dgrad (dY [R, N] times W [E, N, K], each expert
        over its rows), and one holding only the transpose of W, compiled
        for sm_90a (no token buckets: a backward runs once a step)
  python3 -m bench.dgrad_check run DIR [ONLY]
        on the GPU machine: random operands, the result poisoned with NaN,
        one call checked against float64, then timed beside the peer; one
        JSON line per result

Two shapes are also compiled with an f32 result.

The shapes are the dgrads of the training peers' layers (bench/train_peer.py)
at 4096 tokens (16384 for Mixtral): each layer's down (dY times w2) and
gate/up (dH times w13) dgrad, rows spread evenly over the experts; and an
odd shape (experts of 50, 0 and 77 rows, K 40, N 72: the contraction ends
inside a 64-row box) for compute-sanitizer, and one with N 100 (the
transposed copy).
"""
import json
import os
import subprocess
import sys

from bench.common import ROOT, bench, emit

# name: (experts, rows an expert, N (the contraction), K (the result's
# columns)); -1 rows: the odd counts below.
SHAPES = {
    "qwen3_down": (128, 256, 2048, 768),
    "qwen3_up": (128, 256, 1536, 2048),
    "dsv3_shard_down": (32, 1024, 7168, 2048),
    "dsv3_shard_up": (32, 1024, 4096, 7168),
    "mixtral_down_16k": (8, 4096, 4096, 14336),
    "mixtral_up_16k": (8, 4096, 28672, 4096),
    "gpt_oss_shard_down": (32, 512, 2880, 2880),
    "gpt_oss_shard_up": (32, 512, 5760, 2880),
    "odd": (3, -1, 72, 40),
    "odd_copy": (3, -1, 100, 40),
}
ODD_COUNTS = [50, 0, 77]


# Shapes also compiled with an f32 result (a backward whose input gradient
# sums several parts takes them in f32).
F32_SHAPES = ("qwen3_up", "odd", "odd_copy")


def function(name, e, n, k, out_type="bf16"):
    dy, w = f"tensor<?x{n}xbf16>", f"tensor<{e}x{n}x{k}xbf16>"
    c, o, out = f"tensor<{e}xi32>", f"tensor<{e + 1}xi32>", \
        f"tensor<?x{k}x{out_type}>"
    return (f"func.func @{name}(%dy: {dy} {{moe.name = \"out_grad\"}}, "
            f"%w: {w} {{moe.name = \"rhs\"}}, "
            f"%c: {c} {{moe.name = \"counts\"}}, "
            f"%o: {o} {{moe.name = \"offsets\"}}) -> {out} {{\n"
            f"  %0 = moe.grouped_matmul_dgrad %dy, %w groups(%c, %o)\n"
            f"      : ({dy}, {w}, {c}, {o}) -> {out}\n"
            f"  return %0 : {out}\n}}\n")


def transpose_function(name, e, n, k):
    w, t = f"tensor<{e}x{n}x{k}xbf16>", f"tensor<{e}x{k}x{n}xbf16>"
    return (f"func.func @{name}(%w: {w} {{moe.name = \"rhs\"}}) -> {t} {{\n"
            f"  %0 = moe.transpose %w : {w} -> {t}\n"
            f"  return %0 : {t}\n}}\n")


def prepare(out_dir):
    compile_ = os.path.join(ROOT, "build", "bin", "moe-compile")
    os.makedirs(out_dir, exist_ok=True)
    for shape, (e, m, n, k) in SHAPES.items():
        texts = [(f"dgrad_{shape}", function(f"dgrad_{shape}", e, n, k)),
                 (f"transpose_{shape}",
                  transpose_function(f"transpose_{shape}", e, n, k))]
        if shape in F32_SHAPES:
            texts.append((f"dgrad32_{shape}",
                          function(f"dgrad32_{shape}", e, n, k, "f32")))
        for name, text in texts:
            src = os.path.join(out_dir, name + ".mlir")
            with open(src, "w") as f:
                f.write(text)
            subprocess.run([compile_, src, "--target=sm_90a",
                            "--token-buckets=none", "-o",
                            os.path.join(out_dir, f"lib{name}.so")],
                           check=True)
    with open(os.path.join(out_dir, "shapes.json"), "w") as f:
        json.dump(SHAPES, f)


def run(lib_dir, only=None):
    import torch
    from moe_compiler import Layer

    shapes = json.load(open(os.path.join(lib_dir, "shapes.json")))
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    failed = False
    for shape, (e, m, n, k) in shapes.items():
        if only and only not in shape:
            continue
        counts_list = ODD_COUNTS if m < 0 else [m] * e
        rows = sum(counts_list)
        counts = torch.tensor(counts_list, dtype=torch.int32, device=dev)
        offsets = torch.zeros(e + 1, dtype=torch.int32, device=dev)
        offsets[1:] = torch.cumsum(counts, 0)
        dy = torch.randn(rows, n, generator=gen, device=dev).bfloat16()
        w = (torch.randn(e, n, k, generator=gen, device=dev) /
             n ** 0.5).bfloat16()
        ref = torch.empty(rows, k, dtype=torch.float64, device=dev)
        for x in range(e):
            lo, hi = int(offsets[x]), int(offsets[x + 1])
            ref[lo:hi] = dy[lo:hi].double() @ w[x].double()
        floor = ((ref.bfloat16().double() - ref).norm() / ref.norm()).item()
        layer = Layer(os.path.join(lib_dir, f"libdgrad_{shape}.so"))
        out = torch.full((rows, k), float("nan"), dtype=torch.bfloat16,
                         device=dev)
        args = [dy, w, counts, offsets, out]
        layer.forward(*args)
        torch.cuda.synchronize()
        err = ((out.double() - ref).norm() / ref.norm()).item()
        ok = bool(torch.isfinite(out).all()) and err <= 2 * floor + 1e-3
        failed |= not ok
        emit(what="check", shape=shape, rel_error=err, bf16_rounding=floor,
             ok=ok)
        if shape in F32_SHAPES:
            # An f32 result: only the f32 sums' rounding separates it from
            # float64.
            layer32 = Layer(os.path.join(lib_dir, f"libdgrad32_{shape}.so"))
            out32 = torch.full((rows, k), float("nan"), dtype=torch.float32,
                               device=dev)
            args32 = [dy, w, counts, offsets, out32]
            layer32.forward(*args32)
            torch.cuda.synchronize()
            err32 = ((out32.double() - ref).norm() / ref.norm()).item()
            ok32 = bool(torch.isfinite(out32).all()) and err32 <= 1e-5
            failed |= not ok32
            emit(what="check", shape=shape, out="f32", rel_error=err32,
                 ok=ok32)
            if m > 0:
                us32 = bench(lambda: layer32.forward(*args32), 20)
                emit(what="time", shape=shape,
                     kernel="matmul, f32 out", us=us32,
                     tflops=2.0 * rows * n * k / us32 / 1e6)
        if m < 0:
            continue
        flops = 2.0 * rows * n * k
        iters = 10 if m >= 1024 else 20
        us = bench(lambda: layer.forward(*args), iters)
        emit(what="time", shape=shape, kernel="matmul", us=us,
             tflops=flops / us / 1e6)
        t = Layer(os.path.join(lib_dir, f"libtranspose_{shape}.so"))
        wt = torch.empty(e, k, n, dtype=torch.bfloat16, device=dev)
        us_t = bench(lambda: t.forward(w, wt), iters)
        ok_t = torch.equal(wt, w.transpose(1, 2))
        failed |= not ok_t
        emit(what="time", shape=shape, kernel="transpose (the copy)", us=us_t,
             tbps=2 * w.numel() * 2 / us_t / 1e6, ok=ok_t)
        ends = offsets[1:]
        us_p = bench(lambda: torch._grouped_mm(dy, w, offs=ends), iters)
        emit(what="peer", shape=shape, peer="torch._grouped_mm bf16", us=us_p,
             tflops=flops / us_p / 1e6)
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] not in ("prepare", "run"):
        sys.exit(__doc__)
    if sys.argv[1] == "prepare":
        prepare(sys.argv[2])
    else:
        sys.exit(run(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None))
