#!/usr/bin/env python3
"""Training through moe_compiler.patch on tiny random-weight transformers
models (Inputs/hf-models.json, 2 decoder layers), on the CPU backend or,
with --target=sm_90a, on the GPU (its libraries compiled beforehand with
`prepare` where the GPU machine has no compiler).

  check_train.py grads [MODEL...] [--quant SCHEME]
      each patched block's backward (input, router, every expert weight,
      biases, shared experts) against the HF block's in float32 (its
      grouped matmul takes no float64; the C++ checks run float64), on the
      same bf16 weights and input; tokens at a routing near-tie left out.
      With --quant (patch's quant=), the block quantizes its bf16 weights
      and activations in each call: its gradients are straight-through, and
      the bound must allow for what the bf16 block does not quantize.
  check_train.py parity [MODEL...] [--steps N] [--quant SCHEME]
      a 2-layer model trains N steps (AdamW, a fixed synthetic task, the
      same seed and data) patched and unpatched: the losses per step. A
      quantized model's steps are bounded by its last loss (within 0.5%)
      and by every loss being finite.
  check_train.py layers [MODEL...] --target=sm_90a [--tokens N,...]
                 [--bf16-grads] [--quant SCHEME]
      each model's layer library built for training, on the GPU against
      the CPU backend's on the same random weights, inputs and output
      gradient: every output the GPU writes is poisoned (NaN, 0xff bytes)
      first; tokens the two backends route differently (a near-tie, in
      the saved expert ids) take a zero output gradient and are left out.
      With --bf16-grads, both libraries write the weights' gradients in
      bf16. A MODEL ending in .json is a HF config.json: its layer alone
      (odd shapes).
  check_train.py prepare [MODEL...] --target=T
      compiles the libraries the other modes use into the cache.
  check_train.py quant-api MODEL --quant SCHEME
      a quantized block that trains: the state_dict unchanged, and its
      inference forward bit for bit a train=False block's (FP8 weights
      alone) on the same parameters, before and after a training step.
  check_train.py api MODEL
      state_dict keys, an optimizer made after patch, a checkpoint saved
      after training loaded into the unpatched model, gradient
      accumulation, activation checkpointing, and the bad inputs the
      backward refuses.
  check_train.py ep [MODEL...] [--ranks N] [--quant SCHEME]
      a model patched with ep_group= on N processes (torch.distributed,
      gloo, the CPU backend), each on its own sequences, its gradients
      summed over the group (as DistributedDataParallel does), against the
      one-process patched model on the same sequences (a forward per
      rank's share): the loss and every parameter's gradient (bf16: the
      two sum the shares' expert gradients in different orders).
"""
import argparse
import copy
import json
import math
import os
import sys
import tempfile

import torch
import moe_compiler
from check_patch import MODELS, blocks, build, first, refused


def device_of(target):
    return "cpu" if target == "cpu" else "cuda"


def patched(name, cache, seed=0, target="cpu", quant=None):
    model = build(name, seed=seed).to(device_of(target))
    moe_compiler.patch(model, target=target, cache_dir=cache, quant=quant)
    return model


def near_ties(block, x):
    """Tokens whose top-k choice is within a hair of the next expert: the
    two sides may route them differently."""
    router = getattr(block, "gate", None) or getattr(block, "router")
    weight = router.weight.double()
    logits = x.double() @ weight.T
    if getattr(router, "bias", None) is not None:
        logits = logits + router.bias.double()
    if hasattr(router, "e_score_correction_bias"):
        logits = logits.sigmoid() + router.e_score_correction_bias.double()
    k = block.moe.layer.info["config"]["top_k"]
    top = logits.topk(k + 1, dim=-1).values
    gap = top[:, k - 1] - top[:, k]
    return gap < 1e-2 * logits.abs().max()


