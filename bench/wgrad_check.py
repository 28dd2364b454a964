"""The backward's weight-gradient matmul (moe.grouped_matmul_wgrad) on the
GPU: dW[e] = dY_e^T X_e summed over each expert's rows, checked against
float64 and timed beside torch._grouped_mm's K-grouped form on the same
operands.

  python3 -m bench.wgrad_check prepare DIR [--quant]
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

With `--quant` (prepare) the functions are FP8 block-128 wgrads (quant =
fp8_block128): each with a bf16 lhs and with an E4M3 lhs and its 1 x 128
scales (as the forward saves the dispatched rows), f32 results; and one
shape whose columns are no multiple of 8 (which only the FP8 form takes:
its operands reach TMA as blocks of codes). `run`
checks them against float64 products of the codes the recipe gives (each
expert's rows in blocks of 128, each column scaled by amax / 448, codes
rounded to nearest even by torch's float8_e4m3fn), so a wrong code or scale
shows where the sums' rounding alone would not; and times them beside the
bf16 wgrad of the same build and torch._grouped_mm.
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
    # K of at most 128: the FP8 kernel's [128, 128] tiles, its ring
    # wrapping many times.
    "narrow_k": (4, 4096, 256, 96),
    "odd": (3, -1, 72, 40),
    "uneven": (8, -2, 1032, 520),
}
UNEVEN = {-1: [50, 0, 77], -2: [1000, 37, 0, 513, 64, 65, 2048, 7],
          -3: [130, 0, 257]}
# FP8 only: rows no whole number of 16 bytes.
QUANT_SHAPES = {"odd_unaligned": (3, -3, 70, 44)}


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


def quant_function(name, e, n, k, lhs_codes):
    dy, c, o = f"tensor<?x{n}xbf16>", f"tensor<{e}xi32>", \
        f"tensor<{e + 1}xi32>"
    out = f"tensor<{e}x{n}x{k}xf32>"
    quant = "{quant = #moe.quant<kind = fp8_block128>}"
    if lhs_codes:
        x, sx = f"tensor<?x{k}xf8E4M3FN>", f"tensor<?x{-(-k // 128)}xf32>"
        args = (f"%x: {x} {{moe.name = \"lhs\"}}, "
                f"%sx: {sx} {{moe.name = \"lhs_scale\"}}, ")
        op = (f"  %0 = moe.grouped_matmul_wgrad %dy lhs %x groups(%c, %o) "
              f"scale %sx {quant}\n      : ({dy}, {x}, {c}, {o}, {sx}) -> "
              f"{out}\n")
    else:
        x = f"tensor<?x{k}xbf16>"
        args = f"%x: {x} {{moe.name = \"lhs\"}}, "
        op = (f"  %0 = moe.grouped_matmul_wgrad %dy lhs %x groups(%c, %o) "
              f"{quant}\n      : ({dy}, {x}, {c}, {o}) -> {out}\n")
    return (f"func.func @{name}(%dy: {dy} {{moe.name = \"out_grad\"}}, "
            f"{args}%c: {c} {{moe.name = \"counts\"}}, "
            f"%o: {o} {{moe.name = \"offsets\"}}) -> {out} {{\n"
            f"{op}  return %0 : {out}\n}}\n")


def ieee_scale(amax):
    """max(amax, 1e-4) / 448 in f32, divided as the kernels divide: a
    tensor's division (torch takes a scalar divisor's reciprocal on the
    GPU, which moves some codes at a rounding tie)."""
    import torch
    return amax.clamp_min(1e-4) / torch.full_like(amax, 448.0)


def row_block_values(t, offsets, e):
    """`t` ([R, C] f32) as the FP8 wgrad reads it: each expert's rows in
    blocks of 128 from its first, each block's columns quantized to E4M3 by
    amax / 448 (at least 1e-4 / 448), the codes times their scales, in
    float64."""
    import torch
    out = torch.zeros_like(t, dtype=torch.float64)
    for xi in range(e):
        lo, hi = int(offsets[xi]), int(offsets[xi + 1])
        for b in range(lo, hi, 128):
            block = t[b:min(b + 128, hi)]
            scale = ieee_scale(block.abs().amax(0))
            q = (block * torch.reciprocal(scale)).clamp(-448, 448).to(
                torch.float8_e4m3fn)
            out[b:b + block.shape[0]] = q.double() * scale.double()
    return out


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


def prepare(out_dir, quant=False):
    compile_ = os.path.join(ROOT, "build", "bin", "moe-compile")
    os.makedirs(out_dir, exist_ok=True)
    shapes = dict(SHAPES, **(QUANT_SHAPES if quant else {}))
    for shape, (e, m, n, k) in shapes.items():
        plain = () if shape in QUANT_SHAPES else ("f32", "bf16")
        for out_type in plain + (("fp8", "fp8_codes") if quant else ()):
            name = f"wgrad_{shape}_{out_type}"
            src = os.path.join(out_dir, name + ".mlir")
            with open(src, "w") as f:
                f.write(function(name, e, n, k, out_type)
                        if not out_type.startswith("fp8") else
                        quant_function(name, e, n, k, out_type == "fp8_codes"))
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
        json.dump({"shapes": shapes, "quant": quant}, f)


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


def worst_error(out, offsets, reference):
    """The largest relative error of an expert's result (`out` [E, N, K])
    against reference(lo, hi), the float64 product of its rows [lo, hi);
    an expert without rows must be zero."""
    worst = 0.0
    for xi in range(out.shape[0]):
        lo, hi = int(offsets[xi]), int(offsets[xi + 1])
        got = out[xi].double()
        if hi == lo:
            err = float(got.abs().max())
        else:
            ref = reference(lo, hi)
            err = ((got - ref).norm() / ref.norm()).item()
            del ref
        worst = max(worst, err)
        del got
    return worst


def report_time(layer, args, lib_dir, shape, kernel, iters, flops):
    us = bench(lambda: layer.forward(*args), iters)
    emit(what="time", lib=lib_dir, shape=shape, kernel=kernel, us=us,
         tflops=flops / us / 1e6)


def probe_codes(layer, dy, lhs_args, variant, counts, offsets, a, b):
    """Each expert's first rows' values as the kernels quantized them,
    exactly: a one-hot lhs (row t of an expert 1 in column t) makes the
    result's column t the gradient's row t as its codes stand for it
    (times 448 x 1/448), and a one-hot gradient the lhs's likewise."""
    import torch
    e, rows, n, k = counts.numel(), dy.shape[0], dy.shape[1], \
        lhs_args[0].shape[1]
    ok = True
    for side in ("out_grad", "lhs"):
        width = k if side == "out_grad" else n
        onehot = torch.zeros(rows, width, device=dy.device)
        for xi in range(e):
            lo = int(offsets[xi])
            for t in range(min(int(counts[xi]), width)):
                onehot[lo + t, t] = 1.0
        if side == "out_grad":
            lhs = onehot.bfloat16() if variant == "fp8" else None
            if lhs is None:
                # E4M3 codes of 1.0 with scale 1: the one-hot itself.
                lhs = [onehot.to(torch.float8_e4m3fn),
                       torch.ones_like(lhs_args[1])]
            args = [dy, *(lhs if isinstance(lhs, list) else [lhs])]
            want = a
        else:
            args = [onehot.bfloat16(), *lhs_args]
            want = b
        out = torch.full((e, n, k), float("nan"), device=dy.device)
        layer.forward(*args, counts, offsets, out)
        torch.cuda.synchronize()
        bad = 0
        for xi in range(e):
            lo, m = int(offsets[xi]), min(int(counts[xi]), width)
            got = (out[xi][:, :m].t() if side == "out_grad" else
                   out[xi][:m]).double()
            ref = want[lo:lo + m]
            bad += int(((got - ref).abs() > 1e-6 * ref.abs()).sum())
        emit(what="check", probe=f"{variant} {side} codes", wrong=bad,
             ok=bad == 0)
        ok &= bad == 0
    return ok


