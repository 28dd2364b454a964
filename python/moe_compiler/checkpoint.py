"""One MoE layer's weights from a HuggingFace checkpoint, in our ABI.

    weights = load_layer("path/to/checkpoint", layer=3)
    weights.config          # the checkpoint's config.json (a dict)
    weights.tensors         # ABI name -> numpy array (router_weight, w13, ...)

The checkpoint is a folder with config.json and model.safetensors, or shards
listed by model.safetensors.index.json. Only the layer's tensors are read,
memory-mapped. Per-expert tensors (Mixtral, Qwen2/3-MoE, DeepSeek-V2/V3,
Kimi-K2, as published) are stacked; fused ones (GPT-OSS, Llama-4, and what
recent transformers versions save) are split and transposed; GPT-OSS's
interleaved gate/up columns are de-interleaved; MXFP4 experts (GPT-OSS as
published) are dequantized to bf16. FP8 checkpoints with 128 x 128 blocks
(DeepSeek-V3, Kimi-K2, or any model type shipped so) stay FP8 as
moe-compile's `--quant=auto` expects, their shared experts too (quantized
here once if the checkpoint holds those in bf16).

The ABI is the order moe-compile --from-hf-config gives the layer's
arguments: router_weight, [router_bias], w13 (gate rows, then up rows), w2,
[w13_scale, w2_scale], [w13_bias, w2_bias], [shared_w13, shared_w2,
[shared_w13_scale, shared_w2_scale], [shared_gate]].
"""
import json
import os

import ml_dtypes
import numpy as np

from .quantize import quantize_weight
from .safetensors_io import SafetensorsError, SafetensorsFile

BF16 = ml_dtypes.bfloat16
E4M3 = ml_dtypes.float8_e4m3fn


class CheckpointError(ValueError):
    pass


class Checkpoint:
    """A checkpoint folder: its config and its tensors, by name."""

    def __init__(self, folder):
        self.folder = folder
        config_path = os.path.join(folder, "config.json")
        try:
            with open(config_path) as f:
                self.config = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            raise CheckpointError(f"{config_path}: {e}") from None
        if not isinstance(self.config, dict):
            raise CheckpointError(f"{config_path}: not a JSON object")
        index_path = os.path.join(folder, "model.safetensors.index.json")
        single = os.path.join(folder, "model.safetensors")
        self._files = {}
        if os.path.exists(index_path):
            try:
                with open(index_path) as f:
                    weight_map = json.load(f)["weight_map"]
            except (OSError, json.JSONDecodeError, KeyError, TypeError) as e:
                raise CheckpointError(f"{index_path}: {e}") from None
            self._where = {name: os.path.join(folder, shard)
                           for name, shard in weight_map.items()}
        elif os.path.exists(single):
            self._where = None  # read from the file's header when needed
            self._single = single
        else:
            raise CheckpointError(
                f"{folder}: neither model.safetensors nor "
                f"model.safetensors.index.json")

    def _file(self, path):
        if path not in self._files:
            try:
                self._files[path] = SafetensorsFile(path)
            except SafetensorsError as e:
                raise CheckpointError(str(e)) from None
        return self._files[path]

    def _index(self):
        if self._where is None:
            self._where = {name: self._single
                           for name in self._file(self._single).keys()}
        return self._where

    def __contains__(self, name):
        return name in self._index()

    def get(self, name, shape=None):
        """Tensor `name`, checked against `shape` (None: any) if given."""
        path = self._index().get(name)
        if path is None:
            raise CheckpointError(f"{self.folder}: tensor '{name}' is missing")
        f = self._file(path)
        if name not in f:
            raise CheckpointError(
                f"{path}: tensor '{name}' is listed in the index but not in "
                f"the shard")
        array = f.get(name)
        if shape is not None and list(array.shape) != list(shape):
            raise CheckpointError(
                f"tensor '{name}' has shape {list(array.shape)}, expected "
                f"{list(shape)}")
        return array

    def names(self):
        return self._index().keys()


class LayerWeights:
    def __init__(self, config, model_type, tensors):
        self.config = config
        self.model_type = model_type
        self.tensors = tensors


