//===- MoeOps.td - moe dialect operations ------------------*- tablegen -*-===//

#ifndef MOE_OPS_TD
#define MOE_OPS_TD

include "dialects/moe/MoeAttrs.td"
include "mlir/IR/OpBase.td"
include "mlir/IR/CommonTypeConstraints.td"
include "mlir/Interfaces/SideEffectInterfaces.td"

// Element types. Ranks and sizes are checked by the verifiers, which say which
// dimension is wrong and what it means.
def Moe_Activations : RankedTensorOf<[BF16]>;
def Moe_Weights : RankedTensorOf<[BF16, F8E4M3FN]>;
def Moe_RealTensor : RankedTensorOf<[BF16, F32]>;
def Moe_F32Tensor : RankedTensorOf<[F32]>;
def Moe_IndexTensor : RankedTensorOf<[I32]>;
def Moe_QuantData : RankedTensorOf<[F8E4M3FN]>;
def Moe_Scales : RankedTensorOf<[F8E8M0FNU, F32]>;
def Moe_MatmulInput : RankedTensorOf<[BF16, F8E4M3FN]>;
def Moe_WgradInput : RankedTensorOf<[BF16, F32, F8E4M3FN]>;
def Moe_MatmulOutput : RankedTensorOf<[BF16, F32, F8E4M3FN]>;

//===----------------------------------------------------------------------===//
// L0: whole layers
//===----------------------------------------------------------------------===//

