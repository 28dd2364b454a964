//===- MoeAttrs.td - layer configuration attributes --------*- tablegen -*-===//

#ifndef MOE_ATTRS_TD
#define MOE_ATTRS_TD

include "dialects/moe/MoeDialect.td"
include "mlir/IR/AttrTypeBase.td"
include "mlir/IR/EnumAttr.td"

//===----------------------------------------------------------------------===//
// Enums
//===----------------------------------------------------------------------===//

def Moe_RouterKind : I32EnumAttr<"RouterKind", "how tokens choose experts", [
  // softmax over all experts, then top-k (Mixtral, Qwen2/3-MoE).
  I32EnumAttrCase<"SoftmaxTopK", 0, "softmax_topk">,
  // top-k of the logits, then softmax over the k (GPT-OSS).
  I32EnumAttrCase<"TopKSoftmax", 1, "topk_softmax">,
  // sigmoid scores, bias for selection only, grouped top-k (DeepSeek-V3).
  I32EnumAttrCase<"SigmoidGroupedTopK", 2, "sigmoid_grouped_topk">,
  // top-k of the logits; sigmoid of the logit scales the expert input
  // (Llama-4).
  I32EnumAttrCase<"SigmoidScaleInput", 3, "sigmoid_scale_input">
]> {
  let cppNamespace = "::mlir::moe";
  let genSpecializedAttr = 0;
}

def Moe_ActivationKind : I32EnumAttr<"ActivationKind", "gated activation", [
  // silu(gate) * up.
  I32EnumAttrCase<"SwiGLU", 0, "swiglu">,
  // GPT-OSS: gate and up clamped to `limit`, gate * sigmoid(alpha * gate) *
  // (up + 1).
  I32EnumAttrCase<"ClampedSwiGLU", 1, "clamped_swiglu">
]> {
  let cppNamespace = "::mlir::moe";
  let genSpecializedAttr = 0;
}

def Moe_QuantKind : I32EnumAttr<"QuantKind", "quantization scheme", [
  // OCP MX v1.0: 32-element blocks along K, E4M3 data, E8M0 scales.
  I32EnumAttrCase<"MXFP8", 0, "mxfp8">,
  // DeepSeek-V3: E4M3 data, f32 scales per 1x128 (activations) or 128x128
  // (weights) block.
  I32EnumAttrCase<"FP8Block128", 1, "fp8_block128">
]> {
  let cppNamespace = "::mlir::moe";
  let genSpecializedAttr = 0;
}

def Moe_ScaleRounding : I32EnumAttr<"ScaleRounding",
    "how an MXFP8 block scale is rounded to a power of two", [
  // floor(log2(amax)) - 8, as OCP MX v1.0 specifies; the largest elements may
  // saturate to 448.
  I32EnumAttrCase<"Floor", 0, "floor">,
  // ceil(log2(amax / 448)): never saturates.
  I32EnumAttrCase<"Ceil", 1, "ceil">
]> {
  let cppNamespace = "::mlir::moe";
  let genSpecializedAttr = 0;
}

def Moe_KernelArgKind : I32EnumAttr<"KernelArgKind",
    "what a kernel parameter carries", [
  // The device address of a plan buffer.
  I32EnumAttrCase<"Buffer", 0, "buffer">,
  // A TMA descriptor of the plan, passed by value (__grid_constant__).
  I32EnumAttrCase<"TensorMap", 1, "tensor_map">,
  // The address of the call's token count (an i32 in device memory).
  I32EnumAttrCase<"Tokens", 2, "tokens">
]> {
  let cppNamespace = "::mlir::moe";
  let genSpecializedAttr = 0;
}

def Moe_AttentionStageKind : I32EnumAttr<"AttentionStageKind",
    "one stage of attention on a tile of keys", [
  // Matrix stages: S = Q K^T for the tile, O += P V.
  I32EnumAttrCase<"QK", 0, "qk">,
  I32EnumAttrCase<"PV", 1, "pv">,
  // Vector stages: keys a row may not see (causal, past the sequence) to
  // -inf; the running row max; P = exp2(S - max); the running output and
  // sum scaled by exp2(old max - new max); the row sums of P.
  I32EnumAttrCase<"Mask", 2, "mask">,
  I32EnumAttrCase<"Max", 3, "max">,
  I32EnumAttrCase<"Exp", 4, "exp">,
  I32EnumAttrCase<"Rescale", 5, "rescale">,
  I32EnumAttrCase<"Sum", 6, "sum">
]> {
  let cppNamespace = "::mlir::moe";
  let genSpecializedAttr = 0;
}

