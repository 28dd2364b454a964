"""The backward's weight-gradient matmul (moe.grouped_matmul_wgrad) on the
GPU: dW[e] = dY_e^T X_e summed over each expert's rows, checked against
float64 and timed beside torch._grouped_mm's K-grouped form on the same
operands.

  python3 -m bench.wgrad_check prepare DIR
        on the build machine: one function per shape holding one bf16
        moe.grouped_matmul_wgrad (dY [R, N], X [R, K], f32 [E, N, K]),
        compiled for sm_90a (no token buckets: a backward runs once a step),
        each with an f32 and a bf16 result
  python3 -m bench.wgrad_check run DIR[,DIR2...] [ONLY]
        on the GPU machine: random operands, each library's result poisoned
        with NaN, one call checked against float64, then timed beside the
        peer (the libraries of several builds side by side on the same
        operands); one JSON line per result

The shapes are the weight gradients of the training peers' layers
(bench/train_peer.py) at 4096 tokens (16384 for Mixtral): each layer's
down (dY times the activation) and gate/up (dH times the dispatched
tokens) wgrad, rows spread evenly over the experts; and two shapes of
uneven counts (experts with no rows, and counts that are no multiple of
the kernel's 64-row stage) for correctness and compute-sanitizer. The
`kgrouped_*` shapes are the K-grouped weight-gradient shapes DeepGEMM
publishes (4 and 8 groups of 8192 and 4096 rows; outputs 7168 x 4096 and
2048 x 7168).

`run` also checks the backward's moe.scatter (tokens copied, weighted, to
the rows a dispatch chose, in an order no dispatch would give, some
choices outside the experts) bit for bit.

Each shape is timed with an f32 result (what an optimizer's master weights
take) and a bf16 one (what training with bf16 gradients writes, and what
torch._grouped_mm writes).
"""
import json
import os
import subprocess
import sys

from bench.common import ROOT, bench, emit

# name: (experts, rows an expert, N (the output gradient's columns), K (the
# lhs's columns)); rows < 0: the counts in UNEVEN.
SHAPES = {
    "qwen3_down": (128, 256, 2048, 768),
    "qwen3_up": (128, 256, 1536, 2048),
    "dsv3_shard_down": (32, 1024, 7168, 2048),
    "dsv3_shard_up": (32, 1024, 4096, 7168),
    "mixtral_down_16k": (8, 4096, 4096, 14336),
    "mixtral_up_16k": (8, 4096, 28672, 4096),
    "gpt_oss_shard_down": (32, 512, 2880, 2880),
    "gpt_oss_shard_up": (32, 512, 5760, 2880),
    "kgrouped_4x8192_7168x4096": (4, 8192, 7168, 4096),
    "kgrouped_8x4096_7168x4096": (8, 4096, 7168, 4096),
    "kgrouped_4x8192_2048x7168": (4, 8192, 2048, 7168),
    "kgrouped_8x4096_2048x7168": (8, 4096, 2048, 7168),
    "odd": (3, -1, 72, 40),
    "uneven": (8, -2, 1032, 520),
}
UNEVEN = {-1: [50, 0, 77], -2: [1000, 37, 0, 513, 64, 65, 2048, 7]}


def function(name, e, n, k, out_type="f32"):
    dy, x = f"tensor<?x{n}xbf16>", f"tensor<?x{k}xbf16>"
    c, o, out = f"tensor<{e}xi32>", f"tensor<{e + 1}xi32>", \
        f"tensor<{e}x{n}x{k}x{out_type}>"
    return (f"func.func @{name}(%dy: {dy} {{moe.name = \"out_grad\"}}, "
            f"%x: {x} {{moe.name = \"lhs\"}}, "
            f"%c: {c} {{moe.name = \"counts\"}}, "
            f"%o: {o} {{moe.name = \"offsets\"}}) -> {out} {{\n"
            f"  %0 = moe.grouped_matmul_wgrad %dy lhs %x groups(%c, %o)\n"
            f"      : ({dy}, {x}, {c}, {o}) -> {out}\n"
            f"  return %0 : {out}\n}}\n")


# tokens, top-k, experts, hidden. One choice a token: a function's
# dynamic rows are its tokens', so the rows fit the result.
SCATTER = (1000, 1, 10, 200)


def scatter_function(t, topk, e, h):
    g, r, o = f"tensor<?x{h}xbf16>", f"tensor<?x{topk}xi32>", \
        f"tensor<{e + 1}xi32>"
    w = f"tensor<?x{topk}xf32>"
    return (f"func.func @scatter(%g: {g}, %r: {r}, %o: {o}, %w: {w}) -> {g} "
            f"{{\n  %0 = moe.scatter %g, %r offsets %o scale %w\n"
            f"      : ({g}, {r}, {o}, {w}) -> {g}\n  return %0 : {g}\n}}\n")


def prepare(out_dir):
    compile_ = os.path.join(ROOT, "build", "bin", "moe-compile")
    os.makedirs(out_dir, exist_ok=True)
    for shape, (e, m, n, k) in SHAPES.items():
        for out_type in ("f32", "bf16"):
            name = f"wgrad_{shape}_{out_type}"
            src = os.path.join(out_dir, name + ".mlir")
            with open(src, "w") as f:
                f.write(function(name, e, n, k, out_type))
            subprocess.run([compile_, src, "--target=sm_90a",
                            "--token-buckets=none", "-o",
                            os.path.join(out_dir, f"lib{name}.so")],
                           check=True)
    src = os.path.join(out_dir, "scatter.mlir")
    with open(src, "w") as f:
        f.write(scatter_function(*SCATTER))
    subprocess.run([compile_, src, "--target=sm_90a", "--token-buckets=none",
                    "-o", os.path.join(out_dir, "libscatter.so")], check=True)
    with open(os.path.join(out_dir, "shapes.json"), "w") as f:
        json.dump(SHAPES, f)


