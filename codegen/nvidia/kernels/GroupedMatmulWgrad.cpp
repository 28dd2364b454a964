//===- GroupedMatmulWgrad.cpp - the weight-gradient matmul kernel ---------===//
//
// moe.grouped_matmul_wgrad of bf16 operands on the tensor cores: dW[e] =
// dY_e^T X_e, a contraction over expert e's rows, whose count only the
// device knows. A block computes one [128, tileN] tile of one expert's
// gradient (sm90a::WgradLayout): a producer thread loads 64 rows of both
// operands a stage with TMA, as 64-column chunks of swizzled 128-byte rows,
// and two consumer warpgroups each multiply 64 of the tile's rows with
// wgmma reading both operands MN-major through their descriptors, so
// neither is ever copied transposed. A stage that runs past the expert's
// rows (into the next expert's, or past the buffer) has those rows zeroed
// in shared memory before wgmma reads it. The tile sums every row of the
// expert in f32 and is stored as the result's type (f32, or bf16 rounded
// once); an expert without rows stores zeros.
//
//===----------------------------------------------------------------------===//

#include "codegen/nvidia/kernels/Kernels.h"
#include "codegen/nvidia/kernels/Matmul.h"
#include "codegen/nvidia/support/Hopper.h"
#include "codegen/nvidia/support/Ring.h"

#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::nvidia;

using Layout = sm90a::WgradLayout;
static constexpr int64_t kMaxStages = 4;
// The consumers' threads, and the named barrier that joins them after
// they zero a stage's rows past the expert.
static constexpr int64_t kConsumers = Layout::kWarpGroups * 128;
static constexpr int64_t kZeroedBarrier = 1;

static LogicalResult checkWgrad(GroupedMatmulWgradOp op) {
  Value lhs = op.getLhs();
  if (!lhs || cast<RankedTensorType>(lhs.getType()).getRank() != 2)
    return op.emitOpError()
           << "sums rows without a matrix lhs (a bias's or a routing "
              "weight's gradient), for which sm_90a has no kernel";
  Type grad =
      cast<RankedTensorType>(op.getOutGrad().getType()).getElementType();
  Type left = cast<RankedTensorType>(lhs.getType()).getElementType();
  if (!grad.isBF16() || !left.isBF16())
    return op.emitOpError() << "multiplies " << grad << " by " << left
                            << ": sm_90a's weight-gradient kernel takes bf16 "
                               "operands";
  auto check = [&](StringRef name, Value v) -> LogicalResult {
    int64_t size = cast<RankedTensorType>(v.getType()).getDimSize(1);
    if (size % 8 == 0)
      return success();
    return op.emitOpError()
           << "has " << name << " = " << size
           << ": sm_90a loads both operands with TMA, whose rows must be a "
              "multiple of 16 bytes, so it must be a multiple of 8";
  };
  if (failed(check("N (the output gradient's columns)", op.getOutGrad())) ||
      failed(check("K (the lhs's columns)", lhs)))
    return failure();
  return success();
}

