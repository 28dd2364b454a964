"""Our layers against HuggingFace transformers' own MoE blocks (GPU machine).

For each model type of bench/hf_configs.json: build the model with
transformers from the config, give its MoE block random weights (normal,
1/sqrt(fan-in), so routing is decisive), round them to bf16 and save the
model with transformers' save_pretrained. Then load layer 0 with
moe_compiler.MoE.from_pretrained (our loader, the layer compiled beforehand
from the same config: LIB_DIR/lib<name>.so) and compare its output with the
HF block's, run in float32 on the same bf16 weights, at several token
counts. DeepSeek-V3 is also run in FP8: its experts are written as the
published checkpoint stores them (E4M3 with 128 x 128 block scales) and HF's
block is given the dequantized weights.

Then, on one layer: the [batch, seq, H] form, torch.compile and a CUDA graph
replay give the same output as the eager call. Prints one JSON line each.

    python3 -m bench.hf_check LIB_DIR
"""
import json
import math
import os
import sys
import tempfile

import numpy as np
import torch
import transformers
from moe_compiler import MoE
from moe_compiler.quantize import quantize_weight
from moe_compiler.safetensors_io import SafetensorsFile, write_safetensors
from transformers import AutoConfig, AutoModelForCausalLM

from bench.common import emit

TOKENS = [1, 16, 128, 1024]


def moe_block(model):
    layer = model.model.layers[0]
    for name in ("mlp", "block_sparse_moe", "feed_forward"):
        if hasattr(layer, name):
            return getattr(layer, name)
    raise RuntimeError("no MoE block")


def randomize(block, gen):
    with torch.no_grad():
        for name, p in block.named_parameters():
            if p.dim() >= 2:
                fan_in = p.shape[-1]
                if name.endswith(("gate_up_proj", "down_proj")) and \
                        p.dim() == 3 and "gpt" in type(block).__name__.lower():
                    fan_in = p.shape[1]  # GPT-OSS: x @ W, [E, in, out]
                if "Llama4" in type(block).__name__ and p.dim() == 3:
                    fan_in = p.shape[1]
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(fan_in))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
        for name, b in block.named_buffers():
            if "bias" in name:
                b.copy_(torch.randn(b.shape, generator=gen) * 0.1)


def hf_forward(block, x):
    y = block(x)
    return y[0] if isinstance(y, tuple) else y


def fp8_blocks(w):
    """[N, K] f32 -> E4M3 codes and f32 scales per 128 x 128 block, and the
    values they stand for."""
    n, k = w.shape
    codes, scales = quantize_weight(w, "fp8-block128")
    deq = codes.astype(np.float32) * np.repeat(np.repeat(scales, 128, 0),
                                               128, 1)[:n, :k]
    return codes, scales, deq


def to_fp8_checkpoint(folder, config, block):
    """Rewrites the saved checkpoint's expert and shared-expert weights as
    FP8 blocks (as DeepSeek-V3 ships), with `config` (which says so), and
    gives `block` the dequantized values."""
    path = os.path.join(folder, "model.safetensors")
    f = SafetensorsFile(path)
    tensors = {}
    deq = {}
    for name in f.keys():
        a = np.array(f.get(name))
        if ".mlp.experts." in name or ".mlp.shared_experts." in name:
            codes, scales, d = fp8_blocks(a.astype(np.float32))
            tensors[name] = codes
            tensors[name.replace(".weight", ".weight_scale_inv")] = scales
            deq[name] = d
        else:
            tensors[name] = a
    write_safetensors(path, tensors)
    with open(os.path.join(folder, "config.json"), "w") as fh:
        json.dump(config, fh)
    with torch.no_grad():
        experts = block.experts
        for e in range(experts.gate_up_proj.shape[0]):
            p = f"model.layers.0.mlp.experts.{e}."
            gate = deq[p + "gate_proj.weight"]
            up = deq[p + "up_proj.weight"]
            experts.gate_up_proj[e].copy_(torch.from_numpy(
                np.concatenate([gate, up])))
            experts.down_proj[e].copy_(torch.from_numpy(
                deq[p + "down_proj.weight"]))
        for n in ("gate_proj", "up_proj", "down_proj"):
            getattr(block.shared_experts, n).weight.copy_(torch.from_numpy(
                deq[f"model.layers.0.mlp.shared_experts.{n}.weight"]))


