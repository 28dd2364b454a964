"""transformers models with their MoE blocks patched (moe_compiler.patch).

    python3 -m bench.hf_models prepare CACHE    build machine: compiles every
                                                layer below into CACHE
    python3 -m bench.hf_models run CACHE        GPU machine: JSON lines

run: (1) tiny random-weight models of every type on the GPU, through
test/tools/check_patch.py (blocks against HF's, next-token choices and
logits against HF eager; FP8 and MXFP8 errors reported); (2) generate()
eager, with a static cache (transformers compiles the forward and replays
CUDA graphs) and under torch.compile: the same tokens; (3) real-size
configs, 2 decoder layers, random weights: decode tokens/s at batch 1 and
64 for HF eager experts, HF's grouped_mm experts and the patched model,
bf16 and FP8 block-128, in one run.
"""
import json
import math
import os
import sys
import time
from argparse import Namespace

import torch
from transformers import AutoConfig, AutoModelForCausalLM

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "test", "tools"))
import check_patch  # noqa: E402
import moe_compiler  # noqa: E402
from moe_compiler.patching import prepare  # noqa: E402

from bench.common import emit  # noqa: E402

REAL = {
    "qwen3-30b-a3b": dict(
        model_type="qwen3_moe", hidden_size=2048, intermediate_size=6144,
        moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8,
        norm_topk_prob=True, num_attention_heads=32, num_key_value_heads=4,
        head_dim=128, vocab_size=151936),
    "deepseek-v3-ep8-shard": dict(
        model_type="deepseek_v3", hidden_size=7168, intermediate_size=18432,
        moe_intermediate_size=2048, n_routed_experts=32, n_shared_experts=1,
        num_experts_per_tok=8, n_group=8, topk_group=4,
        routed_scaling_factor=2.5, norm_topk_prob=True,
        first_k_dense_replace=0, num_attention_heads=128,
        num_key_value_heads=128, q_lora_rank=1536, kv_lora_rank=512,
        qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
        vocab_size=129280),
}
LAYERS = 2
TINY = list(json.load(open(check_patch.MODELS)))


def real_model(name, experts="eager", device="cuda"):
    fields = dict(REAL[name], num_hidden_layers=LAYERS)
    kind = fields.pop("model_type")
    config = AutoConfig.for_model(kind, **fields)
    config._experts_implementation = experts
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config,
                                                 dtype=torch.bfloat16)
    if device != "meta":
        gen = torch.Generator(device=device).manual_seed(0)
        with torch.no_grad():
            for p in model.parameters():
                fan_in = p.shape[-1] if p.dim() >= 2 else 1
                p.copy_(torch.randn(p.shape, generator=gen, device=device,
                                    dtype=torch.float32) /
                        math.sqrt(fan_in))
    return model.eval()


def do_prepare(cache):
    with torch.device("meta"):
        for name in TINY:
            prepare(check_patch.build(name), cache_dir=cache)
        prepare(check_patch.build("deepseek_v3"), quant="fp8-block128",
                cache_dir=cache)
        prepare(check_patch.build("qwen3_moe"), quant="mxfp8",
                cache_dir=cache)
        prepare(check_patch.build("qwen3_moe"), ep_size=2, cache_dir=cache)
        prepare(check_patch.build("mixtral"), ep_size=4, cache_dir=cache)
    for name in REAL:
        for quant in (None, "fp8-block128"):
            prepare(real_model(name, device="meta"), quant=quant,
                    cache_dir=cache)


def tiny_checks(cache):
    for quant, names in ((None, TINY), ("fp8-block128", ["deepseek_v3"]),
                         ("mxfp8", ["qwen3_moe"])):
        check_patch.check_models(Namespace(target="sm_90a", quant=quant,
                                           cache=cache, models=names))


