"""A compiled MoE layer as a torch module.

    moe = MoE.from_pretrained("path/to/checkpoint", layer=3)   # sm_90a
    out = moe(hidden_states)          # [tokens, H] or [batch, seq, H], bf16

from_pretrained reads the layer's weights (moe_compiler.load_layer), compiles
the layer from the checkpoint's config.json with moe-compile (or takes it
from a cache keyed by config, target and compiler), and holds the weights on
the device. The forward runs on the current stream; it is a torch custom op
(moe_compiler::moe_forward), so torch.compile keeps it whole and CUDA graphs
capture it (the layer waits on nothing and copies nothing).
"""
import hashlib
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import weakref

import numpy as np
import torch

from .checkpoint import load_layer
from .layer import Layer, LayerError
from .tools import native_tool

_TORCH_DTYPES = {"BF16": torch.bfloat16, "F32": torch.float32,
                 "F8_E4M3": torch.float8_e4m3fn, "I32": torch.int32,
                 "F8_E8M0": torch.uint8}
QUANTS = ("fp8-block128", "mxfp8")
# Arguments with one row per expert: an expert-parallel rank keeps its own.
PER_EXPERT = ("w13", "w2", "w13_scale", "w2_scale", "w13_bias", "w2_bias")
_layers = weakref.WeakValueDictionary()  # id -> Layer, for the custom op
_ids = itertools.count()


def _progress(message):
    print(f"moe_compiler: {message}", file=sys.stderr, flush=True)


def _to_torch(array):
    """A numpy array (bf16 and FP8 through ml_dtypes) as a torch tensor."""
    array = np.ascontiguousarray(array)
    name = array.dtype.name
    if name == "bfloat16":
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    if name == "float8_e4m3fn":
        return torch.from_numpy(array.view(np.uint8)).view(
            torch.float8_e4m3fn)
    if name == "float8_e8m0fnu":
        return torch.from_numpy(array.view(np.uint8))
    return torch.from_numpy(array)


def find_compiler(required=True):
    """moe-compile: $MOE_COMPILE (an explicit choice), else the wheel's own,
    else on PATH, else beside this package in a source tree's build/bin;
    None if not found and not `required`."""
    given = os.environ.get("MOE_COMPILE")
    if given:
        found = given if os.path.sep in given else shutil.which(given)
        if found and os.path.exists(found):
            return os.path.abspath(found)
        raise LayerError(f"MOE_COMPILE={given!r} is not an executable")
    found = native_tool("moe-compile") or shutil.which("moe-compile")
    if found:
        return found
    here = os.path.dirname(os.path.abspath(__file__))
    candidate = os.path.join(here, "..", "..", "build", "bin", "moe-compile")
    if os.path.exists(candidate):
        return os.path.abspath(candidate)
    if required:
        raise LayerError("moe-compile not found: set MOE_COMPILE, install "
                         "the wheel (pip install <checkout>) or put it on "
                         "PATH")
    return None


def _compiler_id(compiler):
    """The compiler and the runtime it links into GPU layers make the
    library: a digest of both."""
    digest = hashlib.sha256()
    runtime = os.path.join(os.path.dirname(compiler), "..", "lib",
                           "libmoert.a")
    for part in (compiler, runtime):
        if os.path.exists(part):
            with open(part, "rb") as f:
                digest.update(f.read())
    return digest.hexdigest()


# Config fields that say where a config came from, not what the layer is.
_PROVENANCE = ("transformers_version", "_name_or_path")


