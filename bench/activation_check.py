"""The training forward's activation step (moe.activation) and its backward
(moe.activation_grad) on the GPU, checked against the CPU backend's
libraries of the same functions and timed beside the same arithmetic in
eager PyTorch.

  python3 -m bench.activation_check prepare DIR
        on the build machine: each function compiled for sm_90a and for
        the CPU (no token buckets)
  python3 -m bench.activation_check run DIR
        on the GPU machine: random inputs, the GPU's outputs poisoned with
        NaN, the CPU library's outputs as the reference; then timed at the
        peers' sizes; one JSON line per result

One choice a token (top-k 1): a function's dynamic rows are its tokens', so
the routed rows fit its arguments. The functions: SwiGLU and GPT-OSS's
clamped SwiGLU forward; the backward with routing weights (a row's choice
and weight), with a shared-expert gate, and with neither; and the forward
quantized for the down matmul (fp8_block128: its codes and its scales, each
a function), at 776 columns (whole 16-byte pieces, a last block of 8) and
100 (none: a thread a block). Its codes come from bf16 activations whose
last place may differ from the CPU's (exp), so they are compared as the
values they stand for, and most must be the CPU's own.
"""
import json
import os
import subprocess
import sys

from bench.common import ROOT, bench, emit

INTER = 776  # not a multiple of the warp's 32 lanes
QUANT_UNALIGNED = 100  # no whole 16-byte pieces
ACTIVATIONS = {
    "swiglu": "#moe.activation<kind = swiglu>",
    "clamped": "#moe.activation<kind = clamped_swiglu, alpha = 1.702, "
               "limit = 7.0>",
}


def functions(i):
    """name: (text, result index): a compiled function returns one tensor,
    so each of activation_grad's results has its own."""
    h, a = f"tensor<?x{2 * i}xbf16>", f"tensor<?x{i}xbf16>"
    r, w, f = "tensor<?x1xi32>", "tensor<?x1xf32>", "tensor<?x1xf32>"
    gate = "tensor<?x1xbf16>"
    out = {}
    for name, attr in ACTIVATIONS.items():
        out[f"act_{name}"] = (
            f"func.func @act_{name}(%h: {h}) -> {a} {{\n"
            f"  %0 = moe.activation %h {{activation = {attr}}} : ({h}) -> {a}\n"
            f"  return %0 : {a}\n}}\n")
    for cols in (i, QUANT_UNALIGNED):
        hq, codes = f"tensor<?x{2 * cols}xbf16>", f"tensor<?x{cols}xf8E4M3FN>"
        scales = f"tensor<?x{-(-cols // 128)}xf32>"
        for n, which in enumerate(["codes", "scales"]):
            name = f"actq_{cols}_{which}"
            out[name] = (
                f"func.func @{name}(%h: {hq}) -> {(codes, scales)[n]} {{\n"
                f"  %0, %1 = moe.activation %h {{activation = "
                f"{ACTIVATIONS['swiglu']}, quant = #moe.quant<kind = "
                f"fp8_block128>}} : ({hq}) -> ({codes}, {scales})\n"
                f"  return %{n} : {(codes, scales)[n]}\n}}\n")
    # name: (parameters, the op's operands after %g, %h, their types,
    # activation, whether a weight's gradient comes out)
    variants = {
        f"grad_rows_{name}": (f"%g: {a}, %h: {h}, %r: {r}, %w: {w}",
                              "rows(%r, %w) ", [r, w], attr, True)
        for name, attr in ACTIVATIONS.items()}
    variants["grad_gate"] = (f"%g: {a}, %h: {h}, %s: {gate}", "gate %s ",
                             [gate], ACTIVATIONS["swiglu"], True)
    variants["grad_plain"] = (f"%g: {a}, %h: {h}", "", [],
                              ACTIVATIONS["swiglu"], False)
    for base, (params, extra, types, attr, weighted) in variants.items():
        results = [h, a] + ([f] if weighted else [])
        operands = ", ".join([a, h] + types)
        values = ", ".join(f"%{k}" for k in range(len(results)))
        for n, which in enumerate(["dh", "aw", "dw"][:len(results)]):
            name = f"{base}_{which}"
            out[name] = (
                f"func.func @{name}({params}) -> {results[n]} {{\n"
                f"  {values} = moe.activation_grad %g, %h {extra}"
                f"{{activation = {attr}}}\n"
                f"      : ({operands}) -> ({', '.join(results)})\n"
                f"  return %{n} : {results[n]}\n}}\n")
    return out


