#!/usr/bin/env python3
"""An expert-parallel Layer collected while in its group leaves it without
meeting the other ranks. Two ranks join over a 2-rank library (CPU, or
sm_90a with --gpu, a GPU each or both on GPU 0); rank 1 exits without
finalizing; rank 0 then drops its Layer, which must leave within a second or
so (a finalize that met the others would wait for rank 1 until the 20 s
limit) and warn. Then both ranks of a second group leave a `with` block,
which finalizes them together.

    check_ep_leave.py LIB [--gpu]
"""
import argparse
import gc
import multiprocessing
import os
import sys
import time
import warnings

from moe_compiler import Layer
from moe_compiler.ep import Rendezvous, _listen

TIMEOUT_MS = 20000


def join(rank, path, gpu, ports):
    """This rank's Layer over the 2-rank group (rank 0 listens and tells
    rank 1 its port)."""
    if gpu:
        import torch
        torch.cuda.set_device(rank % torch.cuda.device_count())
    fd = -1
    if rank == 0:
        fd, port = _listen("127.0.0.1")
        ports.put(port)
    else:
        port = ports.get(timeout=60)
    layer = Layer(path)
    layer.ep_init(Rendezvous(rank, 2, "127.0.0.1", port, fd, True),
                  max_tokens=8, timeout_ms=TIMEOUT_MS)
    return layer


def rank_main(rank, path, gpu, ports, gone, results):
    try:
        layer = join(rank, path, gpu, ports)
    except Exception as e:  # the parent reports it
        gone.set()
        results.put((None, f"rank {rank}: {e}"))
        return
    if rank == 1:
        gone.set()
        os._exit(0)  # no finalize: a peer that is gone
    gone.wait()
    time.sleep(0.5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        start = time.monotonic()
        del layer
        gc.collect()
        took = time.monotonic() - start
    warned = any(issubclass(w.category, ResourceWarning) for w in caught)
    results.put((took, warned))


def with_block(rank, path, gpu, ports, results):
    with join(rank, path, gpu, ports) as layer:
        pass
    results.put((rank, layer._ep_live))


def run_ranks(context, target, *args, answers=1):
    """Two ranks running `target(rank, *args)`; their first `answers`
    results, once both are done."""
    results = args[-1]
    procs = [context.Process(target=target, args=(r,) + args)
             for r in range(2)]
    for p in procs:
        p.start()
    got = [results.get(timeout=120) for _ in range(answers)]
    for p in procs:
        p.join(timeout=120)
    return got


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("library")
    ap.add_argument("--gpu", action="store_true")
    args = ap.parse_args()
    path = os.path.abspath(args.library)
    context = multiprocessing.get_context("spawn")
    gone, results, ports = context.Event(), context.Queue(), context.Queue()
    [(took, warned)] = run_ranks(context, rank_main, path, args.gpu, ports,
                                 gone, results)
    if took is None:
        print(warned)
        return 1
    print(f"rank 0, its peer gone: the collected layer left in "
          f"{'under 5 s' if took < 5 else f'{took:.1f} s'}, "
          f"{'with' if warned else 'WITHOUT'} a ResourceWarning")
    status = 0 if took < 5 and warned else 1

    left = run_ranks(context, with_block, path, args.gpu, ports, results,
                     answers=2)
    for rank, live in sorted(left):
        print(f"rank {rank}: the with block "
              f"{'left the group in place' if live else 'finalized the group'}")
        status |= 1 if live else 0
    return status


if __name__ == "__main__":
    sys.exit(main())