def check_grads(args):
    names = args.models or list(json.load(open(MODELS)))
    for name in names:
        device = device_of(args.target)
        model = build(name).to(device)
        reference = copy.deepcopy(model).float()
        moe_compiler.patch(model, target=args.target, cache_dir=args.cache,
                           quant=args.quant)
        hidden = model.config.hidden_size
        gen = torch.Generator().manual_seed(2)
        for (i, ours), (_, theirs) in zip(blocks(model), blocks(reference)):
            x = torch.randn(3, 7, hidden, generator=gen).to(torch.bfloat16)
            x = x.to(device)
            flat = x.reshape(-1, hidden)
            keep = ~near_ties(ours, flat.float())
            dy = torch.randn(3, 7, hidden, generator=gen).to(torch.bfloat16)
            dy = dy.to(device) * keep.reshape(3, 7, 1)
            xo = x.clone().requires_grad_(True)
            first(ours(xo)).reshape(3, 7, hidden).backward(dy)
            xr = x.float().requires_grad_(True)
            first(theirs(xr)).reshape(3, 7, hidden).backward(dy.float())
            worst, report = 0.0, []
            pairs = [("hidden_states", xo.grad, xr.grad)]
            theirs_params = dict(theirs.named_parameters())
            for pname, p in ours.named_parameters():
                if pname.startswith("moe."):
                    continue
                q = theirs_params[pname]
                if q.grad is None and p.grad is None:
                    continue
                pairs.append((pname, p.grad, q.grad))
            for pname, got, want in pairs:
                if got is None or want is None:
                    report.append(f"{pname}: "
                                  f"{'missing' if got is None else 'extra'}")
                    worst = math.inf
                    continue
                g, w = got.double(), want.double()
                if pname == "hidden_states":
                    g = g.reshape(-1, hidden)[keep]
                    w = w.reshape(-1, hidden)[keep]
                error = ((g - w).norm() / max(w.norm(), 1e-30)).item()
                worst = max(worst, error)
                report.append(f"{pname} {error:.1e}")
            verdict = "ok" if worst <= args.bound else "FAILED"
            print(f"{name} layer {i}: {len(pairs)} gradients, worst relative "
                  f"error {worst:.1e} (bound {args.bound:g}) {verdict}")
            if verdict != "ok":
                print("   " + "; ".join(report))
            ours.zero_grad()
        sys.stdout.flush()