def Moe_BufferKind : I32EnumAttr<"BufferKind",
    "where a launch plan's device buffer lives", [
  // The caller's argument `index` (inputs, then outputs, in ABI order).
  I32EnumAttrCase<"Argument", 0, "argument">,
  // A slice of the workspace after its header, in plan order.
  I32EnumAttrCase<"Workspace", 1, "workspace">,
  // The expert-parallel state (device memory the library owns from its
  // init on), at offset `bytes`.
  I32EnumAttrCase<"EpState", 2, "ep_state">,
  // Counters in the workspace header, at offset `bytes`.
  I32EnumAttrCase<"Counters", 3, "counters">
]> {
  let cppNamespace = "::mlir::moe";
  let genSpecializedAttr = 0;
}

def Moe_MatmulRaster : I32EnumAttr<"MatmulRaster",
    "the order in which a matmul's blocks take their tiles", [
  // Within a group of `group` row tiles, down the rows first: the blocks
  // of a wave share the column tiles' weights.
  I32EnumAttrCase<"M", 0, "m">,
  // Within a group of `group` column tiles, across the columns first: the
  // blocks of a wave share the row tiles' activations.
  I32EnumAttrCase<"N", 1, "n">
]> {
  let cppNamespace = "::mlir::moe";
  let genSpecializedAttr = 0;
}

def Moe_MatmulEpilogue : I32EnumAttr<"MatmulEpilogue",
    "how a matmul's tile reaches its output", [
  // Each thread stores its accumulator's elements itself.
  I32EnumAttrCase<"Registers", 0, "registers">,
  // Through shared memory, so every store is 16 bytes of one row.
  I32EnumAttrCase<"Shared", 1, "shared">
]> {
  let cppNamespace = "::mlir::moe";
  let genSpecializedAttr = 0;
}

def Moe_MatmulMulticast : I32EnumAttr<"MatmulMulticast",
    "which operand a cluster's blocks load once for all", [
  I32EnumAttrCase<"None", 0, "none">,
  I32EnumAttrCase<"Lhs", 1, "lhs">,
  I32EnumAttrCase<"Rhs", 2, "rhs">
]> {
  let cppNamespace = "::mlir::moe";
  let genSpecializedAttr = 0;
}

def Moe_Target : I32EnumAttr<"Target", "what a compiled layer runs on", [
  // The host CPU, through the reference backend.
  I32EnumAttrCase<"CPU", 0, "cpu">,
  // NVIDIA Hopper: kernels in an embedded cubin, launched on a stream.
  I32EnumAttrCase<"SM90a", 1, "sm_90a">
]> {
  let cppNamespace = "::mlir::moe";
  let genSpecializedAttr = 0;
}

//===----------------------------------------------------------------------===//
// Parameters
//===----------------------------------------------------------------------===//

// A real number written as a decimal literal.
class Moe_RealParameter<string default>
    : APFloatParameter<"a real number"> {
  let defaultValue = "::llvm::APFloat(" # default # ")";
  let parser = "::mlir::moe::parseReal($_parser)";
  let printer = "::mlir::moe::printReal($_printer, $_self)";
}

// `true` or `false`.
def Moe_BoolParameter : AttrParameter<"bool", "true or false"> {
  let defaultValue = "false";
  let parser = "::mlir::moe::parseBool($_parser)";
  let printer = "$_printer << ($_self ? \"true\" : \"false\")";
}

class Moe_CountParameter<string desc, string default = "">
    : AttrParameter<"int64_t", desc> {
  let defaultValue = default;
}

// A size that grows with the call's token count T, written `fixed`,
// `per_token * T` or `fixed + per_token * T`.
def Moe_TokenLinearParameter
    : AttrParameter<"::mlir::moe::TokenLinear", "fixed + per_token * T"> {
  let defaultValue = "::mlir::moe::TokenLinear()";
  let parser = "::mlir::moe::parseTokenLinear($_parser)";
  let printer = "::mlir::moe::printTokenLinear($_printer, $_self)";
}

