#!/usr/bin/env python3
"""moe_compiler.patch on tiny random-weight transformers models (built from
Inputs/hf-models.json, 2 decoder layers, nothing downloaded), on the CPU
backend or a GPU.

  check_patch.py models [--target T] [--quant Q]
      every model type: each patched block against the HF block it
      replaced (float32, same bf16 weights and inputs), and greedy
      generate() after patch against HF eager: the share of equal tokens.
  check_patch.py refusals
      what patch refuses, one line each with its message.
  check_patch.py ep MODEL  (under torchrun, gloo)
      a model patched over the world group, and over torchrun's variables
      ("env"), bit for bit the same logits as patched on one rank.
  check_patch.py ep-killed MODEL  (under torchrun)
      rank 1 dies before a forward; every survivor's forward raises,
      naming it.
"""
import argparse
import copy
import gc
import json
import math
import os
import sys
import time

import torch
import moe_compiler
from moe_compiler import LayerError
from transformers import AutoConfig, AutoModelForCausalLM

MODELS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "Inputs",
                      "hf-models.json")


def build(name, seed=0, **overrides):
    """A tiny model of type `name`, random weights (normal, 1/sqrt(fan-in)),
    in bf16."""
    fields = dict(json.load(open(MODELS))[name], **overrides)
    kind = fields.pop("model_type")
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(
        AutoConfig.for_model(kind, **fields))
    with torch.no_grad():
        for pname, p in model.named_parameters():
            fan_in = p.shape[-1]
            if p.dim() == 3 and ("gpt" in kind or "llama4" in kind):
                fan_in = p.shape[1]  # x @ W: [E, in, out]
            if p.dim() >= 2:
                p.normal_(0, 1 / math.sqrt(fan_in))
            elif "bias" in pname:
                p.normal_(0, 0.1)
    return model.to(torch.bfloat16).eval()


def blocks(model):
    return [(i, getattr(layer, "mlp", None) or layer.feed_forward)
            for i, layer in enumerate(model.model.layers)]


def first(output):
    return output[0] if isinstance(output, tuple) else output


def check_models(args):
    device = "cpu" if args.target == "cpu" else "cuda"
    names = args.models or list(json.load(open(MODELS)))
    for name in names:
        model = build(name).to(device)
        reference = copy.deepcopy(model).float()
        hidden = model.config.hidden_size
        gen = torch.Generator().manual_seed(1)
        ids = torch.randint(0, model.config.vocab_size, (4, 6),
                            generator=gen).to(device)
        settings = dict(max_new_tokens=16, do_sample=False, pad_token_id=0)
        want = model.generate(ids, **settings)
        with torch.no_grad():
            want_logits = model(want).logits[:, 5:-1].float()
            exact = reference(want).logits[:, 5:-1].double()
            want_router = router_logits(model, want)
        want_next = want_logits.argmax(-1)
        moe_compiler.patch(model, target=args.target, quant=args.quant,
                           cache_dir=args.cache)
        patched = [type(b).__name__ for _, b in blocks(model)]
        bound = 1e-2 if args.quant is None else 0.15
        for (i, ours), (_, theirs) in zip(blocks(model), blocks(reference)):
            x = torch.randn(2, 9, hidden, generator=gen).to(torch.bfloat16)
            x = x.to(device)
            with torch.no_grad():
                expect = first(theirs(x.float())).reshape(-1, hidden)
                got = first(ours(x)).reshape(-1, hidden).float()
            error = ((got.double() - expect.double()).norm() /
                     expect.double().norm()).item()
            verdict = "ok" if error <= bound else "FAILED"
            print(f"{name} layer {i}: {patched[i]} replaces "
                  f"{type(theirs).__name__}: relative error {error:.1e} "
                  f"(bound {bound:g}) {verdict}")
        # Greedy decoding runs apart at the first near-tie it breaks the
        # other way, so positions are compared on HF's own tokens (each
        # next-token choice from the same prefix); the free-running share
        # is printed too.
        got = model.generate(ids, **settings)
        with torch.no_grad():
            got_logits = model(want).logits[:, 5:-1].float()
        same = (got_logits.argmax(-1) == want_next).float().mean().item()
        free = (got[:, 6:] == want[:, 6:]).float().mean().item()
        # Per position (a token whose routing turns on a near-tie moves far,
        # in either model, and so do the positions after it): the median
        # error against the float32 model's, beside HF's own bf16 model's.
        def position_errors(logits):
            return ((logits - exact).norm(dim=-1) /
                    exact.norm(dim=-1)).flatten()
        error = position_errors(got_logits).median().item()
        bound = position_errors(want_logits.double()).median().item()
        if args.quant is None:
            ok = same >= 0.95 and error <= max(2 * bound, 1e-2)
            verdict = "ok" if ok else "FAILED"
        else:
            verdict = "(FP8: reported)"
        if want_router:
            with torch.no_grad():
                got_router = router_logits(model, want)
            # Layer 0 sees the same input in both (bounded); later layers
            # what the blocks before them gave (reported).
            errors = [((g.double() - w.double()).norm() /
                       w.double().norm()).item()
                      for g, w in zip(got_router, want_router)]
            ok = len(got_router) == len(want_router) and \
                bool(errors) and errors[0] <= 1e-2 and \
                all(g.shape == w.shape and g.dtype == w.dtype
                    for g, w in zip(got_router, want_router))
            print(f"{name} router logits: {len(got_router)} layers recorded "
                  f"({len(want_router)} by HF), relative error "
                  f"{', '.join(f'{x:.1e}' for x in errors)} "
                  f"{'ok' if ok else 'FAILED'}")
        print(f"{name} generate: {same:.0%} of 64 next-token choices as HF "
              f"eager's; logits off float32 by {error:.1e} (HF bf16: "
              f"{bound:.1e}) {verdict} (free-running: {free:.0%} of tokens)")
        sys.stdout.flush()