def task(model, steps, seed=3, batch=8, length=32):
    """Token batches of a fixed synthetic task, a fresh one each step: each
    sequence repeats a short random pattern, so a token is learnable from
    the ones before it (the first pattern never is, which keeps the loss
    far from 0: relative differences stay meaningful)."""
    gen = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    for _ in range(steps):
        period = 4
        pattern = torch.randint(0, vocab, (batch, period), generator=gen)
        yield pattern.repeat(1, length // period)


def train(model, steps, lr=1e-4):
    """AdamW on the task's batches; the loss of each step."""
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    device = next(model.parameters()).device
    for ids in task(model, steps):
        ids = ids.to(device)
        loss = model(ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def check_parity(args):
    names = args.models or list(json.load(open(MODELS)))
    for name in names:
        theirs = train(build(name).to(device_of(args.target)), args.steps)
        ours = train(patched(name, args.cache, target=args.target,
                             quant=args.quant), args.steps)
        gaps = [abs(a - b) / abs(b) for a, b in zip(ours, theirs)]
        worst = max(gaps)
        end = gaps[-1]
        finite = all(math.isfinite(x) for x in ours)
        # Quantized steps differ from bf16 ones by more than rounding; the
        # run is bounded where it ends.
        ok = finite and end <= 0.005 and (args.quant or worst <= 0.01)
        print(f"{name}: {args.steps} steps, loss {theirs[0]:.3f} -> "
              f"{theirs[-1]:.3f} unpatched, {ours[0]:.3f} -> {ours[-1]:.3f} "
              f"patched; worst step {worst:.2%} "
              f"({'unbounded' if args.quant else 'bound 1%'}), last "
              f"{end:.2%} (bound 0.5%) {'ok' if ok else 'FAILED'}")
        sys.stdout.flush()


def check_quant_api(args):
    """A quantized block that trains keeps the model's bf16 parameters;
    its inference forward runs on FP8 weights quantized from them, once per
    change: bit for bit a train=False block's (FP8 alone, quantized once)
    on the same parameters, before and after a training step."""
    name, quant = args.models[0], args.quant
    model = build(name)
    shapes = {k: (tuple(v.shape), v.dtype) for k, v in
              model.state_dict().items()}
    moe_compiler.patch(model, target="cpu", cache_dir=args.cache,
                       quant=quant)
    after = {k: (tuple(v.shape), v.dtype) for k, v in
             model.state_dict().items()}
    print(f"{quant} state_dict after patch: "
          f"{'the same keys, shapes and dtypes' if after == shapes else 'CHANGED'}")
    ids = next(iter(task(model, 1, seed=11)))

    def same_as_fp8_only(label):
        frozen = build(name)
        frozen.load_state_dict(model.state_dict())
        moe_compiler.patch(frozen, target="cpu", cache_dir=args.cache,
                           quant=quant, train=False)
        held = [p.dtype for _, b in blocks(frozen)
                for p in b.moe.weights()]
        model.eval()
        with torch.no_grad():
            ours, theirs = model(ids).logits, frozen(ids).logits
        model.train()
        print(f"{label}: no_grad logits bit-identical to a train=False "
              f"model's ({torch.float8_e4m3fn in held and 'FP8 weights'}): "
              f"{torch.equal(ours, theirs)}")
        return ours

    first_logits = same_as_fp8_only("before training")
    losses = train(model, 1)
    second = same_as_fp8_only("after a step")
    print(f"the step changed the inference forward: "
          f"{not torch.equal(first_logits, second)}; loss finite: "
          f"{math.isfinite(losses[0])}")


def check_api(args):
    name, cache = args.models[0], args.cache
    model = build(name)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    shapes = {k: (tuple(v.shape), v.dtype) for k, v in before.items()}
    moe_compiler.patch(model, target="cpu", cache_dir=args.cache)
    after = {k: (tuple(v.shape), v.dtype) for k, v in
             model.state_dict().items()}
    print(f"state_dict after patch: "
          f"{'the same keys, shapes and dtypes' if after == shapes else 'CHANGED'}"
          f" ({len(shapes)} tensors)")

    # Trained after patch, saved, loaded into the unpatched model: the
    # same logits as the patched model's (under no_grad).
    losses = train(model, 5)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "model.pt")
        torch.save(model.state_dict(), path)
        fresh = build(name, seed=7)
        fresh.load_state_dict(torch.load(path))
    ids = next(iter(task(model, 1, seed=11)))
    model.eval()
    fresh.eval()
    with torch.no_grad():
        a = model(ids).logits.double()
        b = fresh(ids).logits.double()
    error = ((a - b).norm() / b.norm()).item()
    trained = dict(model.state_dict())
    same = all(torch.equal(t, trained[k]) for k, t in
               fresh.state_dict().items())
    moved = any(not torch.equal(t, before[k]) for k, t in trained.items())
    print(f"trained 5 steps (loss {losses[0]:.3f} -> {losses[-1]:.3f}), "
          f"saved, loaded into the unpatched model: "
          f"{'every tensor as trained' if same else 'TENSORS DIFFER'}, "
          f"logits off the patched model's by {error:.1e} "
          f"{'ok' if same and moved and error < 5e-2 else 'FAILED'}")

    # Gradient accumulation: two micro-batches' gradients add up to what
    # each gives alone.
    model.train()
    x1, x2 = list(task(model, 2, seed=5))
    grads = []
    for batches in ([x1], [x2], [x1, x2]):
        model.zero_grad()
        for ids in batches:
            model(ids, labels=ids).loss.backward()
        grads.append({k: p.grad.double().clone() for k, p in
                      model.named_parameters() if p.grad is not None})
    worst = max(((grads[2][k] - grads[0][k] - grads[1][k]).norm() /
                 max((grads[0][k] + grads[1][k]).norm(), 1e-30)).item()
                for k in grads[2])
    print(f"gradient accumulation over 2 micro-batches: worst relative error "
          f"{worst:.1e} {'ok' if worst < 2e-2 else 'FAILED'}")

    # Activation checkpointing around each decoder layer: the same
    # gradients, bit for bit.
    model.zero_grad()
    model(x1, labels=x1).loss.backward()
    plain = {k: p.grad.clone() for k, p in model.named_parameters()
             if p.grad is not None}
    model.zero_grad()
    model.gradient_checkpointing_enable(
        gradient_checkpointing_kwargs={"use_reentrant": False})
    model(x1, labels=x1).loss.backward()
    model.gradient_checkpointing_disable()
    same = all(torch.equal(plain[k], p.grad) for k, p in
               model.named_parameters() if k in plain)
    print(f"activation checkpointing: gradients "
          f"{'bit-identical' if same else 'DIFFER'}")

    # The backward's bad inputs, through the layer's own API.
    block = blocks(model)[0][1]
    layer = block.moe._train_layer
    hidden = model.config.hidden_size
    weights = [w.detach() for w in block.moe.weights()]
    x = torch.randn(5, hidden).to(torch.bfloat16)
    out = torch.empty(5, hidden, dtype=torch.bfloat16)
    saved = torch.empty(layer.saved_size(5), dtype=torch.uint8)
    layer.forward_train(x, *weights, out, saved=saved)
    dy = torch.randn(5, hidden).to(torch.bfloat16)
    grads = [torch.empty(s, dtype=d) for _, d, s in layer.gradient_shapes(5)]
    layer.backward([x, *weights], dy, saved, grads)
    print(f"backward on 5 tokens: {len(grads)} gradients, all finite: "
          f"{all(bool(torch.isfinite(g).all()) for g in grads)}")
    refused("a backward without its saved tensors",
            lambda: layer.backward([x, *weights], dy, None, grads))
    grads4 = [torch.empty(s, dtype=d) for _, d, s in
              layer.gradient_shapes(4)]
    refused("a backward of 4 tokens on 5 tokens' saved tensors",
            lambda: layer.backward([x[:4], *weights], dy[:4], saved, grads4))
    unwritten = torch.zeros_like(saved)
    refused("a saved buffer no training forward wrote",
            lambda: layer.backward([x, *weights], dy, unwritten, grads))
    refused("an output gradient of the wrong dtype",
            lambda: layer.backward([x, *weights], dy.float(), saved, grads))
    bad = list(grads)
    bad[1] = torch.empty(3, 3)
    refused("a weight gradient of the wrong shape",
            lambda: layer.backward([x, *weights], dy, saved, bad))
    bad[1] = grads[1].to(torch.float16)
    refused("a weight gradient of the wrong dtype",
            lambda: layer.backward([x, *weights], dy, saved, bad))
    inference = block.moe.layer
    refused("a library not built for training",
            lambda: inference.backward([x, *weights], dy, saved, grads))
    # The C entry point itself, past the Python checks.
    import ctypes
    fn = getattr(layer.lib, layer.training["backward"])
    fn.restype = ctypes.c_int32
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
                   ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32]
    args = (ctypes.c_void_p * (len(weights) + 2))(
        x.data_ptr(), *[w.data_ptr() for w in weights], None)
    gp = (ctypes.c_void_p * len(grads))(*[g.data_ptr() for g in grads])
    for what, call_saved, tokens, flags in (
            ("null saved buffer", None, 5, 0),
            ("4 tokens", saved.data_ptr(), 4, 0),
            ("flags 8", saved.data_ptr(), 5, 8)):
        status = fn(args, tokens, dy.data_ptr(), call_saved, gp, flags)
        print(f"C backward, {what}: status {status}: "
              f"{layer._last_error()}")
    # Overwrite, accumulate, bf16: f32 grads twice with accumulate are twice
    # one overwrite; bf16 ones their rounding.
    once = [torch.zeros(s, dtype=d) for _, d, s in layer.gradient_shapes(5)]
    layer.backward([x, *weights], dy, saved, once)
    twice = [g.clone() for g in once]
    layer.backward([x, *weights], dy, saved, twice, accumulate=True)
    halves = [torch.empty(s, dtype=torch.bfloat16)
              for _, d, s in layer.gradient_shapes(5)]
    layer.backward([x, *weights], dy, saved, halves, bf16=True)
    doubled = all(torch.equal(t, (2 * o.float()).to(o.dtype))
                  for t, o in zip(twice[1:], once[1:]))
    rounded = all(torch.equal(h, o.to(torch.bfloat16))
                  for h, o in zip(halves, once))
    print(f"accumulate: {'twice the overwrite' if doubled else 'WRONG'}; "
          f"bf16: {'the f32 gradients rounded' if rounded else 'WRONG'}")
    # A library built with bf16 weight gradients (--train-bf16-grads): its
    # weights' gradients are bf16, the f32 sums rounded once.
    from moe_compiler.module import compile_layer
    from moe_compiler.patching import _model_config
    if name.endswith(".json"):
        # A HF config.json (odd shapes): the layer alone, no model.
        with open(name) as f:
            config = json.load(f)
    else:
        config, _ = _model_config(build(name))
    lib16 = moe_compiler.Layer.open(compile_layer(
        config, "cpu", cache, train=True, bf16_grads=True))
    saved16 = torch.empty(lib16.saved_size(5), dtype=torch.uint8)
    lib16.forward_train(x, *weights, out, saved=saved16)
    grads16 = [torch.empty(s, dtype=d) for _, d, s in
               lib16.gradient_shapes(5)]
    lib16.backward([x, *weights], dy, saved16, grads16)
    all_bf16 = all(g.dtype == torch.bfloat16 for g in grads16)
    same = all(torch.equal(g, o.to(torch.bfloat16))
               for g, o in zip(grads16, once))
    print(f"bf16-gradient library: {len(grads16)} gradients, "
          f"{'all bf16' if all_bf16 else 'NOT ALL bf16'}, "
          f"{'the f32 library gradients rounded' if same else 'WRONG'}")
    # A library whose backward consumes its saved buffer (sm_90a's, which
    # writes the gate/up gradient over the saved gate/up output) takes one
    # backward a training forward.
    info = layer.info["training"]
    info["consumes_saved"] = True
    layer.forward_train(x, *weights, out, saved=saved)
    layer.backward([x, *weights], dy, saved, once)
    refused("a second backward on a consumed saved buffer",
            lambda: layer.backward([x, *weights], dy, saved, once))
    layer.forward_train(x, *weights, out, saved=saved)
    layer.backward([x, *weights], dy, saved, once)
    print("a training forward again: its backward runs")
    info["consumes_saved"] = False