// Counts in brackets, `[1, 8, 64]`; absent when empty.
def Moe_CountListParameter : OptionalArrayRefParameter<"int64_t", "counts"> {
  let parser = "::mlir::moe::parseCountList($_parser)";
  let printer = "::mlir::moe::printCountList($_printer, $_self)";
}

// A kernel's parameters: `[buffer 0, tensor_map 1, tokens]`.
def Moe_KernelArgsParameter : ArrayRefParameter<"::mlir::moe::KernelArg",
                                                "kernel parameters"> {
  let parser = "::mlir::moe::parseKernelArgs($_parser)";
  let printer = "::mlir::moe::printKernelArgs($_printer, $_self)";
}

//===----------------------------------------------------------------------===//
// Attributes
//===----------------------------------------------------------------------===//

class Moe_Attr<string name, string attrMnemonic> : AttrDef<Moe_Dialect, name> {
  let mnemonic = attrMnemonic;
  let assemblyFormat = "`<` struct(params) `>`";
  let genVerifyDecl = 1;
}

def Moe_RouterAttr : Moe_Attr<"Router", "router"> {
  let summary = "how a token's experts and their weights are chosen";
  let description = [{
    `kind` selects the scoring and selection; `renormalize` divides the k
    weights by their sum (softmax_topk, sigmoid_grouped_topk); `n_group` and
    `topk_group` restrict selection to the best groups of experts
    (sigmoid_grouped_topk); every weight is multiplied by `scaling`.
  }];
  let parameters = (ins
    EnumParameter<Moe_RouterKind>:$kind,
    Moe_BoolParameter:$renormalize,
    Moe_CountParameter<"groups of experts", "1">:$n_group,
    Moe_CountParameter<"groups a token may use", "1">:$topk_group,
    Moe_RealParameter<"1.0">:$scaling
  );
  let extraClassDeclaration = [{
    /// Checks the router against a layer's expert count and top-k.
    ::llvm::LogicalResult
    verifyFor(::llvm::function_ref<::mlir::InFlightDiagnostic()> emitError,
              int64_t experts, int64_t topK) const;
  }];
}

def Moe_StageAttr : Moe_Attr<"Stage", "stage"> {
  let summary = "one stage of a split attention's schedule";
  let description = [{
    Stage `kind` of row group `group` on key tile j + `tile`, where j is the
    iteration of the schedule's loop over key tiles. qk and pv run on the
    matrix engine, the others on the vector engine.
  }];
  let parameters = (ins
    EnumParameter<Moe_AttentionStageKind>:$kind,
    Moe_CountParameter<"row group">:$group,
    Moe_CountParameter<"key tile offset", "0">:$tile
  );
  let extraClassDeclaration = [{
    bool isMatrix() const {
      return getKind() == AttentionStageKind::QK ||
             getKind() == AttentionStageKind::PV;
    }
  }];
}

def Moe_ActivationAttr : Moe_Attr<"Activation", "activation"> {
  let summary = "the gated activation between the two expert matmuls";
  let parameters = (ins
    EnumParameter<Moe_ActivationKind>:$kind,
    Moe_RealParameter<"1.702">:$alpha,
    Moe_RealParameter<"7.0">:$limit
  );
}

def Moe_QuantAttr : Moe_Attr<"Quant", "quant"> {
  let summary = "a block-scaled FP8 quantization scheme";
  let parameters = (ins
    EnumParameter<Moe_QuantKind>:$kind,
    DefaultValuedParameter<"::mlir::moe::ScaleRounding",
                           "::mlir::moe::ScaleRounding::Floor",
                           "MXFP8 scale rounding">:$rounding
  );
  let extraClassDeclaration = [{
    /// Elements along K that share one scale.
    int64_t getBlockSize() const;
    /// The element type of the scales.
    ::mlir::Type getScaleType() const;
  }];
}

