"""vLLM 0.33.0's Triton fused-MoE kernels, standalone, as bench/decode.py's
peer.

bench/vllm-peer.sh extracts vLLM's fused_moe.py and its tuned configs from a
wheel into a git-ignored folder (vLLM's code is never committed here). From
that file this module takes only the @triton.jit kernel `fused_moe_kernel`
and the jit helpers it calls, writes them into a module of their own in the
same folder (Triton reads a kernel's source from its file) and imports it,
so the GPU machine needs torch and triton alone. What vLLM's Python runs
around the kernel is restated here from 0.33.0:
  - the config choice (fused_moe.py's get_config_file_name,
    try_get_optimal_moe_config, get_default_config on CUDA);
  - the launcher (invoke_fused_moe_triton_kernel: grid, strides, block-quant
    groups, SWAP_AB, the tensor-descriptor path off as on Hopper);
  - the steps of TritonExperts.apply (experts/triton_moe.py), the experts
    vLLM runs for block FP8 on Hopper without expert parallelism
    (oracle/fp8.py puts Triton first there), with PyTorch in place of its
    compiled ops: moe_align_block_size (and the naive per-choice assignment
    small batches take), topk_softmax, silu_and_mul (fused with the FP8
    block quantization for block FP8), moe_sum and
    per_token_group_fp8_quant.

    python3 -m bench.vllm_peer DIR             writes DIR/vllm_kernels.py
                                               and checks it parses
    python3 -m bench.vllm_peer DIR --check     also checks the PyTorch ops
                                               against plain Python (CPU)
    python3 -m bench.vllm_peer DIR --interpret also runs a toy layer through
                                               the kernels in Triton's
                                               interpreter (CPU), bf16 and
                                               FP8 block-128

PyTorch and Triton are imported by the functions that use them.
"""
import argparse
import ast
import builtins
import importlib.util
import json
import os
import re
import sys

KERNEL = "fused_moe_kernel"
MODULE = "vllm_kernels.py"
FP8_MAX = 448.0
# fused_moe_kernel's parameters in 0.33.0's order: the launcher below passes
# them so, and a wheel whose kernel differs is refused rather than misread.
PARAMS = (
    "a_ptr b_ptr c_ptr b_bias_ptr a_scale_ptr b_scale_ptr topk_weights_ptr "
    "sorted_token_ids_ptr expert_ids_ptr num_tokens_post_padded_ptr N K EM "
    "num_valid_tokens stride_am stride_ak stride_be stride_bk stride_bn "
    "stride_cm stride_cn stride_asm stride_ask stride_bse stride_bsk "
    "stride_bsn stride_bbe stride_bbn group_n group_k naive_block_assignment "
    "BLOCK_SIZE_M BLOCK_SIZE_N BLOCK_SIZE_K GROUP_SIZE_M SPLIT_K "
    "MUL_ROUTED_WEIGHT top_k compute_type use_fp8_w8a8 use_int8_w8a8 "
    "use_int8_w8a16 per_channel_quant HAS_BIAS SWAP_AB USE_TD").split()
# Config keys a CUDA launch takes (ROCm's files carry others).
LAUNCH_KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M",
               "SPLIT_K", "num_warps", "num_stages", "num_ctas")


# --- The kernel, taken from the extracted file -----------------------------

def _is_jit(decorator):
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return isinstance(target, ast.Attribute) and target.attr == "jit" and \
        isinstance(target.value, ast.Name) and target.value.id == "triton"


def _free_names(fn):
    """Names a function reads that it neither takes nor assigns."""
    args = fn.args
    bound = {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}
    loads = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Load):
                loads.add(node.id)
            else:
                bound.add(node.id)
    return loads - bound - set(dir(builtins))