def libraries(name, args):
    """The layer libraries of model `name` built for training: the
    target's and the CPU backend's (compiled into the cache, or found
    there)."""
    from moe_compiler.module import compile_layer
    from moe_compiler.patching import _model_config
    if name.endswith(".json"):
        # A HF config.json (odd shapes): the layer alone, no model.
        with open(name) as f:
            config = json.load(f)
    else:
        config, _ = _model_config(build(name))
    return [moe_compiler.Layer.open(compile_layer(
        config, target, args.cache, quant=args.quant, train=True,
        bf16_grads=args.bf16_grads)) for target in (args.target, "cpu")]


def random_inputs(layer, tokens, gen):
    """The layer's inputs: hidden states and weights, normal and scaled by
    1/sqrt(fan-in), as the ABI's dtypes."""
    dtypes = {"BF16": torch.bfloat16, "F32": torch.float32}
    inputs = []
    for arg in layer.args:
        if arg["output"]:
            continue
        shape = [tokens if d < 0 else d for d in arg["shape"]]
        scale = 1.0 if arg["name"] == "hidden_states" else \
            shape[-1] ** -0.5
        t = torch.randn(shape, generator=gen, dtype=torch.float64) * scale
        inputs.append(t.to(dtypes[arg["dtype"]]))
    return inputs