def Moe_ConfigAttr : Moe_Attr<"Config", "config"> {
  let summary = "the configuration of one MoE layer";
  let description = [{
    `experts`, `top_k`, `hidden` and `intermediate` are the routed experts'
    sizes; `shared_intermediate` is the total width of the shared experts (0
    for none) and `shared_gate` whether a sigmoid gate scales their output
    (Qwen2-MoE). `quant`, when present, quantizes the expert matmuls. With
    `ep_size` > 1 each rank holds `experts / ep_size` experts.
  }];
  let parameters = (ins
    Moe_CountParameter<"routed experts">:$experts,
    Moe_CountParameter<"experts per token">:$top_k,
    Moe_CountParameter<"hidden size">:$hidden,
    Moe_CountParameter<"expert intermediate size">:$intermediate,
    AttrParameter<"::mlir::moe::RouterAttr", "router">:$router,
    AttrParameter<"::mlir::moe::ActivationAttr", "activation">:$activation,
    Moe_CountParameter<"shared experts' intermediate size", "0">:$shared_intermediate,
    Moe_BoolParameter:$shared_gate,
    OptionalParameter<"::mlir::moe::QuantAttr", "quantization">:$quant,
    Moe_CountParameter<"expert-parallel ranks", "1">:$ep_size
  );
  let extraClassDeclaration = [{
    /// Experts held by one rank.
    int64_t getLocalExperts() const { return getExperts() / getEpSize(); }
  }];
}

//===----------------------------------------------------------------------===//
// Launch plan: how a target's host code runs a layer's kernels
//===----------------------------------------------------------------------===//

def Moe_PlanBufferAttr : Moe_Attr<"PlanBuffer", "buffer"> {
  let summary = "a device buffer of a launch plan";
  let description = [{
    `kind` says where it lives: the caller's argument `index`, a workspace
    slice of `bytes` at `offset` after the header, the expert-parallel state
    at offset `bytes`, or counters in the workspace header at offset
    `bytes`. Slices whose launches do not overlap in stream order may share
    their bytes.
  }];
  let parameters = (ins
    DefaultValuedParameter<"::mlir::moe::BufferKind",
                           "::mlir::moe::BufferKind::Workspace",
                           "where the buffer lives">:$kind,
    Moe_CountParameter<"argument index", "0">:$index,
    Moe_TokenLinearParameter:$bytes,
    Moe_TokenLinearParameter:$offset
  );
  let extraClassDeclaration = [{
    /// The room a workspace slice takes: its bytes, each term rounded up to
    /// 256 so every slice starts 256-byte aligned.
    TokenLinear getSliceBytes() const;
  }];
}

def Moe_TensorMapAttr : Moe_Attr<"TensorMap", "tensor_map"> {
  let summary = "a TMA descriptor the host encodes for a kernel";
  let description = [{
    Buffer `buffer` read as a row-major [rows, cols] matrix of
    `element_bytes`-byte elements, in [box_rows, box_cols] tiles with
    128-byte swizzling; rows past the end read as zero. `row_stride`
    (elements; 0: `cols`) spaces the rows, and `outer` adds dimensions
    beyond the rows, innermost first, as (size, stride in elements, box)
    triples: an attention kernel reads one head of a [B, S, H, D] tensor.
  }];
  let parameters = (ins
    Moe_CountParameter<"plan buffer">:$buffer,
    Moe_CountParameter<"bytes per element">:$element_bytes,
    Moe_TokenLinearParameter:$rows,
    Moe_CountParameter<"columns">:$cols,
    Moe_CountParameter<"tile rows">:$box_rows,
    Moe_CountParameter<"tile columns">:$box_cols,
    Moe_CountParameter<"elements between rows, 0 for cols", "0">:$row_stride,
    OptionalArrayRefParameter<"int64_t">:$outer
  );
}

def Moe_KernelLaunchAttr : Moe_Attr<"KernelLaunch", "launch"> {
  let summary = "one kernel launch of a launch plan";
  let description = [{
    Launches `kernel` of the layer's kernel module with
    ceil(`work` / `per_block`) + `extra_blocks` blocks along x (`work` may
    grow with the token count), `grid_y` along y, `block` threads and
    `shared_bytes` of dynamic shared memory. `args` lists its parameters.
    A `persistent` kernel loops over its blocks' work itself: it launches
    at most one block per multiprocessor of the device it runs on. A kernel
    of `cluster` blocks a cluster launches that many blocks for each block
    the count above gives (fewer clusters than multiprocessors / `cluster`
    when persistent). A `cooperative` kernel's blocks wait for each other
    (grid barriers): it is launched whole or not at all.
  }];
  let parameters = (ins
    "::mlir::FlatSymbolRefAttr":$kernel,
    Moe_TokenLinearParameter:$work,
    Moe_CountParameter<"work items per block", "1">:$per_block,
    Moe_CountParameter<"blocks added along x", "0">:$extra_blocks,
    Moe_CountParameter<"blocks along y", "1">:$grid_y,
    Moe_CountParameter<"threads per block">:$block,
    Moe_CountParameter<"dynamic shared memory", "0">:$shared_bytes,
    Moe_KernelArgsParameter:$args,
    Moe_BoolParameter:$persistent,
    Moe_CountParameter<"blocks of a cluster along x", "1">:$cluster,
    Moe_BoolParameter:$cooperative
  );
}

