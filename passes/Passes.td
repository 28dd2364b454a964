//===- Passes.td - moe-compiler passes ---------------------*- tablegen -*-===//

#ifndef MOE_PASSES_TD
#define MOE_PASSES_TD

include "mlir/Pass/PassBase.td"

def ExportInterface : Pass<"moe-export-interface", "::mlir::ModuleOp"> {
  let summary = "Describe what a layer function's library exports";
  let description = [{
    Runs first, on the layer as written: attaches `moe.interface`
    (`#moe.interface`) to the function `layer`, or, without it, to every
    function of moe ops that the C entry point can call. Its arguments are
    named after the layer operands they feed (`query`, `key`, `value` for
    attention; `moe.name` argument attributes or `argN` for a function of
    L1 ops) and its result is `out`; it records the layer's config, the
    ranks of an expert-parallel layer (with the buffer sizes of a CPU
    rank) and the symbols the library exports. A GPU target's kernel
    builder adds its workspace, buckets and capacity. A function that
    cannot be called through the C entry point (a dynamic size other than
    the token count, an operand that is not its own argument) is an error
    naming the argument when it is `layer`.
  }];
  let options = [
    Option<"layer", "layer", "std::string", "",
           "The function a library is built of (default: every function "
           "that can be one)">,
    Option<"target", "target", "::mlir::moe::Target",
           "::mlir::moe::Target::CPU", "What the library runs on",
           [{::llvm::cl::values(
               clEnumValN(::mlir::moe::Target::CPU, "cpu", "the host CPU"),
               clEnumValN(::mlir::moe::Target::SM90a, "sm_90a",
                          "NVIDIA Hopper"))}]>
  ];
  let dependentDialects = ["::mlir::moe::MoeDialect"];
}

def Decompose : Pass<"moe-decompose"> {
  let summary = "Rewrite whole MoE layers (L0) into their steps (L1)";
  let description = [{
    Each `moe.layer` becomes `moe.route`, `moe.dispatch`, two
    `moe.grouped_matmul`s (gate/up with the activation, then down) and
    `moe.combine`, plus dense matmuls for the shared experts and their gate.
    With a `quant` config, activations and bf16 weights are quantized right
    before the matmuls that read them (moe-fuse-quantization moves that work
    into the producing kernels). A Llama-4 router scales the dispatched
    tokens instead of the combined outputs.
  }];
  let dependentDialects = ["::mlir::moe::MoeDialect"];
}

