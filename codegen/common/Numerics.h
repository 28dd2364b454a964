//===- Numerics.h - the arithmetic every backend shares ---------*- C++ -*-===//
//
// Scalar IR for the parts of the L1 ops that are not data movement or
// matmul: scoring and choosing experts, the activations, and one quantization
// block. The CPU backend wraps them in loops; the GPU kernels run them per
// thread, so both backends compute the same numbers (docs/numerics.md).
//
//===----------------------------------------------------------------------===//

#ifndef MOE_CODEGEN_COMMON_NUMERICS_H
#define MOE_CODEGEN_COMMON_NUMERICS_H

#include "codegen/common/Emitter.h"
#include "dialects/moe/MoeDialect.h"

namespace mlir::moe::common {

/// `x` (f32) rounded to bf16 and back to f32: the value a bf16 tensor holds,
/// as a later step reads what the forward stored.
Value roundedToBF16(Emitter &e, Value x);

/// The logit moe.route gives as its `logits`: the bias added, except for
/// sigmoid_grouped_topk (whose bias only ranks); `bias` may be null.
Value routerLogit(Emitter &e, RouterKind kind, Value logit, Value bias);

/// An expert's score (which gives its weight) and choice value (which ranks
/// it) from its router logit; `bias` (f32) may be null.
std::pair<Value, Value> expertScore(Emitter &e, RouterKind kind, Value logit,
                                    Value bias);

/// Scratch a token's expert selection works in: `score` and `choice` hold
/// expertScore's values on entry ([experts] f32); `taken` is [experts] i8;
/// `groupScore` ([n_group] f32) and `groupTaken` ([n_group] i8) are needed
/// when n_group > 1.
struct RouteScratch {
  Value score, choice, taken, groupScore, groupTaken;
  /// [topK] f32, optional: the chosen weights while they are normalized,
  /// rather than read back from `weights` (a GPU's global memory).
  Value chosen = {};
};

/// Emitter::argmax's contract: the index in [lb, ub) of the largest `key`
/// among the `eligible`, ties and NaN keys to the lowest index, -1 if none.
using ArgmaxFn =
    function_ref<Value(Value lb, Value ub, function_ref<Value(Value)> key,
                       function_ref<Value(Value)> eligible)>;

/// How a target shares a token's selection among threads. Every thread runs
/// selectExperts; each writing step runs inside `single`, which must run it
/// once and make its writes visible to every thread before going on; the
/// searches run in `argmax`, which may split them across the threads if it
/// keeps Emitter::argmax's contract (that fixes the result bit for bit).
/// Both null: one thread does everything.
/// `softmax`, when given, replaces the softmax router's step (every thread
/// runs it): score and choice of each expert become its softmax probability;
/// it may sum in another order than one thread does.
/// `forExperts`, when given, runs a body for every expert, split among the
/// threads, and makes its writes visible to all (steps of one expert each).
struct SelectThreads {
  ArgmaxFn argmax = nullptr;
  function_ref<void(function_ref<void()>)> single = nullptr;
  function_ref<void()> softmax = nullptr;
  function_ref<void(function_ref<void(Value)>)> forExperts = nullptr;
};

/// Chooses token `t`'s top-k experts into ids[t, :] (i32) and their weights
/// into weights[t, :] (f32), as `router` says.
void selectExperts(Emitter &e, RouterAttr router, int64_t experts, int64_t topK,
                   const RouteScratch &scratch, Value ids, Value weights,
                   Value t, SelectThreads threads = {});

/// How a target shares a token's route gradient among threads. Every thread
/// runs routeGrad. `forExperts` runs a body for every expert, split among
/// the threads, and makes its writes visible to all; `reduce` folds a term
/// of every expert (a sum, or a maximum where `isMax`) and gives every
/// thread the result; `single` runs a step once and makes its writes
/// visible. All null: one thread does everything, experts in order.
struct ExpertThreads {
  function_ref<void(function_ref<void(Value)>)> forExperts = nullptr;
  function_ref<Value(Value, function_ref<Value(Value)>, bool)> reduce = nullptr;
  function_ref<void(function_ref<void()>)> single = nullptr;
};

/// moe.route_grad for token `t`: `score` ([experts] f32) holds routerLogit's
/// values on entry and the scores on exit, `scoreGrad` ([experts] f32) is
/// scratch; ids[t, :] are the choices, dw[t, :] their weights' gradient,
/// and the logits' gradient goes to dl[t, :].
void routeGrad(Emitter &e, RouterAttr router, int64_t experts, int64_t topK,
               Value score, Value scoreGrad, Value ids, Value dw, Value dl,
               Value t, ExpertThreads threads = {});

/// The activation of a gate and an up value (f32).
Value activate(Emitter &e, ActivationAttr activation, Value gate, Value up);

/// The partial derivatives of activate() by its gate and by its up value
/// (f32), where the clamps of clamped_swiglu pass no gradient outside
/// their range (as torch.clamp: the bounds themselves pass it).
std::pair<Value, Value> activationGrad(Emitter &e, ActivationAttr activation,
                                       Value gate, Value up);

/// One scale block of `input` (rows [firstRow, lastRow), columns
/// [firstCol, lastCol), after index `prefix`): its scale goes to
/// scales[prefix, rb, kb] and its E4M3 codes to `data`.
void quantizeBlock(Emitter &e, QuantAttr scheme, Value input, Value data,
                   Value scales, ArrayRef<Value> prefix, Value rb, Value kb,
                   Value firstRow, Value lastRow, Value firstCol,
                   Value lastCol);

/// A quantization block's scale: `stored` is its code (i8 E8M0) or value
/// (f32), and encode() gives an element's E4M3 code (i8).
struct BlockScale {
  Value stored, factor;
  bool mx = false;
  Value encode(Emitter &e, Value x) const;
};

/// The scale of a block whose largest magnitude is `amax` (f32, NaN
/// skipped) and whose `special` (f32) is positive if it holds NaN or an
/// infinity, under `scheme`, as quantizeBlock computes it. Kernels that
/// quantize what they produce reduce amax and special across their threads
/// (max of each) and call this.
BlockScale blockScale(Emitter &e, QuantAttr scheme, Value amax, Value special);

/// One element's contribution to a block's statistics: returns |x| (for
/// amax, combined with maxnum so NaN is skipped) and sets `special` to 1.0
/// for NaN or an infinity, else 0.0 (combined with maximum).
Value blockStats(Emitter &e, Value x, Value &special);

/// The inverse of quantizeBlock, into `out`.
void dequantizeBlock(Emitter &e, Value data, Value scales, Value out,
                     ArrayRef<Value> prefix, Value rb, Value kb, Value firstRow,
                     Value lastRow, Value firstCol, Value lastCol);

/// Rows per scale block of quantized data of `dataShape` (rank 2 or 3) whose
/// scales have `scaleShape`: 128 for FP8 block-128 weights stored in
/// 128 x 128 blocks, else 1.
int64_t scaleRowsPerBlock(ArrayRef<int64_t> dataShape,
                          ArrayRef<int64_t> scaleShape, QuantAttr scheme);

/// Lays the experts' rows out back to back in the dispatched buffer:
/// offsets[x] is the sum of the counts before x, each rounded up to `align`,
/// and offsets[experts] the total. `countOf(x)` reads expert x's count (i32);
/// `each(x, offset, count)` runs for every expert once its offset is known.
void layOutExperts(Emitter &e, int64_t experts, int64_t align, Value offsets,
                   function_ref<Value(Value)> countOf,
                   function_ref<void(Value, Value, Value)> each = {});

/// A scale as f32, from its E8M0 code or as stored.
Value loadScale(Emitter &e, Value scales, ValueRange indices);

/// Attention's softmax runs in base 2: scores times scale * log2(e),
/// rounded once to f32, then exp2 (docs/numerics.md).
inline float attentionLog2Scale(double scale) {
  return float(scale * 1.4426950408889634);
}

} // namespace mlir::moe::common

#endif // MOE_CODEGEN_COMMON_NUMERICS_H