def saved_tensor(layer, saved, tokens, name):
    """Saved tensor `name` of a training forward's buffer, as int32 rows."""
    for tensor in layer.training["saved"]:
        if tensor["name"] == name:
            rows = tensor["rows"]["base"] + tensor["rows"]["per_token"] * tokens
            offset = tensor["offset"]["base"] + \
                tensor["offset"]["per_token"] * tokens
            width = math.prod(tensor["shape"][1:])
            data = saved[offset:offset + rows * width * 4].cpu()
            return data.view(torch.int32).reshape(rows, width)
    raise KeyError(name)


def run_layer(layer, inputs, dy, device):
    """forward_train and backward of `layer` on `device`, every output
    poisoned first: (output, saved, gradients)."""
    tokens = inputs[0].shape[0]
    inputs = [t.to(device) for t in inputs]
    out = torch.full(inputs[0].shape, math.nan, dtype=torch.bfloat16,
                     device=device)
    saved = torch.full((layer.saved_size(tokens),), 255, dtype=torch.uint8,
                       device=device)
    layer.forward_train(*inputs, out, saved=saved)
    grads = [torch.full(shape, math.nan, dtype=dtype, device=device)
             for _, dtype, shape in layer.gradient_shapes(tokens)]
    layer.backward(inputs, dy.to(device), saved, grads)
    if device != "cpu":
        torch.cuda.synchronize()
    return out.cpu(), saved, [g.cpu() for g in grads]