def check(name, config, lib_dir, gen):
    # An FP8 config: transformers builds the bf16 model, our checkpoint
    # stores its experts in FP8.
    fp8 = "quantization_config" in config
    kind = config["model_type"]
    fields = {k: v for k, v in config.items()
              if k not in ("model_type", "quantization_config")}
    hf_config = AutoConfig.for_model(kind, **fields)
    try:
        hf_config._experts_implementation = "eager"
    except Exception:
        pass
    model = AutoModelForCausalLM.from_config(hf_config)
    block = moe_block(model)
    randomize(block, gen)
    model = model.to(torch.bfloat16)
    block = moe_block(model)
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        with open(os.path.join(folder, "config.json")) as fh:
            saved = json.load(fh)
        emit(what="saved-config", layer=name,
            fields={k: saved.get(k) for k in sorted(saved) if "expert" in k
                    or "intermediate" in k or k in ("num_experts_per_tok",)})
        if fp8:
            block = block.float()
            to_fp8_checkpoint(folder, config, block)
        library = os.path.join(lib_dir, f"lib{name}.so")
        ours = MoE.from_pretrained(folder, 0, library=library)
    block = block.float().cuda()
    if hasattr(block, "gate") and hasattr(block.gate, "e_score_correction_bias"):
        block.gate.e_score_correction_bias.data = \
            block.gate.e_score_correction_bias.data.float()
    hidden = config["hidden_size"]
    worst = 0.0
    for tokens in TOKENS:
        x = torch.randn(1, tokens, hidden, generator=gen).to(torch.bfloat16)
        x = x.cuda()
        with torch.no_grad():
            want = hf_forward(block, x.float()).reshape(tokens, hidden)
        got = ours(x.reshape(tokens, hidden)).float()
        torch.cuda.synchronize()
        error = ((got.double() - want.double()).norm() /
                 want.double().norm()).item()
        bound = 0.15 if fp8 else 1e-2
        worst = max(worst, error)
        emit(what="hf-block", layer=name, block=type(block).__name__,
            tokens=tokens, rel_error=error, bound=bound,
            ok=bool(error <= bound and torch.isfinite(got).all()))
    return ours


def main():
    lib_dir = sys.argv[1]
    configs = json.load(open(os.path.join(os.path.dirname(__file__),
                                          "hf_configs.json")))
    emit(what="versions", transformers=transformers.__version__,
        torch=torch.__version__, device=torch.cuda.get_device_name())
    gen = torch.Generator().manual_seed(0)
    modules = {}
    for name, config in configs.items():
        modules[name] = check(name, config, lib_dir, gen)

    # Shapes, torch.compile and CUDA graphs on one layer.
    moe = modules["qwen3_moe"]
    x = torch.randn(4, 32, 256, generator=gen).to(torch.bfloat16).cuda()
    eager = moe(x)
    flat = moe(x.reshape(-1, 256)).reshape(eager.shape)
    emit(what="shapes", equal=bool(torch.equal(eager, flat)),
        shape=list(eager.shape))
    compiled = torch.compile(moe, fullgraph=True)
    same = torch.equal(compiled(x), eager)
    emit(what="torch.compile", equal=bool(same))
    static = x.clone()
    moe(static)  # warm-up on a side stream is not needed: no sync inside
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = moe(static)
    static.copy_(x * 0.5)
    graph.replay()
    torch.cuda.synchronize()
    emit(what="cuda-graph", equal=bool(torch.equal(captured, moe(x * 0.5))))


if __name__ == "__main__":
    main()
