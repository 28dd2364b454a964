"""A transformers model's MoE blocks swapped for compiled layers.

    model = AutoModelForCausalLM.from_pretrained(..., dtype=torch.bfloat16)
    moe_compiler.patch(model)            # every MoE block, in place
    model.generate(...)                  # eager, torch.compile, CUDA graphs

Each block's weights go to our ABI through the same loaders as checkpoints
(moe_compiler.checkpoint), read from the module instead of files; the layer
is compiled once per distinct config (and found in the cache after that),
and its blocks share the compiled library. The block's replacement returns
what the model's decoder layer expects of the block it replaces.
"""
import json
import re

import ml_dtypes
import numpy as np
import torch

from .checkpoint import (Checkpoint, CheckpointError, _fp8_block128,
                         load_layer, text_config)
from .layer import Layer, LayerError
from .module import (MoE, compile_layer, ep_size_of, local_experts,
                     quantize_once, start_expert_parallel, _progress,
                     _to_torch, _TORCH_DTYPES)

# model_type -> the class name of its MoE block in transformers, and what
# that block returns: "tensor" ([B, S, H]), "scores" (GPT-OSS: the output and
# the router scores) or "logits" (Llama-4: [T, H] and the router logits).
BLOCKS = {
    "mixtral": ("MixtralSparseMoeBlock", "tensor"),
    "qwen2_moe": ("Qwen2MoeSparseMoeBlock", "tensor"),
    "qwen3_moe": ("Qwen3MoeSparseMoeBlock", "tensor"),
    "deepseek_v2": ("DeepseekV2Moe", "tensor"),
    "deepseek_v3": ("DeepseekV3MoE", "tensor"),
    "kimi_k2": ("DeepseekV3MoE", "tensor"),
    "gpt_oss": ("GptOssMLP", "scores"),
    "llama4_text": ("Llama4TextMoe", "logits"),
}
# Where checkpoints keep the block (transformers renames some on loading).
_CHECKPOINT_NAME = {"mixtral": "block_sparse_moe", "llama4_text": "feed_forward"}
# The models whose outputs carry router logits (output_router_logits): their
# layers are compiled to give the logits their routing step computes.
RECORDS_LOGITS = ("mixtral", "qwen2_moe", "qwen3_moe", "gpt_oss", "llama4_text")
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.(\w+)$")


def _numpy(tensor):
    """A tensor as a numpy array (bf16 and FP8 through ml_dtypes)."""
    t = tensor.detach().to("cpu").contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    if t.dtype == torch.float8_e4m3fn:
        return t.view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn)
    return t.numpy()


class _BlockTensors(Checkpoint):
    """One block's parameters and buffers as a checkpoint holding layer
    `layer`, so the checkpoint loaders read them by their usual names."""

    def __init__(self, config, block, layer, kind):
        self.folder = f"the model's layer {layer}"
        self.config = config
        prefix = f"model.layers.{layer}.{_CHECKPOINT_NAME.get(kind, 'mlp')}."
        self._tensors = {prefix + n: t for n, t in block.state_dict().items()}

    def __contains__(self, name):
        return name in self._tensors

    def names(self):
        return self._tensors.keys()

    def get(self, name, shape=None):
        tensor = self._tensors.get(name)
        if tensor is None:
            raise CheckpointError(f"{self.folder}: tensor '{name}' is missing")
        if shape is not None and list(tensor.shape) != list(shape):
            raise CheckpointError(f"tensor '{name}' has shape "
                                  f"{list(tensor.shape)}, expected "
                                  f"{list(shape)}")
        return _numpy(tensor)


def _cat_gate_up(t, dim):
    """GPT-OSS's interleaved gate/up columns (gate at even, up at odd) as
    gate, then up."""
    index = torch.arange(t.shape[dim], device=t.device)
    order = torch.cat([index[0::2], index[1::2]])
    return t.index_select(dim, order)