def Moe_LayerOp : Moe_Op<"layer", [Pure, AttrSizedOperandSegments]> {
  let summary = "one whole MoE layer";
  let description = [{
    Routes each token of `hidden_states` [T, H] to `top_k` of the config's
    experts, runs them and sums their outputs, weighted by the router, with
    the shared experts' output.

    Weights: `router_weight` [E, H], `router_bias` [E] (DeepSeek's score
    correction bias, GPT-OSS's router bias), `w13` [El, 2I, H] (gate rows, then
    up rows) and `w2` [El, H, I], where El = E / ep_size. With a `quant`
    config the expert weights may be given already quantized (`f8E4M3FN`)
    with `scales(w13_scale, w2_scale)`, and the shared experts' with
    `shared_scales(shared_w13_scale, shared_w2_scale)`; bf16 weights are
    then quantized by the layer on every call. `biases` are GPT-OSS's
    [El, 2I] and [El, H]; `shared` holds [2Is, H], [H, Is] and, with
    `shared_gate`, the gate [1, H].

    With a second result, the layer also gives its router logits [T, E] in
    f32, as `moe.route` computes them (for a model that returns them).

    ```mlir
    %out = moe.layer %x router(%rw) experts(%w13, %w2)
             {config = #moe.config<experts = 8, top_k = 2, hidden = 4096,
                intermediate = 14336,
                router = #moe.router<kind = softmax_topk, renormalize = true>,
                activation = #moe.activation<kind = swiglu>>}
             : (...) -> tensor<?x4096xbf16>
    ```
  }];
  let arguments = (ins
    Moe_Activations:$hidden_states,
    Moe_RealTensor:$router_weight,
    Optional<Moe_F32Tensor>:$router_bias,
    Moe_Weights:$w13,
    Moe_Weights:$w2,
    Optional<Moe_Scales>:$w13_scale,
    Optional<Moe_Scales>:$w2_scale,
    Optional<Moe_RealTensor>:$w13_bias,
    Optional<Moe_RealTensor>:$w2_bias,
    Optional<Moe_Weights>:$shared_w13,
    Optional<Moe_Weights>:$shared_w2,
    Optional<Moe_Activations>:$shared_gate,
    Optional<Moe_Scales>:$shared_w13_scale,
    Optional<Moe_Scales>:$shared_w2_scale,
    Moe_ConfigAttr:$config
  );
  let results = (outs Moe_Activations:$out,
                     Optional<Moe_F32Tensor>:$router_logits);
  let assemblyFormat = [{
    $hidden_states `router` `(` $router_weight (`,` $router_bias^)? `)`
    `experts` `(` $w13 `,` $w2 `)`
    (`scales` `(` $w13_scale^ `,` $w2_scale `)`)?
    (`biases` `(` $w13_bias^ `,` $w2_bias `)`)?
    (`shared` `(` $shared_w13^ `,` $shared_w2 (`,` $shared_gate^)? `)`)?
    (`shared_scales` `(` $shared_w13_scale^ `,` $shared_w2_scale `)`)?
    attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Moe_AttentionOp : Moe_Op<"attention", [Pure]> {
  let summary = "scaled dot-product attention with grouped query heads";
  let description = [{
    `query` [B, Sq, Hq, D], `key` [B, Skv, Hkv, D], `value` [B, Skv, Hkv, Dv]
    give [B, Sq, Hq, Dv]; query head h reads key/value head h / (Hq / Hkv).
    `scale` defaults to 1/sqrt(D). With `causal`, query i sees keys up to
    i + Skv - Sq (the mask is aligned to the end of the keys).
  }];
  let arguments = (ins
    Moe_Activations:$query,
    Moe_Activations:$key,
    Moe_Activations:$value,
    UnitAttr:$causal,
    OptionalAttr<F32Attr>:$scale
  );
  let results = (outs Moe_Activations:$out);
  let assemblyFormat = [{
    $query `,` $key `,` $value attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// L1: the steps of a layer
//===----------------------------------------------------------------------===//

def Moe_RouteOp : Moe_Op<"route", [Pure]> {
  let summary = "router logits, scores and each token's top-k experts";
  let description = [{
    Computes the logits `hidden_states` [T, H] x `router_weight`^T [E, H] in
    f32 and from them, as `router` says, each token's `top_k` expert ids and
    weights; k is the second dimension of the results. `bias` [E] is added to
    the logits, except for sigmoid_grouped_topk, where it is added to the
    scores for selection only. The optional `logits` result [T, E] holds
    the logits so (bias included where it is added to them).
  }];
  let arguments = (ins
    Moe_Activations:$hidden_states,
    Moe_RealTensor:$router_weight,
    Optional<Moe_F32Tensor>:$bias,
    Moe_RouterAttr:$router
  );
  let results = (outs Moe_IndexTensor:$expert_ids, Moe_F32Tensor:$weights,
                     Optional<Moe_F32Tensor>:$logits);
  let assemblyFormat = [{
    $hidden_states `,` $router_weight (`bias` $bias^)? attr-dict `:`
    functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Moe_DispatchOp : Moe_Op<"dispatch", [Pure]> {
  let summary = "scatter tokens into an expert-major buffer";
  let description = [{
    Copies each token of `hidden_states` [T, H] once for each of its
    `expert_ids` [T, k] into `dispatched` [R, H], expert by expert; within
    an expert in token order on the CPU backend, in any order on sm_90a
    (no result of the layer depends on it; `rows` says where each choice
    went, which moe.scatter follows) unless `ordered`: then in token order
    there too, so the sums a backward takes over an expert's rows are the
    same on every call (moe-differentiate sets it on a training forward's
    dispatch). Each expert's rows start at a multiple of `align`; rows between experts are zero. `tokens_per_expert` [E] counts the
    rows of each expert, `expert_offsets` [E + 1] gives where each starts
    (the last entry is R) and `rows` [T, k] where each (token, choice) went,
    or -1 for ids outside [0, E). With `scale`, a row is the token times its
    weight, rounded to bf16 (Llama-4). With `quant`, each row (as bf16) is
    quantized on the way, as `moe.quantize` would quantize `dispatched`:
    `dispatched` holds its E4M3 codes and the first of the `quantized`
    results its scales; two more, when present, are the tokens themselves
    quantized the same way ([T, H] codes and their scales; not with
    `scale`), for the shared experts.

    With `ep_size` > 1 the experts live on `ep_size` ranks: `expert_ids`
    range over all of them and this rank holds `tokens_per_expert`'s E
    experts, [rank * E, (rank + 1) * E). No backend moves tokens between
    ranks from this op: moe-expert-parallel rewrites it into
    moe.ep_dispatch_send and moe.ep_dispatch_recv.
  }];
  let arguments = (ins
    Moe_Activations:$hidden_states,
    Moe_IndexTensor:$expert_ids,
    Optional<Moe_F32Tensor>:$scale,
    DefaultValuedAttr<I64Attr, "1">:$align,
    OptionalAttr<Moe_QuantAttr>:$quant,
    DefaultValuedAttr<I64Attr, "1">:$ep_size,
    UnitAttr:$ordered
  );
  let results = (outs
    Moe_MatmulInput:$dispatched,
    Moe_IndexTensor:$tokens_per_expert,
    Moe_IndexTensor:$expert_offsets,
    Moe_IndexTensor:$rows,
    Variadic<AnyRankedTensor>:$quantized
  );
  let extraClassDeclaration = [{
    /// With `quant`: the scales of `dispatched`.
    ::mlir::Value getDispatchedScales() {
      return getQuantized().empty() ? ::mlir::Value() : getQuantized()[0];
    }
    /// With `quant` and asked for: the tokens quantized, and their scales.
    ::mlir::Value getTokens() {
      return getQuantized().size() == 3 ? getQuantized()[1] : ::mlir::Value();
    }
    ::mlir::Value getTokenScales() {
      return getQuantized().size() == 3 ? getQuantized()[2] : ::mlir::Value();
    }
    /// What a backend checks before it lowers the op: its tokens stay on
    /// this rank (moe-expert-parallel splits the others).
    bool isExpertParallel() { return getEpSize() > 1; }
    ::llvm::LogicalResult checkOneRank() {
      if (!isExpertParallel())
        return ::mlir::success();
      return emitOpError() << "has ep_size = " << getEpSize()
                           << ": run moe-expert-parallel first";
    }
  }];
  let assemblyFormat = [{
    $hidden_states `,` $expert_ids (`scale` $scale^)? attr-dict `:`
    functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Moe_QuantizeOp : Moe_Op<"quantize", [Pure]> {
  let summary = "block-scaled FP8 quantization along the last dimension";
  let description = [{
    Splits the last dimension (K) of `input` into blocks of the scheme's size
    (the last block may be partial) and gives E4M3 `data` of the input's shape
    and one `scales` entry per block: [..., ceil(K/32)] `f8E8M0FNU` for
    MXFP8, [..., ceil(K/128)] `f32` for FP8 block-128, whose weights may also
    share one scale per 128 x 128 block: [..., ceil(N/128), ceil(K/128)].
    input = data * scale, up to rounding.

    With `transpose`, `data` and `scales` are those of the input with its
    last two (static) dimensions swapped: a moe.transpose and a quantize in
    one pass over the input (a dgrad's weights, quantized along N).

    With two `transposed` results (128 x 128 blocks, not `transpose`), they
    are the codes and scales of the input's transpose too: a square block
    has one scale whichever way it is read, so one pass gives both (a
    weight's codes for the forward and for the dgrad).
  }];
  let arguments = (ins Moe_RealTensor:$input, Moe_QuantAttr:$scheme,
                       UnitAttr:$transpose);
  let results = (outs Moe_QuantData:$data, Moe_Scales:$scales,
                      Variadic<AnyRankedTensor>:$transposed);
  let assemblyFormat = [{
    $input attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Moe_DequantizeOp : Moe_Op<"dequantize", [Pure]> {
  let summary = "data times its block scales";
  let description = [{
    The inverse of `moe.quantize`, with the same shapes and scheme.
  }];
  let arguments = (ins Moe_QuantData:$data, Moe_Scales:$scales,
                       Moe_QuantAttr:$scheme);
  let results = (outs Moe_RealTensor:$output);
  let assemblyFormat = [{
    $data `,` $scales attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Moe_PadOp : Moe_Op<"pad", [Pure]> {
  let summary = "zeros appended to the last dimension";
  let description = [{
    `result` is `input` with its last dimension extended with zeros; every
    other dimension (the leading one may be the dynamic token count) is the
    same. moe-legalize pads a matmul's K with it where a target reads rows
    only in whole units (sm_90a's TMA: multiples of 16 bytes); the zeros add
    nothing to any product.
  }];
  let arguments = (ins RankedTensorOf<[BF16, F8E4M3FN, F32]>:$input);
  let results = (outs RankedTensorOf<[BF16, F8E4M3FN, F32]>:$result);
  let assemblyFormat = [{
    $input attr-dict `:` type($input) `->` type($result)
  }];
  let hasVerifier = 1;
}

def Moe_TransposeOp : Moe_Op<"transpose", [Pure]> {
  let summary = "the last two dimensions swapped";
  let description = [{
    `result`[..., j, i] = `input`[..., i, j]: a matrix (or a stack of them,
    one per expert) in its other major order. moe-legalize gives sm_90a's
    matmul kernel, which reads its weights K-major, a dgrad's weights so.
  }];
  let arguments = (ins RankedTensorOf<[BF16, F8E4M3FN, F32]>:$input);
  let results = (outs RankedTensorOf<[BF16, F8E4M3FN, F32]>:$result);
  let assemblyFormat = [{
    $input attr-dict `:` type($input) `->` type($result)
  }];
  let hasVerifier = 1;
}

def Moe_GroupedMatmulOp : Moe_Op<"grouped_matmul",
                                 [Pure, AttrSizedOperandSegments]> {
  let summary = "one matmul per expert over its rows, with an epilogue";
  let description = [{
    With `groups(tokens_per_expert, expert_offsets)`, rows
    [offset[e], offset[e] + count[e]) of `lhs` [R, K] are multiplied by
    `rhs`[e]^T ([E, N, K]); other rows of the result are zero. Without groups
    `rhs` is [N, K] and every row uses it. f32 accumulation; `bias` ([E, N],
    or [N]) is added, then `activation`, if present, combines gate columns
    [0, N/2) with up columns [N/2, N) into N/2 columns. FP8 operands take
    `scales(lhs_scale, rhs_scale)` laid out as `moe.quantize` gives them.
    `configs`, set by moe-configure-matmuls, holds the kernel's
    `#moe.matmul_config` for each plan (any token count, then each bucket).
    With `transpose_rhs`, `rhs` is stored [E, K, N] (or [K, N]), the weights
    of the matmul a dgrad differentiates, and is read along N as it lies:
    bf16 operands, no bias or quantized result, and an activation only
    as the backward's epilogue below.

    With `transpose_rhs`, `activation` and `activation_input` (h [R, 2N],
    that activation's input in the forward), the epilogue is the
    activation's backward, as moe.activation_grad without `gate` gives it:
    the product g is each row's gradient before its weight w
    (`row_weights` [R], or 1), and `out` [R, 2N] (bf16) is
    activation'(h) * (w g), gate columns then up columns. With
    `row_weights` the second result `row_dots` [R, ceil(N / 64)] (f32) holds each
    row's <g, a> (a = activation(h) rounded to bf16) summed over each 64 of
    the N columns; `row_term` [R, 1] (f32), when given, is added to the
    first. With `in_place`, `out` takes `activation_input`'s memory: every
    other reader of h comes before this op.
  }];
  let arguments = (ins
    Moe_MatmulInput:$lhs,
    Moe_MatmulInput:$rhs,
    Optional<Moe_IndexTensor>:$tokens_per_expert,
    Optional<Moe_IndexTensor>:$expert_offsets,
    Optional<Moe_Scales>:$lhs_scale,
    Optional<Moe_Scales>:$rhs_scale,
    Optional<Moe_RealTensor>:$bias,
    OptionalAttr<Moe_ActivationAttr>:$activation,
    OptionalAttr<Moe_QuantAttr>:$out_quant,
    OptionalAttr<TypedArrayAttrBase<Moe_MatmulConfigAttr,
                                    "kernel configurations">>:$configs,
    UnitAttr:$transpose_rhs,
    Optional<Moe_Activations>:$activation_input,
    Optional<Moe_F32Tensor>:$row_weights,
    Optional<Moe_F32Tensor>:$row_term,
    UnitAttr:$in_place
  );
  // `extras`: the result's scales (out_quant), or the rows' partial sums of
  // <g, a> (row_weights); getOutScale() and getRowDots() name them.
  let results = (outs Moe_MatmulOutput:$out, Variadic<Moe_Scales>:$extras);
  let assemblyFormat = [{
    $lhs `,` $rhs
    (`groups` `(` $tokens_per_expert^ `,` $expert_offsets `)`)?
    (`scales` `(` $lhs_scale^ `,` $rhs_scale `)`)?
    (`bias` $bias^)?
    (`activation_input` $activation_input^)?
    (`row_weights` $row_weights^)? (`row_term` $row_term^)?
    attr-dict `:` functional-type(operands, results)
  }];
  let extraClassDeclaration = [{
    /// The scheme of FP8 operands, read off their scales' element type
    /// (E8M0: MXFP8, f32: FP8 block-128); null for bf16 operands.
    ::mlir::moe::QuantAttr getScheme();
    /// The configuration for calls of at most `tokens` tokens (0: any), or
    /// null when moe-configure-matmuls has not chosen one.
    ::mlir::moe::MatmulConfigAttr getConfigFor(int64_t tokens);
    /// N (the result's columns before an activation) and K, wherever
    /// `transpose_rhs` puts them in `rhs`.
    int64_t getN();
    int64_t getK();
    /// The epilogue is an activation's backward (`activation_input`).
    bool isActivationGrad() { return static_cast<bool>(getActivationInput()); }
    /// With `out_quant`: the result's scales.
    ::mlir::Value getOutScale() {
      return getOutQuant() && !getExtras().empty() ? getExtras()[0]
                                                   : ::mlir::Value();
    }
    /// With `row_weights`: each row's partial sums of <g, a>.
    ::mlir::Value getRowDots() {
      return getRowWeights() && !getExtras().empty() ? getExtras()[0]
                                                     : ::mlir::Value();
    }
    /// Columns each `row_dots` entry sums.
    static constexpr int64_t kRowDotColumns = 64;
  }];
  let hasVerifier = 1;
}

def Moe_TiledAttentionOp : Moe_Op<"tiled_attention", [Pure]> {
  let summary = "attention as matrix and vector stages on tiles, scheduled";
  let description = [{
    `moe.attention` (same operands, result and `causal`; `scale` is always
    given) cut into tiles: each row group of `tile_m` query rows (query
    positions times the query heads sharing a key/value head) walks the
    keys `tile_n` at a time with an online softmax in f32. The keys are cut
    into `kv_splits` ranges of whole tiles, each walked on its own and the
    partial results merged at the end.

    `schedule` is the loop body over key tiles, as slots in time order:
    each slot lists the stages (`#moe.stage`) that run side by side, qk and
    pv on the matrix engine, the rest on the vector engine. `groups` row
    groups take turns: with two, one group's matrix stages run beside the
    other's vector stages (FlashAttention-3's ping-pong; a machine with
    separate matrix and vector engines gives each kind its own queue).
    The numerics are in docs/numerics.md.
  }];
  let arguments = (ins
    Moe_Activations:$query,
    Moe_Activations:$key,
    Moe_Activations:$value,
    UnitAttr:$causal,
    F32Attr:$scale,
    ConfinedAttr<I64Attr, [IntPositive]>:$tile_m,
    ConfinedAttr<I64Attr, [IntPositive]>:$tile_n,
    ConfinedAttr<I64Attr, [IntPositive]>:$groups,
    ConfinedAttr<I64Attr, [IntPositive]>:$kv_splits,
    ArrayAttr:$schedule
  );
  let results = (outs Moe_Activations:$out);
  let assemblyFormat = [{
    $query `,` $key `,` $value attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    /// The slot (index into `schedule`) and the position within it of
    /// stage `kind` of row group `group`, and its key tile offset.
    struct Placement { int64_t slot, position, tile; };
    Placement placement(AttentionStageKind kind, int64_t group);
  }];
}

def Moe_CombineOp : Moe_Op<"combine", [Pure, AttrSizedOperandSegments]> {
  let summary = "gather expert outputs back to tokens and sum them";
  let description = [{
    out[t] = sum over j of weights[t, j] * expert_out[rows[t, j]] (all ones
    without `weights`; rows < 0 add nothing), in f32, plus the shared
    experts' output `shared` [T, H], scaled by sigmoid(`gate` [T, 1]) when
    given; rounded to bf16 once.
  }];
  let arguments = (ins
    Moe_RealTensor:$expert_out,
    Moe_IndexTensor:$rows,
    Optional<Moe_F32Tensor>:$weights,
    Optional<Moe_RealTensor>:$shared,
    Optional<Moe_RealTensor>:$gate
  );
  let results = (outs Moe_Activations:$out);
  let assemblyFormat = [{
    $expert_out `,` $rows (`weights` $weights^)?
    (`shared` $shared^ (`gate` $gate^)?)?
    attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// L1: training (the adjoints moe-differentiate builds the backward from)
//===----------------------------------------------------------------------===//

def Moe_ActivationOp : Moe_Op<"activation", [Pure]> {
  let summary = "a gated activation of a row's gate and up columns";
  let description = [{
    `out`[r, c] = activation(`input`[r, c], `input`[r, c + N/2]) for the
    gate columns [0, N/2) and up columns [N/2, N) of `input` [R, N], in f32
    from bf16, rounded to bf16: the epilogue of a gated moe.grouped_matmul
    as a step of its own, so that a training forward keeps the matmul's
    output (the activation's input) for the backward. With `row_weights`
    [R] (f32), row r is that rounded value times row_weights[r], rounded
    again: the weighted activation a backward's weight gradient reads.

    With `quant`, `out` is those bf16 values quantized along each row as
    `moe.quantize` quantizes them, and `scales` their scales: the
    activation and the down matmul's quantize in one pass, the bf16 values
    never stored.
  }];
  let arguments = (ins Moe_Activations:$input,
                       Optional<Moe_F32Tensor>:$row_weights,
                       Moe_ActivationAttr:$activation,
                       OptionalAttr<Moe_QuantAttr>:$quant);
  let results = (outs Moe_MatmulInput:$out, Optional<Moe_Scales>:$scales);
  let assemblyFormat = [{
    $input (`row_weights` $row_weights^)? attr-dict `:`
    functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Moe_ActivationGradOp : Moe_Op<"activation_grad",
                                  [Pure, AttrSizedOperandSegments]> {
  let summary = "the backward of a gated activation and its row's weight";
  let description = [{
    For each row r of `input` [R, N] (the activation's input h) and
    `out_grad` [R, N/2] (g, the gradient of the weighted row's activation
    before its weight, as the down matmul's dgrad gives it), with the row's
    weight w and a = activation(h) rounded to bf16 as the forward rounds it:
    `input_grad`[r] = activation'(h) * (w g) (the gate and the up columns),
    `weighted`[r] = w a, both rounded to bf16, and the weight's gradient
    <g, a> in f32.

    With `bias_term` [R, 1] (f32), each row's weight gradient adds it: the
    part that comes through the bias of the matmul that follows.

    The weights: with `rows(rows, weights)` ([T, k] each), the row of choice
    (t, j) is rows[t, j] and its weight weights[t, j], whose gradient is
    `weight_grad`[t, j]; a row no choice maps to (alignment padding) has
    weight 0. With `gate` [R, 1] a row's weight is sigmoid(gate[r]) and
    `weight_grad` [R, 1] the gate's gradient; with `linear_gate` too, the
    gate (f32) is the row's weight itself and `weight_grad` [R, 1] its
    gradient (an expert-parallel rank's rows, whose weights came with them).
    With neither, every weight is 1 and there is no `weight_grad`.
  }];
  let arguments = (ins
    Moe_Activations:$out_grad,
    Moe_Activations:$input,
    Optional<Moe_IndexTensor>:$rows,
    Optional<Moe_F32Tensor>:$weights,
    Optional<Moe_RealTensor>:$gate,
    Optional<Moe_F32Tensor>:$bias_term,
    Moe_ActivationAttr:$activation,
    UnitAttr:$linear_gate
  );
  let results = (outs Moe_Activations:$input_grad, Moe_Activations:$weighted,
                     Optional<Moe_F32Tensor>:$weight_grad);
  let assemblyFormat = [{
    $out_grad `,` $input (`rows` `(` $rows^ `,` $weights `)`)?
    (`gate` $gate^)? (`bias_term` $bias_term^)? attr-dict `:`
    functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Moe_GroupedMatmulDgradOp : Moe_Op<"grouped_matmul_dgrad",
                                      [Pure, AttrSizedOperandSegments]> {
  let summary = "a grouped matmul's input gradient: rows times weights";
  let description = [{
    The gradient of moe.grouped_matmul's `lhs` from its result's gradient:
    with `groups(tokens_per_expert, expert_offsets)`, rows
    [offset[e], offset[e] + count[e]) of `out_grad` [R, N] are multiplied by
    `rhs`[e] ([E, N, K], read along N: the forward's weights in their other
    major order); other rows of the result are zero. Without groups `rhs` is
    [N, K]. f32 accumulation, plus `acc` [R, K] (f32) when given; the result
    [R, K] is bf16 or f32. With the forward's `bias` ([E, N] or [N]), the
    second result [R, 1] (f32) is each row of `out_grad` dotted with its
    expert's bias: what the bias adds to the gradient of a weight the
    forward's rows were scaled by.
  }];
  let arguments = (ins
    Moe_RealTensor:$out_grad,
    Moe_RealTensor:$rhs,
    Optional<Moe_IndexTensor>:$tokens_per_expert,
    Optional<Moe_IndexTensor>:$expert_offsets,
    Optional<Moe_F32Tensor>:$acc,
    Optional<Moe_RealTensor>:$bias
  );
  let results = (outs Moe_RealTensor:$out, Optional<Moe_F32Tensor>:$bias_dot);
  let assemblyFormat = [{
    $out_grad `,` $rhs
    (`groups` `(` $tokens_per_expert^ `,` $expert_offsets `)`)?
    (`acc` $acc^)? (`bias` $bias^)? attr-dict `:`
    functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Moe_GroupedMatmulWgradOp : Moe_Op<"grouped_matmul_wgrad",
                                      [Pure, AttrSizedOperandSegments]> {
  let summary = "a grouped matmul's weight gradient: a sum over each expert's rows";
  let description = [{
    The gradient of moe.grouped_matmul's `rhs` (or bias) from its result's
    gradient `out_grad` [R, N] and its `lhs` [R, K]: with
    `groups(tokens_per_expert, expert_offsets)`, `out`[e] = the sum over
    expert e's rows r of out_grad[r]^T lhs[r] ([E, N, K]), a contraction
    whose length varies per expert; without groups, over every row
    ([N, K]). A rank-1 `lhs` [R] gives out[e] = sum of lhs[r] out_grad[r]
    ([E, N] or [N]); no `lhs`, the sum of the rows (a bias's gradient).
    Accumulated in f32, returned in f32 or bf16 (rounded once).

    With `quant` (fp8_block128; a rank-2 `lhs`), the product is taken in
    E4M3 as DeepSeek-V3's recipe takes it, along the contraction: each
    expert's rows (every row, without groups) in blocks of 128 from its
    first, and in each block each column of `out_grad` and of `lhs` is
    quantized with its own scale (amax / 448, as moe.quantize takes it;
    the codes of x times the scale's reciprocal, in f32). Each
    block's product of the codes is summed in f32, then scaled by its two
    columns' scales and added: out = sum over blocks of (codes^T codes) x
    scale(n) x scale(k). With `lhs_scale`, `lhs` holds E4M3 codes
    quantized along K in 1 x 128 tiles ([R, ceil(K / 128)] scales), taken
    as the f32 values they stand for.
  }];
  let arguments = (ins
    Moe_RealTensor:$out_grad,
    Optional<Moe_WgradInput>:$lhs,
    Optional<Moe_IndexTensor>:$tokens_per_expert,
    Optional<Moe_IndexTensor>:$expert_offsets,
    Optional<Moe_F32Tensor>:$lhs_scale,
    OptionalAttr<Moe_QuantAttr>:$quant
  );
  let results = (outs Moe_RealTensor:$out);
  let assemblyFormat = [{
    $out_grad (`lhs` $lhs^)?
    (`groups` `(` $tokens_per_expert^ `,` $expert_offsets `)`)?
    (`scale` $lhs_scale^)?
    attr-dict `:` functional-type(operands, results)
  }];
  let extraClassDeclaration = [{
    /// The verifier's part for `quant` and `lhs_scale`.
    ::llvm::LogicalResult checkQuantizedWgrad(int64_t rows);
  }];
  let hasVerifier = 1;
}

def Moe_ScatterOp : Moe_Op<"scatter", [Pure, AttrSizedOperandSegments]> {
  let summary = "each token copied to the rows a dispatch gave it";
  let description = [{
    `out`[rows[t, j]] = `source`[t] ([T, H]) for each choice j of each token
    t with rows[t, j] >= 0, times `scale`[t, j] (rounded to bf16) when
    given. `out` has `expert_offsets`[E] rows; rows no choice names are
    zero. The backward lays a gradient out as the forward's moe.dispatch
    laid its tokens, from the `rows` and `expert_offsets` that dispatch
    gave: a backend may order an expert's rows freely, so a second
    dispatch of the same choices need not place them alike. `align` is
    that dispatch's, which bounds the rows (T x k + E x (align - 1)).

    With `weights` [T, k] (f32; not with `scale`), the rows are not
    scaled, and `row_weights` [R] (f32) holds weights[t, j] at row
    rows[t, j], 0 at rows no choice names: each row's routing weight, for
    a kernel that works by row.
  }];
  let arguments = (ins
    Moe_Activations:$source,
    Moe_IndexTensor:$rows,
    Moe_IndexTensor:$expert_offsets,
    Optional<Moe_F32Tensor>:$scale,
    Optional<Moe_F32Tensor>:$weights,
    DefaultValuedAttr<I64Attr, "1">:$align
  );
  let results = (outs Moe_Activations:$out,
                     Optional<Moe_F32Tensor>:$row_weights);
  let assemblyFormat = [{
    $source `,` $rows `offsets` $expert_offsets (`scale` $scale^)?
    (`weights` $weights^)? attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Moe_GatherDotOp : Moe_Op<"gather_dot", [Pure, AttrSizedOperandSegments]> {
  let summary = "each choice's row dotted with its token";
  let description = [{
    `out`[t, j] = the dot product of `row_values`[rows[t, j]] ([R, H]) and
    `tokens`[t] ([T, H]), in f32; 0 where rows[t, j] < 0. The gradient of a
    routing weight that scaled a token into its row (the Llama-4 router),
    from the row's gradient. Without `tokens`, `out`[t, j] is the sum of
    row_values[rows[t, j]] ([R, P]): a row's partial sums (moe.grouped_matmul's
    `row_dots`) gathered into its choice. Without `rows` either, `out` [R, 1]
    holds each row's own sum (an expert-parallel backward's rows, whose
    weights' gradients go home with them).
  }];
  let arguments = (ins Moe_RealTensor:$row_values,
                       Optional<Moe_RealTensor>:$tokens,
                       Optional<Moe_IndexTensor>:$rows);
  let results = (outs Moe_F32Tensor:$out);
  let assemblyFormat = [{
    $row_values (`,` $tokens^)? (`rows` $rows^)? attr-dict `:`
    functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Moe_RouteGradOp : Moe_Op<"route_grad",
                              [Pure, AttrSizedOperandSegments]> {
  let summary = "the router's logit gradient from its weights' gradient";
  let description = [{
    Takes moe.route's `logits` [T, E] (f32, the bias added where moe.route
    adds it) that the training forward saved, or recomputes them for
    `hidden_states` [T, H] and `router_weight` [E, H] (`bias` [E] as
    moe.route adds it); then the scores, and gives the
    gradient of the logits [T, E] (f32) from `weight_grad` [T, k], the
    gradient of the weights moe.route gave for the choices `expert_ids`
    [T, k]: the softmax's or sigmoid's Jacobian through the renormalization
    and the scaling factor. Experts a token did not choose take a gradient
    only through a softmax over every expert. A selection-only bias
    (sigmoid_grouped_topk) takes none; sigmoid_scale_input's weight is the
    sigmoid of the chosen logit. The router weight's and the hidden states'
    gradients are matmuls of this result.
  }];
  let arguments = (ins
    Moe_Activations:$hidden_states,
    Moe_RealTensor:$router_weight,
    Optional<Moe_F32Tensor>:$bias,
    Optional<Moe_F32Tensor>:$logits,
    Moe_IndexTensor:$expert_ids,
    Moe_F32Tensor:$weight_grad,
    Moe_RouterAttr:$router
  );
  let results = (outs Moe_F32Tensor:$logit_grad);
  let assemblyFormat = [{
    $hidden_states `,` $router_weight (`bias` $bias^)? (`logits` $logits^)?
    `choices` `(` $expert_ids `,` $weight_grad `)` attr-dict `:`
    functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// L1: expert parallelism, each exchange in a send and a receive half
//===----------------------------------------------------------------------===//

// Not Pure: each half moves data between ranks and must run exactly once, in
// order; the values they pass each other order them.

def Moe_EpDispatchSendOp : Moe_Op<"ep_dispatch_send"> {
  let summary = "send each token once to every rank holding one of its experts";
  let description = [{
    Of `ep_size` ranks (the size of `sent`), rank r holds experts
    [r * El, (r + 1) * El), El = `local_experts`. Each token of
    `hidden_states` [T, H] goes once to every rank holding one of its
    `expert_ids` [T, k] (ids outside [0, ep_size * El) go nowhere), with its
    choices for that rank and, with `scale` [T, k], their weights. Each rank
    first receives how many tokens come, then the tokens. With `quant` and
    no `scale`, tokens travel quantized: `quantized` holds their E4M3 codes
    [T, H] and block scales, which the shared experts use too. With `scale`
    they travel in bf16, and the receiver scales, then quantizes.

    `sent` [ep_size] counts the tokens sent to each rank. `rows` [T, k]
    says where each (token, choice)'s expert output lands in
    moe.ep_combine_recv's result, or -1 for none. The choices going to rank
    0 come first, then those going to rank 1, and so on; within a rank they
    are in (token, choice) order.
  }];
  let arguments = (ins
    Moe_Activations:$hidden_states,
    Moe_IndexTensor:$expert_ids,
    Optional<Moe_F32Tensor>:$scale,
    I64Attr:$local_experts,
    OptionalAttr<Moe_QuantAttr>:$quant
  );
  let results = (outs
    Moe_IndexTensor:$sent,
    Moe_IndexTensor:$rows,
    Variadic<AnyRankedTensor>:$quantized
  );
  let assemblyFormat = [{
    $hidden_states `,` $expert_ids (`scale` $scale^)? attr-dict `:`
    functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Moe_EpDispatchRecvOp : Moe_Op<"ep_dispatch_recv"> {
  let summary = "receive the tokens of every rank into this rank's experts";
  let description = [{
    Waits for the tokens that moe.ep_dispatch_send sent this rank from every
    rank (`sent` is this rank's own send: it orders the two) and copies each
    once per choice into `dispatched` [R, H], expert by expert and within an
    expert by source rank, then token: the buffer and counts that
    moe.dispatch gives one rank's experts, `tokens_per_expert` [El] and
    `expert_offsets` [El + 1]. With `scaled`, each row is multiplied by its
    choice's weight and rounded to bf16 (as moe.dispatch's `scale`); with
    `quant`, rows are E4M3 codes and the one `quantized` result their
    scales. `origin` [R, 2] gives each row's source rank and where its
    output goes in that rank's moe.ep_combine_recv result. With `weights`
    (a send with `scale`, the rows not scaled), the one `quantized` result
    is each row's weight instead, [R, 1] f32: the backward's rows, whose
    weights multiply later.
  }];
  let arguments = (ins
    Moe_IndexTensor:$sent,
    UnitAttr:$scaled,
    UnitAttr:$weights,
    OptionalAttr<Moe_QuantAttr>:$quant
  );
  let results = (outs
    Moe_MatmulInput:$dispatched,
    Moe_IndexTensor:$tokens_per_expert,
    Moe_IndexTensor:$expert_offsets,
    Moe_IndexTensor:$origin,
    Variadic<AnyRankedTensor>:$quantized
  );
  let assemblyFormat = [{
    $sent attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Moe_EpCombineSendOp : Moe_Op<"ep_combine_send"> {
  let summary = "send each expert output row back to its token's rank";
  let description = [{
    Sends row i of `expert_out` [R, H] to rank `origin`[i, 0], where it
    lands at row `origin`[i, 1] of that rank's moe.ep_combine_recv result.
    `sent` [ep_size] counts the rows sent to each rank. With `values`
    [R, 1] (f32), each row's value travels with it (the backward's
    routing-weight gradients).
  }];
  let arguments = (ins Moe_Activations:$expert_out, Moe_IndexTensor:$origin,
                       Optional<Moe_F32Tensor>:$values);
  let results = (outs Moe_IndexTensor:$sent);
  let assemblyFormat = [{
    $expert_out `,` $origin (`values` $values^)? attr-dict `:`
    functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Moe_EpCombineRecvOp : Moe_Op<"ep_combine_recv"> {
  let summary = "receive this rank's tokens' expert outputs";
  let description = [{
    Waits for every expert output row of this rank's tokens and gives them
    as `gathered` [T * k, H], laid out as `rows` [T, k] (from
    moe.ep_dispatch_send) says, so moe.combine with those rows sums them
    exactly as on one rank. `sent` is this rank's own moe.ep_combine_send;
    where it sent `values`, `values` [T, k] (f32) gives each choice's, 0
    for a choice no rank holds.
  }];
  let arguments = (ins Moe_IndexTensor:$sent, Moe_IndexTensor:$rows);
  let results = (outs Moe_Activations:$gathered,
                      Optional<Moe_F32Tensor>:$values);
  let assemblyFormat = [{
    $sent `,` $rows attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

#endif // MOE_OPS_TD