def check_layers(args):
    names = args.models or list(json.load(open(MODELS)))
    counts = [int(n) for n in args.tokens.split(",")]
    for name in names:
        ours, reference = libraries(name, args)
        for tokens in counts:
            gen = torch.Generator().manual_seed(tokens)
            inputs = random_inputs(ours, tokens, gen)
            hidden = inputs[0].shape[1]
            dy = torch.randn(tokens, hidden, generator=gen).to(torch.bfloat16)
            out_r, saved_r, grads_r = run_layer(reference, inputs, dy, "cpu")
            out_g, saved_g, _ = run_layer(ours, inputs, dy, "cuda")
            # A token routed differently takes no output gradient.
            keep = (saved_tensor(ours, saved_g, tokens, "route.expert_ids") ==
                    saved_tensor(reference, saved_r, tokens,
                                 "route.expert_ids")).all(dim=1)
            dy = dy * keep.reshape(-1, 1)
            out_r, saved_r, grads_r = run_layer(reference, inputs, dy, "cpu")
            out_g, saved_g, grads_g = run_layer(ours, inputs, dy, "cuda")
            pairs = [("output", out_g[keep], out_r[keep])]
            for (gname, *_), g, r in zip(ours.gradient_shapes(tokens),
                                         grads_g, grads_r):
                if gname == "hidden_states":
                    g, r = g[keep], r[keep]
                pairs.append((gname, g, r))
            worst, report = 0.0, []
            for pname, got, want in pairs:
                g, w = got.double(), want.double()
                if not torch.isfinite(g).all():
                    error = math.inf  # a poisoned value left unwritten
                elif w.norm() == 0:
                    error = g.norm().item()
                else:
                    error = ((g - w).norm() / w.norm()).item()
                worst = max(worst, error)
                report.append(f"{pname} {error:.1e}")
            verdict = "ok" if worst <= args.bound else "FAILED"
            print(f"{name} {tokens} tokens ({tokens - int(keep.sum())} "
                  f"routed apart): {len(pairs)} tensors against the CPU "
                  f"backend, worst relative error {worst:.1e} (bound "
                  f"{args.bound:g}) {verdict}")
            print("   " + "; ".join(report))
            sys.stdout.flush()