def Moe_LaunchPlanAttr : Moe_Attr<"LaunchPlan", "launch_plan"> {
  let summary = "the buffers, TMA descriptors and launches of a layer";
  let description = [{
    What a GPU target's kernel builder hands to the host code: every device
    buffer (the caller's arguments, then workspace slices, each 256-byte
    aligned at its offset after the workspace's header: the call's token count
    and `counters` more i32 words, which the host sets to the token count
    before each call and split-K matmuls count their blocks in), the TMA
    descriptors to encode per call, and the kernel launches in stream order.
    A plan with `max_tokens` serves calls of at most that many tokens (a
    token bucket, moe-bucketize); without, any count.
  }];
  let parameters = (ins
    "::mlir::ArrayAttr":$buffers,
    "::mlir::ArrayAttr":$tensor_maps,
    "::mlir::ArrayAttr":$launches,
    Moe_CountParameter<"the most tokens it serves, 0 for any", "0">:$max_tokens,
    Moe_CountParameter<"i32 words after the token count", "0">:$counters
  );
  let extraClassDeclaration = [{
    ::llvm::SmallVector<PlanBufferAttr> getBufferList() const;
    ::llvm::SmallVector<TensorMapAttr> getTensorMapList() const;
    ::llvm::SmallVector<KernelLaunchAttr> getLaunchList() const;
    /// The workspace: its header and the end of its furthest slice (each
    /// term the largest over the slices, so it bounds every slice's end at
    /// any token count).
    TokenLinear getWorkspaceBytes() const;
    /// The header's bytes (the token count and the counters), a multiple
    /// of 256: where the first slice starts.
    int64_t getHeaderBytes() const {
      return (4 * (1 + getCounters()) + 255) / 256 * 256;
    }
    /// The name a function's launch plan is attached under.
    static ::llvm::StringRef getAttrName() { return "moe.launch_plan"; }
  }];
}

//===----------------------------------------------------------------------===//
// Interface: what a compiled layer exports
//===----------------------------------------------------------------------===//

def Moe_MatmulConfigAttr : Moe_Attr<"MatmulConfig", "matmul_config"> {
  let summary = "how a grouped matmul's kernel is cut and scheduled";
  let description = [{
    The kernel of a `moe.grouped_matmul` for calls of at most `tokens`
    tokens (a token bucket; 0 for any count). A block computes `tile_m`
    rows x `tile_n` weight rows, `tile_k` elements of K a stage, over a
    ring of `stages` stages, with `warpgroups` consumer warpgroups beside
    a producer; `cluster_m` x `cluster_n` blocks form a cluster, loading
    the `multicast` operand once for all. Blocks take tiles in `raster`
    order, `group` tiles at a time along it; K is cut into `split_k`
    ranges; `swap_ab` puts the weights on the wide side of the MMA (few
    rows). A `persistent` kernel runs one block per multiprocessor, each
    walking the tiles, so the next tile's loads overlap the last's
    epilogue. `epilogue` says how results reach memory.
    `moe-configure-matmuls` chooses it; a target's kernel builder refuses
    what it cannot honour, naming the field.
  }];
  let parameters = (ins
    Moe_CountParameter<"the bucket's tokens, 0 for any", "0">:$tokens,
    Moe_CountParameter<"rows of a tile">:$tile_m,
    Moe_CountParameter<"weight rows of a tile">:$tile_n,
    Moe_CountParameter<"K elements of a stage">:$tile_k,
    Moe_CountParameter<"ring stages">:$stages,
    Moe_CountParameter<"consumer warpgroups", "2">:$warpgroups,
    Moe_CountParameter<"cluster blocks along M", "1">:$cluster_m,
    Moe_CountParameter<"cluster blocks along N", "1">:$cluster_n,
    DefaultValuedParameter<"::mlir::moe::MatmulMulticast",
                           "::mlir::moe::MatmulMulticast::None",
                           "multicast operand">:$multicast,
    DefaultValuedParameter<"::mlir::moe::MatmulRaster",
                           "::mlir::moe::MatmulRaster::M",
                           "tile order">:$raster,
    Moe_CountParameter<"tiles a raster group spans", "8">:$group,
    Moe_CountParameter<"K ranges", "1">:$split_k,
    Moe_BoolParameter:$swap_ab,
    Moe_BoolParameter:$persistent,
    DefaultValuedParameter<"::mlir::moe::MatmulEpilogue",
                           "::mlir::moe::MatmulEpilogue::Registers",
                           "epilogue">:$epilogue
  );
}