def _experts(p, names, fused):
    """w13 [E, 2I, H] and w2 [E, H, I] from fused experts (gate_up_proj
    [E, 2I, H], down_proj [E, H, I]) or per-expert Linear weights."""
    if fused[0] in p:
        return {"w13": p[fused[0]], "w2": p[fused[1]]}
    gate, up, down = names
    count = sum(1 for n in p if n.startswith("experts.") and
                n.endswith("." + down.split(".")[-1] + ".weight"))
    return {"w13": torch.stack([torch.cat([p[gate.format(e) + ".weight"],
                                           p[up.format(e) + ".weight"]])
                                for e in range(count)]),
            "w2": torch.stack([p[down.format(e) + ".weight"]
                               for e in range(count)])}


def _shared(p, prefix):
    return {"shared_w13": torch.cat([p[prefix + ".gate_proj.weight"],
                                     p[prefix + ".up_proj.weight"]]),
            "shared_w2": p[prefix + ".down_proj.weight"]}


def pack_block(kind, p):
    """A bf16 block's tensors `p` (its parameters and buffers by name) as
    the layer's arguments, with torch operations a backward goes through:
    the same layout moe_compiler.checkpoint reads from files."""
    per_expert = ("experts.{}.gate_proj", "experts.{}.up_proj",
                  "experts.{}.down_proj")
    fused = ("experts.gate_up_proj", "experts.down_proj")
    if kind == "mixtral":
        out = {"router_weight": p["gate.weight"]}
        out.update(_experts(p, ("experts.{}.w1", "experts.{}.w3",
                                "experts.{}.w2"), fused))
        return out
    if kind in ("qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3",
                "kimi_k2"):
        out = {"router_weight": p["gate.weight"]}
        if "gate.e_score_correction_bias" in p:
            out["router_bias"] = p["gate.e_score_correction_bias"]
        out.update(_experts(p, per_expert, fused))
        if "shared_expert.gate_proj.weight" in p:
            out.update(_shared(p, "shared_expert"))
            out["shared_gate"] = p["shared_expert_gate.weight"]
        if "shared_experts.gate_proj.weight" in p:
            out.update(_shared(p, "shared_experts"))
        return out
    if kind == "gpt_oss":
        # x @ gate_up_proj [E, H, 2I], gate and up columns interleaved.
        return {"router_weight": p["router.weight"],
                "router_bias": p["router.bias"],
                "w13": _cat_gate_up(p["experts.gate_up_proj"], 2)
                .transpose(1, 2),
                "w2": p["experts.down_proj"].transpose(1, 2),
                "w13_bias": _cat_gate_up(p["experts.gate_up_proj_bias"], 1),
                "w2_bias": p["experts.down_proj_bias"]}
    if kind == "llama4_text":
        out = {"router_weight": p["router.weight"],
               "w13": p["experts.gate_up_proj"].transpose(1, 2),
               "w2": p["experts.down_proj"].transpose(1, 2)}
        out.update(_shared(p, "shared_expert"))
        return out
    raise LayerError(f"model type {kind!r} has no trainable packing")


def _bf16_args(args):
    """The arguments of a quantized layer's library built for training:
    its quantized weights in bf16, without their scales."""
    out = []
    for a in args:
        if a["name"].endswith("_scale"):
            continue
        out.append(dict(a, dtype="BF16") if a["dtype"] == "F8_E4M3" else a)
    return out


def _to_numpy(tensor):
    """A bf16 or f32 torch tensor as a numpy array on the host (bf16
    through ml_dtypes)."""
    tensor = tensor.detach().cpu().contiguous()
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()