def text_config(config):
    """The part of a config that describes the decoder (Llama-4 nests it)."""
    if config.get("model_type") == "llama4":
        if not isinstance(config.get("text_config"), dict):
            raise CheckpointError("config.json (llama4): no text_config")
        return dict(config["text_config"], model_type="llama4_text")
    return config


def _need(config, key, alias=None):
    # Recent transformers versions save some fields under other names.
    if (key not in config or config[key] is None) and alias in config:
        key = alias
    if key not in config or config[key] is None:
        raise CheckpointError(
            f"config.json ({config.get('model_type')}): missing field '{key}'")
    return config[key]


def _is_moe_layer(config, layer):
    """Whether decoder layer `layer` has an MoE block; the reason if not."""
    kind = config["model_type"]
    layers = config.get("num_hidden_layers")
    if layers is not None and not 0 <= layer < layers:
        return f"the model has {layers} layers"
    if kind in ("qwen2_moe", "qwen3_moe"):
        if layer in config.get("mlp_only_layers", []):
            return "it is in mlp_only_layers (a dense MLP)"
        step = config.get("decoder_sparse_step", 1)
        if (layer + 1) % step != 0:
            return f"only every {step}th layer is MoE (decoder_sparse_step)"
    if kind in ("deepseek_v2", "deepseek_v3", "kimi_k2"):
        first = config.get("first_k_dense_replace", 0)
        if layer < first:
            return (f"the first {first} layers are dense MLPs "
                    f"(first_k_dense_replace)")
        freq = config.get("moe_layer_freq", 1)
        if layer % freq != 0:
            return f"only every {freq}th layer is MoE (moe_layer_freq)"
    if kind == "llama4_text":
        moe_layers = config.get("moe_layers")
        if moe_layers is None:
            step = config.get("interleave_moe_layer_step", 1)
            moe_layers = [i for i in range(layers or layer + 1)
                          if (i + 1) % step == 0]
        if layer not in moe_layers:
            return "it is not among the MoE layers (moe_layers)"
    return None


def _first_present(ckpt, candidates):
    for name in candidates:
        if name in ckpt:
            return name
    return None


def _prefix(ckpt, layer, block, probe):
    """The name prefix of the layer's MoE block in this checkpoint."""
    candidates = [f"{root}layers.{layer}.{block}."
                  for root in ("model.", "model.language_model.",
                               "language_model.model.", "")]
    for prefix in candidates:
        if any(prefix + p in ckpt for p in probe):
            return prefix
    raise CheckpointError(
        f"no MoE block of layer {layer} in the checkpoint: none of "
        f"{[c + probe[0] for c in candidates]} is there")


def _bf16(array):
    return np.asarray(array).astype(BF16)


def _dequantize_block128(codes, scales):
    """FP8 weights [..., N, K] with f32 scales per 128 x 128 block -> f32."""
    values = codes.astype(np.float32)
    n, k = values.shape[-2:]
    scale = np.repeat(np.repeat(scales.astype(np.float32), 128, axis=-2),
                      128, axis=-1)[..., :n, :k]
    return values * scale