def Moe_ArgumentAttr : Moe_Attr<"Argument", "argument"> {
  let summary = "one argument of a compiled layer's C entry point";
  let description = [{
    A row-major buffer named `name` (the layer operand it feeds, or `out`)
    of `type`, whose only dynamic size is the leading token dimension;
    `output` marks what the layer writes.
  }];
  let parameters = (ins
    StringRefParameter<"the operand it feeds">:$name,
    "::mlir::RankedTensorType":$type,
    Moe_BoolParameter:$output
  );
}

def Moe_ExpertParallelAttr : Moe_Attr<"ExpertParallel", "expert_parallel"> {
  let summary = "what an expert-parallel layer's ranks agree on";
  let description = [{
    `ranks` ranks of `local_experts` experts each; `experts`, `top_k` and
    `hidden` are the layer's, handed to the runtime's init. A GPU layer is
    compiled for at most `max_tokens` tokens a rank and owns `state_bytes`
    of device memory a rank; a CPU layer takes its capacity at init and
    allocates `send_bytes` and `recv_bytes`, written `base + per * T` with T
    that capacity.
  }];
  let parameters = (ins
    Moe_CountParameter<"ranks">:$ranks,
    Moe_CountParameter<"experts a rank holds">:$local_experts,
    Moe_CountParameter<"routed experts">:$experts,
    Moe_CountParameter<"experts per token">:$top_k,
    Moe_CountParameter<"hidden size">:$hidden,
    Moe_CountParameter<"the most tokens a rank passes, 0: set at init", "0">:$max_tokens,
    Moe_CountParameter<"device state bytes a rank", "0">:$state_bytes,
    Moe_TokenLinearParameter:$send_bytes,
    Moe_TokenLinearParameter:$recv_bytes
  );
  let extraClassDeclaration = [{
    /// The ranks and shapes of `config`, or null for a layer on one rank.
    static ExpertParallelAttr forLayer(ConfigAttr config);
  }];
}

def Moe_SavedAttr : Moe_Attr<"Saved", "saved"> {
  let summary = "one tensor a training forward saves for the backward";
  let description = [{
    The value of the training forward's step `name` (the name its
    `moe.saved` gives), of `type`, whose leading dimension holds `rows`
    rows for a call of T tokens (the token count, a dispatched layout's
    rows, or a fixed count). It lives in the caller's saved buffer in a
    16-byte aligned slice of its own.
  }];
  let parameters = (ins
    StringRefParameter<"the step that computed it">:$name,
    "::mlir::RankedTensorType":$type,
    Moe_TokenLinearParameter:$rows
  );
  let extraClassDeclaration = [{
    /// Its bytes for T tokens, the fixed term rounded up to 256 and the
    /// per-token one to 16 (the slice it takes in the saved buffer, which
    /// starts 16-byte aligned at any token count).
    TokenLinear getSliceBytes() const;
  }];
  let genVerifyDecl = 1;
}