class CompiledMoeBlock(torch.nn.Module):
    """A compiled layer in the place of a transformers MoE block.

    A trainable block (bf16 weights on one rank) keeps the block's own parameters and buffers under their own
    names, so the model's state_dict is the unpatched model's, an optimizer
    trains them, and each forward hands the layer views of them
    (pack_block); a forward that needs gradients runs the training
    forward, whose backward reaches them."""

    def __init__(self, moe, returns, replaced, block=None, kind=None,
                 quant=None, train_args=None, config=None,
                 expert_parallel=None):
        super().__init__()
        self.moe = moe
        # (rank, ranks): the layer takes this rank's experts' slices.
        self._expert_parallel = expert_parallel
        self.returns = returns
        self.replaced = replaced  # the class name of the block it replaces
        self._kind = kind
        self._quant, self._config = quant, config
        # The arguments the block's own tensors are packed as: the training
        # library's (bf16 weights) where it differs from the forward's.
        self._args = train_args or self.moe.layer.args
        if block is not None:
            for name, child in list(block.named_children()):
                self.add_module(name, child)
            for name, param in list(block.named_parameters(recurse=False)):
                self.register_parameter(name, param)
            for name, buf in list(block.named_buffers(recurse=False)):
                self.register_buffer(name, buf)
            self.moe._weights_fn = self._packed
            if quant is not None:
                self.moe._inference_weights_fn = self._quantized

    def _packed(self):
        """The layer's weights from the block's own tensors, in the ABI's
        dtypes and order; under torch.no_grad() packed once and kept while
        no tensor changes."""
        tensors = dict(self.named_parameters())
        tensors.update(self.named_buffers())
        tensors = {n: t for n, t in tensors.items()
                   if not n.startswith("moe.")}
        grad = torch.is_grad_enabled() and any(
            t.requires_grad for t in tensors.values())
        key = tuple((id(t), t._version) for t in tensors.values())
        cached = getattr(self, "_packed_cache", None)
        if not grad and cached is not None and cached[0] == key:
            return cached[1]
        packed = pack_block(self._kind, tensors)
        if self._expert_parallel is not None:
            # Slices of the block's tensors: autograd gives the other
            # ranks' experts zeros.
            packed = local_experts(packed, *self._expert_parallel)
        dtypes = {"BF16": torch.bfloat16, "F32": torch.float32}
        weights = [packed[a["name"]].to(dtypes[a["dtype"]]).contiguous()
                   for a in self._args
                   if not a["output"] and a["name"] != "hidden_states"]
        self._packed_cache = None if grad else (key, weights)
        return weights

    def _quantized(self):
        """The forward library's weights (FP8, with their scales) from the
        block's own, quantized once and kept while no tensor changes: the
        inference forward of a quantized block that trains."""
        weights = self._packed()
        key = tuple((id(t), t._version) for t in weights)
        cached = getattr(self, "_quantized_cache", None)
        if cached is not None and cached[0] == key:
            return cached[1]
        names = [a["name"] for a in self._args
                 if not a["output"] and a["name"] != "hidden_states"]
        device = weights[0].device
        arrays = {n: _to_numpy(w) for n, w in zip(names, weights)}
        tensors = quantize_once(arrays, self._quant, self._config)
        args = {a["name"]: a for a in self.moe.layer.args}
        out = [_to_torch(tensors[n]).to(device) for n in self.moe._names]
        for n, t in zip(self.moe._names, out):
            assert t.dtype == _TORCH_DTYPES[args[n]["dtype"]], n
        self._quantized_cache = (key, out)
        return out

    def forward(self, hidden_states):
        logits = None
        if self._kind is not None and torch.is_grad_enabled() and (
                hidden_states.requires_grad or
                any(p.requires_grad for p in self.parameters())):
            # The training forward: router logits take no gradient yet.
            if _router_logits_wanted():
                raise LayerError("router logits (output_router_logits, the "
                                 "auxiliary loss) take no gradient yet; "
                                 "train without them")
            out = self.moe(hidden_states).to(hidden_states.dtype)
        elif self.moe.router_logits:
            out, logits = self.moe.forward_with_logits(hidden_states)
            logits = logits.to(hidden_states.dtype)  # as the HF router's
            _record_router_logits(logits)
            out = out.to(hidden_states.dtype)
        else:
            out = self.moe(hidden_states)
        out = out.to(hidden_states.dtype)
        if self.returns == "tensor":
            return out
        if self.returns == "scores":
            # GPT-OSS's decoder layer drops the router scores.
            return out, None
        # Llama-4's: [T, H] and the router logits.
        return out.reshape(-1, out.shape[-1]), logits

    def extra_repr(self):
        return f"replaces {self.replaced}, layer {self.moe.layer.info['name']}"


def _router_logits_wanted():
    if torch.compiler.is_compiling():
        return False
    try:
        from transformers.utils.output_capturing import _active_collector
    except ImportError:
        return False
    collected = _active_collector.get()
    return collected is not None and "router_logits" in collected