def compile_layer(config, target="sm_90a", cache_dir=None, compiler=None,
                  quant=None, ep_size=1, router_logits=False, train=False,
                  bf16_grads=False):
    """The path of a library for `config` (a HF config dict), compiled by
    moe-compile or found in the cache (key: config and options; an entry a
    different compiler built is rebuilt, and taken as it is where no
    compiler is found). `quant`: None (as the config says), "fp8-block128"
    or "mxfp8"; `ep_size`: expert-parallel ranks; `router_logits`: the
    layer also outputs its router logits; `train`: the library also holds
    the layer's training forward and backward (moe-compile --train); a
    quantized one takes bf16 weights and quantizes them each call;
    `bf16_grads`: its backward writes the weights' gradients in bf16, as
    the weights are (--train-bf16-grads), rather than f32."""
    options = [f"--target={target}"]
    if bf16_grads and not train:
        raise LayerError("bf16_grads is an option of a library built for "
                         "training (train=True)")
    if train:
        if router_logits:
            raise LayerError("training takes layers without router logits "
                             "(they are not differentiated yet)")
        options.append("--train")
        if bf16_grads:
            options.append("--train-bf16-grads")
    if quant is not None:
        if quant not in QUANTS:
            raise LayerError(f"quant={quant!r}: one of "
                             f"{', '.join(map(repr, QUANTS))} or None")
        options.append(f"--quant={quant}")
    if ep_size != 1:
        options.append(f"--ep-size={ep_size}")
    if router_logits:
        options.append("--router-logits")
    layer_config = {k: v for k, v in config.items() if k not in _PROVENANCE}
    key = hashlib.sha256(json.dumps(
        [layer_config, options], sort_keys=True).encode()).hexdigest()
    cache_dir = cache_dir or os.environ.get("MOE_COMPILER_CACHE") or \
        os.path.join(os.path.expanduser("~"), ".cache", "moe-compiler")
    folder = os.path.join(cache_dir, key[:32])
    library = os.path.join(folder, "liblayer.so")
    stamp = os.path.join(folder, "compiler-id")
    compiler = compiler or find_compiler(required=not os.path.exists(library))
    if compiler is not None:
        compiler = os.path.abspath(compiler)
        if not os.path.exists(compiler):
            raise LayerError(f"moe-compile not found at {compiler}")
    compiler_id = _compiler_id(compiler) if compiler else None
    def ours():
        """Whether the entry is whole and this compiler's build."""
        try:
            with open(stamp) as f:
                return f.read() == compiler_id and os.path.exists(library)
        except OSError:
            return False

    if os.path.exists(library):
        if compiler is None:
            return library  # no compiler here: the cache's build it is
        if ours():
            return library
    os.makedirs(cache_dir, exist_ok=True)
    work = tempfile.mkdtemp(dir=cache_dir, prefix=".compiling-")
    try:
        config_path = os.path.join(work, "config.json")
        with open(config_path, "w") as f:
            json.dump(config, f)
        _progress(f"compiling the layer for {target} ...")
        start = time.time()
        result = subprocess.run(
            [compiler, "--from-hf-config", config_path, "--name", "layer",
             *options, "-o", os.path.join(work, "liblayer.so")],
            capture_output=True, text=True)
        if result.returncode != 0:
            raise LayerError(f"moe-compile failed: {result.stderr.strip()}")
        with open(os.path.join(work, "compiler-id"), "w") as f:
            f.write(compiler_id)
        _progress(f"compiled in {time.time() - start:.1f} s")
        # Processes (the ranks of a group) may build the same entry at
        # once: one that finds this compiler's entry in place takes it;
        # another compiler's is first moved aside whole (a rename), so no
        # process deletes files from an entry that another just placed.
        if os.path.exists(folder) and not ours():
            stale = tempfile.mkdtemp(dir=cache_dir, prefix=".stale-")
            try:
                os.rename(folder, os.path.join(stale, "entry"))
            except OSError:
                pass  # another process moved or replaced it
            shutil.rmtree(stale, ignore_errors=True)
        try:
            os.rename(work, folder)  # atomic: a cache entry is whole or absent
        except OSError:
            if not ours():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return library


@torch.library.custom_op("moe_compiler::moe_forward", mutates_args=())
def moe_forward(hidden_states: torch.Tensor, weights: list[torch.Tensor],
                layer_id: int) -> torch.Tensor:
    return _run(_layers[layer_id], hidden_states, weights)


def _run(layer, hidden_states, weights, *extra_outputs):
    """The layer's forward into a new `out` (and `extra_outputs` after it,
    in the ABI's order); returns `out`."""
    out = torch.empty(hidden_states.shape, dtype=torch.bfloat16,
                      device=hidden_states.device)
    workspace = None
    if layer.target != "cpu":
        # The op's own temporary, from the caching allocator: nothing it
        # allocates outlives the call (torch.compile's CUDA graph trees
        # refuse allocations in their pool that no output holds).
        tokens = hidden_states.shape[0]
        workspace = torch.empty(max(layer.workspace_size(tokens), 1),
                                dtype=torch.uint8, device=out.device)
    layer.forward(hidden_states.contiguous(), *weights, out, *extra_outputs,
                  workspace=workspace)
    _check_peers(layer, out.device)
    return out


