//===- Matmul.cpp - what the grouped matmul's two kernels share -----------===//

#include "codegen/nvidia/kernels/Matmul.h"
#include "codegen/nvidia/support/Hopper.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::nvidia;

namespace {
/// A warp's lanes over the experts, a run of `per` each: their counts and
/// tiles of `tileM` rows (findTile, countTiles).
struct LaneExperts {
  LaneExperts(Emitter &e, Value tid, Value counts, int64_t experts,
              int64_t tileM)
      : e(e), counts(counts), experts(experts), tileM(tileM),
        per(llvm::divideCeil(experts, int64_t(32))),
        lane(e.toI32(e.remUI(tid, 32))),
        first(arith::MulIOp::create(e.b, e.loc, lane, e.i32(per))) {}
  /// Expert `first + j`, clamped to the last (for its loads).
  Value clamped(Value j) {
    Value x = e.iadd(first, j);
    return e.toIndex(e.select(inside(x), x, e.i32(experts - 1)));
  }
  Value inside(Value x) {
    return e.icmp(arith::CmpIPredicate::slt, x, e.i32(experts));
  }
  /// Expert `first + j`'s count, zero past the last expert.
  Value countAt(Value j) {
    return e.select(inside(e.iadd(first, j)), e.loadRaw(counts, {clamped(j)}),
                    e.i32(0));
  }
  Value tilesOf(Value count) {
    return arith::CeilDivUIOp::create(e.b, e.loc, count, e.i32(tileM))
        .getResult();
  }
  /// This lane's tiles; the loads are independent, so they overlap.
  Value mine() {
    return e.reduce(
        e.i32(0), e.i32(per), {e.i32(0)},
        [&](Value j, ValueRange acc) -> SmallVector<Value> {
          return {e.iadd(acc[0], tilesOf(countAt(j)))};
        },
        e.i32(1))[0];
  }

  Emitter &e;
  Value counts;
  int64_t experts, tileM, per;
  Value lane, first;
};
} // namespace

// Summed by every warp for itself: each lane its run of experts, then a
// butterfly over the lanes.
Value nvidia::countTiles(Emitter &e, Value tid, Value counts, int64_t experts,
                         int64_t tileM) {
  Value total = LaneExperts(e, tid, counts, experts, tileM).mine();
  for (int64_t offset = 16; offset >= 1; offset /= 2)
    total = e.iadd(total, gpu::ShuffleOp::create(e.b, e.loc, total, offset, 32,
                                                 gpu::ShuffleMode::XOR)
                              .getShuffleResult());
  return e.toIndex(total);
}

// Every warp finds its tile on its own, its lanes each summing the tiles of
// a run of experts and meeting through shuffles, so a block waits for one
// round of loads rather than one per expert.
SmallVector<Value> nvidia::findTile(Emitter &e, Value tid, Value counts,
                                    Value offsets, int64_t experts,
                                    int64_t tileM, Value target) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  LaneExperts lanes(e, tid, counts, experts, tileM);
  Value lane = lanes.lane, first = lanes.first;
  int64_t per = lanes.per;
  Value mine = lanes.mine();
  // Inclusive prefix over the lanes.
  Value inclusive = mine;
  for (int64_t offset = 1; offset < 32; offset *= 2) {
    Value other = gpu::ShuffleOp::create(b, loc, inclusive, offset, 32,
                                         gpu::ShuffleMode::UP)
                      .getShuffleResult();
    inclusive = e.select(e.icmp(arith::CmpIPredicate::sge, lane, e.i32(offset)),
                         e.iadd(inclusive, other), inclusive);
  }
  Value seen0 = arith::SubIOp::create(b, loc, inclusive, mine);
  // The lane whose experts hold the tile walks them; the others give
  // (-1, 0, 0) and the warp takes the maxima.
  auto walk = e.reduce(
      e.i32(0), e.i32(per), {e.i32(-1), e.i32(0), e.i32(0), seen0},
      [&](Value j, ValueRange acc) -> SmallVector<Value> {
        Value c = lanes.countAt(j), seen = acc[3];
        Value x = e.iadd(first, j);
        Value tiles = lanes.tilesOf(c);
        Value into = arith::SubIOp::create(b, loc, target, seen);
        Value here =
            e.andi(e.icmp(arith::CmpIPredicate::slt, acc[0], e.i32(0)),
                   e.andi(e.icmp(arith::CmpIPredicate::sge, into, e.i32(0)),
                          e.icmp(arith::CmpIPredicate::slt, into, tiles)));
        Value offset = e.loadRaw(offsets, {lanes.clamped(j)});
        Value start =
            e.iadd(offset, arith::MulIOp::create(b, loc, into, e.i32(tileM)));
        return {e.select(here, x, acc[0]), e.select(here, start, acc[1]),
                e.select(here, e.iadd(offset, c), acc[2]), e.iadd(seen, tiles)};
      },
      e.i32(1));
  SmallVector<Value> result = {walk[0], walk[1], walk[2]};
  for (Value &v : result)
    for (int64_t offset = 16; offset > 0; offset /= 2) {
      Value other =
          gpu::ShuffleOp::create(b, loc, v, offset, 32, gpu::ShuffleMode::XOR)
              .getShuffleResult();
      v = arith::MaxSIOp::create(b, loc, v, other);
    }
  return result;
}

nvgpu::TensorMapDescriptorType nvidia::matmulMapType(MLIRContext *ctx,
                                                     Type element, int64_t rows,
                                                     int64_t tileK) {
  return matmulMapType(ctx, element, {rows, tileK});
}