def _record_router_logits(logits):
    """Hands the logits to transformers' output capture, where the model
    was asked for them (output_router_logits): its hooks on the router
    modules this block replaced no longer run."""
    if torch.compiler.is_compiling():
        return
    try:
        from transformers.utils.output_capturing import _active_collector
    except ImportError:
        return
    collected = _active_collector.get()
    if collected is not None and "router_logits" in collected:
        collected["router_logits"].append(logits)


def _model_config(model):
    """The model's config as a dict, and its (decoder's) model type."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "to_json_string"):
        raise LayerError("patch takes a transformers model (a PreTrainedModel"
                         " with a config)")
    config = json.loads(config.to_json_string(use_diff=False))
    kind = text_config(config).get("model_type")
    if kind not in BLOCKS:
        raise LayerError(f"model type {kind!r} is not supported (supported: "
                         f"{', '.join(sorted(BLOCKS))}, llama4)")
    return config, kind


def _check_device(target, device):
    if target == "cpu":
        if device.type != "cpu":
            raise LayerError(f"target='cpu' runs on the CPU; the model is on "
                             f"{device}")
        return
    if device.type != "cuda":
        raise LayerError(f"target={target!r} runs on a Hopper GPU; the model "
                         f"is on {device} (move it with model.to('cuda') "
                         f"first, or use target='cpu')")
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) != (9, 0):
        raise LayerError(f"target={target!r} needs a Hopper GPU (compute "
                         f"capability 9.0); {device} is "
                         f"{torch.cuda.get_device_name(device)} ({major}.{minor})")


def find_blocks(model, kind):
    """(name, layer index, parent, attribute, block) of each MoE block."""
    cls, _ = BLOCKS[kind]
    found = []
    modules = dict(model.named_modules())
    for name, module in modules.items():
        if type(module).__name__ != cls:
            continue
        match = _LAYER.search(name)
        if not match:
            raise LayerError(f"{name}: a {cls} outside a decoder layer's "
                             f"'layers.N.<name>' is not patched")
        parent = modules[name.rsplit(".", 1)[0]]
        found.append((name, int(match.group(1)), parent, match.group(2),
                      module))
    return found


def check_peers(model):
    """Raises LayerError if a peer of the model's expert-parallel layers
    stalled or died in forwards replayed from a CUDA graph (an eager
    forward checks this itself). Waits for the device."""
    for module in model.modules():
        if isinstance(module, CompiledMoeBlock) and module.moe.layer.ep:
            if module.moe.layer.target != "cpu":
                torch.cuda.synchronize()
            module.moe.layer.ep_check()
            return


def prepare(model, target="sm_90a", quant=None, ep_size=1, cache_dir=None,
            compiler=None, train=False):
    """Compiles the layer patch(model, ...) would use into the cache (or
    finds it there) without touching the model or needing its device: for
    building on one machine what a GPU machine without the compiler runs.
    The model may be on the meta device. `train`: also the library a
    trainable block's training forward and backward use. Returns the
    library's path."""
    config, kind = _model_config(model)
    path = compile_layer(config, target, cache_dir, compiler, quant, ep_size,
                         kind in RECORDS_LOGITS)
    if train:
        compile_layer(config, target, cache_dir, compiler, quant, ep_size,
                      train=True, bf16_grads=_bf16_grads(target))
    return path


def _bf16_grads(target):
    """Whether a GPU block's backward writes bf16 weight gradients: the
    weights' own dtype, which autograd gives them anyway, at half the
    memory of f32 (the CPU backend keeps f32)."""
    return target != "cpu"


