//===- SplitAttention.cpp - attention as scheduled matrix/vector stages ---===//
//
// Attention is two matmuls with a softmax between them. Run as one kernel
// stage after another, the tensor cores idle while the softmax's
// exponentials run, and the other way round. Cut into tiles, one tile's
// softmax can run beside another tile's matmuls: the schedule this pass
// writes into the IR says which, so a backend maps it to its engines
// (sm_90a: two consumer warpgroups in ping-pong) and a test can check it.
//
//===----------------------------------------------------------------------===//

#include "passes/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/PatternMatch.h"

#include <cmath>

namespace mlir::moe {
#define GEN_PASS_DEF_SPLITATTENTION
#include "passes/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;
using namespace mlir::moe;

namespace {
constexpr int64_t kTileM = 64;

/// The loop body over key tiles. Ping-pong (groups >= 2): slot s runs
/// group s's matrix stages (qk of this tile, pv of the previous one) beside
/// the vector stages of the group before it, so each group's softmax
/// overlaps the next group's matmuls and its own pv. Otherwise: all
/// matrix stages, then all vector stages.
ArrayAttr buildSchedule(MLIRContext *ctx, int64_t groups, bool pingPong) {
  using K = AttentionStageKind;
  auto stage = [&](K kind, int64_t group, int64_t tile) -> Attribute {
    return StageAttr::get(ctx, kind, group, tile);
  };
  auto vector = [&](SmallVector<Attribute> &slot, int64_t g, int64_t tile) {
    for (K kind : {K::Mask, K::Max, K::Exp, K::Rescale, K::Sum})
      slot.push_back(stage(kind, g, tile));
  };
  SmallVector<Attribute> slots;
  if (pingPong && groups >= 2) {
    for (int64_t s = 0; s < groups; ++s) {
      SmallVector<Attribute> slot = {stage(K::QK, s, 0), stage(K::PV, s, -1)};
      // The previous group's softmax; group groups-1's comes a slot after
      // its qk, in the next iteration.
      int64_t g = (s + groups - 1) % groups;
      vector(slot, g, s == 0 ? -1 : 0);
      slots.push_back(ArrayAttr::get(ctx, slot));
    }
    return ArrayAttr::get(ctx, slots);
  }
  SmallVector<Attribute> matrix, vectors;
  for (int64_t g = 0; g < groups; ++g) {
    matrix.append({stage(K::QK, g, 0), stage(K::PV, g, -1)});
    vector(vectors, g, 0);
  }
  return ArrayAttr::get(
      ctx, {ArrayAttr::get(ctx, matrix), ArrayAttr::get(ctx, vectors)});
}

struct SplitAttentionPass
    : public moe::impl::SplitAttentionBase<SplitAttentionPass> {
  using SplitAttentionBase::SplitAttentionBase;

  /// Key ranges for `op`: the fewest that make row tiles times ranges fill
  /// whole waves of the target's blocks to within 10%, each range at least
  /// two key tiles. Dynamic shapes take one.
  int64_t chooseSplits(AttentionOp op, int64_t tileN) {
    auto q = cast<RankedTensorType>(op.getQuery().getType());
    auto k = cast<RankedTensorType>(op.getKey().getType());
    if (!q.hasStaticShape() || !k.hasStaticShape())
      return 1;
    int64_t rowsPerHead = q.getDimSize(1) * (q.getDimSize(2) / k.getDimSize(2));
    int64_t blocks = q.getDimSize(0) * k.getDimSize(2) *
                     llvm::divideCeil(rowsPerHead, groups * kTileM);
    int64_t keyTiles = llvm::divideCeil(k.getDimSize(1), tileN);
    int64_t most = std::clamp<int64_t>(keyTiles / 2, 1, 64);
    if (blocks >= targetBlocks)
      return 1;
    for (int64_t s = 1; s <= most; ++s) {
      int64_t total = blocks * s;
      int64_t waves = llvm::divideCeil(total, targetBlocks);
      if (total * 10 >= waves * targetBlocks * 9)
        return s;
    }
    return most;
  }

  void runOnOperation() override {
    if (groups < 1 || tileN < 0 || kvSplits < 0 || targetBlocks < 1) {
      getOperation()->emitError()
          << "moe-split-attention needs groups >= 1, tile-n >= 0, "
             "kv-splits >= 0 and target-blocks >= 1";
      return signalPassFailure();
    }
    IRRewriter rewriter(&getContext());
    getOperation()->walk([&](AttentionOp op) {
      auto q = cast<RankedTensorType>(op.getQuery().getType());
      int64_t headSize = q.getDimSize(3);
      int64_t tile = tileN ? tileN : headSize > 128 ? 64 : 128;
      int64_t splits = kvSplits ? kvSplits : chooseSplits(op, tile);
      float scale = op.getScale() ? op.getScale()->convertToFloat()
                                  : float(1.0 / std::sqrt(double(headSize)));
      rewriter.setInsertionPoint(op);
      auto tiled = TiledAttentionOp::create(
          rewriter, op.getLoc(), op.getType(), op.getQuery(), op.getKey(),
          op.getValue(), op.getCausalAttr(), rewriter.getF32FloatAttr(scale),
          rewriter.getI64IntegerAttr(kTileM), rewriter.getI64IntegerAttr(tile),
          rewriter.getI64IntegerAttr(groups),
          rewriter.getI64IntegerAttr(splits),
          buildSchedule(&getContext(), groups, pingPong));
      rewriter.replaceOp(op, tiled.getResult());
    });
  }
};
} // namespace
