"""An expert-parallel GPU layer on two (or more) GPUs of one host, one
process per GPU: checked bit for bit against the same layer compiled with
ep_size 1, and its dispatch and combine timed beside NCCL's
all_to_all_single doing the same exchange, and beside the link itself.

  python3 -m bench.ep_bench EP1.so EPN.so --tokens 1,128,4096 [--repeat 50]

Weights and tokens are made on each GPU from one seed, so every rank has the
same full layer without files. For each token count T (per rank), every
rank runs the one-rank layer on all N * T tokens (the reference for its
slice), then the N-rank layer on its T tokens, with each kernel timed by CUDA
events (MOERT_KERNEL_TIMES). Prints one JSON line per rank and count, and
one for the link.
"""
import argparse
import ctypes
import json
import os
import re
import socket
import sys
import tempfile

from bench.common import emit
from moe_compiler.ep import EpConfig


def load(path):
    lib = ctypes.CDLL(os.path.abspath(path))
    lib.moe_layer_info.restype = ctypes.c_char_p
    info = json.loads(lib.moe_layer_info().decode())
    fwd = getattr(lib, info["forward"])
    fwd.restype = ctypes.c_int32
    fwd.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
                    ctypes.c_void_p]
    size = getattr(lib, info["workspace_size"])
    size.restype = ctypes.c_int64
    size.argtypes = [ctypes.c_int64]
    lib.moe_last_error.restype = ctypes.c_char_p
    return lib, info, fwd, size


EXPERT_WEIGHTS = ("w13", "w2", "w13_scale", "w2_scale", "w13_bias",
                  "w2_bias")


def arg_k(info, scale_name):
    """K of the weight a scale belongs to."""
    for arg in info["args"]:
        if arg["name"] == scale_name[:-len("_scale")]:
            return arg["shape"][-1]
    return 1


def full_inputs(info, ranks, total, seed):
    """Every input of the whole layer (all experts), on the current GPU."""
    import torch
    g = torch.Generator(device="cuda").manual_seed(seed)
    out = {}
    for arg in info["args"]:
        if arg["output"]:
            continue
        shape = [total if d < 0 else d for d in arg["shape"]]
        name = arg["name"]
        if name in EXPERT_WEIGHTS:
            shape[0] *= ranks
        if arg["dtype"] == "F8_E4M3":
            # Codes of a normal draw times 4 (within E4M3's range).
            t = torch.randn(shape, generator=g, device="cuda",
                            dtype=torch.bfloat16).mul_(4)
            out[name] = t.to(torch.float8_e4m3fn)
            continue
        if name.endswith("_scale"):
            # FP8 block-128 weight scales: f32, about 1 / (4 sqrt(K)).
            t = torch.rand(shape, generator=g, device="cuda",
                           dtype=torch.float32)
            out[name] = t.add_(0.5).mul_(0.25 * arg_k(info, name) ** -0.5)
            continue
        dtype = torch.float32 if arg["dtype"] == "F32" else torch.bfloat16
        scale = 1.0 if name == "hidden_states" else (
            0.1 if "bias" in name else shape[-1] ** -0.5)
        t = torch.randn(shape, generator=g, device="cuda", dtype=dtype)
        out[name] = t.mul_(scale)
    return out