def Differentiate : Pass<"moe-differentiate", "::mlir::ModuleOp"> {
  let summary = "Build a layer's backward from its L1 forward";
  let description = [{
    For each function of L1 ops that ends in a moe.combine, @f, adds
    @f_train, the forward that also returns what the backward reads (named
    in its `moe.saved`), and @f_backward, which takes @f's arguments, the
    output's gradient and those saved values and returns the gradient of
    each argument that has one (`moe.gradients` lists their argument
    numbers): reverse mode over the L1 ops, one adjoint rule an op. The
    forward saves the dispatched rows and each gate/up matmul's output, not
    the activation (recomputed) nor any per-choice copy of the output; a
    routing weight's gradient comes from the down matmul's dgrad and the
    recomputed activation. Gradients of weights are f32 (bf16 with
    `bf16-grads`, the weights' own type). A selection-only
    router bias (sigmoid_grouped_topk) takes none. A `moe.quantize` is
    straight-through: the gradient of its codes is its bf16 input's, and
    the backward multiplies by the values the forward multiplied (the codes
    dequantized); the forward saves quantized rows as codes and scales and
    the backward quantizes weights and the layer's input again. Weights
    must reach the layer in bf16 (or f32): quantized weights given to it
    have no gradient to take. Expert-parallel layers are refused with a
    diagnostic. With `recompute`, the backward computes each gate/up output
    again from the dispatched rows instead: less memory, one more matmul.
  }];
  let options = [
    Option<"recompute", "recompute", "bool", "false",
           "Recompute each gate/up matmul's output in the backward rather "
           "than save it">,
    Option<"bf16Grads", "bf16-grads", "bool", "false",
           "Weights' and biases' gradients in bf16 (as the weights are) "
           "rather than f32: half their memory, rounded once">
  ];
  let dependentDialects = ["::mlir::moe::MoeDialect",
                           "::mlir::func::FuncDialect"];
}

def FuseQuantization : Pass<"moe-fuse-quantization"> {
  let summary = "Quantize activations in the kernels that produce them";
  let description = [{
    After it, a quantized layer has no standalone activation quantize or
    dequantize step:
    - a `moe.quantize` of `moe.dispatch`'s rows becomes the dispatch's
      `quant`: the rows are quantized as they are scattered;
    - a `moe.quantize` of a `moe.grouped_matmul`'s result becomes the
      matmul's `out_quant`: its epilogue (after the activation) quantizes;
    - a `moe.grouped_matmul` of two `moe.dequantize`d operands takes the
      codes and their scales instead.
    Each fused op computes the bf16 values the unfused steps stored and
    quantizes those, so results are bit for bit the same. A quantize whose
    input has other users stays as it is.
  }];
  let dependentDialects = ["::mlir::moe::MoeDialect"];
}

def ExpertParallel : Pass<"moe-expert-parallel"> {
  let summary = "Split an expert-parallel layer's token exchanges into send "
                "and receive halves";
  let description = [{
    Each `moe.dispatch` with `ep_size` > 1 becomes `moe.ep_dispatch_send`
    (counts, then each token once per rank that holds one of its experts,
    quantized when the dispatch quantizes) and `moe.ep_dispatch_recv` (the
    arrivals fanned out into this rank's experts' rows). Its `moe.combine`
    then sums rows that `moe.ep_combine_send` (placed right after the expert
    outputs are computed) returned to each token's rank and
    `moe.ep_combine_recv` (placed right before the combine) gathered, so
    the shared experts run while the outputs travel. Each token's choices
    are summed in the same order as on one rank: the results are bit for
    bit those of the layer with ep_size = 1.
  }];
  let dependentDialects = ["::mlir::moe::MoeDialect"];
}

def LegalizeScaledMatmul : Pass<"moe-legalize-scaled-matmul"> {
  let summary = "Run FP8 matmuls as a dequantize and a bf16 matmul";
  let description = [{
    For a target without an FP8 matmul kernel: each `moe.grouped_matmul`
    with `scales(...)` becomes `moe.dequantize` of both operands to bf16 and
    the same matmul on them. E4M3 codes times an E8M0 scale are exact in
    bf16; with FP8 block-128's f32 scales each product is rounded once to
    bf16 (a relative error of at most 2^-9) before the f32 accumulation.
  }];
  let dependentDialects = ["::mlir::moe::MoeDialect"];
}

def Legalize : Pass<"moe-legalize"> {
  let summary = "Rewrite what sm_90a's kernels do not take into what they do";
  let description = [{
    sm_90a's matmul reads both operands with TMA, whose rows must be a
    whole number of 16 bytes: K a multiple of 8 in bf16, of 16 in FP8. A
    `moe.grouped_matmul` whose K is not gets both operands padded with zeros
    to the next such K (`moe.pad`; the zeros add nothing, so the result is
    the same), and a remark naming the rule and what the padding copies on
    each call. Scales need nothing: a padded K has as many scale blocks.
  }];
  let dependentDialects = ["::mlir::moe::MoeDialect"];
}

def Bucketize : Pass<"moe-bucketize"> {
  let summary = "Cut a layer's dynamic token count into buckets";
  let description = [{
    Marks each function of moe ops whose token dimension is dynamic with
    `moe.token_buckets`: ascending token counts, each of which gets a plan
    of its own when the kernels are built. A bucket's kernels and grids are
    specialized to its size; the token count stays in device memory, so one
    CUDA graph per bucket, captured once and replayed, serves every count
    up to the bucket's (the host code picks the smallest bucket that holds a
    call). Calls above the largest bucket run the plan for any count.
    An expert-parallel layer's bucket is picked by the rank's own tokens;
    the kernels after its exchange, whose rows come from every rank, keep
    grids for the layer's capacity. Functions with a fixed token count are
    left as they are, with a remark.
  }];
  let options = [
    ListOption<"buckets", "buckets", "int64_t",
               "Ascending token counts, each at least 1 (default: 1, 2, 4, "
               "..., 4096)">
  ];
  let dependentDialects = ["::mlir::moe::MoeDialect"];
}