def prepare(args):
    names = args.models or list(json.load(open(MODELS)))
    for name in names:
        if not name.endswith(".json"):
            for ranks in {1, args.ranks if args.with_ep else 1}:
                moe_compiler.prepare(build(name), target=args.target,
                                     cache_dir=args.cache, train=True,
                                     quant=args.quant, ep_size=ranks)
        if args.target != "cpu":
            for args.bf16_grads in (False, True):
                libraries(name, args)
        print(f"{name}: compiled for {args.target} (training too)")


def ep_rank(rank, args, name, port, out):
    """One rank of check_ep: its sequences, its gradients summed over the
    group."""
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=args.ranks)
    if args.target != "cpu":
        torch.cuda.set_device(0)  # the ranks share the device
    model = build(name).to(device_of(args.target))
    moe_compiler.patch(model, target=args.target, cache_dir=args.cache,
                       quant=args.quant, ep_group=dist.group.WORLD)
    ids = next(task(model, 1, batch=2 * args.ranks))
    mine = ids.chunk(args.ranks)[rank].to(device_of(args.target))
    loss = model(mine, labels=mine).loss
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= args.ranks
    dist.all_reduce(loss.detach())
    if rank == 0:
        torch.save({"loss": loss.item() / args.ranks, "grads": {
            n: p.grad.cpu() for n, p in model.named_parameters()}}, out)
    dist.destroy_process_group()


def check_ep(args):
    import socket
    import torch.multiprocessing as mp
    names = args.models or ["mixtral", "qwen2_moe", "deepseek_v3"]
    for name in names:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        out = os.path.join(args.cache, f"ep-{name}.pt")
        mp.spawn(ep_rank, args=(args, name, port, out), nprocs=args.ranks)
        got = torch.load(out)
        # One process, all the sequences: the mean of the ranks' losses.
        model = build(name).to(device_of(args.target))
        moe_compiler.patch(model, target=args.target, cache_dir=args.cache,
                           quant=args.quant)
        ids = next(task(model, 1, batch=2 * args.ranks)).to(
            device_of(args.target))
        loss = sum(model(part, labels=part).loss
                   for part in ids.chunk(args.ranks)) / args.ranks
        loss.backward()
        loss_error = abs(got["loss"] - loss.item()) / abs(loss.item())
        worst, where = 0.0, ""
        for n, p in model.named_parameters():
            want = p.grad.double().cpu()
            delta = (got["grads"][n].double() - want).norm().item()
            error = delta / want.norm().item() if want.norm() > 0 else delta
            if error > worst:
                worst, where = error, n
        ok = loss_error <= 1e-3 and worst <= args.bound
        print(f"{name}: {args.ranks} ranks: loss within {loss_error:.1e}, "
              f"every gradient within {worst:.1e} of one process's (bound "
              f"{args.bound:g}; largest: {where}) "
              f"{'ok' if ok else 'FAILED'}")
        sys.stdout.flush()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["grads", "parity", "api", "layers",
                                         "prepare", "quant-api", "ep"])
    parser.add_argument("models", nargs="*",
                        help="model names of Inputs/hf-models.json; layers "
                        "and prepare also take a HF config.json's path")
    parser.add_argument("--cache", required=True)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--bound", type=float, default=2e-2)
    parser.add_argument("--target", default="cpu")
    parser.add_argument("--tokens", default="1,77,300")
    parser.add_argument("--quant", choices=["fp8-block128", "mxfp8"],
                        help="grads, parity: patch(model, quant=...); "
                        "layers, prepare: libraries of that scheme")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--with-ep", action="store_true",
                        help="prepare: also the libraries of --ranks "
                             "expert-parallel ranks (for ep)")
    parser.add_argument("--bf16-grads", action="store_true",
                        help="layers: both libraries write bf16 weight "
                        "gradients (--train-bf16-grads)")
    args = parser.parse_intermixed_args()
    torch.manual_seed(0)
    {"grads": check_grads, "parity": check_parity, "api": check_api,
     "layers": check_layers, "prepare": prepare,
     "quant-api": check_quant_api, "ep": check_ep}[args.mode](args)


if __name__ == "__main__":
    main()