def check_scatter(lib_dir, dev, gen):
    import torch
    from moe_compiler import Layer
    t, topk, e, h = SCATTER
    ids = torch.randint(-1, e, (t, topk), generator=gen, device=dev)
    local = ids >= 0
    counts = torch.bincount(ids[local], minlength=e)
    offsets = torch.zeros(e + 1, dtype=torch.int64, device=dev)
    offsets[1:] = torch.cumsum(counts, 0)
    # Each expert's rows in reverse token order: not what a dispatch gives.
    rows = torch.full((t, topk), -1, dtype=torch.int64, device=dev)
    flat = ids.flatten()
    order = torch.argsort(flat * (t * topk) - torch.arange(
        t * topk, device=dev), stable=True)
    order = order[flat[order] >= 0]
    rows.view(-1)[order] = torch.arange(order.numel(), device=dev)
    g = torch.randn(t, h, generator=gen, device=dev).bfloat16()
    w = torch.rand(t, topk, generator=gen, device=dev)
    total = int(offsets[-1])
    want = torch.empty(total, h, dtype=torch.bfloat16, device=dev)
    tok, j = local.nonzero(as_tuple=True)
    want[rows[tok, j]] = (g[tok].float() * w[tok, j, None]).bfloat16()
    out = torch.full((t * topk, h), float("nan"), dtype=torch.bfloat16,
                     device=dev)
    Layer(os.path.join(lib_dir, "libscatter.so")).forward(
        g, rows.int(), offsets.int(), w, out)
    torch.cuda.synchronize()
    ok = torch.equal(out[:total], want)
    emit(what="check", shape="scatter", rows=total, ok=ok)
    return ok


def run(lib_dirs, only=None):
    import torch
    from moe_compiler import Layer

    lib_dirs = lib_dirs.split(",")
    shapes = json.load(open(os.path.join(lib_dirs[0], "shapes.json")))
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    failed = False
    if not only or only == "scatter":
        for lib_dir in lib_dirs:
            failed |= not check_scatter(lib_dir, dev, gen)
    for shape, (e, m, n, k) in shapes.items():
        if only and only not in shape:
            continue
        counts_list = UNEVEN[m] if m < 0 else [m] * e
        rows = sum(counts_list)
        counts = torch.tensor(counts_list, dtype=torch.int32, device=dev)
        offsets = torch.zeros(e + 1, dtype=torch.int32, device=dev)
        offsets[1:] = torch.cumsum(counts, 0)
        dy = torch.randn(rows, n, generator=gen, device=dev).bfloat16()
        x = torch.randn(rows, k, generator=gen, device=dev).bfloat16()
        flops = 2.0 * rows * n * k
        iters = 10 if flops > 1e12 else 20
        for lib_dir in lib_dirs:
            for out_type, dtype, bound in (("f32", torch.float32, 1e-5),
                                           ("bf16", torch.bfloat16, 4e-3)):
                layer = Layer(os.path.join(
                    lib_dir, f"libwgrad_{shape}_{out_type}.so"))
                out = torch.full((e, n, k), float("nan"), dtype=dtype,
                                 device=dev)
                args = [dy, x, counts, offsets, out]
                layer.forward(*args)
                torch.cuda.synchronize()
                # Expert by expert, in float64: the operands are exact, so
                # only the f32 sums' rounding (and bf16's) separates them.
                worst = 0.0
                finite = bool(torch.isfinite(out).all())
                for xi in range(e):
                    lo, hi = int(offsets[xi]), int(offsets[xi + 1])
                    got = out[xi].double()
                    if hi == lo:
                        err = float(got.abs().max())
                    else:
                        ref = dy[lo:hi].double().t() @ x[lo:hi].double()
                        err = ((got - ref).norm() / ref.norm()).item()
                        del ref
                    worst = max(worst, err)
                    del got
                ok = finite and worst <= bound
                failed |= not ok
                emit(what="check", lib=lib_dir, shape=shape, out=out_type,
                     rel_error=worst, finite=finite, ok=ok)
                if m >= 0:
                    us = bench(lambda: layer.forward(*args), iters)
                    emit(what="time", lib=lib_dir, shape=shape,
                         kernel=f"wgrad ({out_type} out)", us=us,
                         tflops=flops / us / 1e6)
                del out, args
                torch.cuda.empty_cache()
        if m < 0:
            continue
        ends = offsets[1:]
        us_p = bench(lambda: torch._grouped_mm(dy.t(), x, offs=ends), iters)
        emit(what="peer", shape=shape, peer="torch._grouped_mm bf16 out",
             us=us_p, tflops=flops / us_p / 1e6)
        torch.cuda.empty_cache()
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] not in ("prepare", "run"):
        sys.exit(__doc__)
    if sys.argv[1] == "prepare":
        prepare(sys.argv[2])
    else:
        sys.exit(run(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None))