def check_quant(lib_dirs, shape, e, m, dy, x, counts, offsets, iters,
                flops):
    """The FP8 wgrads of `shape` (a bf16 lhs, and E4M3 codes with 1 x 128
    scales) against float64 sums of the codes the recipe gives."""
    import torch
    from moe_compiler import Layer
    rows, k = x.shape
    # The E4M3 lhs: x quantized 1 x 128 along its columns, as the forward's
    # dispatch saves it.
    blocks = -(-k // 128)
    padded = torch.nn.functional.pad(x.float(), (0, blocks * 128 - k))
    sx = ieee_scale(padded.view(rows, blocks, 128).abs().amax(2))
    codes = (padded.view(rows, blocks, 128) *
             torch.reciprocal(sx)[..., None]).clamp(-448, 448).to(
                 torch.float8_e4m3fn).view(rows, -1)[:, :k].contiguous()
    a = row_block_values(dy.float(), offsets, e)
    ok = True
    for variant, lhs_args, lhs in (
            ("fp8", [x], x.float()),
            ("fp8_codes", [codes, sx],
             (codes.float().view(rows, -1) *
              sx.repeat_interleave(128, 1)[:, :k]))):
        b = row_block_values(lhs, offsets, e)
        for lib_dir in lib_dirs:
            layer = Layer(os.path.join(lib_dir,
                                       f"libwgrad_{shape}_{variant}.so"))
            out = torch.full((e, dy.shape[1], k), float("nan"),
                             dtype=torch.float32, device=dy.device)
            args = [dy, *lhs_args, counts, offsets, out]
            layer.forward(*args)
            torch.cuda.synchronize()
            finite = bool(torch.isfinite(out).all())
            worst = worst_error(out, offsets,
                                lambda lo, hi: a[lo:hi].t() @ b[lo:hi])
            # Exact products, but the FP8 tensor cores keep about 14 bits
            # of each wgmma's sums (DeepSeek-V3's report measured the
            # same): 1.3e-4 on every shape. A code one step off in one
            # place in a thousand gave 2e-3 to 5e-3.
            good = finite and worst <= 5e-4
            if m < 0:
                good &= probe_codes(layer, dy, lhs_args, variant, counts,
                                    offsets, a, b)
            ok &= good
            emit(what="check", lib=lib_dir, shape=shape, out=variant,
                 rel_error=worst, finite=finite, ok=good)
            if m >= 0:
                report_time(layer, args, lib_dir, shape,
                            f"wgrad {variant} (f32 out)", iters, flops)
            del out, args
        del b
        torch.cuda.empty_cache()
    return ok


def run(lib_dirs, only=None):
    import torch
    from moe_compiler import Layer

    lib_dirs = lib_dirs.split(",")
    built = json.load(open(os.path.join(lib_dirs[0], "shapes.json")))
    shapes, quant = built["shapes"], built["quant"]
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
        for lib_dir in lib_dirs if shape not in QUANT_SHAPES else []:
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
                finite = bool(torch.isfinite(out).all())
                worst = worst_error(
                    out, offsets,
                    lambda lo, hi: dy[lo:hi].double().t() @ x[lo:hi].double())
                ok = finite and worst <= bound
                failed |= not ok
                emit(what="check", lib=lib_dir, shape=shape, out=out_type,
                     rel_error=worst, finite=finite, ok=ok)
                if m >= 0:
                    report_time(layer, args, lib_dir, shape,
                                f"wgrad ({out_type} out)", iters, flops)
                del out, args
                torch.cuda.empty_cache()
        if quant:
            failed |= not check_quant(lib_dirs, shape, e, m, dy, x, counts,
                                      offsets, iters, flops)
        if m < 0 or shape in QUANT_SHAPES:
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
        prepare(sys.argv[2], "--quant" in sys.argv[3:])
    else:
        sys.exit(run(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None))