def FuseLayer : Pass<"moe-fuse-layer"> {
  let summary = "Run a small bucket's layer as one persistent kernel";
  let description = [{
    Marks the token buckets of at most `max-tokens` tokens with
    `moe.fused_buckets`: moe-build-kernels then stitches such a bucket's
    kernels into one kernel of a block per multiprocessor (a cooperative
    launch, so every block is resident), which runs each step over that
    step's own grid and waits at a grid barrier (a counter in the workspace
    header) before the next. The steps' numerics do not change. A bucket
    keeps its chain of kernels, with a remark saying why, where a grouped
    matmul's tiles form clusters or walk a persistent schedule, and where
    the layer holds attention. Run after moe-configure-matmuls.
  }];
  let options = [
    Option<"maxTokens", "max-tokens", "int64_t", /*default=*/"64",
           "The largest bucket run as one kernel (0: none)">
  ];
  let dependentDialects = ["::mlir::moe::MoeDialect"];
}

def ConfigureMatmuls : Pass<"moe-configure-matmuls"> {
  let summary = "Choose each grouped matmul's kernel configuration";
  let description = [{
    Puts `configs` on every `moe.grouped_matmul`: one `#moe.matmul_config`
    for calls of any token count, then one for each token bucket
    (`moe.token_buckets`). A cost model chooses it from the shapes, the
    scheme, the rows a call brings (the dispatch's top-k times the bucket's
    tokens) and the GPU's multiprocessors and shared memory for a block:
    the ring takes the stages that fit beside the epilogue's buffer; a
    bucket whose tiles would leave most multiprocessors idle splits K; the
    rest run persistent, one block per multiprocessor walking the tiles.
    A bucket of at most 64 tokens (up to 512 while an expert has few rows)
    takes the decode tile (`swap_ab`): the
    weights are the MMA's wide side in 64-row fragments and an expert's
    rows (8 to 64, at most a token each) its narrow side, stages small
    enough for two blocks a multiprocessor, K split until the busy tiles
    fill the GPU; pinning a field of the wide tile keeps the wide tile.
    `matmul-config` pins fields for every matmul, as comma-separated
    `key=value` pairs: `tile=MxNxK`, `stages`, `warpgroups`, `cluster=MxN`,
    `multicast` (none, lhs, rhs), `raster` (m, n), `group`, `split-k`,
    `swap-ab`, `persistent` (true, false), `epilogue` (registers, shared).
    The kernel builder refuses a field it cannot honour, naming it.
  }];
  let options = [
    Option<"matmulConfig", "matmul-config", "std::string", "",
           "Fields to pin on every matmul's configuration, as key=value "
           "pairs separated by commas">,
    Option<"multiprocessors", "multiprocessors", "int64_t",
           "::sm90a::kMultiprocessors",
           "Multiprocessors of the GPU the cost model plans for">,
    Option<"sharedBytes", "shared-bytes", "int64_t",
           "::sm90a::kSharedPerBlock",
           "Shared memory a block may have, in bytes">
  ];
  let dependentDialects = ["::mlir::moe::MoeDialect"];
}

def SplitAttention : Pass<"moe-split-attention"> {
  let summary = "Split attention into matrix and vector stages on tiles";
  let description = [{
    Each `moe.attention` becomes `moe.tiled_attention`: row groups of 64
    query rows walk the keys a tile at a time (128 keys, 64 for head sizes
    above 128) with an online softmax, and the loop body is an explicit
    schedule of matrix stages (qk, pv) and vector stages (mask, max, exp,
    rescale, sum). With `ping-pong` and two or more groups, each slot runs
    one group's matrix stages beside another group's vector stages, and a
    group issues pv of the previous tile with qk of the next, so its own
    softmax overlaps that pv too; without, all groups run the same kind of
    stage at once. When the row groups of a static shape would fill fewer
    than `target-blocks` blocks of two groups, the keys are split into
    ranges walked in parallel and merged (`kv-splits`; 0 chooses), as a
    decode step needs.
  }];
  let options = [
    Option<"tileN", "tile-n", "int64_t", "0",
           "Keys per tile (0: 128, or 64 for head sizes above 128)">,
    Option<"groups", "groups", "int64_t", "2",
           "Row groups of 64 query rows that take turns">,
    Option<"pingPong", "ping-pong", "bool", "true",
           "One group's matrix stages beside another's vector stages">,
    Option<"kvSplits", "kv-splits", "int64_t", "0",
           "Key ranges walked in parallel (0: as the shape needs)">,
    Option<"targetBlocks", "target-blocks", "int64_t",
           "::sm90a::kMultiprocessors",
           "Blocks that fill the target (its multiprocessors)">
  ];
  let dependentDialects = ["::mlir::moe::MoeDialect"];
}

#endif // MOE_PASSES_TD