def run(lib, info, fwd, size, tensors, tokens, repeat=0, meet=None):
    """Runs the layer on `tensors` (name -> tensor); returns out and, with
    `repeat`, the mean forward time in microseconds. With `meet`, each
    timed forward starts once the device is idle and `meet()` (every rank
    calls it) returns: no rank's forward starts while another's last one
    still runs, so no exchange waits out a peer's longer forward."""
    import torch
    hidden = info["config"]["hidden"]
    out = torch.empty([tokens, hidden], device="cuda", dtype=torch.bfloat16)
    out.fill_(float("nan"))
    ptrs = []
    for arg in info["args"]:
        t = out if arg["output"] else tensors[arg["name"]]
        ptrs.append(t.data_ptr())
    argv = (ctypes.c_void_p * len(ptrs))(*ptrs)
    ws = torch.empty([max(1, size(tokens))], device="cuda", dtype=torch.uint8)
    stream = torch.cuda.current_stream().cuda_stream

    def once():
        if fwd(argv, tokens, ctypes.c_void_p(stream),
               ctypes.c_void_p(ws.data_ptr())) != 0:
            raise RuntimeError(lib.moe_last_error().decode())
    once()
    torch.cuda.synchronize()
    us = None
    if repeat and meet:
        total = 0.0
        for _ in range(repeat):
            torch.cuda.synchronize()
            meet()
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            once()
            end.record()
            end.synchronize()
            total += start.elapsed_time(end)
        us = 1000.0 * total / repeat
    elif repeat:
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeat):
            once()
        end.record()
        torch.cuda.synchronize()
        us = 1000.0 * start.elapsed_time(end) / repeat
    return out, us


