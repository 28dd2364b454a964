#!/usr/bin/env python3
"""Trains one step of a layer compiled with ep_size N (moe-compile --train
--ep-size N, for the CPU or with --target sm_90a the GPU, where the ranks
share the current device) on N processes and checks every result bit for
bit against the same layer compiled with ep_size 1:

  * each rank's output and its tokens' gradient: the one-rank layer's on
    every rank's tokens together, that rank's rows;
  * each rank's experts' weight gradients: the one-rank layer's (on every
    rank's tokens), those experts' slice;
  * the parameters every rank holds (router, shared experts and their
    gate): the one-rank layer's on that rank's tokens alone. They are this
    rank's part, which the caller sums over ranks as data parallelism
    does.

Prints one line per rank count. --uneven gives rank 0 one more token and
checks that every rank refuses the step with the same message. --kill R
kills rank R in its backward (after it sent the output's gradient; on the
GPU, before its backward): every other rank must name it and leave every
gradient buffer as it was. Libraries already in --workdir are taken as they
are (built where MLIR is, run where the GPU is).
"""
import argparse
import math
import os
import signal
import socket
import subprocess
import sys

import torch

import check_train
import moe_compiler
from moe_compiler import ep
from moe_compiler.layer import LayerError


def compile_layer(opts, ranks):
    path = os.path.join(opts.workdir,
                        f"lib{opts.tag}-{opts.target}-train-ep{ranks}.so")
    if not os.path.exists(path):
        subprocess.run([opts.moe_compile, "--from-hf-config", opts.config,
                        f"--quant={opts.quant}", "--name", "layer", "--train",
                        f"--target={opts.target}", "--ep-size", str(ranks),
                        "-o", path], check=True)
    return path


def random_inputs(layer, tokens, seed):
    """check_train's random inputs, and an output gradient."""
    gen = torch.Generator().manual_seed(seed)
    inputs = check_train.random_inputs(layer, tokens, gen)
    dy = torch.randn(tokens, inputs[0].shape[1], generator=gen)
    return inputs, dy.to(torch.bfloat16)


def device_of(layer):
    return "cpu" if layer.target == "cpu" else "cuda"


def finished(layer):
    """A GPU layer's calls are done, and its group's waits all arrived."""
    if device_of(layer) == "cuda":
        torch.cuda.synchronize()
        layer.ep_check()


def step(layer, inputs, dy, grads=None, die_before_backward=False):
    """forward_train and backward, every result poisoned first; the results
    on the CPU."""
    dev = device_of(layer)
    inputs = [t.to(dev) for t in inputs]
    tokens = inputs[0].shape[0]
    out = torch.full(inputs[0].shape, math.nan, dtype=torch.bfloat16,
                     device=dev)
    saved = torch.full((layer.saved_size(tokens),), 255, dtype=torch.uint8,
                       device=dev)
    layer.forward_train(*inputs, out, saved=saved)
    finished(layer)
    if die_before_backward:
        os.kill(os.getpid(), signal.SIGKILL)
    if grads is None:
        grads = [torch.full(shape, math.nan, dtype=dtype, device=dev)
                 for _, dtype, shape in layer.gradient_shapes(tokens)]
    layer.backward(inputs, dy.to(dev), saved, grads)
    finished(layer)
    return [t.cpu() for t in [out] + grads]


def sharded(layer1, layerN):
    """Which inputs an expert-parallel rank holds a slice of (its experts')."""
    args1 = [a for a in layer1.args if not a["output"]]
    argsN = [a for a in layerN.args if not a["output"]]
    return {a["name"]: a["shape"] != b["shape"] for a, b in zip(args1, argsN)}


def worker(opts):
    """One rank: its slice of the tokens and of the experts' weights."""
    data = torch.load(opts.data)
    layer = moe_compiler.Layer.open(data["lib"])
    r, n = opts.worker, data["ranks"]
    rendezvous = ep.Rendezvous(r, n, "127.0.0.1", data["port"],
                               data["fd"] if r == 0 else -1, True)
    if device_of(layer) == "cuda":
        torch.zeros(1, device="cuda")  # init takes the current context
    layer.ep_init(rendezvous, max_tokens=data["tokens"] + 1,
                  timeout_ms=data["timeout_ms"], proxy=data["proxy"])
    split = sharded(moe_compiler.Layer.open(data["lib1"]), layer)
    inputs = []
    for arg, t in zip([a for a in layer.args if not a["output"]],
                      data["inputs"]):
        if arg["name"] == "hidden_states":
            t = t[data["starts"][r]:data["starts"][r + 1]]
        elif split[arg["name"]]:
            local = t.shape[0] // n
            t = t[r * local:(r + 1) * local]
        inputs.append(t.contiguous())
    dy = data["dy"][data["starts"][r]:data["starts"][r + 1]].contiguous()
    # Gradients hold a known value: a refused backward must leave it.
    tokens = inputs[0].shape[0]
    grads = [torch.full(shape, 7.0, dtype=dtype, device=device_of(layer))
             for _, dtype, shape in layer.gradient_shapes(tokens)]
    try:
        results = step(layer, inputs, dy, grads,
                       data["gpu_kill"] == r)
        torch.save({"results": results}, f"{opts.data}.rank{r}")
    except LayerError as e:
        if device_of(layer) == "cuda":
            torch.cuda.synchronize()
        untouched = all(bool((g == 7.0).all()) for g in grads)
        torch.save({"error": str(e), "untouched": untouched},
                   f"{opts.data}.rank{r}")
    layer.ep_finalize()


