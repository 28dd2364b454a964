#!/usr/bin/env python3
"""Writes a tiny HuggingFace checkpoint of one model type in its real tensor
names and layouts, loads a layer with moe-pack, and checks it two ways:

1. expert by expert: each expert's gate, up and down projections of random
   vectors computed from the checkpoint's tensors as the model's own code
   uses them (per-expert Linear weights, GPT-OSS's interleaved gate_up_proj
   with biases, Llama-4's fused [E, H, 2I], MXFP4 and FP8 blocks dequantized)
   equal the same projections from the packed tensors (float64);
2. the whole layer: the CPU library moe-compile builds from the checkpoint's
   config.json, run by moe-exec on the packed weights and random hidden
   states, against moe-reference (float64) on the same inputs.

Needs numpy and ml_dtypes only.
"""
import argparse
import json
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
from moe_compiler.checkpoint import FP4_VALUES
from moe_compiler.safetensors_io import SafetensorsFile, write_safetensors

BF16, E4M3 = ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn
H, I, E, K = 256, 128, 8, 2  # multiples of 128 so FP8 blocks line up
# How DeepSeek-V3 (and other FP8 checkpoints) declare their weights.
FP8_BLOCK128 = {"quant_method": "fp8", "fmt": "e4m3",
                "activation_scheme": "dynamic", "weight_block_size": [128, 128]}

CONFIGS = {
    "mixtral": dict(model_type="mixtral", hidden_size=H, intermediate_size=I,
                    num_local_experts=E, num_experts_per_tok=K,
                    num_hidden_layers=2),
    "qwen2_moe": dict(model_type="qwen2_moe", hidden_size=H,
                      moe_intermediate_size=I, num_experts=E,
                      num_experts_per_tok=K,
                      shared_expert_intermediate_size=2 * I,
                      norm_topk_prob=False, num_hidden_layers=2),
    "qwen3_moe": dict(model_type="qwen3_moe", hidden_size=H,
                      moe_intermediate_size=I, num_experts=E,
                      num_experts_per_tok=K, norm_topk_prob=True,
                      num_hidden_layers=2),
    "qwen3_moe_fp8": dict(model_type="qwen3_moe", hidden_size=H,
                          moe_intermediate_size=I, num_experts=E,
                          num_experts_per_tok=K, norm_topk_prob=True,
                          num_hidden_layers=2,
                          quantization_config=FP8_BLOCK128),
    "deepseek_v3": dict(model_type="deepseek_v3", hidden_size=H,
                        moe_intermediate_size=I, n_routed_experts=E,
                        num_experts_per_tok=K, n_shared_experts=1, n_group=2,
                        topk_group=1, routed_scaling_factor=2.5,
                        norm_topk_prob=True, first_k_dense_replace=1,
                        num_hidden_layers=2),
    "deepseek_v3_fp8": dict(model_type="deepseek_v3", hidden_size=H,
                            moe_intermediate_size=I, n_routed_experts=E,
                            num_experts_per_tok=K, n_shared_experts=1,
                            n_group=2, topk_group=1,
                            routed_scaling_factor=2.5, norm_topk_prob=True,
                            first_k_dense_replace=1, num_hidden_layers=2,
                            quantization_config=FP8_BLOCK128),
    "gpt_oss": dict(model_type="gpt_oss", hidden_size=H, intermediate_size=I,
                    num_local_experts=E, num_experts_per_tok=K,
                    num_hidden_layers=2, swiglu_limit=7.0),
    "gpt_oss_mxfp4": dict(model_type="gpt_oss", hidden_size=H,
                          intermediate_size=I, num_local_experts=E,
                          num_experts_per_tok=K, num_hidden_layers=2,
                          swiglu_limit=7.0,
                          quantization_config={"quant_method": "mxfp4"}),
    "llama4": dict(model_type="llama4", text_config=dict(
        hidden_size=H, intermediate_size=I, num_local_experts=E,
        num_experts_per_tok=1, num_hidden_layers=2,
        interleave_moe_layer_step=1)),
}
LAYER = 1