def _check_peers(layer, device):
    """A GPU expert-parallel layer's peer that stalled or died (or, in a
    training step, passed another token count) shows once the call's waits
    end: raises then."""
    if layer.ep and layer.target != "cpu" and \
            not torch.cuda.is_current_stream_capturing():
        torch.cuda.current_stream(device).synchronize()
        layer.ep_check()


@moe_forward.register_fake
def _(hidden_states, weights, layer_id):
    return hidden_states.new_empty(hidden_states.shape, dtype=torch.bfloat16)


@torch.library.custom_op("moe_compiler::moe_forward_logits", mutates_args=())
def moe_forward_logits(hidden_states: torch.Tensor, weights: list[torch.Tensor],
                       layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """moe_forward of a layer compiled with router logits: the output and
    the router logits [T, E] f32 its routing step computed."""
    layer = _layers[layer_id]
    experts = layer.info["config"]["experts"]
    logits = torch.empty(hidden_states.shape[0], experts, dtype=torch.float32,
                         device=hidden_states.device)
    return _run(layer, hidden_states, weights, logits), logits


@moe_forward_logits.register_fake
def _(hidden_states, weights, layer_id):
    experts = _layers[layer_id].info["config"]["experts"]
    return (hidden_states.new_empty(hidden_states.shape, dtype=torch.bfloat16),
            hidden_states.new_empty((hidden_states.shape[0], experts),
                                    dtype=torch.float32))


@torch.library.custom_op("moe_compiler::moe_forward_train", mutates_args=())
def moe_forward_train(hidden_states: torch.Tensor, weights: list[torch.Tensor],
                      layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The training forward of a layer built for training: the output and
    the saved buffer (uint8) its backward reads."""
    layer = _layers[layer_id]
    x = hidden_states.contiguous()
    out = torch.empty(x.shape, dtype=torch.bfloat16, device=x.device)
    saved = torch.empty(layer.saved_size(x.shape[0]), dtype=torch.uint8,
                        device=x.device)
    layer.forward_train(x, *weights, out, saved=saved)
    _check_peers(layer, x.device)
    return out, saved


@moe_forward_train.register_fake
def _(hidden_states, weights, layer_id):
    layer = _layers[layer_id]
    return (hidden_states.new_empty(hidden_states.shape, dtype=torch.bfloat16),
            hidden_states.new_empty(layer.saved_size(hidden_states.shape[0]),
                                    dtype=torch.uint8))


# An sm_90a backward writes gradients over the saved tensors.
@torch.library.custom_op("moe_compiler::moe_backward",
                         mutates_args=("saved",))
def moe_backward(output_grad: torch.Tensor, hidden_states: torch.Tensor,
                 weights: list[torch.Tensor], saved: torch.Tensor,
                 layer_id: int) -> list[torch.Tensor]:
    """The layer's backward: the gradients its info lists, in order (the
    tokens' bf16, the weights' f32, or bf16 where the library was built
    with bf16 gradients)."""
    layer = _layers[layer_id]
    x = hidden_states.contiguous()
    grads = [torch.empty(shape, dtype=dtype, device=x.device)
             for _, dtype, shape in layer.gradient_shapes(x.shape[0])]
    layer.backward([x, *weights], output_grad.contiguous(), saved, grads)
    _check_peers(layer, x.device)
    return grads


@moe_backward.register_fake
def _(output_grad, hidden_states, weights, saved, layer_id):
    layer = _layers[layer_id]
    return [hidden_states.new_empty(shape, dtype=dtype) for _, dtype, shape
            in layer.gradient_shapes(hidden_states.shape[0])]


def _train_setup(ctx, inputs, output):
    hidden_states, weights, layer_id = inputs
    ctx.save_for_backward(hidden_states, output[1], *weights)
    ctx.layer_id = layer_id
    ctx.set_materialize_grads(True)


def _train_backward(ctx, output_grad, saved_grad):
    hidden_states, saved, *weights = ctx.saved_tensors
    layer = _layers[ctx.layer_id]
    grads = torch.ops.moe_compiler.moe_backward(
        output_grad.to(torch.bfloat16), hidden_states, weights, saved,
        ctx.layer_id)
    by_name = dict(zip((g["name"] for g in layer.training["gradients"]),
                       grads))
    names = [a["name"] for a in layer.args
             if not a["output"] and a["name"] != "hidden_states"]
    d_hidden = by_name.get("hidden_states")
    if d_hidden is not None:
        d_hidden = d_hidden.to(hidden_states.dtype)
    d_weights = [by_name[n].to(w.dtype) if n in by_name else None
                 for n, w in zip(names, weights)]
    return d_hidden, d_weights, None


moe_forward_train.register_autograd(_train_backward,
                                    setup_context=_train_setup)


def _finalize_on_destroy():
    """torch.distributed.destroy_process_group finalizes the expert-parallel
    layers started over the group it destroys (before the group goes)."""
    import torch.distributed as dist
    if getattr(dist.destroy_process_group, "_moe_compiler", False):
        return
    original = dist.destroy_process_group

    def destroy_process_group(group=None):
        for layer, on in list(_ep_layers.items()):
            if group is None or on is group:
                layer.ep_finalize()
                _ep_layers.pop(layer, None)
        return original(group)
    destroy_process_group._moe_compiler = True
    dist.destroy_process_group = destroy_process_group


_ep_layers = weakref.WeakKeyDictionary()  # Layer -> the group it runs over


def start_expert_parallel(layer, ep_group, device=None, max_tokens=None,
                          timeout_ms=0, proxy=False):
    """Joins `layer` (an expert-parallel Layer) to its ranks over `ep_group`
    (a torch.distributed group, or "env": see moe_compiler.ep); a GPU
    layer's group lives on `device`. Returns this rank."""
    from . import ep
    if layer._ep_live:
        # Another module of the same library started the group already.
        if layer._ep_group is not ep_group and not (
                isinstance(ep_group, str) and layer._ep_group == ep_group):
            raise LayerError("the layer's expert-parallel group is started "
                             "already, over another group (one group per "
                             "library and process)")
        if device is not None and layer.target != "cpu" and \
                torch.device(device) != layer.ep_device:
            raise LayerError(f"the layer's expert-parallel group lives on "
                             f"{layer.ep_device}, not {device}")
        return layer.ep_rank
    meeting = ep.rendezvous(ep_group)
    try:
        if layer.target != "cpu":
            with torch.cuda.device(device if device is not None else
                                   torch.cuda.current_device()):
                torch.cuda.synchronize()  # init allocates in this context
                layer.ep_init(meeting, max_tokens, timeout_ms, proxy)
        else:
            layer.ep_init(meeting, max_tokens, timeout_ms, proxy)
    finally:
        meeting.close()  # rank 0's socket, where init never took it
    layer._ep_group = ep_group
    if not isinstance(ep_group, str):
        _ep_layers[layer] = ep_group
        _finalize_on_destroy()
    return meeting.rank


def ep_size_of(ep_group):
    if ep_group is None:
        return 1
    if isinstance(ep_group, str):
        from . import ep
        return ep.from_environment().world_size
    import torch.distributed as dist
    return dist.get_world_size(ep_group)


def local_experts(tensors, rank, ranks):
    """The rank's slice of the per-expert tensors (experts [rank * E / N,
    (rank + 1) * E / N)); every other tensor whole."""
    out = dict(tensors)
    for name in PER_EXPERT:
        if name in out:
            experts = out[name].shape[0]
            if experts % ranks:
                raise LayerError(f"{experts} experts do not split over "
                                 f"{ranks} expert-parallel ranks")
            step = experts // ranks
            out[name] = out[name][rank * step:(rank + 1) * step]
    return out


def quantize_once(tensors, quant, config):
    """bf16 expert weights as the FP8 arguments a `quant` layer takes,
    quantized here once; FP8 weights only as they are."""
    if quant is None:
        return tensors
    from .quantize import QuantizeError, quantize_tensors
    held = "fp8-block128" if "w13_scale" in tensors else None
    if held is not None:
        if quant != held:
            raise LayerError(f"quant={quant!r}: the weights are FP8 with "
                             f"128 x 128 block scales; they can be run as "
                             f"quant='fp8-block128' or None")
        return tensors
    try:
        out, _ = quantize_tensors(tensors, quant)
    except QuantizeError as e:
        raise LayerError(f"quant={quant!r}: {e}") from None
    return out


class _NoBackward(torch.autograd.Function):
    """The output of a layer not built for training, in a graph that wants
    gradients: its backward raises."""

    @staticmethod
    def forward(ctx, out, hidden_states):
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad):
        raise LayerError("backward through a compiled MoE layer that was not "
                         "built for training (MoE.from_pretrained(..., "
                         "train=True), or patch(model, target='cpu'))")