def patch(model, target="sm_90a", quant=None, ep_group=None, cache_dir=None,
          compiler=None, ep_timeout_ms=0, train=True):
    """Replaces every MoE block of `model` (Mixtral, Qwen2-MoE, Qwen3-MoE,
    DeepSeek-V2/V3, Kimi-K2, GPT-OSS, Llama-4) in place with a module that
    runs our compiled layer; returns the model.

    `target`: "sm_90a" (the model on a Hopper GPU) or "cpu". `quant`: None
    (the weights as they are: bf16, or FP8 128 x 128 blocks as the config
    says), "fp8-block128" or "mxfp8": the block keeps its bf16 parameters,
    which train (a training forward quantizes them inside the layer), and
    other forwards run on FP8 weights quantized from them once per change.
    `train=False` keeps the FP8 weights alone (quantized once, here: half
    the memory) and nothing trains.
    `ep_group`: a torch.distributed group (or "env", torchrun's variables)
    whose ranks split the experts; each rank computes only its own. Such a
    block trains on the CPU backend: it keeps every parameter, passes the
    layer its experts' slices, and its backward gives its own experts'
    gradients and this rank's tokens' part of the others' (router, shared
    experts), zeros for the other ranks' experts; summing gradients over
    the group (as DistributedDataParallel does) gives the whole batch's.
    Every rank passes the same number of tokens to each training forward.
    Without training, each rank keeps only its own experts."""
    config, kind = _model_config(model)
    blocks = find_blocks(model, kind)
    if not blocks:
        raise LayerError(f"the {kind} model has no MoE block "
                         f"({BLOCKS[kind][0]}) to patch")
    # Every block's device first: a refusal leaves the model as it was.
    devices = [next(b.parameters()).device for *_, b in blocks]
    for device in devices:
        _check_device(target, device)
    if ep_group is not None and len(set(devices)) > 1:
        raise LayerError(f"an expert-parallel model's MoE blocks must share "
                         f"one device (its group lives there); they are on "
                         f"{', '.join(sorted(map(str, set(devices))))}")
    ranks = ep_size_of(ep_group)
    library = None
    shared = None
    rank = 0
    # What can train keeps the model's own parameters: bf16 weights on one
    # rank. Quantized, a training forward runs the training library, which
    # quantizes them in each call; other forwards run the forward's library
    # on FP8 weights quantized from them once per change.
    trainable = train and not _fp8_block128(config)
    train_layer = []

    def train_library():
        if not train_layer:
            train_layer.append(Layer.open(compile_layer(
                config, target, cache_dir, compiler, quant, ranks, train=True,
                bf16_grads=_bf16_grads(target))))
        return train_layer[0]
    for (name, index, parent, attribute, block), device in zip(blocks,
                                                               devices):
        try:
            weights = load_layer(_BlockTensors(config, block, index, kind),
                                 index)
        except CheckpointError as e:
            raise LayerError(f"{name}: {e}") from None
        if shared is None and trainable and ranks > 1:
            # One library joins the group: the training one, whose forward
            # serves the other calls too (on the bf16 weights, quantized in
            # each call).
            shared = train_library()
            shared.set_graphs(False)
            rank = start_expert_parallel(shared, ep_group, device,
                                         timeout_ms=ep_timeout_ms)
        if shared is None:
            library = compile_layer(config, target, cache_dir, compiler,
                                    quant, ranks, kind in RECORDS_LOGITS)
            shared = Layer.open(library)
            # Its blocks call it with their own weights in turn, which would
            # re-capture a bucket's graph each call: launch directly (a graph
            # the caller captures around the model holds the launches).
            shared.set_graphs(False)
            if ranks > 1:
                rank = start_expert_parallel(shared, ep_group, device,
                                             timeout_ms=ep_timeout_ms)
        tensors = None if trainable else \
            quantize_once(weights.tensors, quant, config)
        if ranks > 1 and not trainable:
            tensors = local_experts(tensors, rank, ranks)
        if trainable:
            # The block's own tensors stay; the layer reads them each
            # forward. The training library is compiled on first use.
            moe = MoE(library, None, device, layer=shared,
                      train_layer=train_library, weights=lambda: [])
            # The training library's arguments: the forward's, with bf16
            # weights where those are quantized (it is compiled on first
            # use, and checked against these then).
            args = _bf16_args(shared.args) if quant is not None else None
            expert_parallel = (rank, ranks) if ranks > 1 else None
            replacement = CompiledMoeBlock(
                moe, BLOCKS[kind][1], type(block).__name__, block, kind,
                quant=None if expert_parallel else quant, train_args=args,
                config=config, expert_parallel=expert_parallel)
            replacement._packed()  # checks the block's tensors now
        else:
            moe = MoE(library, tensors, device, layer=shared)
            replacement = CompiledMoeBlock(moe, BLOCKS[kind][1],
                                           type(block).__name__)
        setattr(parent, attribute, replacement)
        del block, weights, tensors
    _progress(f"patched {len(blocks)} {BLOCKS[kind][0]} blocks")
    return model
