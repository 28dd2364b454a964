"""The backward's weight-gradient matmul (moe.grouped_matmul_wgrad) on the
GPU: dW[e] = dY_e^T X_e summed over each expert's rows, checked against
float64 and timed beside torch._grouped_mm's K-grouped form on the same
operands.

  python3 -m bench.wgrad_check prepare DIR
        on the build machine: one function per shape holding one bf16
        moe.grouped_matmul_wgrad (dY [R, N], X [R, K], f32 [E, N, K]),
        compiled for sm_90a (no token buckets: a backward runs once a step)
  python3 -m bench.wgrad_check run DIR [ONLY]
        on the GPU machine: random operands, the result poisoned with NaN,
        one call checked against float64, then timed beside the peer; one
        JSON line per result

The shapes are the weight gradients of the training peers' layers
(bench/train_peer.py) at 4096 tokens (16384 for Mixtral): each layer's
down (dY times the activation) and gate/up (dH times the dispatched
tokens) wgrad, rows spread evenly over the experts; and two shapes of
uneven counts (experts with no rows, and counts that are no multiple of
the kernel's 64-row stage) for correctness and compute-sanitizer.

`run` also checks the backward's moe.scatter (tokens copied, weighted, to
the rows a dispatch chose, in an order no dispatch would give, some
choices outside the experts) bit for bit.

Ours writes the gradient in f32 (what an optimizer's master weights take);
torch._grouped_mm writes bf16, half the bytes.
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
    "odd": (3, -1, 72, 40),
    "uneven": (8, -2, 1032, 520),
}
UNEVEN = {-1: [50, 0, 77], -2: [1000, 37, 0, 513, 64, 65, 2048, 7]}


def function(name, e, n, k):
    dy, x = f"tensor<?x{n}xbf16>", f"tensor<?x{k}xbf16>"
    c, o, out = f"tensor<{e}xi32>", f"tensor<{e + 1}xi32>", \
        f"tensor<{e}x{n}x{k}xf32>"
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
        name = f"wgrad_{shape}"
        src = os.path.join(out_dir, name + ".mlir")
        with open(src, "w") as f:
            f.write(function(name, e, n, k))
        subprocess.run([compile_, src, "--target=sm_90a",
                        "--token-buckets=none", "-o",
                        os.path.join(out_dir, f"lib{name}.so")], check=True)
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


def run(lib_dir, only=None):
    import torch
    from moe_compiler import Layer

    shapes = json.load(open(os.path.join(lib_dir, "shapes.json")))
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    failed = False
    if not only or only == "scatter":
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
        layer = Layer(os.path.join(lib_dir, f"libwgrad_{shape}.so"))
        out = torch.full((e, n, k), float("nan"), dtype=torch.float32,
                         device=dev)
        args = [dy, x, counts, offsets, out]
        layer.forward(*args)
        torch.cuda.synchronize()
        # Expert by expert, in float64: the operands are exact, so only the
        # f32 sums' rounding separates the two.
        worst = 0.0
        finite = bool(torch.isfinite(out).all())
        for xi in range(e):
            lo, hi = int(offsets[xi]), int(offsets[xi + 1])
            ref = dy[lo:hi].double().t() @ x[lo:hi].double()
            got = out[xi].double()
            if hi == lo:
                err = float(got.abs().max())
            else:
                err = ((got - ref).norm() / ref.norm()).item()
            worst = max(worst, err)
            del ref, got
        ok = finite and worst <= 1e-5
        failed |= not ok
        emit(what="check", shape=shape, rel_error=worst, finite=finite, ok=ok)
        if m < 0:
            continue
        flops = 2.0 * rows * n * k
        iters = 10 if flops > 1e12 else 20
        us = bench(lambda: layer.forward(*args), iters)
        emit(what="time", shape=shape, kernel="wgrad (f32 out)", us=us,
             tflops=flops / us / 1e6)
        ends = offsets[1:]
        us_p = bench(lambda: torch._grouped_mm(dy.t(), x, offs=ends), iters)
        emit(what="peer", shape=shape, peer="torch._grouped_mm bf16 out",
             us=us_p, tflops=flops / us_p / 1e6)
        del out, args
        torch.cuda.empty_cache()
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] not in ("prepare", "run"):
        sys.exit(__doc__)
    if sys.argv[1] == "prepare":
        prepare(sys.argv[2])
    else:
        sys.exit(run(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None))