def prepare(out_dir):
    compile_ = os.path.join(ROOT, "build", "bin", "moe-compile")
    os.makedirs(out_dir, exist_ok=True)
    names = []
    for name, text in functions(INTER).items():
        src = os.path.join(out_dir, name + ".mlir")
        with open(src, "w") as f:
            f.write(text)
        for target in ("sm_90a", "cpu"):
            subprocess.run([compile_, src, f"--target={target}",
                            "--token-buckets=none", "-o",
                            os.path.join(out_dir,
                                         f"lib{name}_{target}.so")],
                           check=True)
        names.append(name)
    with open(os.path.join(out_dir, "functions.json"), "w") as f:
        json.dump({"inter": INTER, "names": names}, f)


def columns(name, i):
    """The activation's columns of function `name`."""
    return int(name.split("_")[1]) if name.startswith("actq_") else i


def inputs(name, t, i, dev, gen):
    import torch
    i = columns(name, i)
    g = torch.randn(t, i, generator=gen, device=dev).bfloat16()
    h = (3 * torch.randn(t, 2 * i, generator=gen, device=dev)).bfloat16()
    if name.startswith("act"):
        return [h]
    if name.startswith("grad_rows"):
        # Tokens whose choice is outside the experts (-1) have no row.
        r = torch.arange(t, dtype=torch.int32, device=dev)[:, None].clone()
        r[::7] = -1
        w = torch.rand(t, 1, generator=gen, device=dev)
        return [g, h, r, w]
    if name.startswith("grad_gate"):
        return [g, h, torch.randn(t, 1, generator=gen, device=dev).bfloat16()]
    return [g, h]