/// The block's tile (f32 fragment `result` of warpgroup g) into `out`
/// ([E, N, K], or [N, K] without an expert), rows below N and columns
/// below K only.
struct TilePlace {
  Value tid, g, mTile, nTile, expert;
};
static void storeTile(Emitter &e, Value result, const TilePlace &at, Value out,
                      const Layout &l, int64_t n, int64_t kDim) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  Type f32 = b.getF32Type();
  Value tid = at.tid, g = at.g, mTile = at.mTile, nTile = at.nTile;
  Value expert = at.expert, outView = out;
  bool grouped = cast<MemRefType>(out.getType()).getRank() == 3;
  // f32, or bf16 (rounded once, from the f32 sums).
  Type element = cast<MemRefType>(out.getType()).getElementType();
  // Fragment element i of lane l in warp w is row 16 w + l / 4 + 8 ((i / 2)
  // % 2), column 8 (i / 4) + 2 (l % 4) + i % 2: pairs of columns.
  Value warp = e.remUI(e.divUI(tid, 32), 4), lane = e.remUI(tid, 32);
  Value rowBase =
      e.iadd(e.iadd(e.imul(mTile, l.tileM), e.imul(g, sm90a::kWgmmaM)),
             e.iadd(e.imul(warp, 16), e.divUI(lane, 4)));
  Value colBase =
      e.iadd(e.imul(nTile, l.tileN), e.imul(e.remUI(lane, 4), e.index(2)));
  auto pairType = VectorType::get({2}, f32);
  for (int64_t rowHalf = 0; rowHalf < 2; ++rowHalf) {
    Value row = e.iadd(rowBase, e.index(rowHalf * 8));
    e.ifThen(e.ult(row, e.index(n)), [&] {
      for (int64_t i = 0; i < l.tileN / 2; i += 2) {
        if ((i / 2) % 2 != rowHalf)
          continue;
        Value col = e.iadd(colBase, e.index((i / 4) * 8));
        auto field = [&](int64_t j) -> Value {
          return LLVM::ExtractValueOp::create(b, loc, result,
                                              ArrayRef<int64_t>{j});
        };
        Value pair = vector::FromElementsOp::create(
            b, loc, pairType, ValueRange{field(i), field(i + 1)});
        if (element != f32)
          pair = arith::TruncFOp::create(b, loc, VectorType::get({2}, element),
                                         pair);
        // K is a multiple of 8: a pair starts in bounds or not at all.
        e.ifThen(e.ult(col, e.index(kDim)), [&] {
          SmallVector<Value> index;
          if (grouped)
            index.push_back(expert);
          index.append({row, col});
          vector::StoreOp::create(b, loc, pair, outView, index, false,
                                  vectorAlign(2, element));
        });
      }
    });
  }
}