def Moe_TrainingAttr : Moe_Attr<"Training", "training"> {
  let summary = "what a layer library built for training also exports";
  let description = [{
    moe-differentiate's training forward (`@<layer>_train`) and backward
    (`@<layer>_backward`) as the library offers them: the tensors the
    forward saves, in the order the backward reads them, and the gradient
    of each argument that has one (an `#moe.argument` named after it, of
    the type the backward computes it in), in the backward's order.
  }];
  let parameters = (ins
    "::mlir::ArrayAttr":$saved,
    "::mlir::ArrayAttr":$gradients
  );
  let extraClassDeclaration = [{
    ::llvm::SmallVector<SavedAttr> getSavedList() const;
    ::llvm::SmallVector<ArgumentAttr> getGradientList() const;
    /// The saved buffer's header (the token count and the layer it came
    /// from), before the first tensor.
    static constexpr int64_t kHeaderBytes = 256;
    /// Where saved tensor `i` starts, and the whole buffer, for T tokens.
    TokenLinear getSavedOffset(unsigned i) const;
    TokenLinear getSavedBytes() const;
  }];
  let genVerifyDecl = 1;
}

def Moe_InterfaceAttr : Moe_Attr<"Interface", "interface"> {
  let summary = "what a compiled layer exports";
  let description = [{
    Everything a library built from the layer function `name` offers its
    caller, for `target`: the entry point's arguments in call order
    (outputs last), the layer's configuration where it is a layer, the
    workspace a GPU forward needs (`fixed + per_token * T` bytes for T
    tokens), the token buckets whose graphs it replays, what its
    expert-parallel ranks agree on, the training forward and backward of a
    library built for training, and every exported symbol by role.
    moe-export-interface attaches it as `moe.interface` to the layer
    function; moe-differentiate adds the training part and the target's
    kernel builder what its launch plan decides. The host code, the header and the description JSON are
    rendered from it alone.
  }];
  let parameters = (ins
    StringRefParameter<"the layer function">:$name,
    EnumParameter<Moe_Target>:$target,
    "::mlir::ArrayAttr":$args,
    OptionalParameter<"::mlir::moe::ConfigAttr", "the layer's config">:$config,
    Moe_TokenLinearParameter:$workspace,
    Moe_CountListParameter:$token_buckets,
    OptionalParameter<"::mlir::moe::ExpertParallelAttr",
                      "expert-parallel ranks">:$expert_parallel,
    OptionalParameter<"::mlir::moe::TrainingAttr",
                      "the training forward and backward">:$training,
    "::mlir::DictionaryAttr":$symbols
  );
  let builders = [
    // The symbols follow from the rest (exportedSymbols).
    AttrBuilder<(ins "::llvm::StringRef":$name, "Target":$target,
                     "::mlir::ArrayAttr":$args, "ConfigAttr":$config,
                     "TokenLinear":$workspace,
                     "::llvm::ArrayRef<int64_t>":$tokenBuckets,
                     "ExpertParallelAttr":$expertParallel,
                     CArg<"TrainingAttr", "{}">:$training), [{
      return $_get($_ctxt, name, target, args, config, workspace,
                   tokenBuckets, expertParallel, training,
                   exportedSymbols($_ctxt, name, target, tokenBuckets,
                                   expertParallel, bool(training)));
    }]>
  ];
  let extraClassDeclaration = [{
    ::llvm::SmallVector<ArgumentAttr> getArgList() const;
    /// The exported symbol of `role` (forward, layer_info, last_error,
    /// workspace_size, set_graphs, warmup, ep_init, ep_finalize, ep_leave,
    /// ep_status, forward_train, saved_size, backward), or empty if the
    /// library has none.
    ::llvm::StringRef getSymbol(::llvm::StringRef role) const;
    /// This interface with what a GPU launch plan decided.
    InterfaceAttr withLaunch(TokenLinear workspace,
                             ::llvm::ArrayRef<int64_t> tokenBuckets,
                             ExpertParallelAttr expertParallel) const;
    /// This interface with the training forward and backward.
    InterfaceAttr withTraining(TrainingAttr training) const;
    /// Every symbol a library of this shape exports, by role.
    static ::mlir::DictionaryAttr
    exportedSymbols(::mlir::MLIRContext *context, ::llvm::StringRef name,
                    Target target, ::llvm::ArrayRef<int64_t> tokenBuckets,
                    ExpertParallelAttr expertParallel, bool training);
    /// The name a layer function's interface is attached under.
    static ::llvm::StringRef getAttrName() { return "moe.interface"; }
  }];
}

#endif // MOE_ATTRS_TD