def run_ranks(opts, lib1, libN, n, inputs, dy, starts):
    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    fd = sock.detach()
    data = os.path.join(opts.workdir,
                        f"{opts.tag}-{opts.target}-train-ep{n}.pt")
    env = dict(os.environ)
    if opts.kill is not None and opts.target == "cpu":
        # Its second dispatch: the backward's.
        env.update(MOE_EP_TEST_KILL_RANK=str(opts.kill),
                   MOE_EP_TEST_KILL_AFTER="1")
    torch.save({"lib": libN, "lib1": lib1, "ranks": n, "port": port,
                "timeout_ms": 3000 if opts.kill is not None else 0,
                "gpu_kill": opts.kill if opts.target != "cpu" else None,
                "proxy": opts.proxy,
                "fd": fd, "tokens": max(b - a for a, b in
                                        zip(starts, starts[1:])),
                "inputs": inputs, "dy": dy, "starts": starts}, data)
    procs = []
    for r in range(n):
        sanitizer = ["compute-sanitizer", "--tool", "memcheck",
                     "--error-exitcode", "3"] if opts.sanitize else []
        procs.append(subprocess.Popen(
            sanitizer + [sys.executable, __file__, opts.config, "--worker", str(r),
             "--data", data, "--compile", opts.moe_compile,
             "--workdir", opts.workdir, "--target", opts.target],
            pass_fds=(fd,) if r == 0 else (), env=env))
    os.close(fd)
    results = []
    for r, p in enumerate(procs):
        code = p.wait(timeout=600)
        if r == opts.kill and code == -9:
            results.append({"killed": True})
            continue
        if code != 0:
            raise SystemExit(f"rank {r} exited {code}")
        results.append(torch.load(f"{data}.rank{r}"))
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("config")
    ap.add_argument("--compile", dest="moe_compile", required=True)
    ap.add_argument("--ranks", default="2")
    ap.add_argument("--tokens", type=int, default=9,
                    help="tokens a rank")
    ap.add_argument("--quant", default="auto")
    ap.add_argument("--target", default="cpu")
    ap.add_argument("--proxy", action="store_true",
                    help="GPU ranks exchange through the proxy and host "
                         "memory, as between hosts")
    ap.add_argument("--sanitize", action="store_true",
                    help="every rank under compute-sanitizer memcheck")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--uneven", action="store_true")
    ap.add_argument("--kill", type=int)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    opts = ap.parse_args()
    name = os.path.splitext(os.path.basename(opts.config))[0]
    opts.tag = f"{name}-{opts.quant}"
    if opts.worker is not None:
        return worker(opts)

    os.makedirs(opts.workdir, exist_ok=True)
    lib1 = compile_layer(opts, 1)
    layer1 = moe_compiler.Layer.open(lib1)
    status = 0
    for n in [int(x) for x in opts.ranks.split(",")]:
        counts = [opts.tokens + (1 if opts.uneven and r == 0 else 0)
                  for r in range(n)]
        starts = [sum(counts[:r]) for r in range(n + 1)]
        inputs, dy = random_inputs(layer1, starts[-1], opts.seed)
        libN = compile_layer(opts, n)
        got = run_ranks(opts, lib1, libN, n, inputs, dy, starts)
        label = f"{opts.tag}, {n} ranks x {opts.tokens} tokens" + \
            (" (proxy)" if opts.proxy else "")
        if opts.uneven:
            errors = {g.get("error") for g in got}
            # A GPU rank's message names its own count and a peer's.
            ok = None not in errors and (len(errors) == 1 or all(
                "the same count on every rank" in e for e in errors))
            print(f"{label}, rank 0 one more: " +
                  (f"refused by every rank alike ({min(errors)})" if ok
                   else f"NOT refused alike: {errors}"))
            status |= 0 if ok else 1
            continue
        if opts.kill is not None:
            for r, g in enumerate(got):
                if r == opts.kill:
                    ok = g.get("killed", False)
                    print(f"{label}: rank {r} " +
                          ("was killed in its backward" if ok else
                           "was NOT killed"))
                else:
                    ok = "error" in g and g["untouched"]
                    print(f"{label}: rank {r}: " +
                          (f"{g['error']}; every gradient untouched" if ok
                           else f"NOT refused cleanly: {g}"))
                status |= 0 if ok else 1
            continue
        whole = step(layer1, inputs, dy)
        names = ["output"] + [g for g, *_ in layer1.gradient_shapes(1)]
        split = sharded(layer1, moe_compiler.Layer.open(libN))
        differ = []
        for r in range(n):
            if "error" in got[r]:
                differ.append(f"rank {r}: {got[r]['error']}")
                continue
            mine = [t[starts[r]:starts[r + 1]] if i == 0 else t
                    for i, t in enumerate(inputs)]
            alone = step(layer1, mine, dy[starts[r]:starts[r + 1]])
            for i, gname in enumerate(names):
                if gname in ("output", "hidden_states"):
                    want = whole[i][starts[r]:starts[r + 1]]
                elif split.get(gname):
                    local = whole[i].shape[0] // n
                    want = whole[i][r * local:(r + 1) * local]
                else:
                    want = alone[i]
                g = got[r]["results"][i]
                if g.shape != want.shape or not torch.isfinite(g).all() or \
                        not torch.equal(
                        g.view(torch.uint8) if g.dtype != torch.float32
                        else g.view(torch.int32),
                        want.view(torch.uint8) if want.dtype != torch.float32
                        else want.view(torch.int32)):
                    differ.append(f"rank {r} {gname}")
        print(f"{label}: {len(names)} results a rank " +
              ("bit-identical to one rank" if not differ else
               "DIFFER: " + ", ".join(differ)))
        status |= 1 if differ else 0
    return status


if __name__ == "__main__":
    sys.exit(main())