LogicalResult nvidia::buildGroupedMatmulWgrad(LayerKernels &layer,
                                              GroupedMatmulWgradOp op) {
  if (failed(checkWgrad(op)))
    return failure();
  int64_t n = cast<RankedTensorType>(op.getOutGrad().getType()).getDimSize(1);
  int64_t kDim = cast<RankedTensorType>(op.getLhs().getType()).getDimSize(1);
  bool grouped = static_cast<bool>(op.getTokensPerExpert());
  int64_t experts =
      grouped ? cast<RankedTensorType>(op.getTokensPerExpert().getType())
                    .getDimSize(0)
              : 1;
  // Copies: define() may grow the map they live in.
  FailureOr<TensorInfo> gradSource = layer.tmaSource(op, op.getOutGrad());
  if (failed(gradSource))
    return failure();
  TensorInfo grad = *gradSource;
  FailureOr<TensorInfo> lhsSource = layer.tmaSource(op, op.getLhs());
  if (failed(lhsSource))
    return failure();
  TensorInfo lhs = *lhsSource;

  Layout l;
  l.tileN = std::min<int64_t>(sm90a::kWgmmaMaxN,
                              llvm::alignTo(kDim, Layout::kChunkColumns));
  l.fit(kMaxStages);
  int64_t mTiles = llvm::divideCeil(n, l.tileM);
  int64_t nTiles = llvm::divideCeil(kDim, l.tileN);
  TensorInfo out = layer.define(op.getOut(), {});
  unsigned mapA =
      layer.plan.addTensorMap(grad.buffer, 2, grad.rowCount(), n,
                              Layout::kSlabRows, Layout::kChunkColumns);
  unsigned mapB =
      layer.plan.addTensorMap(lhs.buffer, 2, lhs.rowCount(), kDim,
                              Layout::kSlabRows, Layout::kChunkColumns);
  SmallVector<unsigned> bufferIndices = {out.buffer};
  TensorInfo countsInfo{}, offsetsInfo{};
  if (grouped) {
    countsInfo = layer.info(op.getTokensPerExpert());
    offsetsInfo = layer.info(op.getExpertOffsets());
    bufferIndices.append({countsInfo.buffer, offsetsInfo.buffer});
  }
  Kernel k =
      layer.kernelOn(op, "grouped_matmul_wgrad", bufferIndices, {mapA, mapB});
  k.launch.work = {experts * mTiles * nTiles, 0};
  k.launch.block = kConsumers + 128;
  k.func.setKnownBlockSizeAttr(
      k.b.getDenseI32ArrayAttr({int32_t(k.launch.block), 1, 1}));
  k.launch.sharedBytes = l.sharedBytes();
  k.launch.accumulators = l.tileN / 2;

  Emitter &e = k.e;
  OpBuilder &b = k.b;
  Location loc = e.loc;
  MLIRContext *ctx = b.getContext();
  Type bf16 = b.getBF16Type(), f32 = b.getF32Type();
  Value outView = k.view(0, out);
  Value counts = grouped ? k.view(1, countsInfo) : Value();
  Value offsets = grouped ? k.view(2, offsetsInfo) : Value();
  auto chunkType = sharedType({Layout::kSlabRows, Layout::kChunkColumns}, bf16);
  auto mapType =
      matmulMapType(ctx, bf16, Layout::kSlabRows, Layout::kChunkColumns);
  Value descA = k.tensorMap(bufferIndices.size(), mapType);
  Value descB = k.tensorMap(bufferIndices.size() + 1, mapType);

  // The block's tile: an expert's (its rows stay in L2), and within it the
  // tiles that share one tile of the operand with more columns next to
  // each other, so that the other, smaller one is what L2 must hold
  // (Mixtral's down wgrad: lhs 4096 x 14336, the gradient 4096 x 4096 an
  // expert; swept the other way, the lhs came from DRAM 32 times).
  Value tid = k.threadId();
  Value id = k.blockId(gpu::Dimension::x);
  Value expert = e.divUI(id, e.index(mTiles * nTiles));
  Value within = e.remUI(id, e.index(mTiles * nTiles));
  bool sweepRows = kDim > n;
  Value mTile = sweepRows ? e.remUI(within, e.index(mTiles))
                          : e.divUI(within, e.index(nTiles));
  Value nTile = sweepRows ? e.divUI(within, e.index(mTiles))
                          : e.remUI(within, e.index(nTiles));
  Value rowStart = e.index(0), rowCount = k.linear(grad.rowCount());
  if (grouped) {
    rowStart = e.toIndex(e.loadRaw(offsets, {expert}));
    rowCount = e.toIndex(e.loadRaw(counts, {expert}));
  }
  Value slabs = e.divUI(e.iadd(rowCount, e.index(Layout::kSlabRows - 1)),
                        e.index(Layout::kSlabRows));

  AlignedShared shared(e);
  Ring ring{shared, l.stages, l.stageBytes()};
  Value full = createBarriers(e, l.stages);
  Value empty = createBarriers(e, l.stages);
  Value leader = e.eq(tid, e.index(0));
  initBarriers(e, leader, l.stages, {{full, 1}, {empty, kConsumers}});
  fenceBarrierInits(e, leader);
  gpu::BarrierOp::create(b, loc);

  auto chunk = [&](Value slot, int64_t c) {
    return ring.view(chunkType, slot, e.index(c * Layout::kChunkBytes));
  };
  auto roles = scf::IfOp::create(b, loc, e.ult(tid, e.index(kConsumers)),
                                 /*withElse=*/true);
  // The producer: one thread keeps the ring full, slab by slab.
  b.setInsertionPointToStart(&roles.getElseRegion().front());
  producerRegisters(e, sm90a::kProducerRegisters);
  e.ifThen(e.eq(tid, e.index(kConsumers)), [&] {
    e.forEach(e.index(0), slabs, [&](Value s) {
      Value slot = ring.slot(s);
      ring.waitReleased(empty, s, slot);
      expectBytes(e, full, l.stageBytes(), slot);
      Value row = e.iadd(rowStart, e.imul(s, Layout::kSlabRows));
      Value aCol = e.imul(mTile, l.tileM), bCol = e.imul(nTile, l.tileN);
      for (int64_t c = 0; c < l.aChunks(); ++c)
        tmaLoad(
            e, chunk(slot, c), full, descA,
            ValueRange{e.iadd(aCol, e.index(c * Layout::kChunkColumns)), row},
            slot);
      for (int64_t c = 0; c < l.bChunks(); ++c)
        tmaLoad(
            e, chunk(slot, l.aChunks() + c), full, descB,
            ValueRange{e.iadd(bCol, e.index(c * Layout::kChunkColumns)), row},
            slot);
    });
  });

  // The consumers: warpgroup g multiplies the tile's rows [64 g, 64 g + 64).
  b.setInsertionPointToStart(&roles.getThenRegion().front());
  consumerRegisters(e, sm90a::kConsumerRegisters);
  SmallVector<Type> fields(l.tileN / 2, f32);
  Type fragment = LLVM::LLVMStructType::getLiteral(ctx, fields);
  Value g = e.divUI(tid, 128);
  auto loop = scf::ForOp::create(b, loc, e.index(0), slabs, e.index(1),
                                 ValueRange{zeroFragment(b, loc, fragment)});
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(loop.getBody());
    Value s = loop.getInductionVar();
    Value acc = loop.getRegionIterArgs()[0];
    Value slot = ring.slot(s);
    waitBarrier(e, full, ring.parity(s, /*released=*/false), slot);
    // The slab's rows past the expert's are zeroed (whole swizzled rows:
    // a row's 16-byte pieces stay within it), then shown to wgmma.
    Value valid = e.minUI(e.isub(rowCount, e.imul(s, Layout::kSlabRows)),
                          e.index(Layout::kSlabRows));
    e.ifThen(e.ult(valid, e.index(Layout::kSlabRows)), [&] {
      auto vecType = VectorType::get({8}, bf16);
      Value zeros = arith::ConstantOp::create(
          b, loc, DenseElementsAttr::get(vecType, b.getZeroAttr(bf16)));
      Value pieces =
          e.imul(e.isub(e.index(Layout::kSlabRows), valid), e.index(8));
      for (int64_t c = 0; c < l.aChunks() + l.bChunks(); ++c) {
        Value view = chunk(slot, c);
        e.forEach(
            tid, pieces,
            [&](Value p) {
              Value r = e.iadd(valid, e.divUI(p, 8));
              Value col = e.imul(e.remUI(p, 8), 8);
              vector::StoreOp::create(b, loc, zeros, view, ValueRange{r, col});
            },
            e.index(kConsumers));
      }
      inlinePtx(b, loc, {}, {}, "fence.proxy.async.shared::cta;", "");
      namedBarrierSync(b, loc, e.i32(kZeroedBarrier), kConsumers);
    });
    Value aAddress = LLVM::AddOp::create(
        b, loc, ring.address(slot, 0),
        arith::IndexCastOp::create(b, loc, b.getI64Type(),
                                   e.imul(g, Layout::kChunkBytes)));
    Value bAddress = ring.address(slot, l.aChunks() * Layout::kChunkBytes);
    NVVM::WgmmaFenceAlignedOp::create(b, loc);
    // k16 steps down the slab's rows: 16 swizzled rows of 128 bytes each;
    // 64-column chunks kChunkBytes apart, 8-row groups 1024 bytes apart.
    int64_t instK = sm90a::wgmmaK(2);
    for (int64_t kk = 0; kk < Layout::kSlabRows / instK; ++kk) {
      auto descriptor = [&](Value address) {
        return swizzledDescriptor(
            b, loc,
            LLVM::AddOp::create(
                b, loc, address,
                k.constI64(kk * instK * sm90a::kTmaSwizzleBytes)),
            Layout::kChunkBytes, 1024);
      };
      acc = wgmma(b, loc, fragment, acc, descriptor(aAddress),
                  descriptor(bAddress), l.tileN, instK, NVVM::WGMMATypes::bf16,
                  /*accumulate=*/true, /*aMNMajor=*/true, /*bMNMajor=*/true);
    }
    NVVM::WgmmaGroupSyncAlignedOp::create(b, loc);
    // The previous slab's wgmma are done: its slot can be refilled.
    NVVM::WgmmaWaitGroupSyncOp::create(b, loc, 1);
    e.ifThen(e.icmp(arith::CmpIPredicate::uge, s, e.index(1)), [&] {
      mbarrierArrive(b, loc, empty, ring.slot(e.isub(s, e.index(1))));
    });
    scf::YieldOp::create(b, loc, acc);
  }
  NVVM::WgmmaWaitGroupSyncOp::create(b, loc, 0);
  Value result = fenceFragment(b, loc, loop.getResult(0));

  storeTile(e, result, {tid, g, mTile, nTile, expert}, outView, l, n, kDim);
  b.setInsertionPointAfter(roles);
  return k.finish(op);
}