nvgpu::TensorMapDescriptorType
nvidia::matmulMapType(MLIRContext *ctx, Type element, ArrayRef<int64_t> box) {
  auto tile = MemRefType::get(
      box, element, MemRefLayoutAttrInterface(),
      gpu::AddressSpaceAttr::get(ctx, gpu::AddressSpace::Workgroup));
  // A box's rows are one swizzle span (the runtime encodes the same).
  bool half = box.back() * element.getIntOrFloatBitWidth() == 64 * 8;
  return nvgpu::TensorMapDescriptorType::get(
      ctx, tile,
      half ? nvgpu::TensorMapSwizzleKind::SWIZZLE_64B
           : nvgpu::TensorMapSwizzleKind::SWIZZLE_128B,
      nvgpu::TensorMapL2PromoKind::L2PROMO_128B,
      nvgpu::TensorMapOOBKind::OOB_ZERO,
      nvgpu::TensorMapInterleaveKind::INTERLEAVE_NONE);
}

MatmulViews::MatmulViews(LayerKernels &layer, GroupedMatmulOp op,
                         const MatmulConfig &c, Kernel &k,
                         ArrayRef<Value> buffers) {
  auto view = [&](Value tensor) {
    return k.view(llvm::find(buffers, tensor) - buffers.begin(),
                  layer.info(tensor));
  };
  out = view(op.getOut());
  counts = c.grouped ? view(op.getTokensPerExpert()) : Value();
  offsets = c.grouped ? view(op.getExpertOffsets()) : Value();
  bias = op.getBias() ? view(op.getBias()) : Value();
  lhsScale = c.enc.fp8() ? view(op.getLhsScale()) : Value();
  rhsScale = c.enc.fp8() ? view(op.getRhsScale()) : Value();
  outScale = c.outBlock ? view(op.getOutScale()) : Value();
  auto optional = [&](Value tensor) { return tensor ? view(tensor) : Value(); };
  activationInput = optional(op.getActivationInput());
  rowWeights = optional(op.getRowWeights());
  rowTerm = optional(op.getRowTerm());
  rowDots = optional(op.getRowDots());
}

SmallVector<Value> nvidia::splitPartialAt(Kernel &k, TokenLinear rows,
                                          Value split, Value row, Value wr) {
  Emitter &e = k.e;
  return SmallVector<Value>{e.iadd(e.imul(split, k.linear(rows)), row), wr};
}

void nvidia::enterLastSplit(Kernel &k, Value tid, Value counters, Value tile,
                            int64_t splits,
                            function_ref<void()> consumerBarrier) {
  Emitter &e = k.e;
  OpBuilder &b = k.b;
  Value ticket = k.workgroupBuffer({1}, b.getI32Type());
  auto fence = [&] { inlinePtx(b, e.loc, {}, {}, "fence.acq_rel.gpu;", ""); };
  fence();
  consumerBarrier();
  e.ifThen(e.eq(tid, e.index(0)), [&] {
    Value counter = LLVM::GEPOp::create(
        b, e.loc, LLVM::LLVMPointerType::get(b.getContext()), b.getI32Type(),
        counters,
        ValueRange{arith::IndexCastOp::create(b, e.loc, b.getI64Type(), tile)});
    Value before =
        LLVM::AtomicRMWOp::create(b, e.loc, LLVM::AtomicBinOp::add, counter,
                                  e.i32(1), LLVM::AtomicOrdering::acq_rel);
    memref::StoreOp::create(
        b, e.loc, arith::SubIOp::create(b, e.loc, before, e.toI32(k.tokens)),
        ticket, ValueRange{e.index(0)});
  });
  consumerBarrier();
  Value last =
      e.eq(memref::LoadOp::create(b, e.loc, ticket, ValueRange{e.index(0)}),
           e.i32(splits - 1));
  auto lastOnly = scf::IfOp::create(b, e.loc, last, /*withElse=*/false);
  b.setInsertionPointToStart(&lastOnly.getThenRegion().front());
  fence();
}

SmallVector<Value> nvidia::sumSplits(Kernel &k, Value partials,
                                     TokenLinear rows, int64_t splits,
                                     Value split, ArrayRef<Value> mine,
                                     ArrayRef<std::pair<Value, Value>> at) {
  Emitter &e = k.e;
  // Split s's term of element j: this block's own, or the stored partial.
  auto term = [&](Value s, size_t j) {
    Value theirs = memref::LoadOp::create(
        k.b, e.loc, partials,
        splitPartialAt(k, rows, s, at[j].first, at[j].second));
    return e.select(e.eq(split, s), mine[j], theirs);
  };
  SmallVector<Value> totals;
  for (size_t j = 0; j < mine.size(); ++j)
    totals.push_back(term(e.index(0), j));
  if (splits == 1)
    return totals;
  auto loop = scf::ForOp::create(k.b, e.loc, e.index(1), e.index(splits),
                                 e.index(1), totals);
  OpBuilder::InsertionGuard guard(k.b);
  k.b.setInsertionPointToStart(loop.getBody());
  SmallVector<Value> next;
  for (size_t j = 0; j < mine.size(); ++j)
    next.push_back(
        e.add(loop.getRegionIterArgs()[j], term(loop.getInductionVar(), j)));
  scf::YieldOp::create(k.b, e.loc, next);
  return SmallVector<Value>(loop.getResults());
}