def router_logits(model, ids):
    """The router logits the model records with output_router_logits (none
    for a model that records none)."""
    out = model(ids, output_router_logits=True)
    logits = getattr(out, "router_logits", None)
    return tuple(logits) if logits else ()


def refused(what, call):
    try:
        call()
    except LayerError as e:
        print(f"{what}: refused: {str(e).splitlines()[0]}")
        return
    print(f"{what}: NOT refused")


def check_refusals(args):
    from transformers import LlamaConfig, LlamaForCausalLM
    dense = LlamaForCausalLM(LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, vocab_size=32))
    refused("a dense llama model",
            lambda: moe_compiler.patch(dense, target="cpu"))
    no_moe = build("qwen3_moe", mlp_only_layers=[0, 1])
    refused("qwen3_moe, every layer in mlp_only_layers",
            lambda: moe_compiler.patch(no_moe, target="cpu"))
    refused("a torch module that is not a transformers model",
            lambda: moe_compiler.patch(torch.nn.Linear(2, 2)))
    model = build("qwen3_moe")
    refused("quant='int4'",
            lambda: moe_compiler.patch(model, target="cpu", quant="int4",
                                       cache_dir=args.cache))
    refused("target sm_90a, the model on the CPU",
            lambda: moe_compiler.patch(model, cache_dir=args.cache))
    os.environ.update(RANK="0", WORLD_SIZE="3", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT="29500")
    refused("8 experts over 3 expert-parallel ranks (torchrun's variables)",
            lambda: moe_compiler.patch(model, target="cpu", ep_group="env",
                                       cache_dir=args.cache))
    os.environ["RANK"] = "3"
    refused("RANK 3 of WORLD_SIZE 3",
            lambda: moe_compiler.patch(model, target="cpu", ep_group="env",
                                       cache_dir=args.cache))
    del os.environ["WORLD_SIZE"]
    refused("WORLD_SIZE unset",
            lambda: moe_compiler.patch(model, target="cpu", ep_group="env",
                                       cache_dir=args.cache))
    # Weights held as FP8 128 x 128 blocks run as such, never re-quantized.
    import numpy as np
    from moe_compiler.module import quantize_once
    held = {"w13": np.zeros((8, 256, 256), np.float32),
            "w13_scale": np.ones((8, 2, 2), np.float32)}
    refused("quant='mxfp8' on FP8 block-128 weights",
            lambda: quantize_once(held, "mxfp8", {}))
    print("blocks left in place after the refusals:",
          type(model.model.layers[0].mlp).__name__)


def say(line):
    """One line in one write: ranks share the output."""
    os.write(1, (line + "\n").encode())


def logits(model, rank):
    gen = torch.Generator().manual_seed(rank)
    # Ranks pass different token counts, one of them none at all.
    tokens = [5, 0, 17, 3][rank % 4]
    device = model.device
    ids = torch.randint(0, model.config.vocab_size, (1, tokens),
                        generator=gen).to(device)
    with torch.no_grad():
        if tokens == 0:
            # Every forward is a collective: a rank with no tokens still
            # runs each MoE layer, in the model's order.
            hidden = model.config.hidden_size
            return torch.cat([first(block(torch.zeros(
                1, 0, hidden, dtype=torch.bfloat16, device=device)))
                for _, block in blocks(model)])
        return model(ids).logits


INPUTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "Inputs")