def kernel_source(peer_dir):
    """The source of DIR/fused_moe.py's fused_moe_kernel and of the jit
    helpers it calls, in the file's order, each with its decorators. Raises
    if they read anything but triton, tl and each other (vLLM's Python
    helpers would not be there)."""
    path = os.path.join(peer_dir, "fused_moe.py")
    with open(path) as f:
        text = f.read()
    tree = ast.parse(text, path)
    jitted = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)
              and any(_is_jit(d) for d in n.decorator_list)}
    if KERNEL not in jitted:
        raise RuntimeError(f"{path}: no @triton.jit {KERNEL}")
    needed, todo = set(), [KERNEL]
    while todo:
        name = todo.pop()
        if name in needed:
            continue
        needed.add(name)
        free = _free_names(jitted[name])
        strange = free - {"tl", "triton"} - set(jitted)
        if strange:
            raise RuntimeError(f"{path}: {name} reads {sorted(strange)}, "
                               f"which the standalone module lacks")
        todo += sorted(free & set(jitted))
    parts = []
    for fn in (n for n in tree.body if n in jitted.values()):
        if fn.name not in needed:
            continue
        decorators = "".join("@" + ast.get_source_segment(text, d) + "\n"
                             for d in fn.decorator_list)
        parts.append(decorators + ast.get_source_segment(text, fn))
    return "\n\n\n".join(parts) + "\n"


def write_kernel_module(peer_dir):
    """Writes DIR/vllm_kernels.py (when it changes) and returns its path."""
    version = ""
    try:
        with open(os.path.join(peer_dir, "VERSION")) as f:
            version = f.readline().split()[-1]
    except OSError:
        pass
    version = version or "an unnamed wheel"
    text = ("# SPDX-License-Identifier: Apache-2.0\n"
            "# SPDX-FileCopyrightText: Copyright contributors to the vLLM "
            "project\n"
            f"# The Triton kernels of vLLM's fused_moe.py ({version}), "
            "alone,\n# as bench/vllm_peer.py extracts them.\n"
            "import triton\nimport triton.language as tl\n\n\n"
            + kernel_source(peer_dir))
    ast.parse(text)
    path = os.path.join(peer_dir, MODULE)
    old = None
    if os.path.exists(path):
        with open(path) as f:
            old = f.read()
    if old != text:
        with open(path, "w") as f:
            f.write(text)
    return path


_kernels = {}


