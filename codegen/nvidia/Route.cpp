//===- Route.cpp - the routing kernel -------------------------------------===//
//
// moe.route in one kernel: a block per kRouteTokens tokens, whose warps
// compute the router logits (each load of a weight serves every token of the
// block, each load of a token every expert of a pass) and reduce them across
// lanes with shuffles; then one lane per token chooses its experts with the
// selection code the CPU backend runs (codegen/common/Numerics.h).
//
//===----------------------------------------------------------------------===//

#include "codegen/common/Numerics.h"
#include "codegen/nvidia/KernelBuilder.h"

#include "mlir/Dialect/Vector/IR/VectorOps.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::nvidia;

namespace {
constexpr int64_t kRouteWarps = 8, kRouteTokens = 4;
} // namespace

LogicalResult nvidia::buildRoute(LayerKernels &layer, RouteOp op) {
  RouterAttr router = op.getRouter();
  auto weightType = cast<RankedTensorType>(op.getRouterWeight().getType());
  int64_t experts = weightType.getDimSize(0), h = weightType.getDimSize(1);
  int64_t topK =
      cast<RankedTensorType>(op.getExpertIds().getType()).getDimSize(1);
  TokenLinear tokens = layer.info(op.getHiddenStates()).rows;
  layer.define(op.getExpertIds(), tokens);
  layer.define(op.getWeights(), tokens);
  SmallVector<Value> buffers = {op.getHiddenStates(), op.getRouterWeight()};
  if (op.getBias())
    buffers.push_back(op.getBias());
  buffers.append({op.getExpertIds(), op.getWeights()});
  Kernel k = layer.kernel(op, "route", buffers);
  // kRouteTokens tokens per block share each load of the router weights.
  k.launch.work = tokens;
  k.launch.perBlock = kRouteTokens;
  k.launch.block = kRouteWarps * 32;
  Emitter &e = k.e;
  SmallVector<Value> views;
  for (auto [i, v] : llvm::enumerate(buffers))
    views.push_back(k.view(i, layer.info(v)));
  Value hidden = views[0], weight = views[1];
  Value bias = op.getBias() ? views[2] : Value();
  Value ids = views[views.size() - 2], weights = views.back();

  Type f32 = e.b.getF32Type(), i8 = e.b.getI8Type();
  int64_t nGroup = router.getNGroup();
  // One row of scratch per token of the block.
  common::RouteScratch all;
  all.score = k.workgroupBuffer({kRouteTokens, experts}, f32);
  all.choice = k.workgroupBuffer({kRouteTokens, experts}, f32);
  all.taken = k.workgroupBuffer({kRouteTokens, experts}, i8);
  if (nGroup > 1) {
    all.groupScore = k.workgroupBuffer({kRouteTokens, nGroup}, f32);
    all.groupTaken = k.workgroupBuffer({kRouteTokens, nGroup}, i8);
  }
  auto row = [&](Value buffer, Value r) -> Value {
    if (!buffer)
      return buffer;
    auto type = cast<MemRefType>(buffer.getType());
    int64_t n = type.getDimSize(1);
    SmallVector<OpFoldResult> offsets = {r, e.b.getIndexAttr(0)};
    SmallVector<OpFoldResult> sizes = {e.b.getIndexAttr(1),
                                       e.b.getIndexAttr(n)};
    SmallVector<OpFoldResult> strides = {e.b.getIndexAttr(1),
                                         e.b.getIndexAttr(1)};
    MemRefType rowType = memref::SubViewOp::inferRankReducedResultType(
        {n}, type, offsets, sizes, strides);
    return memref::SubViewOp::create(e.b, e.loc, rowType, buffer, offsets,
                                     sizes, strides);
  };
  Value tokenCount = k.linear(tokens);
  Value firstToken = e.imul(k.blockId(gpu::Dimension::x), kRouteTokens);
  Value lastToken = arith::SubIOp::create(e.b, e.loc, tokenCount, e.index(1));
  // Tokens past the end read the last one and are chosen for by no one.
  SmallVector<Value> loadRows;
  for (int64_t p = 0; p < kRouteTokens; ++p)
    loadRows.push_back(e.minUI(e.iadd(firstToken, e.index(p)), lastToken));
  Value tid = k.threadId();
  Value warp = e.divUI(tid, 32), lane = e.remUI(tid, 32);
  // Each warp takes `unroll` experts at a time, every kRouteWarps-th group;
  // lanes split the hidden dimension with 16-byte loads and meet through
  // shuffles. Each load of a weight serves every token of the block, each
  // load of a token every expert of the pass.
  int64_t width = vectorWidth(h);
  // Two experts a pass: four would keep 128 f32 accumulators per thread
  // and one block per SM.
  int64_t unroll = experts % (kRouteWarps * 2) == 0 ? 2 : 1;
  auto f32Vec = VectorType::get({width}, f32);
  auto loadVec = [&](Value buffer, ValueRange index) {
    return loadF32Vector(e, buffer, index, width);
  };
  e.forEach(
      e.imul(warp, unroll), e.index(experts),
      [&](Value first) {
        Value zero = arith::ConstantOp::create(
            e.b, e.loc, DenseElementsAttr::get(f32Vec, e.b.getF32FloatAttr(0)));
        SmallVector<Value> xs, init(kRouteTokens * unroll, zero);
        for (int64_t u = 0; u < unroll; ++u)
          xs.push_back(e.iadd(first, e.index(u)));
        // acc[p * unroll + u]: token p, expert u.
        SmallVector<Value> lanes = e.reduce(
            e.imul(lane, width), e.index(h), init,
            [&](Value c, ValueRange acc) -> SmallVector<Value> {
              SmallVector<Value> w, next;
              for (int64_t u = 0; u < unroll; ++u)
                w.push_back(loadVec(weight, {xs[u], c}));
              for (int64_t p = 0; p < kRouteTokens; ++p) {
                Value x = loadVec(hidden, {loadRows[p], c});
                for (int64_t u = 0; u < unroll; ++u)
                  next.push_back(e.add(acc[p * unroll + u], e.mul(x, w[u])));
              }
              return next;
            },
            e.index(32 * width));
        for (int64_t p = 0; p < kRouteTokens; ++p) {
          for (int64_t u = 0; u < unroll; ++u) {
            Value partial = vector::ReductionOp::create(
                e.b, e.loc, vector::CombiningKind::ADD, lanes[p * unroll + u]);
            for (int offset = 16; offset > 0; offset /= 2) {
              Value other = gpu::ShuffleOp::create(e.b, e.loc, partial, offset,
                                                   32, gpu::ShuffleMode::XOR)
                                .getShuffleResult();
              partial = e.add(partial, other);
            }
            Value x = xs[u];
            Value slot = e.index(p);
            e.ifThen(e.eq(lane, e.index(0)), [&] {
              auto [s, choice] =
                  common::expertScore(e, router.getKind(), partial,
                                      bias ? e.load(bias, {x}) : Value());
              e.storeRaw(s, all.score, {slot, x});
              e.storeRaw(choice, all.choice, {slot, x});
            });
          }
        }
      },
      e.index(kRouteWarps * unroll));
  gpu::BarrierOp::create(e.b, e.loc);
  // The first lane of warp p chooses token p's experts.
  Value t = e.iadd(firstToken, warp);
  Value chooses =
      e.andi(e.eq(lane, e.index(0)),
             e.andi(e.ult(warp, e.index(kRouteTokens)), e.ult(t, tokenCount)));
  e.ifThen(chooses, [&] {
    common::RouteScratch mine{row(all.score, warp), row(all.choice, warp),
                              row(all.taken, warp), row(all.groupScore, warp),
                              row(all.groupTaken, warp)};
    common::selectExperts(e, router, experts, topK, mine, ids, weights, t);
  });
  return k.finish(op);
}
