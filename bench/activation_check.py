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
and weight), with a shared-expert gate, and with neither.
"""
import json
import os
import subprocess
import sys

from bench.common import ROOT, bench, emit

INTER = 776  # not a multiple of the warp's 32 lanes
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


def inputs(name, t, i, dev, gen):
    import torch
    g = torch.randn(t, i, generator=gen, device=dev).bfloat16()
    h = (3 * torch.randn(t, 2 * i, generator=gen, device=dev)).bfloat16()
    if name.startswith("act_"):
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
    if name.endswith("_dw"):
        return torch.full((t, 1), fill, dtype=torch.float32, device=dev)
    cols = 2 * i if name.endswith("_dh") else i
    return torch.full((t, cols), fill, dtype=torch.bfloat16, device=dev)


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