def load_kernel(peer_dir):
    """fused_moe_kernel from DIR/vllm_kernels.py (written if missing or
    stale), its parameters checked against PARAMS."""
    path = os.path.realpath(write_kernel_module(peer_dir))
    if path not in _kernels:
        spec = importlib.util.spec_from_file_location("vllm_peer_kernels",
                                                      path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        kernel = getattr(module, KERNEL)
        names = list(getattr(kernel, "arg_names", PARAMS))
        if names != list(PARAMS):
            raise RuntimeError(f"{path}: {KERNEL} takes {names}; the "
                               f"launcher passes vLLM 0.33.0's {PARAMS}")
        _kernels[path] = kernel
    return _kernels[path]


# --- The config: vLLM's tuned files, else its default ----------------------

def device_file_name(device_name):
    """The device's name as vLLM's config files spell it: spaces and
    slashes as underscores, any H200 as NVIDIA_H200."""
    name = re.sub(r"[\s/]+", "_", device_name)
    return "NVIDIA_H200" if "H200" in name.split("_") else name


def config_file_name(experts, n, dtype, block_shape, device_name):
    """get_config_file_name: N is the intermediate size (w2's last
    dimension); dtype "fp8_w8a8" or None (bf16)."""
    name = f"E={experts},N={n},device_name={device_file_name(device_name)}"
    if dtype:
        name += f",dtype={dtype}"
    if block_shape and all(block_shape):
        name += f",block_shape=[{block_shape[0]},{block_shape[1]}]"
    return name + ".json"


def default_config(m, experts, dtype, block_shape):
    """get_default_config's choice on CUDA (VLLM_BATCH_INVARIANT unset), for
    `m` tokens."""
    if dtype == "fp8_w8a8" and block_shape:
        # Block-wise FP8: small M tiles for decode; N tiles of 64 with a
        # deeper pipeline up to 8 tokens, the quant block's width after.
        if m <= 8 and block_shape[0] % 64 == 0:
            block_n, stages = 64, 4 if m <= 4 else 3
        else:
            block_n, stages = block_shape[0], 3
        return {"BLOCK_SIZE_M": 16 if m <= 64 else 64,
                "BLOCK_SIZE_N": block_n, "BLOCK_SIZE_K": block_shape[1],
                "GROUP_SIZE_M": 1 if m <= 16 else 32, "SPLIT_K": 1,
                "num_warps": 4, "num_stages": stages}
    # bf16 (and per-tensor FP8): tiles grow with the batch; M blocks are
    # grouped (to share weight tiles in L2) past 128 tokens per expert.
    block_m = 16 if m <= 32 else 32 if m <= 96 else 64 if m <= 512 else 128
    return {"BLOCK_SIZE_M": block_m,
            "BLOCK_SIZE_N": 64 if m <= 64 else 128,
            "BLOCK_SIZE_K": 128 if dtype == "fp8_w8a8" or m <= 64 else 64,
            "GROUP_SIZE_M": 16 if m // max(experts, 1) > 128 else 1,
            "SPLIT_K": 1,
            "num_warps": 4 if m <= 128 else 8,
            "num_stages": 4 if m <= 32 else 3}


def choose_config(peer_dir, experts, n, m, dtype, block_shape, device_name):
    """try_get_optimal_moe_config: the tuned file's entry of the batch size
    nearest `m` (the first of two equally near, as min() over the file's
    keys gives), else the default. Returns (config, the file's name or
    "default")."""
    name = config_file_name(experts, n, dtype, block_shape, device_name)
    path = os.path.join(peer_dir, "configs", name)
    if not os.path.exists(path):
        return default_config(m, experts, dtype, block_shape), "default"
    with open(path) as f:
        tuned = json.load(f)
    tuned.pop("triton_version", None)
    tuned = {int(k): v for k, v in tuned.items()}
    return dict(tuned[min(tuned, key=lambda k: abs(k - m))]), name


# --- PyTorch in place of vLLM's compiled ops ------------------------------

def topk_softmax(logits, k, renormalize):
    """vLLM's topk_softmax: softmax over every expert in f32, the k largest,
    divided by their sum with `renormalize`. Returns (weights f32, ids
    int32), both [T, k]."""
    probs = logits.float().softmax(-1)
    weights, ids = probs.topk(k, -1)
    if renormalize:
        weights = weights / weights.sum(-1, keepdim=True)
    return weights, ids.int()


def moe_align_block_size(topk_ids, block_size, num_experts):
    """vLLM's moe_align_block_size (no expert map): the choices' flat
    indices grouped by expert, each expert's run padded to a multiple of
    `block_size` with the sentinel topk_ids.numel(); the expert of each
    block (-1 past the used blocks, which the kernel never reads: it stops at
    num_tokens_post_padded); and that padded total. Buffers sized as vLLM's.
    Within an expert choices keep their order (the CUDA op's atomics may
    order them otherwise; the products are the same)."""
    import torch
    dev = topk_ids.device
    flat = topk_ids.flatten().long()
    numel = flat.numel()
    max_padded = numel + num_experts * (block_size - 1)
    if numel < num_experts:
        max_padded = min(numel * block_size, max_padded)
    counts = torch.bincount(flat, minlength=num_experts)
    padded = (counts + block_size - 1) // block_size * block_size
    starts = padded.cumsum(0) - padded
    order = flat.argsort(stable=True)
    expert = flat[order]
    # Each choice's place among its expert's: its place in `order` less the
    # choices of the experts before.
    first = counts.cumsum(0) - counts
    rank = torch.arange(numel, device=dev) - first[expert]
    sorted_ids = torch.full((max_padded,), numel, dtype=torch.int32,
                            device=dev)
    sorted_ids[starts[expert] + rank] = order.int()
    blocks = -(-max_padded // block_size)
    expert_ids = torch.full((blocks,), -1, dtype=torch.int32, device=dev)
    used = torch.repeat_interleave(torch.arange(num_experts, device=dev),
                                   padded // block_size)
    expert_ids[:used.numel()] = used.int()
    total = padded.sum().reshape(1).int()
    return sorted_ids, expert_ids, total


def expert_assignment(topk_ids, block_m, num_experts):
    """_prepare_expert_assignment: with few choices (4 x T x k at most the
    experts' count) no sorting at all, one M block per choice; else
    moe_align_block_size. Returns (sorted ids or None, expert ids,
    num_tokens_post_padded)."""
    import torch
    if topk_ids.numel() * 4 <= num_experts:
        total = torch.full((1,), topk_ids.numel() * block_m,
                           dtype=torch.int32, device=topk_ids.device)
        return None, topk_ids.reshape(-1), total
    return moe_align_block_size(topk_ids, block_m, num_experts)


def silu_and_mul(x):
    """vLLM's silu_and_mul on [.., 2d] (gate half first): silu in f32
    rounded to x's dtype, times the up half in that dtype, as its CUDA
    kernel computes it."""
    import torch.nn.functional as F
    d = x.shape[-1] // 2
    return F.silu(x[..., :d].float()).to(x.dtype) * x[..., d:]


def silu_and_mul_quant_fp8(x, group=128):
    """vLLM's silu_and_mul_per_block_quant, which TritonExperts runs for
    SiLU with FP8 block-128: silu(gate) x up quantized per 1 x `group`. Its
    CUDA source is not in the wheel; the product is taken to stay f32 up to
    the quantization."""
    import torch.nn.functional as F
    d = x.shape[-1] // 2
    act = F.silu(x[..., :d].float()) * x[..., d:].float()
    return per_token_group_quant_fp8(act, group)


def moe_sum(x):
    """vLLM's moe_sum of [T, k, H] over k: for k above 4 it is at::sum_out,
    f32 accumulation rounded once."""
    return x.sum(1)


def per_token_group_quant_fp8(x, group=128, eps=1e-10):
    """per_token_group_quant_fp8 of [M, K] (row-major scales, no E8M0
    rounding): per 1 x `group` block scale = max(amax, eps) * (1 / 448) in
    f32, codes E4M3(clamp(x / scale, +-448)). Returns (codes, scales f32
    [M, K / group])."""
    import torch
    m, k = x.shape
    g = x.float().reshape(m, k // group, group)
    scale = g.abs().amax(-1).clamp_min(eps) * (1.0 / FP8_MAX)
    q = (g / scale[..., None]).clamp(-FP8_MAX, FP8_MAX)
    return q.to(torch.float8_e4m3fn).reshape(m, k), scale.contiguous()


def quantize_block128(w):
    """E4M3 codes and f32 128 x 128 block scales of float [E, N, K], as
    DeepSeek-V3's checkpoints (and moe_compiler.quantize) scale them:
    max(amax, 1e-4) / 448. Returns (codes, scales [E, N/128, K/128])."""
    import torch
    e, n, k = w.shape
    nb, kb = -(-n // 128), -(-k // 128)
    p = torch.zeros(e, nb * 128, kb * 128, device=w.device)
    p[:, :n, :k] = w
    blocks = p.view(e, nb, 128, kb, 128)
    scale = blocks.abs().amax((2, 4)).clamp_min(1e-4) / FP8_MAX
    q = (blocks / scale[:, :, None, :, None]).clamp(-FP8_MAX, FP8_MAX)
    q = q.view(e, nb * 128, kb * 128)[:, :n, :k]
    return q.to(torch.float8_e4m3fn).contiguous(), scale


# --- The launcher and fused_experts ---------------------------------------

def invoke_kernel(kernel, a, b, c, a_scale, b_scale, topk_weights,
                  sorted_ids, expert_ids, post_padded, mul_routed_weight,
                  top_k, config, block_shape, swap_ab):
    """invoke_fused_moe_triton_kernel for bf16 and FP8 w8a8 (block-wise
    with `block_shape`), no bias, the tensor-descriptor path off
    (VLLM_TRITON_USE_TD unset: off but on XPU). `c` is [M, k, N] as vLLM's
    intermediate caches; the arguments are vLLM's, in its order."""
    import triton
    import triton.language as tl
    m = a.size(0)
    choices = m * top_k
    block_m = config["BLOCK_SIZE_M"]
    if sorted_ids is not None:
        em = sorted_ids.size(0)
        if m < block_m:
            # vLLM's small-batch bound: at most one block per choice.
            em = min(em, m * top_k * block_m)
    else:
        em = choices * block_m
    grid = (triton.cdiv(em, block_m)
            * triton.cdiv(b.size(1), config["BLOCK_SIZE_N"]),)
    meta = {k: v for k, v in config.items() if k in LAUNCH_KEYS}
    meta["SPLIT_K"] = 1
    block_k = meta.pop("BLOCK_SIZE_K")
    if block_shape:
        block_k = min(block_k, min(block_shape))
    a2d = a_scale is not None and a_scale.ndim == 2
    has_b = b_scale is not None
    kernel[grid](
        a, b, c, None, a_scale, b_scale, topk_weights, sorted_ids,
        expert_ids, post_padded,
        b.size(1), b.size(2), em, choices,
        a.stride(0), a.stride(1), b.stride(0), b.stride(2), b.stride(1),
        c.stride(1), c.stride(2),
        a_scale.stride(0) if a2d else 0, a_scale.stride(1) if a2d else 0,
        b_scale.stride(0) if has_b else 0,
        b_scale.stride(2) if has_b and b_scale.ndim == 3 else 0,
        b_scale.stride(1) if has_b and b_scale.ndim >= 2
        and b_scale.size(1) > 1 else 0,
        0, 0,
        block_shape[0] if block_shape else 0,
        block_shape[1] if block_shape else 0,
        MUL_ROUTED_WEIGHT=mul_routed_weight, top_k=top_k,
        compute_type=tl.bfloat16, use_fp8_w8a8=has_b, use_int8_w8a8=False,
        use_int8_w8a16=False, per_channel_quant=False,
        naive_block_assignment=sorted_ids is None, HAS_BIAS=False,
        BLOCK_SIZE_K=block_k, SWAP_AB=swap_ab, USE_TD=False, **meta)


class Prepared:
    """One input's two kernel launches (`launch`), every tensor they read
    made beforehand, and `output()`, moe_sum of what the down kernel
    wrote."""

    def __init__(self, launch, c3, config):
        self.launch, self._c3, self.config = launch, c3, config

    def output(self):
        return moe_sum(self._c3)


class FusedExperts:
    """vLLM's TritonExperts (SiLU, no expert map, no LoRA) over one layer's
    weights: w1 [E, 2I, H] (gate rows, then up rows), w2 [E, H, I], bf16, or
    FP8 with f32 block scales w1_scale [E, 2I/128, H/128] and w2_scale
    [E, H/128, I/128] (dequantized = code x scale). `prepare` does for one
    input what vLLM runs around the kernels (the prepare step's activation
    quantization included) and returns the two launches alone."""

    def __init__(self, peer_dir, w1, w2, w1_scale=None, w2_scale=None,
                 device_name=None, capability=None):
        import torch
        self.peer_dir = peer_dir
        self.kernel = load_kernel(peer_dir)
        self.w1, self.w2 = w1, w2
        self.w1_scale, self.w2_scale = w1_scale, w2_scale
        self.fp8 = w1_scale is not None
        self.block_shape = [128, 128] if self.fp8 else None
        self.dtype = "fp8_w8a8" if self.fp8 else None
        if w1.is_cuda:
            device_name = device_name or torch.cuda.get_device_name(w1.device)
            capability = capability or \
                torch.cuda.get_device_capability(w1.device)
        self.device_name, self.capability = device_name or "", capability

    def config(self, m):
        """(config, its source) for `m` tokens, and whether SWAP_AB is on
        (enable_swap_ab: FP8 on compute capability 9.0, M tiles below 64, N
        tiles of 64 or more)."""
        config, source = choose_config(
            self.peer_dir, self.w1.size(0), self.w2.size(2), m, self.dtype,
            self.block_shape, self.device_name)
        swap = self.fp8 and tuple(self.capability or ()) == (9, 0) and \
            config["BLOCK_SIZE_M"] < 64 and config["BLOCK_SIZE_N"] >= 64
        return config, source, swap

    def _quant(self, x):
        if not self.fp8:
            return x, None
        return per_token_group_quant_fp8(x, self.block_shape[1])

    def prepare(self, x, topk_weights, topk_ids):
        """x [M, H] bf16, topk_weights f32 and topk_ids int32 [M, k]: runs
        the forward once (so Triton has compiled both launches) and returns
        its Prepared."""
        import torch
        m, top_k = topk_ids.shape
        experts, n, _ = self.w1.shape
        h = self.w2.size(1)
        config, source, swap = self.config(m)
        a1, a1_scale = self._quant(x.contiguous())
        sorted_ids, expert_ids, post_padded = expert_assignment(
            topk_ids, config["BLOCK_SIZE_M"], experts)
        # The gate/up output and the down output share one buffer, as
        # TritonExperts' workspace2.
        cache13 = torch.empty(m * top_k * max(n, h), dtype=x.dtype,
                              device=x.device)
        c1 = cache13[:m * top_k * n].view(m, top_k, n)
        c3 = cache13[:m * top_k * h].view(m, top_k, h)
        assigned = (sorted_ids, expert_ids, post_padded)

        def gate_up():
            # TritonExperts passes no router weights to the first GEMM.
            invoke_kernel(self.kernel, a1, self.w1, c1, a1_scale,
                          self.w1_scale, None, *assigned, False, top_k,
                          config, self.block_shape, swap)
        gate_up()
        if self.fp8:
            a2, a2_scale = silu_and_mul_quant_fp8(c1.view(-1, n),
                                                  self.block_shape[1])
        else:
            a2, a2_scale = silu_and_mul(c1.view(-1, n)), None

        def down():
            invoke_kernel(self.kernel, a2, self.w2, c3, a2_scale,
                          self.w2_scale, topk_weights, *assigned, True, 1,
                          config, self.block_shape, swap)
        down()

        def launch():
            gate_up()
            down()
        described = dict(config, source=source, swap_ab=bool(swap),
                         naive_block_assignment=sorted_ids is None)
        return Prepared(launch, c3, described)


# --- Local checks (CPU) ---------------------------------------------------

def _align_reference(ids, block, experts):
    """moe_align_block_size in plain Python, as vLLM's docstring explains
    it: each expert's choices, padded to a multiple of `block`."""
    flat = [e for row in ids for e in row]
    sentinel = len(flat)
    sorted_ids, expert_ids = [], []
    for e in range(experts):
        mine = [i for i, x in enumerate(flat) if x == e]
        pad = -len(mine) % block
        sorted_ids += mine + [sentinel] * pad
        expert_ids += [e] * ((len(mine) + pad) // block)
    return sorted_ids, expert_ids


def check_ops(seed=0):
    """moe_align_block_size, topk_softmax and the FP8 quantizers against
    plain Python on random CPU tensors; raises on a difference."""
    import math
    import random
    import torch
    rng = random.Random(seed)
    for t, k, e, block in [(1, 8, 128, 16), (3, 2, 4, 4), (8, 8, 32, 16),
                           (64, 8, 128, 16), (128, 8, 32, 64), (5, 3, 7, 8)]:
        ids = [rng.sample(range(e), k) for _ in range(t)]
        s, eids, total = moe_align_block_size(torch.tensor(ids), block, e)
        ref_s, ref_e = _align_reference(ids, block, e)
        n = int(total)
        assert n == len(ref_s), (t, k, e, block, n, len(ref_s))
        assert s[:n].tolist() == ref_s, (t, k, e, block)
        assert (s[n:] == t * k).all() and s.numel() >= n
        assert eids[:n // block].tolist() == ref_e
        assert (eids[n // block:] == -1).all()
        naive = expert_assignment(torch.tensor(ids), block, e)
        assert (naive[0] is None) == (t * k * 4 <= e)
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(16, 32, generator=gen)
    w, ids = topk_softmax(logits, 4, True)
    for row, wr, ir in zip(logits.tolist(), w.tolist(), ids.tolist()):
        top = sorted(range(32), key=lambda i: -row[i])[:4]
        z = sum(math.exp(v) for v in row)
        p = [math.exp(row[i]) / z for i in top]
        assert ir == top and all(abs(a - b / sum(p)) < 1e-6
                                 for a, b in zip(wr, p))
    x = torch.randn(4, 256, generator=gen).bfloat16()
    q, s = per_token_group_quant_fp8(x)
    for r in range(4):
        for g in range(2):
            block = x[r, g * 128:(g + 1) * 128].float()
            scale = float(s[r, g])
            assert scale == float(torch.tensor(
                max(float(block.abs().max()), 1e-10)) * (1.0 / FP8_MAX))
            back = q[r, g * 128:(g + 1) * 128].float() * scale
            assert (back - block).abs().max() <= 2 ** -4 * scale * 256
    w3 = torch.randn(3, 300, 200, generator=gen)
    q, s = quantize_block128(w3)
    from bench.common import quantize
    ref_q, ref_s = quantize(w3, "F32")
    assert torch.equal(s, ref_s) and torch.equal(
        q.view(torch.uint8), ref_q.view(torch.uint8)), "block-128 codes"
    print("vllm_peer: align, topk_softmax and FP8 quantizers match")


def _interpreter_shims():
    """Three gaps of Triton 3.6's interpreter, mended for the check: it
    turns its 1-element scalar arrays into ints with int(), which numpy 2.4
    refuses for arrays of rank 1 (`range(tl.cdiv(K, BLOCK_SIZE_K))` fails),
    so ints are taken from the element; its tl.dot multiplies bf16 operands
    as their uint16 storage, so they are widened to f32 first (as it widens
    FP8 to f16); and it rounds f32 to bf16 toward zero, so PyTorch rounds
    them to nearest even, as a GPU does."""
    import numpy as np
    import torch
    import triton.language as tl
    import triton.runtime.interpreter as interpreter
    patch = interpreter._patch_lang_tensor

    def patched(tensor, scope):
        patch(tensor, scope)
        scope.set_attr(tensor, "__index__",
                       lambda self: int(self.handle.data.reshape(-1)[0]))
    interpreter._patch_lang_tensor = patched
    builder = interpreter.InterpreterBuilder
    dot = builder.create_dot

    def widened(x):
        if x.dtype.scalar != tl.bfloat16:
            return x
        data = interpreter._convert_float(x.data, tl.bfloat16, tl.float32,
                                          None).view(np.float32)
        return interpreter.TensorHandle(data, tl.float32)
    builder.create_dot = lambda self, a, b, *rest: dot(self, widened(a),
                                                       widened(b), *rest)
    cast = builder.cast_impl

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar != tl.float32 or dst_type.scalar != tl.bfloat16:
            return cast(self, src, dst_type)
        data = torch.from_numpy(np.ascontiguousarray(src.data)).bfloat16()
        return interpreter.TensorHandle(
            data.view(torch.int16).numpy().view(np.uint16), tl.bfloat16)
    builder.cast_impl = cast_impl


def _reference(x, weights, ids, w1, w2, fp8):
    """TritonExperts' numerics in PyTorch, choice by choice, on f32 weights
    (FP8 ones dequantized): the gate/up output and each choice's weighted
    down output rounded to bf16, summed in f32; the activation rounded to
    bf16, or with `fp8` quantized per 1 x 128 as the input is."""
    import torch

    def dequant(q, s):
        return (q.float().view(q.shape[0], -1, 128) * s[..., None]).view(
            q.shape)
    xs = dequant(*per_token_group_quant_fp8(x)) if fp8 else x.float()
    out = torch.zeros(x.shape)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            hid = (w1[e] @ xs[t]).bfloat16()[None]
            act = dequant(*silu_and_mul_quant_fp8(hid)) if fp8 \
                else silu_and_mul(hid).float()
            out[t] += (weights[t, j] * (w2[e] @ act[0])).bfloat16().float()
    return out


def check_interpreted(peer_dir, seed=0):
    """A toy layer through fused_moe_kernel in Triton's interpreter (CPU;
    TRITON_INTERPRET=1 is set before triton is imported): bf16, and FP8
    block-128 with SWAP_AB on (capability 9.0) and off, at 1 token (one M
    block per choice), 5 and 70 (sorted, M tiles of 16 and 64), against
    _reference on the same weights in our layout (same roundings; the sums'
    order differs, which may move a value across a rounding boundary). A
    wrong layout or argument is off by the values themselves."""
    import torch
    if "triton" in sys.modules:
        raise RuntimeError("the interpreter needs TRITON_INTERPRET=1 before "
                           "triton is imported")
    os.environ["TRITON_INTERPRET"] = "1"
    _interpreter_shims()
    from bench.common import dequantized, quantize
    gen = torch.Generator().manual_seed(seed)
    e, h, inter, k = 8, 256, 128, 2
    w13 = torch.randn(e, 2 * inter, h, generator=gen) / h ** 0.5
    w2 = torch.randn(e, h, inter, generator=gen) / inter ** 0.5
    named = {}
    named["w13"], named["w13_scale"] = quantize(w13, "F32")
    named["w2"], named["w2_scale"] = quantize(w2, "F32")
    fp8 = [named[n] for n in ("w13", "w2", "w13_scale", "w2_scale")]
    kinds = {"bf16": ([w13.bfloat16(), w2.bfloat16()], (9, 0)),
             "fp8 swap_ab": (fp8, (9, 0)), "fp8": (fp8, (8, 9))}
    ref_w = {"bf16": (w13.bfloat16().float(), w2.bfloat16().float()),
             "fp8": (dequantized(named, "w13"), dequantized(named, "w2"))}
    for tokens in (1, 5, 70):
        x = torch.randn(tokens, h, generator=gen).bfloat16()
        weights, ids = topk_softmax(torch.randn(tokens, e, generator=gen),
                                    k, True)
        for kind, (ws, capability) in kinds.items():
            peer = FusedExperts(peer_dir, *ws, device_name="toy",
                                capability=capability)
            prepared = peer.prepare(x, weights, ids)
            got = prepared.output().float()
            ref = _reference(x, weights, ids, *ref_w[kind.split()[0]],
                             kind != "bf16")
            err = float((got - ref).abs().max() / ref.abs().max())
            cfg = prepared.config
            print(f"vllm_peer: interpreted {kind}, {tokens} tokens, "
                  f"BLOCK_M {cfg['BLOCK_SIZE_M']}, swap_ab "
                  f"{cfg['swap_ab']}, naive "
                  f"{cfg['naive_block_assignment']}: rel err {err:.1e}")
            assert err < 1e-2, (kind, tokens, err)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("peer_dir")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--interpret", action="store_true")
    opts = ap.parse_args()
    path = write_kernel_module(opts.peer_dir)
    print(f"vllm_peer: {path} holds {KERNEL} and its jit helpers")
    if opts.check:
        check_ops()
    if opts.interpret:
        check_interpreted(opts.peer_dir)


if __name__ == "__main__":
    main()