class MoE(torch.nn.Module):
    """One compiled MoE layer and its weights on a device."""

    def __init__(self, library, tensors, device=None, layer=None,
                 trainable=False, train_layer=None, weights=None):
        """`library`: a layer compiled by moe-compile (or `layer`, a Layer
        several modules share); `tensors`: its weights by argument name
        (numpy arrays or torch tensors). `trainable`: the weights are
        nn.Parameters a backward reaches; `train_layer`: the Layer (or a
        function giving it, called on the first forward that needs it) of a
        library built for training, where `library` is not. `weights`: a
        function giving the weights (in the ABI's order) at each forward,
        instead of `tensors` held here."""
        super().__init__()
        self.layer = layer if layer is not None else Layer.open(library)
        self._train_layer = train_layer
        self._train_id = None
        self._weights_fn = weights
        # The forward library's weights made from weights() where the two
        # differ (a quantized block that trains: FP8 from its bf16).
        self._inference_weights_fn = None
        gpu = self.layer.target != "cpu"
        device = torch.device(device if device is not None else
                              ("cuda" if gpu else "cpu"))
        self.hidden = next(a["shape"][1] for a in self.layer.args
                           if a["name"] == "hidden_states")
        names = [a["name"] for a in self.layer.args
                 if not a["output"] and a["name"] != "hidden_states"]
        self._names = names
        self.layer_id = next(_ids)
        _layers[self.layer_id] = self.layer
        if weights is not None:
            return
        missing = [n for n in names if n not in tensors]
        if missing:
            raise LayerError(f"weights missing: {', '.join(missing)}")
        extra = sorted(set(tensors) - set(names))
        if extra:
            raise LayerError(f"weights the layer does not take: "
                             f"{', '.join(extra)}")
        for arg in self.layer.args:
            if arg["name"] not in tensors:
                continue
            value = tensors[arg["name"]]
            if not isinstance(value, torch.Tensor):
                value = _to_torch(value)
            value = value.to(device=device, dtype=_TORCH_DTYPES[arg["dtype"]])
            if trainable and value.is_floating_point():
                self.register_parameter(
                    arg["name"], torch.nn.Parameter(value.contiguous()))
            else:
                self.register_buffer(arg["name"], value.contiguous())
        outputs = [torch.empty([0] + a["shape"][1:],
                               dtype=_TORCH_DTYPES[a["dtype"]], device=device)
                   for a in self.layer.args if a["output"]]
        self.layer.check([torch.empty(0, self.hidden, dtype=torch.bfloat16,
                                      device=device)] +
                         [getattr(self, n).detach() for n in names] + outputs)

    @classmethod
    def from_pretrained(cls, checkpoint, layer, target="sm_90a", device=None,
                        library=None, cache_dir=None, compiler=None,
                        quant=None, ep_group=None, ep_timeout_ms=0,
                        train=False):
        """Layer `layer` of a HuggingFace checkpoint folder. `library`: a
        layer already compiled from its config.json (else compiled here, or
        found in the cache). `quant`: "fp8-block128" or "mxfp8" quantizes
        bf16 expert weights once, here (with `train`, the layer quantizes
        its bf16 weights each call). `ep_group`: a torch.distributed
        group (or "env") whose ranks split the experts; every rank calls
        this, and keeps only its experts' weights. `train`: the weights are
        nn.Parameters and the library is built for training too."""
        start = time.time()
        _progress(f"reading layer {layer} of {checkpoint} ...")
        weights = load_layer(checkpoint, layer, progress=_progress)
        total = sum(a.nbytes for a in weights.tensors.values())
        _progress(f"read {total / 2**20:.0f} MiB in {time.time() - start:.1f}"
                  f" s")
        if train and "w13_scale" in weights.tensors:
            raise LayerError("train=True: the checkpoint's experts are FP8, "
                             "and training needs their bf16 (or f32) "
                             "weights")
        ranks = ep_size_of(ep_group)
        if library is None:
            library = compile_layer(weights.config, target, cache_dir,
                                    compiler, quant, ranks, train=train)
        shared = Layer.open(library)
        tensors = weights.tensors if train else \
            quantize_once(weights.tensors, quant, weights.config)
        if ranks > 1:
            if device is None and shared.target != "cpu":
                device = torch.device("cuda", torch.cuda.current_device())
            rank = start_expert_parallel(shared, ep_group, device,
                                         timeout_ms=ep_timeout_ms)
            tensors = local_experts(tensors, rank, ranks)
        return cls(library, tensors, device, layer=shared, trainable=train)

    def weights(self):
        """The layer's weights in the ABI's order, as the forward takes
        them."""
        if self._weights_fn is not None:
            return self._weights_fn()
        return [getattr(self, n) for n in self._names]

    def _inference_weights(self, weights):
        """The forward library's weights, given weights()."""
        if self._inference_weights_fn is None:
            return weights
        return self._inference_weights_fn()

    def _training_layer(self):
        """The id of the library built for training (self.trainable),
        compiled on first use where it was given as a function."""
        if self._train_id is not None:
            return self._train_id
        layer = self._train_layer or self.layer
        if not isinstance(layer, Layer):
            layer = layer()
        self._train_layer = layer
        if layer is self.layer:
            self._train_id = self.layer_id
        else:
            self._train_id = next(_ids)
            _layers[self._train_id] = layer
        return self._train_id

    @staticmethod
    def _wants_grad(flat, weights):
        return torch.is_grad_enabled() and (
            flat.requires_grad or any(w.requires_grad for w in weights))

    def forward(self, hidden_states):
        """hidden_states: [tokens, H] or [batch, seq, H], bf16. With
        gradients asked for (a weight or the input requiring them, outside
        torch.no_grad()) the training forward runs, and backward() reaches
        the weights and the input."""
        flat = self._flat(hidden_states)
        weights = self.weights()
        wants_grad = self._wants_grad(flat, weights)
        if wants_grad and self.trainable:
            out, _ = torch.ops.moe_compiler.moe_forward_train(
                flat, weights, self._training_layer())
            return out.reshape(hidden_states.shape)
        weights = self._inference_weights(weights)
        with torch.no_grad():
            if self.router_logits:
                out, _ = torch.ops.moe_compiler.moe_forward_logits(
                    flat, weights, self.layer_id)
            else:
                out = torch.ops.moe_compiler.moe_forward(flat, weights,
                                                         self.layer_id)
        if wants_grad:
            # A backward through this forward would miss the layer: it
            # says so rather than train without it.
            out = _NoBackward.apply(out, flat)
        return out.reshape(hidden_states.shape)

    @property
    def trainable(self):
        """Whether a backward can run: the library is built for training,
        or one that is was given."""
        return self._train_layer is not None or bool(self.layer.training)

    def _flat(self, hidden_states):
        """[tokens, H] bf16 of hidden_states' rows."""
        if hidden_states.shape[-1] != self.hidden:
            raise LayerError(f"hidden_states has {hidden_states.shape[-1]} "
                             f"features; the layer takes {self.hidden}")
        return hidden_states.reshape(-1, self.hidden).to(torch.bfloat16)

    @property
    def router_logits(self):
        """Whether the layer also outputs its router logits."""
        return any(a["name"] == "router_logits" for a in self.layer.args)

    def forward_with_logits(self, hidden_states):
        """(output as forward gives it, router logits [tokens, E] f32) of a
        layer compiled with router logits (compile_layer(...,
        router_logits=True))."""
        if not self.router_logits:
            raise LayerError("the layer was compiled without router logits")
        flat, weights = self._flat(hidden_states), self.weights()
        wants_grad = self._wants_grad(flat, weights)
        with torch.no_grad():
            out, logits = torch.ops.moe_compiler.moe_forward_logits(
                flat, self._inference_weights(weights), self.layer_id)
        if wants_grad:
            # Router logits take no gradient yet: a backward through this
            # forward says so.
            out = _NoBackward.apply(out, flat)
        return out.reshape(hidden_states.shape), logits