def token_row_bytes(cfg):
    """Bytes a token's row takes between ranks: bf16, or E4M3 codes with
    their block scales in a quantized layer."""
    hidden = cfg["hidden"]
    quant = cfg.get("quant")
    if quant == "fp8_block128":
        return hidden + 4 * -(-hidden // 128)
    if quant == "mxfp8":
        return hidden + -(-hidden // 32)
    return 2 * hidden


def nccl_exchange(rank, counts, cfg, repeat):
    """all_to_all_single moving the bytes the layer's dispatch and combine
    move, each rank its own token count (`counts`): every token to every
    rank as the layer sends it (bf16, or codes and scales), and top_k /
    ranks bf16 outputs back per token."""
    import torch
    import torch.distributed as dist
    times = {}
    ranks, top_k, hidden = len(counts), cfg["top_k"], cfg["hidden"]
    back = [max(1, c * top_k // ranks) for c in counts]
    for what, send, receive, row_bytes in (
            ("dispatch", [counts[rank]] * ranks, counts,
             token_row_bytes(cfg)),
            ("combine", back, [back[rank]] * ranks, 2 * hidden)):
        x = torch.randint(0, 255, [sum(send), row_bytes], device="cuda",
                          dtype=torch.uint8)
        y = torch.empty([sum(receive), row_bytes], device="cuda",
                        dtype=torch.uint8)
        def exchange():
            dist.all_to_all_single(y, x, output_split_sizes=receive,
                                   input_split_sizes=send)
        for _ in range(3):
            exchange()
        torch.cuda.synchronize()
        dist.barrier()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeat):
            exchange()
        end.record()
        torch.cuda.synchronize()
        times[what] = 1000.0 * start.elapsed_time(end) / repeat
        peer = (rank + 1) % ranks
        times[what + "_bytes_to_peer"] = send[peer] * row_bytes
    return times


def rank_main(rank, ranks, args, port, nccl_port, results):
    import torch
    import torch.distributed as dist
    torch.cuda.set_device(rank)
    torch.zeros(1, device="cuda")  # the primary context, current
    if not args.plain:
        os.environ["MOERT_KERNEL_TIMES"] = "1"
    lib1, info1, fwd1, size1 = load(args.ep1)
    libn, infon, fwdn, sizen = load(args.epn)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{nccl_port}",
                            rank=rank, world_size=ranks)
    cfg = infon["config"]
    lines = []
    def say(*what):
        print(f"rank {rank}:", *what, file=sys.stderr, flush=True)
    for t in args.tokens:
        say(f"{t} tokens per rank")
        # The last rank may bring another count (--last-rank-tokens): its
        # peers then receive rows their own buckets do not bound.
        counts = [t] * ranks
        if args.last_rank_tokens is not None:
            counts[-1] = args.last_rank_tokens
        first = sum(counts[:rank])
        mine_t = counts[rank]
        total = sum(counts)
        full = full_inputs(info1, 1, total, seed=t)
        ref, us1 = run(lib1, info1, fwd1, size1, full, total,
                       repeat=args.repeat)
        say("one-rank reference done")
        local = cfg["experts"] // ranks
        mine = {}
        for name, tensor in full.items():
            if name in EXPERT_WEIGHTS:
                mine[name] = tensor[rank * local:(rank + 1) * local]
            elif name == "hidden_states":
                mine[name] = tensor[first:first + mine_t]
            else:
                mine[name] = tensor
        init = getattr(libn, infon["ep"]["init"])
        init.restype = ctypes.c_int32
        config = EpConfig(rank, ranks, b"127.0.0.1", port + t, -1,
                          max(counts),
                          args.provider.encode() if args.provider else None,
                          args.domain.encode() if args.domain else None,
                          args.timeout_ms, 1 if args.proxy else 0)
        if init(ctypes.byref(config)) != 0:
            raise RuntimeError("init: " + libn.moe_last_error().decode())
        say("joined")
        status = getattr(libn, infon["ep"]["status"])
        # One forward checked before the timed ones: a broken exchange
        # costs one time limit, not one per repeat.
        out, _ = run(libn, infon, fwdn, sizen, mine, mine_t)
        if status() != 0:
            raise RuntimeError("status: " + libn.moe_last_error().decode())
        out, usn = run(libn, infon, fwdn, sizen, mine, mine_t,
                       repeat=args.repeat,
                       meet=dist.barrier if args.lockstep else None)
        if status() != 0:
            raise RuntimeError("status: " + libn.moe_last_error().decode())
        expected = ref[first:first + mine_t]
        same = bool(torch.equal(out.view(torch.int16),
                                expected.view(torch.int16)))
        differ = int((out.view(torch.int16) != expected.view(torch.int16))
                     .sum().item())
        worst = max_difference(out, expected)
        # Kernel times go to stderr at finalize: catch them.
        err = tempfile.TemporaryFile(mode="w+")
        saved = os.dup(2)
        os.dup2(err.fileno(), 2)
        getattr(libn, infon["ep"]["finalize"])()
        os.dup2(saved, 2)
        err.seek(0)
        kernels = {}
        for line in err.read().splitlines():
            m = re.search(r"kernel (\S+): (\d+) launches, ([0-9.]+) us", line)
            if m:
                kernels[m.group(1)] = float(m.group(3))
        dispatch = sum(v for k, v in kernels.items()
                       if k.startswith("moe_ep_dispatch"))
        combine = sum(v for k, v in kernels.items()
                      if k.startswith("moe_ep_combine"))
        say("expert-parallel layer done")
        nccl = nccl_exchange(rank, counts, cfg, args.repeat)
        lines.append({"rank": rank, "ranks": ranks, "tokens_per_rank": t,
                      "tokens_this_rank": mine_t,
                      "path": "proxy" if args.proxy else "nvlink",
                      "lockstep": args.lockstep,
                      "bit_identical": same, "values_differing": differ,
                      "max_difference": worst,
                      "layer_us": usn, "one_rank_layer_us_all_tokens": us1,
                      "dispatch_us": dispatch, "combine_us": combine,
                      "kernels_us": kernels, "nccl_us": nccl})
        del full, mine, ref, out
        torch.cuda.empty_cache()
        dist.barrier()
    results.put(lines)
    dist.destroy_process_group()


def link(repeat):
    import torch
    if torch.cuda.device_count() < 2:
        return None
    x = torch.empty([256 << 20], dtype=torch.uint8, device="cuda:0")
    y = torch.empty_like(x, device="cuda:1")
    for _ in range(3):
        y.copy_(x)
    torch.cuda.synchronize(0)
    torch.cuda.synchronize(1)
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    with torch.cuda.device(0):
        start.record()
        for _ in range(repeat):
            y.copy_(x, non_blocking=True)
        end.record()
    torch.cuda.synchronize(0)
    torch.cuda.synchronize(1)
    seconds = start.elapsed_time(end) / 1000.0 / repeat
    # Both ways at once, as an all-to-all loads the link: each direction on
    # its own pair of streams (one a GPU), so neither waits for the other
    # (a copy between GPUs orders itself after both current streams).
    back = torch.empty_like(x, device="cuda:1")
    into = torch.empty_like(x, device="cuda:0")
    ways = []
    for src, dst in ((x, y), (back, into)):
        streams = [torch.cuda.Stream(device=d) for d in (0, 1)]
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        ways.append((src, dst, streams, start, end))
    for d in range(2):
        torch.cuda.synchronize(d)
    for src, dst, streams, start, end in ways:
        with torch.cuda.stream(streams[0]), torch.cuda.stream(streams[1]):
            lead = streams[src.device.index]
            start.record(lead)
            for _ in range(repeat):
                dst.copy_(src, non_blocking=True)
            end.record(lead)
    for d in range(2):
        torch.cuda.synchronize(d)
    both = max(s.elapsed_time(e) for _, _, _, s, e in ways) / 1000.0 / repeat
    return {"link": "GPU0 -> GPU1 copy, 256 MiB",
            "GB_per_s": x.numel() / seconds / 1e9,
            "GB_per_s_each_way_both_at_once": x.numel() / both / 1e9}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("ep1")
    ap.add_argument("epn")
    ap.add_argument("--tokens", default="1,128,4096")
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--provider", default=os.environ.get("EP_PROVIDER", "shm"))
    ap.add_argument("--domain")
    ap.add_argument("--timeout-ms", type=int, default=5000)
    ap.add_argument("--last-rank-tokens", type=int,
                    help="the last rank's token count (default: each "
                         "count of --tokens, as the others)")
    ap.add_argument("--plain", action="store_true",
                    help="time the forward alone, as a caller runs it: no "
                         "event around each kernel (no kernel times), "
                         "buckets' graphs replayed")
    ap.add_argument("--lockstep", action="store_true",
                    help="start each timed forward on every rank together "
                         "(the device idle, then a barrier), as NCCL's "
                         "exchanges are timed: a rank's exchange then does "
                         "not count its wait for a peer's longer last "
                         "forward (more rows to multiply)")
    ap.add_argument("--proxy", action="store_true",
                    help="move tokens through host memory and the "
                         "transport's proxy instead of NVLink")
    args = ap.parse_args()
    args.tokens = [int(t) for t in args.tokens.split(",")]
    import torch
    import torch.multiprocessing as mp
    info = load(args.epn)[1]
    ranks = info["ep"]["ranks"]
    if torch.cuda.device_count() < ranks:
        print(f"needs {ranks} GPUs, has {torch.cuda.device_count()}")
        return 1
    emit(**link(20))
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port, nccl_port = 20000 + free_port() % 20000, free_port()
    procs = [ctx.Process(target=rank_main,
                         args=(r, ranks, args, port, nccl_port, results))
             for r in range(ranks)]
    for p in procs:
        p.start()
    import queue
    lines, reported = [], 0
    while reported < len(procs):
        try:
            lines += results.get(timeout=5)
            reported += 1
        except queue.Empty:
            if any(p.exitcode not in (None, 0) for p in procs):
                print("a rank failed (see above)", flush=True)
                for p in procs:
                    p.kill()
                return 1
    for p in procs:
        p.join()
    for line in sorted(lines, key=lambda l: (l["tokens_per_rank"], l["rank"])):
        emit(**line)
    if all(l["bit_identical"] for l in lines):
        print("all bit-identical", flush=True)
        return 0
    # Exit 3: the layers ran, but some values differ.
    print("MISMATCH: up to %d values a rank differ, by at most %.3g of the "
          "largest output" % (max(l["values_differing"] for l in lines),
                              max(l["max_difference"] for l in lines)),
          flush=True)
    return 3


def max_difference(a, b):
    """The largest difference between two outputs over the largest
    magnitude of `b` (0 where they are bit-identical)."""
    if a.numel() == 0:
        return 0.0
    scale = b.float().abs().max().item() or 1.0
    return float((a.float() - b.float()).abs().max().item() / scale)


if __name__ == "__main__":
    sys.exit(main())