def bf16(shape, rng, scale):
    return (rng.standard_normal(shape) * scale).astype(BF16)


def fp8_blocks(values):
    """E4M3 codes and f32 scales (amax / 448) per 128 x 128 block."""
    n, k = values.shape
    scales = np.zeros((-(-n // 128), -(-k // 128)), np.float32)
    codes = np.zeros(values.shape, E4M3)
    for rb in range(scales.shape[0]):
        for cb in range(scales.shape[1]):
            tile = values[rb * 128:(rb + 1) * 128, cb * 128:(cb + 1) * 128]
            scale = max(float(np.abs(tile).max()), 1e-4) / 448.0
            scales[rb, cb] = scale
            codes[rb * 128:(rb + 1) * 128, cb * 128:(cb + 1) * 128] = \
                (tile / scale).astype(E4M3)
    return codes, scales


def mxfp4(values):
    """MXFP4 [rows, K] -> blocks [rows, K/32, 16] uint8, scales [rows, K/32]."""
    rows, k = values.shape
    groups = values.reshape(rows, k // 32, 32)
    amax = np.abs(groups).max(axis=-1)
    exponent = np.where(amax > 0, np.floor(np.log2(np.maximum(amax, 1e-30)))
                        - 2, -127).astype(np.int32)
    scaled = groups / np.ldexp(1.0, exponent)[..., None]
    codes = np.abs(scaled[..., None] - FP4_VALUES).argmin(axis=-1)
    codes = codes.astype(np.uint8)
    blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return blocks.astype(np.uint8), (exponent + 127).astype(np.uint8)


def linear(x, weight, scale=None):
    """x @ W^T for a Linear weight [out, in] (FP8 with block scales)."""
    w = weight.astype(np.float64)
    if scale is not None:
        w = w * np.repeat(np.repeat(scale.astype(np.float64), 128, 0), 128,
                          1)[:w.shape[0], :w.shape[1]]
    return x @ w.T


def write_checkpoint(kind, folder, rng):
    """The checkpoint, and a function giving expert e's (gate, up, down)
    projections of vectors as the model's code computes them."""
    config = CONFIGS[kind]
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    t, dtypes = {}, {}
    w = 1.0 / np.sqrt(H)
    if kind.startswith("llama4"):
        prefix = f"language_model.model.layers.{LAYER}.feed_forward."
        t[prefix + "router.weight"] = bf16([E, H], rng, w)
        t[prefix + "experts.gate_up_proj"] = bf16([E, H, 2 * I], rng, w)
        t[prefix + "experts.down_proj"] = bf16([E, I, H], rng, w)
        for p, shape in (("gate_proj", [I, H]), ("up_proj", [I, H]),
                         ("down_proj", [H, I])):
            t[prefix + f"shared_expert.{p}.weight"] = bf16(shape, rng, w)

        def expert(e, x, y):
            gu = x @ t[prefix + "experts.gate_up_proj"][e].astype(np.float64)
            return gu[:, :I], gu[:, I:], y @ t[prefix + "experts.down_proj"][
                e].astype(np.float64)
    elif kind.startswith("gpt_oss"):
        prefix = f"model.layers.{LAYER}.mlp."
        t[prefix + "router.weight"] = bf16([E, H], rng, w)
        t[prefix + "router.bias"] = bf16([E], rng, 0.3)
        t[prefix + "experts.gate_up_proj_bias"] = bf16([E, 2 * I], rng, 0.3)
        t[prefix + "experts.down_proj_bias"] = bf16([E, H], rng, 0.3)
        if kind == "gpt_oss_mxfp4":
            gate_up = rng.standard_normal([E, 2 * I, H]) * w
            down = rng.standard_normal([E, H, I]) * w
            gb, gs = zip(*(mxfp4(gate_up[e]) for e in range(E)))
            db, ds = zip(*(mxfp4(down[e]) for e in range(E)))
            t[prefix + "experts.gate_up_proj_blocks"] = np.stack(gb)
            t[prefix + "experts.gate_up_proj_scales"] = np.stack(gs)
            t[prefix + "experts.down_proj_blocks"] = np.stack(db)
            t[prefix + "experts.down_proj_scales"] = np.stack(ds)

            def dequant(blocks, scales):
                low, high = FP4_VALUES[blocks & 15], FP4_VALUES[blocks >> 4]
                v = np.stack([low, high], -1).reshape(*blocks.shape[:-1], 32)
                v = v * np.ldexp(1.0, scales.astype(np.int32) - 127)[..., None]
                return v.reshape(blocks.shape[0], -1)

            def weights(e):
                return (dequant(t[prefix + "experts.gate_up_proj_blocks"][e],
                                t[prefix + "experts.gate_up_proj_scales"][e]),
                        dequant(t[prefix + "experts.down_proj_blocks"][e],
                                t[prefix + "experts.down_proj_scales"][e]))
        else:
            t[prefix + "experts.gate_up_proj"] = bf16([E, H, 2 * I], rng, w)
            t[prefix + "experts.down_proj"] = bf16([E, I, H], rng, w)

            def weights(e):  # as [out, in]
                return (t[prefix + "experts.gate_up_proj"][e].astype(
                    np.float64).T, t[prefix + "experts.down_proj"][e].astype(
                    np.float64).T)

        def expert(e, x, y):
            gate_up, down = weights(e)
            gu = x @ gate_up.T + t[prefix + "experts.gate_up_proj_bias"][
                e].astype(np.float64)
            return gu[:, 0::2], gu[:, 1::2], y @ down.T
    else:
        block, names = {
            "mixtral": ("block_sparse_moe", ("w1", "w3", "w2")),
        }.get(kind, ("mlp", ("gate_proj", "up_proj", "down_proj")))
        prefix = f"model.layers.{LAYER}.{block}."
        t[prefix + "gate.weight"] = bf16([E, H], rng, w)
        fp8 = kind.endswith("fp8")
        if kind.startswith("deepseek"):
            t[prefix + "gate.e_score_correction_bias"] = \
                (rng.standard_normal([E]) * 0.1).astype(np.float32)
            # Layer 0 is dense (first_k_dense_replace = 1).
            for p, shape in (("gate_proj", [I, H]), ("up_proj", [I, H]),
                             ("down_proj", [H, I])):
                t[f"model.layers.0.mlp.{p}.weight"] = bf16(shape, rng, w)

        def put(name, shape):
            values = rng.standard_normal(shape) * w
            if fp8:
                t[name + ".weight"], t[name + ".weight_scale_inv"] = \
                    fp8_blocks(values)
            else:
                t[name + ".weight"] = values.astype(BF16)

        for e in range(E):
            put(prefix + f"experts.{e}.{names[0]}", [I, H])
            put(prefix + f"experts.{e}.{names[1]}", [I, H])
            put(prefix + f"experts.{e}.{names[2]}", [H, I])
        shared = {"qwen2_moe": ("shared_expert", 2 * I),
                  "deepseek_v3": ("shared_experts", I),
                  "deepseek_v3_fp8": ("shared_experts", I)}.get(kind)
        if shared:
            for p, shape in (("gate_proj", [shared[1], H]),
                             ("up_proj", [shared[1], H]),
                             ("down_proj", [H, shared[1]])):
                put(prefix + f"{shared[0]}.{p}", shape)
        if kind == "qwen2_moe":
            t[prefix + "shared_expert_gate.weight"] = bf16([1, H], rng, w)

        def expert(e, x, y):
            def proj(n, v):
                name = prefix + f"experts.{e}.{n}"
                return linear(v, t[name + ".weight"],
                              t.get(name + ".weight_scale_inv"))
            return proj(names[0], x), proj(names[1], x), proj(names[2], y)

    # Two shards and an index, as large checkpoints come.
    every = sorted(t)
    shards = {"model-00001-of-00002.safetensors": every[0::2],
              "model-00002-of-00002.safetensors": every[1::2]}
    weight_map = {}
    for shard, members in shards.items():
        write_safetensors(os.path.join(folder, shard),
                          {n: t[n] for n in members}, dtypes)
        weight_map.update({n: shard for n in members})
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    return expert


def packed_expert(packed, e, x, y):
    """Expert e's projections from the packed (ABI) tensors."""
    w13 = packed["w13"][e].astype(np.float64)
    w2 = packed["w2"][e].astype(np.float64)
    if "w13_scale" in packed:
        def dequant(w, s):
            return w * np.repeat(np.repeat(s.astype(np.float64), 128, 0), 128,
                                 1)[:w.shape[0], :w.shape[1]]
        w13 = dequant(w13, packed["w13_scale"][e])
        w2 = dequant(w2, packed["w2_scale"][e])
    gu = x @ w13.T
    if "w13_bias" in packed:
        gu = gu + packed["w13_bias"][e].astype(np.float64)
    return gu[:, :I], gu[:, I:], y @ w2.T


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("kind", choices=sorted(CONFIGS))
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--tokens", type=int, default=33)
    ap.add_argument("--tools", required=True,
                    help="folder with moe-pack, moe-compile, moe-exec and "
                         "moe-reference")
    opts = ap.parse_args()
    rng = np.random.default_rng(7)
    folder = os.path.join(opts.workdir, "checkpoint")
    expert = write_checkpoint(opts.kind, folder, rng)
    tool = lambda name: os.path.join(opts.tools, name)  # noqa: E731
    packed_path = os.path.join(opts.workdir, "layer.safetensors")
    subprocess.run([tool("moe-pack"), folder, "--layer", str(LAYER), "-o",
                    packed_path], check=True, stdout=subprocess.DEVNULL)
    f = SafetensorsFile(packed_path)
    packed = {name: np.array(f.get(name)) for name in f.keys()}

    # 1. Expert by expert, against the model code's use of its tensors.
    worst = 0.0
    for e in range(E):
        x = rng.standard_normal([3, H])
        y = rng.standard_normal([3, I])
        for want, got in zip(expert(e, x, y), packed_expert(packed, e, x, y)):
            error = np.linalg.norm(want - got) / np.linalg.norm(want)
            worst = max(worst, error)
    # bf16 packing of f32 (or MXFP4 / FP8 decoded) values: 2^-9 relative.
    print(f"{opts.kind}: experts match the checkpoint to {worst:.1e}")
    if worst > 4e-3:
        return 1

    # 2. The whole layer: CPU library vs the float64 reference.
    library = os.path.join(opts.workdir, "liblayer.so")
    subprocess.run([tool("moe-compile"), "--from-hf-config",
                    os.path.join(folder, "config.json"), "--name", "layer",
                    "-o", library], check=True)
    hidden = (rng.standard_normal([opts.tokens, H])).astype(BF16)
    tokens_path = os.path.join(opts.workdir, "tokens.safetensors")
    write_safetensors(tokens_path, {"hidden_states": hidden})
    both_path = os.path.join(opts.workdir, "in.safetensors")
    write_safetensors(both_path, dict(packed, hidden_states=hidden),
                      {"w13_scale": None})
    out_path = os.path.join(opts.workdir, "out.safetensors")
    ref_path = os.path.join(opts.workdir, "ref.safetensors")
    subprocess.run([tool("moe-exec"), library, "--inputs", packed_path,
                    "--inputs", tokens_path, "--outputs", out_path],
                   check=True)
    subprocess.run([tool("moe-reference"), library, both_path, ref_path],
                   check=True)
    out = SafetensorsFile(out_path).get("out").astype(np.float64)
    ref = SafetensorsFile(ref_path).get("out").astype(np.float64)
    error = np.linalg.norm(out - ref) / np.linalg.norm(ref)
    print(f"{opts.kind}: layer {LAYER} from the checkpoint, {opts.tokens} "
          f"tokens: relative error {error:.2e} against the reference")
    # FP8 layers quantize activations too, which the reference does not
    # (see moe-exec-quant.test): about 5%.
    bound = 0.15 if "fp8" in opts.kind else 1e-2
    return 0 if error <= bound else 1


if __name__ == "__main__":
    sys.exit(main())