def generate_modes(cache):
    """The patched block under torch.compile(fullgraph=True) and replayed
    from a CUDA graph: bit for bit its eager output. The patched model in
    generate() with a static cache (transformers compiles the forward and
    replays CUDA graphs) and under torch.compile: next-token choices as the
    unpatched model's in the same mode."""
    for name in ("qwen3_moe", "deepseek_v3", "gpt_oss"):
        hf = check_patch.build(name).cuda()
        model = moe_compiler.patch(check_patch.build(name).cuda(),
                                   cache_dir=cache)
        block = check_patch.blocks(model)[0][1]
        x = torch.randn(3, 7, model.config.hidden_size, device="cuda",
                        dtype=torch.bfloat16)
        eager = check_patch.first(block(x))
        compiled = check_patch.first(torch.compile(block, fullgraph=True)(x))
        static = x.clone()
        check_patch.first(block(static))
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = check_patch.first(block(static))
        static.copy_(x)
        graph.replay()
        torch.cuda.synchronize()
        emit(what="block-modes", model=name,
             compile_equal=bool(torch.equal(compiled, eager)),
             graph_equal=bool(torch.equal(captured, eager)))

        ids = torch.randint(0, 128, (2, 6), generator=torch.Generator()
                            .manual_seed(3)).cuda()
        settings = dict(max_new_tokens=24, min_new_tokens=24,
                        do_sample=False, pad_token_id=0,
                        cache_implementation="static")
        want = hf.generate(ids, **settings)
        got = model.generate(ids, **settings)
        with torch.no_grad():
            theirs = torch.compile(hf)(want).logits[:, 5:-1]
            ours = torch.compile(model)(want).logits[:, 5:-1]
        emit(what="generate-static-cache", model=name,
             same_tokens=round((got[:, 6:] == want[:, 6:]).float().mean()
                               .item(), 3))
        emit(what="torch.compile-model", model=name,
             same_next_token=round((ours.argmax(-1) == theirs.argmax(-1))
                                   .float().mean().item(), 3))


def decode_rate(model, batch, steps=32, prompt=16):
    ids = torch.randint(0, model.config.vocab_size, (batch, prompt),
                        device="cuda")
    settings = dict(max_new_tokens=steps, min_new_tokens=steps,
                    do_sample=False, pad_token_id=0)
    model.generate(ids, **settings)  # warm-up (and a static cache's compile)
    best = float("inf")
    for _ in range(3):  # the host's speed varies: the best of three
        torch.cuda.synchronize()
        start = time.perf_counter()
        model.generate(ids, **settings)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return batch * steps / best


def real_size(cache):
    for name in REAL:
        for quant in (None, "fp8-block128"):
            rates = {}
            for side in ("eager", "grouped_mm", "ours"):
                if quant and side != "ours":
                    continue  # HF's blocks run bf16 weights only
                model = real_model(name, "eager" if side == "ours" else side)
                if side == "ours":
                    moe_compiler.patch(model, quant=quant, cache_dir=cache)
                for batch in (1, 64):
                    rates[(side, batch)] = decode_rate(model, batch)
                    emit(what="decode", model=name, layers=LAYERS,
                         quant=quant or "bf16", side=side, batch=batch,
                         tokens_per_s=round(rates[(side, batch)], 1))
                del model
                torch.cuda.empty_cache()


def static_decode(cache):
    """Batch 1 with a static cache (transformers compiles the forward and
    replays CUDA graphs, so the host's per-token work leaves the step):
    HF's grouped_mm experts beside the patched model."""
    for name in ("qwen3-30b-a3b",):
        for side in ("grouped_mm", "ours"):
            model = real_model(name, "eager" if side == "ours" else side)
            if side == "ours":
                moe_compiler.patch(model, cache_dir=cache)
            model.generation_config.cache_implementation = "static"
            rate = decode_rate(model, 1)
            emit(what="decode-static-cache", model=name, layers=LAYERS,
                 quant="bf16", side=side, batch=1,
                 tokens_per_s=round(rate, 1))
            del model
            torch.cuda.empty_cache()


def main():
    mode, cache = sys.argv[1], sys.argv[2]
    if mode == "prepare":
        do_prepare(cache)
        return
    import transformers
    emit(what="versions", torch=torch.__version__,
         transformers=transformers.__version__,
         device=torch.cuda.get_device_name())
    parts = sys.argv[3:] or ["tiny", "generate", "real"]  # "ep": the shell
    if "tiny" in parts:
        tiny_checks(cache)
    if "generate" in parts:
        generate_modes(cache)
    if "real" in parts:
        real_size(cache)
    if "static" in parts:
        static_decode(cache)


if __name__ == "__main__":
    main()
