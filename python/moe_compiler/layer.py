"""A compiled MoE layer, loaded with ctypes.

Layer(path).info is moe_layer_info()'s JSON. For a GPU layer (target sm_90a)
forward() takes torch CUDA tensors on one device in the order of
info["args"], output last, and enqueues the layer on the current torch stream
(or `stream`) of that device. Its workspace is allocated on that stream and
grows as needed; a workspace a CUDA graph captured is never freed while the
layer lives, or pass your own (`workspace`, uint8, workspace_size(tokens)
bytes). A CPU layer takes contiguous CPU tensors.
"""
import ctypes
import json
import os
import weakref

_open = weakref.WeakValueDictionary()  # real path -> Layer


class LayerError(RuntimeError):
    pass


class Layer:
    def __init__(self, path):
        self.lib = ctypes.CDLL(os.path.abspath(path))
        self.lib.moe_layer_info.restype = ctypes.c_char_p
        self.info = json.loads(self.lib.moe_layer_info().decode())
        self.target = self.info["target"]
        self.args = self.info["args"]
        self._forward = getattr(self.lib, self.info["forward"])
        self._forward.restype = ctypes.c_int32
        if self.target == "cpu":
            self._forward.argtypes = [ctypes.c_void_p, ctypes.c_int64]
        else:
            self._forward.argtypes = [ctypes.c_void_p, ctypes.c_int64,
                                      ctypes.c_void_p, ctypes.c_void_p]
            size = getattr(self.lib, self.info["workspace_size"])
            size.restype = ctypes.c_int64
            size.argtypes = [ctypes.c_int64]
            self._workspace_size = size
            self.lib.moe_last_error.restype = ctypes.c_char_p
        self._workspace = {}  # (device, stream) -> uint8 tensor
        self._retired = []  # outgrown workspaces a graph may still use
        self.ep = self.info.get("ep")  # None unless expert parallel
        self._ep_live = False
        self._ep_group = None  # what start_expert_parallel joined over
        self.ep_device = None  # a GPU layer's group lives on this device

    def ep_init(self, rendezvous, max_tokens=None, timeout_ms=0, proxy=False):
        """Joins the layer's expert-parallel group (every rank calls it);
        `rendezvous`: an ep.Rendezvous. A GPU layer allocates its state on
        the current CUDA device."""
        if not self.ep:
            raise LayerError("the layer is not expert parallel (compiled "
                             "with ep_size 1)")
        if self._ep_live:
            raise LayerError("the layer's expert-parallel group is started "
                             "already")
        if rendezvous.world_size != self.ep["ranks"]:
            raise LayerError(f"the layer was compiled for {self.ep['ranks']} "
                             f"expert-parallel ranks; the group has "
                             f"{rendezvous.world_size}")
        if max_tokens is None:
            max_tokens = self.ep.get("max_tokens", 4096)
        config = rendezvous.config(max_tokens, timeout_ms, proxy)
        init = getattr(self.lib, self.ep["init"])
        init.restype = ctypes.c_int32
        init.argtypes = [ctypes.c_void_p]
        if self.target != "cpu":
            import torch
            # Init puts the group's state in the current device's context.
            self.ep_device = torch.device("cuda", torch.cuda.current_device())
        rendezvous.listen_fd = -1  # init takes rank 0's socket
        if init(ctypes.byref(config)) != 0:
            raise LayerError(f"expert-parallel init (rank {rendezvous.rank} "
                             f"of {rendezvous.world_size}) failed: "
                             f"{self._last_error()}")
        self._ep_live = True
        self.ep_rank = rendezvous.rank

    def _check_ep(self, tensors):
        if not self.ep:
            return
        if not self._ep_live:
            raise LayerError("an expert-parallel layer's forward needs its "
                             "group: call ep_init on every rank first")
        device = self.ep_device
        if device is not None and tensors[0].device != device:
            raise LayerError(f"the layer's expert-parallel group lives on "
                             f"{device}; its tensors are on "
                             f"{tensors[0].device}")

    def ep_finalize(self):
        """Leaves the group (every rank calls it: on the GPU it meets the
        others); safe to call twice."""
        if self._ep_live:
            self._ep_live = False
            getattr(self.lib, self.ep["finalize"])()

    close = ep_finalize

    def ep_leave(self):
        """Leaves the group without meeting the others, for a rank whose
        peers may be gone: nothing waits for them. Safe to call twice."""
        if self._ep_live:
            if "leave" not in self.ep:
                raise LayerError("the library has no ep_leave (compiled by "
                                 "an older moe-compile): call ep_finalize")
            self._ep_live = False
            getattr(self.lib, self.ep["leave"])()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        # A failed block may have lost a peer: leave rather than meet.
        if exc[0] is None:
            self.ep_finalize()
        else:
            self.ep_leave()
        return False

    def ep_check(self):
        """A GPU layer's forwards wait for peers on the device: raises if one
        of them ran out of time. Call once their stream is done."""
        if self._ep_live and self.ep.get("status"):
            status = getattr(self.lib, self.ep["status"])
            status.restype = ctypes.c_int32
            if status() != 0:
                raise LayerError(f"expert parallel (rank {self.ep_rank}): "
                                 f"{self._last_error()}")

    def _last_error(self):
        fn = self.lib.moe_last_error
        fn.restype = ctypes.c_char_p
        return fn().decode()

    @classmethod
    def open(cls, path):
        """The Layer of this library, shared: a library's expert-parallel
        group and graphs are its own, one per process."""
        key = os.path.realpath(path)
        layer = _open.get(key)
        if layer is None:
            layer = cls(path)
            _open[key] = layer
        return layer

    def workspace_size(self, tokens):
        return int(self._workspace_size(tokens))

    @property
    def token_buckets(self):
        """The token counts whose calls replay a CUDA graph (sm_90a)."""
        return list(self.info.get("token_buckets", []))

    def set_graphs(self, on):
        """Turns the buckets' graph replay on or off (for callers that
        capture their own graphs, which works either way)."""
        if "set_graphs" in self.info:
            getattr(self.lib, self.info["set_graphs"])(ctypes.c_int32(int(on)))

    def warmup(self, *tensors, stream=None):
        """Captures every bucket's graph for these tensors' addresses (the
        token dimension may be any size), launching nothing; later forwards
        on the same tensors replay them. Returns the seconds it took."""
        import time
        import torch
        if "warmup" not in self.info or not self.token_buckets:
            return 0.0
        self.check(tensors)
        self._check_ep(tensors)
        device = tensors[0].device
        with torch.cuda.device(device):
            if stream is None:
                stream = torch.cuda.current_stream(device)
            buckets = self.token_buckets
            workspace = self._workspace_for(device, stream,
                                            self.workspace_size(buckets[-1]))
            pointers = (ctypes.c_void_p * len(tensors))(
                *[t.data_ptr() for t in tensors])
            fn = getattr(self.lib, self.info["warmup"])
            fn.restype = ctypes.c_int32
            fn.argtypes = [ctypes.c_void_p] * 3
            start = time.perf_counter()
            status = fn(pointers, stream.cuda_stream, workspace.data_ptr())
            took = time.perf_counter() - start
        if status != 0:
            raise LayerError(f"{self.info['warmup']} failed: "
                             f"{self.lib.moe_last_error().decode()}")
        return took

    def _workspace_for(self, device, stream, need):
        """This stream's workspace, grown (never shrunk) to `need` bytes."""
        import torch
        key = (device, stream.cuda_stream)
        workspace = self._workspace.get(key)
        if workspace is None or workspace.numel() < need:
            if workspace is not None:
                self._retired.append(workspace)
            with torch.cuda.stream(stream):
                workspace = torch.empty(need, dtype=torch.uint8, device=device)
            self._workspace[key] = workspace
        return workspace

    def _launch_on(self, device, tokens, stream, workspace):
        """The stream (the device's current one unless given) and workspace
        a GPU call of `tokens` launches with."""
        import torch
        if stream is None:
            stream = torch.cuda.current_stream(device)
        elif stream.device != device:
            raise LayerError(f"the stream is on {stream.device}; the "
                             f"tensors on {device}")
        need = max(self.workspace_size(tokens), 1)
        if workspace is None and torch.cuda.is_current_stream_capturing():
            # Captured: a workspace of the call's own, from the graph's
            # pool (one kept past the call would be a live allocation the
            # graph does not own).
            workspace = torch.empty(need, dtype=torch.uint8, device=device)
        elif workspace is None:
            workspace = self._workspace_for(device, stream, need)
        elif workspace.numel() < need or workspace.device != device:
            raise LayerError(f"the workspace needs {need} bytes on {device}")
        return stream, workspace

    def check(self, tensors, inputs_only=False):
        """Raises unless `tensors` match the ABI's names, dtypes and shapes
        (its inputs alone with `inputs_only`); returns the token count."""
        import torch
        dtypes = {"BF16": torch.bfloat16, "F32": torch.float32,
                  "F8_E4M3": torch.float8_e4m3fn, "I32": torch.int32,
                  "F8_E8M0": torch.uint8}
        args = [a for a in self.args if not (inputs_only and a["output"])]
        if len(tensors) != len(args):
            raise LayerError(f"{len(args)} tensors expected, "
                             f"{len(tensors)} given")
        tokens = tensors[0].shape[0]
        gpu = self.target != "cpu"
        device = tensors[0].device
        for arg, t in zip(args, tensors):
            if (t.device != device) or (t.is_cuda != gpu):
                raise LayerError(f"{arg['name']}: on {t.device}; a "
                                 f"{self.target} layer takes all its tensors "
                                 f"on one {'CUDA' if gpu else 'CPU'} device")
            shape = [tokens if d < 0 else d for d in arg["shape"]]
            if list(t.shape) != shape or t.dtype != dtypes[arg["dtype"]] \
                    or not t.is_contiguous():
                raise LayerError(f"{arg['name']}: expected {arg['dtype']} "
                                 f"{shape} contiguous, got {t.dtype} "
                                 f"{list(t.shape)}")
        return tokens

    def __deepcopy__(self, memo):
        return self  # one per library and process: copies share it

    def __del__(self):
        # Collection happens at no moment the ranks share, and a peer may
        # be gone: leave without meeting them (ep_finalize is the
        # collective way out).
        if not getattr(self, "_ep_live", False):
            return
        try:
            # A GPU group leaves from its own device's context.
            if self.ep_device is not None:
                import torch
                with torch.cuda.device(self.ep_device):
                    self.ep_leave()
            else:
                self.ep_leave()
        except Exception:
            pass
        try:
            import warnings
            warnings.warn("an expert-parallel layer was collected while in "
                          "its group: it left without meeting the other "
                          "ranks; call ep_finalize() on every rank (or use "
                          "the layer as a context manager)",
                          ResourceWarning, stacklevel=2)
        except Exception:
            pass

    def forward(self, *tensors, stream=None, workspace=None):
        import torch
        tokens = self.check(tensors)
        self._check_ep(tensors)
        pointers = (ctypes.c_void_p * len(tensors))(
            *[t.data_ptr() for t in tensors])
        if self.target == "cpu":
            status = self._forward(pointers, tokens)
        else:
            device = tensors[0].device
            with torch.cuda.device(device):
                stream, workspace = self._launch_on(device, tokens, stream,
                                                    workspace)
                status = self._forward(pointers, tokens, stream.cuda_stream,
                                       workspace.data_ptr())
        if status != 0:
            why = self._last_error() \
                if self.target != "cpu" or self.ep else f"status {status}"
            raise LayerError(f"{self.info['forward']} failed: {why}")
        outputs = tensors[len(tensors) - self.num_outputs:]
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    # Training (a library built with moe-compile --train).

    @property
    def training(self):
        """The library's training part of its info (None unless built with
        --train): saved tensors, gradients and entry points."""
        return self.info.get("training")

    def _training_entry(self, role, argtypes):
        if not self.training:
            raise LayerError(f"{self.info['name']}: the library was not "
                             f"built for training (moe-compile --train)")
        fn = getattr(self.lib, self.training[role])
        fn.restype = ctypes.c_int32
        fn.argtypes = argtypes
        return fn

    def saved_size(self, tokens):
        """Bytes of the buffer forward_train saves into, for `tokens`."""
        if not self.training:
            self._training_entry("saved_size", [])  # raises
        size = self.training["saved_bytes"]
        return size["base"] + size["per_token"] * tokens

    def forward_train(self, *tensors, saved, stream=None, workspace=None):
        """forward() that also writes what the backward reads into `saved`
        (uint8, saved_size(tokens) bytes, contiguous, on the tensors'
        device)."""
        import torch
        gpu = self.target != "cpu"
        params = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
        fn = self._training_entry("forward", params + params[2:] * 2 * gpu)
        self._check_ep(tensors)
        tokens = self.check(tensors)
        self._check_saved(saved, tokens, tensors[0].device)
        pointers = (ctypes.c_void_p * len(tensors))(
            *[t.data_ptr() for t in tensors])
        if not gpu:
            status = fn(pointers, tokens, saved.data_ptr())
        else:
            device = tensors[0].device
            with torch.cuda.device(device):
                stream, workspace = self._launch_on(device, tokens, stream,
                                                    workspace)
                status = fn(pointers, tokens, stream.cuda_stream,
                            workspace.data_ptr(), saved.data_ptr())
        if status != 0:
            raise LayerError(f"{self.training['forward']} failed: "
                             f"{self._last_error()}")
        saved._moe_consumed = False

    def _check_saved(self, saved, tokens, device):
        import torch
        need = self.saved_size(tokens)
        if saved is None or not isinstance(saved, torch.Tensor):
            raise LayerError("the saved tensors are missing: pass the buffer "
                             "forward_train wrote")
        if saved.dtype != torch.uint8 or saved.numel() < need or \
                not saved.is_contiguous() or saved.device != device:
            raise LayerError(f"the saved buffer must be {need} contiguous "
                             f"uint8 bytes on {device} for {tokens} tokens; "
                             f"it is {saved.numel()} {saved.dtype} on "
                             f"{saved.device}")

    def gradient_shapes(self, tokens):
        """(name, torch dtype, shape) of each gradient the backward gives,
        in order."""
        import torch
        dtypes = {"BF16": torch.bfloat16, "F32": torch.float32}
        return [(g["name"], dtypes[g["dtype"]],
                 [tokens if d < 0 else d for d in g["shape"]])
                for g in self.training["gradients"]]

    def backward(self, tensors, output_grad, saved, grads, accumulate=False,
                 bf16=False, stream=None, workspace=None):
        """The layer's backward. `tensors`: the forward's inputs (outputs
        may be left out); `output_grad`: the output's gradient, bf16;
        `saved`: what forward_train wrote; `grads`: a tensor (or None, not
        wanted) for each gradient of gradient_shapes(), written in order
        (each in the dtype gradient_shapes() gives: weights' f32, or bf16
        in a library built with bf16 gradients; on the CPU, bf16 also with
        `bf16`; added to with `accumulate`). On the GPU, `stream` and `workspace` as for
        forward_train, and the backward consumes `saved` (it writes gradients
        over saved tensors): a second backward on it is refused."""
        import torch
        fn = self._training_entry("backward", [
            ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
            ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32])
        inputs = [a for a in self.args if not a["output"]]
        if len(tensors) != len(inputs):
            raise LayerError(f"the backward takes the forward's "
                             f"{len(inputs)} inputs; {len(tensors)} given")
        self._check_ep(tensors)
        tokens = self.check(tensors, inputs_only=True)
        device = tensors[0].device
        out = next(a for a in self.args if a["output"])
        shape = [tokens if d < 0 else d for d in out["shape"]]
        if not isinstance(output_grad, torch.Tensor) or \
                list(output_grad.shape) != shape or \
                output_grad.dtype != torch.bfloat16 or \
                not output_grad.is_contiguous() or \
                output_grad.device != device:
            raise LayerError(f"the output's gradient must be bf16 {shape} "
                             f"contiguous on {device}; it is "
                             + (f"{output_grad.dtype} "
                                f"{list(output_grad.shape)} on "
                                f"{output_grad.device}"
                                if isinstance(output_grad, torch.Tensor)
                                else type(output_grad).__name__))
        self._check_saved(saved, tokens, device)
        consumes = self.training.get("consumes_saved", False)
        if consumes and getattr(saved, "_moe_consumed", False):
            raise LayerError("the saved buffer was consumed by an earlier "
                             "backward (it writes gradients over saved "
                             "tensors): run forward_train again for another "
                             "backward")
        expected = self.gradient_shapes(tokens)
        if len(grads) != len(expected):
            raise LayerError(f"{len(expected)} gradients expected "
                             f"({', '.join(n for n, *_ in expected)}); "
                             f"{len(grads)} given")
        for g, (name, dtype, gshape) in zip(grads, expected):
            if g is None:
                continue
            want = torch.bfloat16 if bf16 else dtype
            if list(g.shape) != gshape or g.dtype != want or \
                    not g.is_contiguous() or g.device != device:
                raise LayerError(f"the gradient of {name} must be {want} "
                                 f"{gshape} contiguous on {device}; it is "
                                 f"{g.dtype} {list(g.shape)} on {g.device}")
        if self.target != "cpu":
            self._backward_gpu(fn, tensors, tokens, output_grad, saved, grads,
                               accumulate, expected, stream, workspace)
        else:
            self._backward_cpu(fn, tensors, tokens, output_grad, saved, grads,
                               accumulate, bf16)
        if consumes:
            saved._moe_consumed = True

    def _backward_cpu(self, fn, tensors, tokens, output_grad, saved, grads,
                      accumulate, bf16):
        args = list(tensors) + [None] * self.num_outputs
        pointers = (ctypes.c_void_p * len(args))(
            *[t.data_ptr() if t is not None else None for t in args])
        grad_pointers = (ctypes.c_void_p * len(grads))(
            *[g.data_ptr() if g is not None else None for g in grads])
        flags = (1 if accumulate else 0) | (2 if bf16 else 0)
        if fn(pointers, tokens, output_grad.data_ptr(), saved.data_ptr(),
              grad_pointers, flags) != 0:
            raise LayerError(f"{self.training['backward']} failed: "
                             f"{self._last_error()}")

    def _backward_gpu(self, fn, tensors, tokens, output_grad, saved, grads,
                      accumulate, expected, stream, workspace):
        """backward() on the GPU, whose library writes every gradient in the
        dtype it computes it: one the caller wants in another dtype, added
        to what it holds, or not at all goes through a tensor of its own."""
        import torch
        device = tensors[0].device
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
                       ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32,
                       ctypes.c_void_p, ctypes.c_void_p]
        args = list(tensors) + [None] * self.num_outputs
        pointers = (ctypes.c_void_p * len(args))(
            *[t.data_ptr() if t is not None else None for t in args])
        with torch.cuda.device(device):
            stream, workspace = self._launch_on(device, tokens, stream,
                                                workspace)
            # The scratch tensors, the call and the conversions all on the
            # call's stream: in order, and scratch not reused early.
            with torch.cuda.stream(stream):
                targets = []
                for g, (_, dtype, shape) in zip(grads, expected):
                    direct = g is not None and g.dtype == dtype and \
                        not accumulate
                    targets.append(g if direct else torch.empty(
                        shape, dtype=dtype, device=device))
                grad_pointers = (ctypes.c_void_p * len(targets))(
                    *[t.data_ptr() for t in targets])
                status = fn(pointers, tokens, output_grad.data_ptr(),
                            saved.data_ptr(), grad_pointers, 0,
                            stream.cuda_stream, workspace.data_ptr())
                if status != 0:
                    raise LayerError(f"{self.training['backward']} failed: "
                                     f"{self._last_error()}")
                for g, t in zip(grads, targets):
                    if g is None or g is t:
                        continue
                    if accumulate:
                        g.add_(t.to(g.dtype))
                    else:
                        g.copy_(t)

    @property
    def num_outputs(self):
        return sum(1 for a in self.args if a["output"])
