"""Checks and times a GPU layer's route (compile it with --router-logits).

    python3 -m bench.route_check LIB... [--tokens N...] [--max-tokens N]

For each layer: one forward of --max-tokens random tokens (outputs poisoned
first); its router logits against float64 (hidden @ router_weight^T, plus
the bias where the router adds it), as a relative error. Then for each
count of --tokens, the first tokens alone: a call in its own bucket, whose
route kernels may be another form (a bucket of few tokens spreads the
product over chunks of columns); its logits must equal the big call's
bit for bit, the guarantee that every bucket and every rank chooses alike.
The route kernels' device times (torch.profiler) beside the PyTorch peer's
(the router product in bf16 with f32 output, then softmax or sigmoid and
top-k) on the same tokens. One JSON line per layer and count.
"""
import argparse
import sys

import torch
from moe_compiler import Layer

from bench.common import bench, emit, kernel_times, make_inputs


def router_logits64(named, info):
    """The router logits in float64, as the layer returns them: plus the
    bias, except DeepSeek's, which only ranks the scores."""
    logits = named["hidden_states"].double() @ \
        named["router_weight"].double().t()
    bias = named.get("router_bias")
    if bias is not None and info["config"]["router"] != "sigmoid_grouped_topk":
        logits = logits + bias.double()
    return logits


def peer(named, info):
    """The router as PyTorch runs it: one bf16 product, f32 scores, top-k."""
    c = info["config"]
    x, w = named["hidden_states"], named["router_weight"]
    sigmoid = c["router"] == "sigmoid_grouped_topk"

    def fwd():
        logits = (x @ w.t()).float()
        scores = logits.sigmoid() if sigmoid else logits.softmax(-1)
        return scores.topk(c["top_k"], dim=-1)
    return fwd


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("libraries", nargs="+")
    ap.add_argument("--tokens", type=int, nargs="+",
                    default=[1, 8, 64, 128, 512, 600, 4096])
    ap.add_argument("--max-tokens", type=int, default=4096)
    ap.add_argument("--bound", type=float, default=1e-5)
    opts = ap.parse_args()
    dev = torch.device("cuda")
    failed = False
    for path in opts.libraries:
        layer = Layer(path)
        name = layer.info["name"]
        names = [a["name"] for a in layer.args]
        if "router_logits" not in names:
            sys.exit(f"{path}: the layer returns no router logits "
                     "(compile it with --router-logits)")
        gen = torch.Generator(device=dev).manual_seed(0)
        full = make_inputs(layer, opts.max_tokens, gen, dev)
        named = dict(zip(names, full))
        layer.forward(*full)
        torch.cuda.synchronize()
        logits = named["router_logits"]
        ref = router_logits64(named, layer.info)
        err = ((logits.double() - ref).norm() / ref.norm()).item()
        ok = bool(torch.isfinite(logits).all()) and err <= opts.bound
        failed |= not ok
        emit(what="logits", layer=name, tokens=opts.max_tokens,
             rel_error_vs_f64=err, bound=opts.bound, ok=ok)
        for tokens in opts.tokens:
            part = [t[:tokens].clone() if n in ("hidden_states", "out",
                                                 "router_logits") else t
                    for n, t in zip(names, full)]
            for n, t in zip(names, part):
                if n in ("out", "router_logits"):
                    t.fill_(float("nan"))
            layer.forward(*part)
            torch.cuda.synchronize()
            same = bool(torch.equal(part[names.index("router_logits")],
                                    logits[:tokens]))
            failed |= not same
            times = kernel_times(layer, part)
            route = {k: round(v, 2) for k, v in times.items() if "route" in k}
            sub = {n: t for n, t in zip(names, part)}
            emit(what="route", layer=name, tokens=tokens,
                 equal_to_big_call=same, ok=same,
                 route_us=round(sum(route.values()), 2), kernels=route,
                 peer_us=round(bench(peer(sub, layer.info), 50), 2))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