def _tiny_qwen3():
    with open(os.path.join(INPUTS, "tiny", "qwen3_moe.json")) as f:
        return json.load(f)


def _compile_into(cache):
    from moe_compiler.module import compile_layer
    library = compile_layer(_tiny_qwen3(), target="cpu", cache_dir=cache)
    with open(os.path.join(os.path.dirname(library), "compiler-id")) as f:
        return os.path.exists(library), f.read()


def check_cache(args):
    """Six processes (a group's ranks) compile one config into one cache at
    once, into an empty cache and over another compiler's entry: each gets
    the whole entry of this compiler, and nothing else is left."""
    import multiprocessing
    from moe_compiler.module import compile_layer
    config = _tiny_qwen3()
    for case in ("an empty cache", "another compiler's entry"):
        cache = os.path.join(args.cache, "race-" + case.split()[0])
        if case != "an empty cache":
            stale = compile_layer(config, target="cpu", cache_dir=cache)
            with open(os.path.join(os.path.dirname(stale), "compiler-id"),
                      "w") as f:
                f.write("another compiler")
        with multiprocessing.get_context("fork").Pool(6) as pool:
            got = pool.map(_compile_into, [cache] * 6)
        ids = {i for _, i in got}
        ok = all(whole for whole, _ in got) and len(ids) == 1 and \
            "another compiler" not in ids
        verdict = "each has this compiler's whole entry" if ok else str(got)
        print(f"cache, 6 processes at once into {case}: {verdict}; "
              f"{len(os.listdir(cache))} left in the cache")


def ep_port(args):
    """--port, else a port free on rank 0's host, told to every rank."""
    import socket
    import torch.distributed as dist
    if args.port:
        return args.port
    port = [0]
    if dist.get_rank() == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port[0] = s.getsockname()[1]
    dist.broadcast_object_list(port, src=0)
    return port[0]


def check_ep(args):
    import torch.distributed as dist
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    name = args.models[0]
    device = "cpu" if args.target == "cpu" else "cuda"
    one = moe_compiler.patch(build(name).to(device), target=args.target,
                             cache_dir=args.cache)
    want = logits(one, rank)
    layer = None
    for group in ("env", dist.group.WORLD):
        if group == "env":
            os.environ["MOE_EP_PORT"] = str(ep_port(args))
        model = moe_compiler.patch(build(name).to(device), target=args.target,
                                   ep_group=group, cache_dir=args.cache)
        got = logits(model, rank)
        how = "the world group" if group != "env" else "torchrun's variables"
        verdict = "bit-identical" if torch.equal(got, want) else "DIFFERENT"
        say(f"{name}, rank {rank} of {world} over {how}: {verdict} to one "
            f"rank")
        if group == "env":
            # Every rank leaves the group together (collection would leave
            # it without meeting the others), then drops the model.
            for _, block in blocks(model):
                if hasattr(block, "moe"):
                    block.moe.layer.ep_finalize()
            del model
            gc.collect()
            dist.barrier()
    # The layer over the world group finishes with the group.
    layer = blocks(model)[0][1].moe.layer
    dist.destroy_process_group()
    say(f"rank {rank}: destroy_process_group "
        f"{'finalized' if not layer._ep_live else 'did NOT finalize'} the "
        f"layer's group")


def check_ep_killed(args):
    import torch.distributed as dist
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    device = "cpu" if args.target == "cpu" else "cuda"
    model = moe_compiler.patch(build(args.models[0]).to(device),
                               target=args.target, ep_group=dist.group.WORLD,
                               ep_timeout_ms=3000, cache_dir=args.cache)
    logits(model, rank)
    if rank == 1:
        sys.stdout.flush()
        os._exit(0)
    start = time.time()
    try:
        logits(model, rank)
        say(f"rank {rank}: NOT raised")
    except LayerError as e:
        say(f"rank {rank} raised after {time.time() - start:.0f} s: {e}")
    os._exit(0)  # the group lost a rank: nothing to tear down with it


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("what", choices=["models", "refusals", "ep", "ep-killed",
                                     "cache"])
    ap.add_argument("models", nargs="*")
    ap.add_argument("--target", default="cpu")
    ap.add_argument("--quant")
    ap.add_argument("--cache", required=True, help="the compile cache")
    ap.add_argument("--port", type=int, default=0,
                    help="MOE_EP_PORT for the 'env' rendezvous (default: "
                         "one free on rank 0's host)")
    args = ap.parse_intermixed_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    {"models": check_models, "refusals": check_refusals, "ep": check_ep,
     "ep-killed": check_ep_killed, "cache": check_cache}[args.what](args)


if __name__ == "__main__":
    main()
