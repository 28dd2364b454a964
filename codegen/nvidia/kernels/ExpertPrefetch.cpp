//===- ExpertPrefetch.cpp - the chosen experts' weights into L2 -----------===//
//
// In a fused bucket, after the route: blocks prefetch the first bytes of
// each row of the chosen experts' weights into L2 while the dispatch runs,
// so that the matmuls' weight streams start early.
//
//===----------------------------------------------------------------------===//

#include "codegen/nvidia/kernels/Kernels.h"
#include "codegen/nvidia/support/Hopper.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::nvidia;

namespace {
/// L2 a prefetch may fill ahead of the matmuls: well under the H100's
/// 50 MB, so the streams that follow do not evict it before it is read.
constexpr int64_t kPrefetchBudget = 20 << 20;
/// Virtual blocks of the prefetch step, threads each.
constexpr int64_t kPrefetchBlocks = 128, kPrefetchThreads = 256;
/// The least bytes of a row worth a prefetch instruction.
constexpr int64_t kPrefetchMinBytes = 512;

/// Expert weights [E, N, K] a grouped matmul reads: which plan buffer, and
/// the bytes of each row to prefetch.
struct PrefetchedWeight {
  unsigned buffer;
  int64_t experts, rows, rowBytes, bytes;
};
} // namespace

LogicalResult nvidia::buildExpertPrefetch(LayerKernels &layer, RouteOp route) {
  auto func = route->getParentOfType<func::FuncOp>();
  auto idsType = cast<RankedTensorType>(route.getExpertIds().getType());
  int64_t topK = idsType.getDimSize(1);
  int64_t choices = layer.maxTokens * topK;
  // The experts' weights in the order the matmuls read them: each row's
  // first bytes (the first K a tile streams), as many as the budget
  // leaves.
  SmallVector<PrefetchedWeight> weights;
  int64_t budget = kPrefetchBudget;
  func.walk([&](GroupedMatmulOp matmul) {
    auto arg = dyn_cast<BlockArgument>(matmul.getRhs());
    if (!matmul.getTokensPerExpert() || !arg ||
        arg.getOwner()->getParentOp() != func.getOperation())
      return;
    auto type = cast<RankedTensorType>(arg.getType());
    if (type.getRank() != 3)
      return;
    int64_t rowBytes = type.getDimSize(2) * type.getElementTypeBitWidth() / 8;
    if (rowBytes % 16 != 0)
      return;
    int64_t rows = choices * type.getDimSize(1);
    int64_t bytes = std::min(rowBytes, budget / rows / 128 * 128);
    if (bytes < std::min(rowBytes, kPrefetchMinBytes))
      return;
    budget -= rows * bytes;
    weights.push_back({arg.getArgNumber(), type.getDimSize(0),
                       type.getDimSize(1), rowBytes, bytes});
  });
  if (weights.empty())
    return success();
  const TensorInfo &ids = layer.info(route.getExpertIds());
  SmallVector<unsigned> buffers = {ids.buffer};
  for (const PrefetchedWeight &w : weights)
    buffers.push_back(w.buffer);
  Kernel k = layer.kernelOn(route, "prefetch_experts", buffers);
  k.launch.work = {kPrefetchBlocks, 0};
  k.launch.block = kPrefetchThreads;
  k.launch.prefetchOnly = true;
  Emitter &e = k.e;
  OpBuilder &b = k.b;
  Value idsView = k.view(0, ids);
  Value choicesNow = e.imul(k.tokens, e.index(topK));
  Value first =
      e.iadd(e.imul(k.blockId(gpu::Dimension::x), e.index(kPrefetchThreads)),
             k.threadId());
  Value stride = e.index(kPrefetchBlocks * kPrefetchThreads);
  Type i8 = b.getI8Type(), i64 = b.getI64Type();
  for (auto [i, w] : llvm::enumerate(weights)) {
    Value base = k.func.getArgument(i + 1);
    // Row r of every choice c, choices fastest.
    e.forEach(
        first, e.imul(choicesNow, e.index(w.rows)),
        [&](Value item) {
          Value c = e.remUI(item, choicesNow), r = e.divUI(item, choicesNow);
          Value x = e.loadRaw(
              idsView, {e.divUI(c, e.index(topK)), e.remUI(c, e.index(topK))});
          Value held =
              e.andi(e.icmp(arith::CmpIPredicate::sge, x, e.i32(0)),
                     e.icmp(arith::CmpIPredicate::slt, x, e.i32(w.experts)));
          e.ifThen(held, [&] {
            Value row = e.iadd(e.imul(e.toIndex(x), e.index(w.rows)), r);
            Value offset = arith::IndexCastOp::create(
                b, e.loc, i64, e.imul(row, e.index(w.rowBytes)));
            Value address = LLVM::GEPOp::create(b, e.loc, base.getType(), i8,
                                                base, ValueRange{offset});
            inlinePtx(b, e.loc, {}, {address, e.i32(w.bytes)},
                      "cp.async.bulk.prefetch.L2.global [$0], $1;", "l,r");
          });
        },
        stride);
  }
  return k.finish(route);
}