def output(name, t, i, dev, fill):
    import torch
    i = columns(name, i)
    if name.endswith("_codes"):
        return torch.full((t, i), fill, device=dev).to(torch.float8_e4m3fn)
    if name.endswith("_scales"):
        return torch.full((t, -(-i // 128)), fill, dtype=torch.float32,
                          device=dev)
    if name.endswith("_dw"):
        return torch.full((t, 1), fill, dtype=torch.float32, device=dev)
    cols = 2 * i if name.endswith("_dh") else i
    return torch.full((t, cols), fill, dtype=torch.bfloat16, device=dev)


def codes_of(lib_dir, name, args, target="sm_90a"):
    """The codes (as f32) of the quantized activation whose scales
    function is `name`, on `target`."""
    import torch
    from moe_compiler import Layer
    codes = name.replace("_scales", "_codes")
    out = output(codes, args[0].shape[0], 0, args[0].device, float("nan"))
    Layer(os.path.join(lib_dir, f"lib{codes}_{target}.so")).forward(*args,
                                                                   out)
    if target != "cpu":
        torch.cuda.synchronize()
    return out.cpu().float()


def check_quantized(name, gpu_codes, cpu_codes, got, want):
    """The values the codes stand for (code x its block's scale) against
    the CPU's: within one E4M3 step of the block's largest (1/16), most
    codes and scales the CPU's own."""
    import torch
    cols = gpu_codes.shape[1]
    blocks = torch.arange(cols) // 128
    a = gpu_codes.double() * got.double()[:, blocks]
    b = cpu_codes.double() * want.double()[:, blocks]
    finite = bool(torch.isfinite(a).all())
    err = ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()
    same_codes = (gpu_codes == cpu_codes).double().mean().item()
    same_scales = (got == want).double().mean().item()
    ok = finite and err <= 1 / 16 and same_codes >= 0.99 and \
        same_scales >= 0.99
    emit(what="check", function=name.replace("_scales", ""),
         max_rel_error=err, same_codes=same_codes, same_scales=same_scales,
         ok=ok)
    return ok


def run(lib_dir):
    import torch
    from moe_compiler import Layer

    spec = json.load(open(os.path.join(lib_dir, "functions.json")))
    i = spec["inter"]
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    failed = False
    t = 1000
    for name in spec["names"]:
        gpu = Layer(os.path.join(lib_dir, f"lib{name}_sm_90a.so"))
        cpu = Layer(os.path.join(lib_dir, f"lib{name}_cpu.so"))
        args = inputs(name, t, i, dev, gen)
        got = output(name, t, i, dev, float("nan"))
        gpu.forward(*args, got)
        torch.cuda.synchronize()
        want = output(name, t, i, torch.device("cpu"), 0.0)
        cpu.forward(*[x.cpu() for x in args], want)
        got = got.cpu()
        if name.startswith("actq_"):
            if name.endswith("_codes"):
                continue
            failed |= not check_quantized(name, gpu_codes=codes_of(
                lib_dir, name, args), cpu_codes=codes_of(
                lib_dir, name, [x.cpu() for x in args], "cpu"),
                got=got, want=want)
            continue
        if name.startswith("grad_rows") and not name.endswith("_dw"):
            # Rows no choice names are the CPU's zeros and no kernel's.
            keep = args[2][:, 0].cpu() >= 0
            got, want = got[keep], want[keep]
        got, want = got.double(), want.double()
        finite = bool(torch.isfinite(got).all())
        err = ((got - want).abs().max() /
               want.abs().max().clamp_min(1e-30)).item()
        # bf16 results may differ in the last place (exp, fused
        # multiply-adds); the weight's gradient is an f32 sum in another
        # order.
        ok = finite and err <= 1e-2
        failed |= not ok
        emit(what="check", function=name, max_rel_error=err,
             exact=torch.equal(got, want), ok=ok)
    # Times at Qwen3's 32768 rows (4096 tokens x 8 choices), beside the
    # same arithmetic in eager PyTorch (its backward recomputes the
    # activation too).
    t = 32768
    fwd = Layer(os.path.join(lib_dir, "libact_swiglu_sm_90a.so"))
    bwd = Layer(os.path.join(lib_dir, "libgrad_rows_swiglu_dh_sm_90a.so"))
    args = inputs("grad_rows_swiglu", t, i, dev, gen)
    g, h, r, w = args
    a_out = output("act_swiglu", t, i, dev, 0.0)
    dh_out = output("grad_rows_swiglu_dh", t, i, dev, 0.0)
    us = bench(lambda: fwd.forward(h, a_out), 50)
    emit(what="time", kernel="activation", rows=t, inter=i, us=us,
         tbps=(h.numel() + g.numel()) * 2 / us / 1e6)
    us = bench(lambda: bwd.forward(*args, dh_out), 50)
    emit(what="time", kernel="activation_grad", rows=t, inter=i, us=us,
         tbps=(2 * h.numel() + 2 * g.numel()) * 2 / us / 1e6)
    silu = torch.nn.functional.silu
    us = bench(lambda: silu(h[:, :i]) * h[:, i:], 50)
    emit(what="peer", kernel="activation", peer="torch eager", us=us)
    hh = h.detach().requires_grad_()

    def peer_backward():
        a = silu(hh[:, :i]) * hh[:, i:]
        dh, = torch.autograd.grad(a, hh, g * w.bfloat16())
        return dh, w * a.detach(), (g.float() * a.detach().float()).sum(1)
    us = bench(peer_backward, 50)
    emit(what="peer", kernel="activation_grad", peer="torch eager", us=us)
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] not in ("prepare", "run"):
        sys.exit(__doc__)
    if sys.argv[1] == "prepare":
        prepare(sys.argv[2])
    else:
        sys.exit(run(sys.argv[2]))