FP4_VALUES = np.array([+0.0, +0.5, +1.0, +1.5, +2.0, +3.0, +4.0, +6.0,
                       -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
                      np.float32)


def dequantize_mxfp4(blocks, scales):
    """MXFP4 as GPT-OSS stores it: blocks [..., G, 16] uint8 (two E2M1 codes
    per byte, low nibble first) and scales [..., G] uint8 (E8M0, bias 127)
    -> f32 [..., G * 32]."""
    blocks = np.asarray(blocks)
    scales = np.asarray(scales).astype(np.int32) - 127
    low = FP4_VALUES[blocks & 0x0F]
    high = FP4_VALUES[blocks >> 4]
    values = np.stack([low, high], axis=-1).reshape(*blocks.shape[:-1], -1)
    values = np.ldexp(values, scales[..., None])
    return values.reshape(*values.shape[:-2], -1)


class _Reader:
    """Reads one layer, checking every tensor's shape."""

    def __init__(self, ckpt, config, prefix, progress=None):
        self.ckpt, self.config, self.prefix = ckpt, config, prefix
        self.progress = progress

    def get(self, name, shape):
        return self.ckpt.get(self.prefix + name, shape)

    def has(self, name):
        return self.prefix + name in self.ckpt

    def experts_stacked(self, experts, pattern, shape):
        parts = []
        for e in range(experts):
            parts.append(self.get(pattern.format(e), shape))
            if self.progress and (e + 1) % max(experts // 4, 1) == 0:
                self.progress(f"{pattern.format('*')}: {e + 1} of {experts}")
        return np.stack(parts)


def _fp8_block128(config):
    q = config.get("quantization_config") or {}
    return q.get("quant_method") == "fp8" and \
        list(q.get("weight_block_size", [])) == [128, 128]


def _linear_experts(r, experts, hidden, inter, names, fp8):
    """Per-expert gate/up/down Linear weights ([out, in]) -> w13, w2 and, for
    FP8, their block scales."""
    gate, up, down = names
    tensors = {}
    g = r.experts_stacked(experts, gate + ".weight", [inter, hidden])
    u = r.experts_stacked(experts, up + ".weight", [inter, hidden])
    d = r.experts_stacked(experts, down + ".weight", [hidden, inter])
    if not fp8:
        return {"w13": _bf16(np.concatenate([g, u], axis=1)), "w2": _bf16(d)}
    if inter % 128 != 0:
        raise CheckpointError(
            f"FP8 experts with intermediate size {inter}: the layer keeps one "
            f"scale per 128 x 128 block of w13 (gate rows, then up rows), so "
            f"the intermediate size must be a multiple of 128")
    blocks_i, blocks_h = -(-inter // 128), -(-hidden // 128)
    gs = r.experts_stacked(experts, gate + ".weight_scale_inv",
                           [blocks_i, blocks_h])
    us = r.experts_stacked(experts, up + ".weight_scale_inv",
                           [blocks_i, blocks_h])
    ds = r.experts_stacked(experts, down + ".weight_scale_inv",
                           [blocks_h, blocks_i])
    tensors["w13"] = np.concatenate([g, u], axis=1).astype(E4M3)
    tensors["w2"] = d.astype(E4M3)
    tensors["w13_scale"] = np.concatenate([gs, us], axis=1).astype(np.float32)
    tensors["w2_scale"] = ds.astype(np.float32)
    return tensors


def _linear(r, name, shape, fp8):
    """One Linear weight as bf16, dequantized if the checkpoint holds FP8."""
    weight = r.get(name + ".weight", shape)
    if fp8 and r.has(name + ".weight_scale_inv"):
        scales = r.get(name + ".weight_scale_inv",
                       [-(-shape[0] // 128), -(-shape[1] // 128)])
        return _bf16(_dequantize_block128(weight, scales))
    return _bf16(weight)


def _shared(r, prefix, hidden, inter, fp8):
    """The shared experts' weights: bf16, or for an FP8 checkpoint E4M3 with
    f32 scales per 128 x 128 block, as the layer takes them (weights the
    checkpoint stores in bf16 are quantized here, once)."""
    names = [prefix + p for p in (".gate_proj", ".up_proj", ".down_proj")]
    shapes = [[inter, hidden], [inter, hidden], [hidden, inter]]
    if not fp8:
        g, u, d = (_linear(r, n, s, False) for n, s in zip(names, shapes))
        return {"shared_w13": np.concatenate([g, u], axis=0), "shared_w2": d}
    if inter % 128 != 0:
        raise CheckpointError(
            f"FP8 shared experts with intermediate size {inter}: the layer "
            f"keeps one scale per 128 x 128 block of shared_w13 (gate rows, "
            f"then up rows), so it must be a multiple of 128")
    codes, scales = [], []
    for name, shape in zip(names, shapes):
        weight = r.get(name + ".weight", shape)
        if r.has(name + ".weight_scale_inv"):
            codes.append(np.asarray(weight).astype(E4M3))
            scales.append(np.asarray(r.get(
                name + ".weight_scale_inv",
                [-(-shape[0] // 128), -(-shape[1] // 128)])).astype(np.float32))
        else:
            c, s = quantize_weight(_bf16(weight), "fp8-block128")
            codes.append(c)
            scales.append(s)
    return {"shared_w13": np.concatenate(codes[:2], axis=0),
            "shared_w2": codes[2],
            "shared_w13_scale": np.concatenate(scales[:2], axis=0),
            "shared_w2_scale": scales[2]}


def _fused_or_per_expert(r, experts, hidden, inter, fused, per_expert, fp8):
    """Experts stored fused ([E, 2I, H] gate_up_proj and [E, H, I] down_proj,
    as recent transformers versions hold them) or per expert."""
    if r.has(fused[0]):
        if fp8:
            raise CheckpointError(
                f"{r.prefix}{fused[0]}: fused FP8 experts are not read (the "
                f"published FP8 checkpoints hold them per expert)")
        gate_up = r.get(fused[0], [experts, 2 * inter, hidden])
        down = r.get(fused[1], [experts, hidden, inter])
        return {"w13": _bf16(gate_up), "w2": _bf16(down)}
    return _linear_experts(r, experts, hidden, inter, per_expert, fp8)


def load_layer(checkpoint, layer, progress=None):
    """The tensors of decoder layer `layer`'s MoE block, in our ABI (numpy
    arrays: bf16 through ml_dtypes, FP8 as float8_e4m3fn, scales f32).
    `progress`, if given, is called with a line of text as experts are read
    (a layer of a large checkpoint takes a while)."""
    ckpt = checkpoint if isinstance(checkpoint, Checkpoint) \
        else Checkpoint(checkpoint)
    config = text_config(ckpt.config)
    kind = config.get("model_type")
    loaders = {
        "mixtral": _mixtral, "qwen2_moe": _qwen, "qwen3_moe": _qwen,
        "deepseek_v2": _deepseek, "deepseek_v3": _deepseek,
        "kimi_k2": _deepseek, "gpt_oss": _gpt_oss, "llama4_text": _llama4,
    }
    if kind not in loaders:
        raise CheckpointError(
            f"config.json: model type '{kind}' is not supported (supported: "
            f"{', '.join(sorted(loaders))}, llama4)")
    if not isinstance(layer, int) or layer < 0:
        raise CheckpointError(f"layer {layer!r} is not a layer index")
    why = _is_moe_layer(config, layer)
    if why:
        raise CheckpointError(f"layer {layer} has no MoE block: {why}")
    tensors = loaders[kind](ckpt, config, layer, progress)
    return LayerWeights(ckpt.config, kind, tensors)


def _layer(ckpt, config, layer, progress, block, probe, inter_key):
    """The block's sizes (experts, hidden, intermediate) and its reader."""
    experts = _need(config, {"qwen2_moe": "num_experts",
                             "qwen3_moe": "num_experts",
                             "deepseek_v2": "n_routed_experts",
                             "deepseek_v3": "n_routed_experts",
                             "kimi_k2": "n_routed_experts"}.get(
        config["model_type"], "num_local_experts"), "num_local_experts")
    sizes = experts, _need(config, "hidden_size"), _need(config, inter_key)
    prefix = _prefix(ckpt, layer, block, probe)
    return sizes, _Reader(ckpt, config, prefix, progress)


def _mixtral(ckpt, config, layer, progress):
    (experts, hidden, inter), r = _layer(
        ckpt, config, layer, progress, "block_sparse_moe",
        ["gate.weight", "experts.gate_up_proj"], "intermediate_size")
    out = {"router_weight": _bf16(r.get("gate.weight", [experts, hidden]))}
    out.update(_fused_or_per_expert(
        r, experts, hidden, inter,
        ("experts.gate_up_proj", "experts.down_proj"),
        ("experts.{}.w1", "experts.{}.w3", "experts.{}.w2"),
        _fp8_block128(config)))
    return out


def _qwen(ckpt, config, layer, progress):
    (experts, hidden, inter), r = _layer(ckpt, config, layer, progress, "mlp",
                                         ["gate.weight"],
                                         "moe_intermediate_size")
    out = {"router_weight": _bf16(r.get("gate.weight", [experts, hidden]))}
    out.update(_fused_or_per_expert(
        r, experts, hidden, inter,
        ("experts.gate_up_proj", "experts.down_proj"),
        ("experts.{}.gate_proj", "experts.{}.up_proj",
         "experts.{}.down_proj"), _fp8_block128(config)))
    if config["model_type"] == "qwen2_moe":
        shared = _need(config, "shared_expert_intermediate_size")
        if shared > 0:
            out.update(_shared(r, "shared_expert", hidden, shared,
                               _fp8_block128(config)))
            out["shared_gate"] = _bf16(r.get("shared_expert_gate.weight",
                                             [1, hidden]))
    return out


def _deepseek(ckpt, config, layer, progress):
    (experts, hidden, inter), r = _layer(ckpt, config, layer, progress, "mlp",
                                         ["gate.weight"],
                                         "moe_intermediate_size")
    fp8 = _fp8_block128(config)
    out = {"router_weight": _bf16(r.get("gate.weight", [experts, hidden]))}
    v2 = config["model_type"] == "deepseek_v2"
    scoring = config.get("scoring_func", "softmax" if v2 else "sigmoid")
    if scoring == "sigmoid":
        out["router_bias"] = np.asarray(
            r.get("gate.e_score_correction_bias", [experts])).astype(np.float32)
    out.update(_fused_or_per_expert(
        r, experts, hidden, inter,
        ("experts.gate_up_proj", "experts.down_proj"),
        ("experts.{}.gate_proj", "experts.{}.up_proj",
         "experts.{}.down_proj"), fp8))
    shared = config.get("n_shared_experts", 0) or 0
    if shared:
        out.update(_shared(r, "shared_experts", hidden, shared * inter, fp8))
    return out


def _gpt_oss(ckpt, config, layer, progress):
    (experts, hidden, inter), r = _layer(
        ckpt, config, layer, progress, "mlp",
        ["router.weight", "experts.gate_up_proj",
         "experts.gate_up_proj_blocks"], "intermediate_size")
    out = {"router_weight": _bf16(r.get("router.weight", [experts, hidden])),
           "router_bias": np.asarray(
               r.get("router.bias", [experts])).astype(np.float32)}
    if r.has("experts.gate_up_proj_blocks"):
        # MXFP4 as published: [E, 2I, H/32, 16] codes and [E, 2I, H/32]
        # scales, i.e. the [E, 2I, H] (out x in) weight.
        groups = hidden // 32
        gate_up = dequantize_mxfp4(
            r.get("experts.gate_up_proj_blocks",
                  [experts, 2 * inter, groups, 16]),
            r.get("experts.gate_up_proj_scales", [experts, 2 * inter, groups]))
        down = dequantize_mxfp4(
            r.get("experts.down_proj_blocks",
                  [experts, hidden, inter // 32, 16]),
            r.get("experts.down_proj_scales", [experts, hidden, inter // 32]))
    else:
        # bf16 as transformers holds it: x @ gate_up_proj, [E, H, 2I].
        gate_up = np.swapaxes(r.get("experts.gate_up_proj",
                                    [experts, hidden, 2 * inter]), 1, 2)
        down = np.swapaxes(r.get("experts.down_proj",
                                 [experts, inter, hidden]), 1, 2)
    bias = np.asarray(r.get("experts.gate_up_proj_bias", [experts, 2 * inter]))
    # Gate and up columns are interleaved: gate at even, up at odd.
    out["w13"] = _bf16(np.concatenate([gate_up[:, 0::2], gate_up[:, 1::2]],
                                      axis=1))
    out["w2"] = _bf16(down)
    out["w13_bias"] = _bf16(np.concatenate([bias[:, 0::2], bias[:, 1::2]],
                                           axis=1))
    out["w2_bias"] = _bf16(r.get("experts.down_proj_bias", [experts, hidden]))
    return out


def _llama4(ckpt, config, layer, progress):
    (experts, hidden, inter), r = _layer(
        ckpt, config, layer, progress, "feed_forward",
        ["router.weight", "experts.gate_up_proj"], "intermediate_size")
    out = {"router_weight": _bf16(r.get("router.weight", [experts, hidden]))}
    # x @ gate_up_proj with gate_up_proj [E, H, 2I]: gate columns, then up.
    gate_up = np.swapaxes(r.get("experts.gate_up_proj",
                                [experts, hidden, 2 * inter]), 1, 2)
    down = np.swapaxes(r.get("experts.down_proj", [experts, inter, hidden]),
                       1, 2)
    out["w13"] = _bf16(gate_up)
    out["w2"] = _bf16(down)
    out.update(_shared(r, "shared_expert", hidden, inter, False))
    return out
