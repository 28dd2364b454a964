//===- GroupedMatmulWgrad.cpp - the weight-gradient matmul kernel ---------===//
//
// moe.grouped_matmul_wgrad of bf16 operands on the tensor cores: dW[e] =
// dY_e^T X_e, a contraction over expert e's rows, whose count only the
// device knows. A block computes one [128, tileN] tile of one expert's
// gradient (sm90a::WgradLayout), and walks such tiles persistently: a
// producer thread loads 64 rows of both operands a stage with TMA, as
// 64-column chunks of swizzled 128-byte rows, running ahead into the next
// tile, and two consumer warpgroups each multiply 64 of the tile's rows
// with wgmma reading both operands MN-major through their descriptors, so
// neither is ever copied transposed. A stage that runs past the expert's
// rows (into the next expert's, or past the buffer) has those rows zeroed
// in shared memory before wgmma reads it. The tile sums every row of the
// expert in f32 and is stored as the result's type (f32, or bf16 rounded
// once) through shared memory by TMA; an expert without rows stores
// zeros.
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
/// Named barriers 2 + g: consumer warpgroup g's epilogue.
static constexpr int64_t kEpilogueBarrier = 2;

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

/// Where a block's tile lies: its expert's rows and its place in the
/// expert's gradient.
struct WgradTile {
  Value expert, mTile, nTile, rowStart, rowCount, slabs;
};

/// Each consumer warpgroup's epilogue: its 64 rows of the tile's f32 sums,
/// 128 bytes of columns at a time, into one of its two buffers (swizzled as
/// TMA reads them), which its leader then stores with TMA. A buffer is
/// refilled once the store before last has read it, so the stores overlap
/// the next chunk's writes, and the last ones the block's next tile.
struct WgradEpilogue {
  Emitter &e;
  AlignedShared &shared;
  const Layout &l;
  Value desc, tid, g;
  Type element;
  bool grouped;

  int64_t elementBytes() const { return element.getIntOrFloatBitWidth() / 8; }
  int64_t chunkColumns() const {
    return sm90a::kTmaSwizzleBytes / elementBytes();
  }
  SmallVector<int64_t> box() const {
    SmallVector<int64_t> box = {sm90a::kWgmmaM, chunkColumns()};
    if (grouped)
      box.insert(box.begin(), 1);
    return box;
  }

  void store(Value result, const WgradTile &at) {
    OpBuilder &b = e.b;
    Location loc = e.loc;
    Value warp = e.remUI(e.divUI(tid, 32), 4), lane = e.remUI(tid, 32);
    Value leader = e.eq(e.remUI(tid, 128), e.index(0));
    Value barrier = e.toI32(e.iadd(g, e.index(kEpilogueBarrier)));
    // Fragment element i of lane l in warp w is row 16 w + l / 4 + 8 ((i /
    // 2) % 2), column 8 (i / 4) + 2 (l % 4) + i % 2: pairs of columns. A
    // buffer row's 16-byte unit u lies at u ^ (row % 8), and row % 8 is
    // l / 4 for both of a thread's rows.
    Value fragmentRow = e.iadd(e.imul(warp, 16), e.divUI(lane, 4));
    Value swizzle = e.divUI(lane, 4);
    int64_t perUnit = 16 / elementBytes(), columns = chunkColumns();
    auto bufferType = sharedType({sm90a::kWgmmaM, columns}, element);
    auto pairType = VectorType::get({2}, element);
    Value row0 = e.iadd(e.imul(at.mTile, l.tileM), e.imul(g, sm90a::kWgmmaM));
    for (int64_t c = 0; c < l.tileN / columns; ++c) {
      int64_t buffer = c % Layout::kEpilogueBuffers;
      Value offset =
          e.index(l.epilogueOffset() + buffer * Layout::kEpilogueBufferBytes);
      offset = e.iadd(offset, e.imul(g, Layout::kEpilogueBuffers *
                                            Layout::kEpilogueBufferBytes));
      // The buffer's last store has read it (the first chunk: every store
      // of the last tile, whichever buffer it took).
      e.ifThen(leader, [&] {
        inlinePtx(b, loc, {}, {},
                  c == 0 ? "cp.async.bulk.wait_group.read 0;"
                         : "cp.async.bulk.wait_group.read 1;",
                  "");
      });
      inlinePtx(b, loc, {}, {barrier}, "bar.sync $0, 128;", "r");
      Value view = shared.view(bufferType, offset);
      for (int64_t i = c * columns / 2; i < (c + 1) * columns / 2; i += 2) {
        auto field = [&](int64_t j) -> Value {
          return LLVM::ExtractValueOp::create(b, loc, result,
                                              ArrayRef<int64_t>{j});
        };
        Value pair = vector::FromElementsOp::create(
            b, loc, VectorType::get({2}, b.getF32Type()),
            ValueRange{field(i), field(i + 1)});
        if (!element.isF32())
          pair = arith::TruncFOp::create(b, loc, pairType, pair);
        Value r = e.iadd(fragmentRow, e.index(((i / 2) % 2) * 8));
        // The pair's column within the chunk, its unit and place there.
        Value col =
            e.iadd(e.index((i / 4) * 8 % columns), e.imul(e.remUI(lane, 4), 2));
        Value unit = e.xori(e.divUI(col, perUnit), swizzle);
        Value at2 = e.iadd(e.imul(unit, perUnit), e.remUI(col, perUnit));
        vector::StoreOp::create(b, loc, pair, view, ValueRange{r, at2}, false,
                                vectorAlign(2, element));
      }
      // The writes reach TMA (the async proxy) once the group is done.
      inlinePtx(b, loc, {}, {}, "fence.proxy.async.shared::cta;", "");
      inlinePtx(b, loc, {}, {barrier}, "bar.sync $0, 128;", "r");
      e.ifThen(leader, [&] {
        // TMA stores only what lies inside the result: rows past N and
        // columns past K stay unwritten.
        SmallVector<Value> coords = {
            e.iadd(e.imul(at.nTile, l.tileN), e.index(c * columns)), row0};
        if (grouped)
          coords.push_back(at.expert);
        nvgpu::TmaAsyncStoreOp::create(
            b, loc, shared.view(sharedType(box(), element), offset), desc,
            coords, Value());
        inlinePtx(b, loc, {}, {}, "cp.async.bulk.commit_group;", "");
      });
    }
  }

  /// The block's last stores are complete before it exits.
  void drain() {
    e.ifThen(e.eq(e.remUI(tid, 128), e.index(0)), [&] {
      inlinePtx(e.b, e.loc, {}, {}, "cp.async.bulk.wait_group 0;", "");
    });
  }
};

/// A stage of the ring: 64 rows of both operands as 64-column chunks.
struct WgradStage {
  Emitter &e;
  Kernel &k;
  const Ring &ring;
  const Layout &l;
  MemRefType chunkType;

  Value chunk(Value slot, int64_t c) const {
    return ring.view(chunkType, slot, e.index(c * Layout::kChunkBytes));
  }

  /// Loads the slab of rows from `row` on: dY's columns from `aCol`, X's
  /// from `bCol`, completing on `full`'s barrier of `slot`.
  void load(Value slot, Value full, Value descA, Value descB, Value row,
            Value aCol, Value bCol) const {
    expectBytes(e, full, l.stageBytes(), slot);
    for (int64_t c = 0; c < l.aChunks(); ++c)
      tmaLoad(e, chunk(slot, c), full, descA,
              ValueRange{e.iadd(aCol, e.index(c * Layout::kChunkColumns)), row},
              slot);
    for (int64_t c = 0; c < l.bChunks(); ++c)
      tmaLoad(e, chunk(slot, l.aChunks() + c), full, descB,
              ValueRange{e.iadd(bCol, e.index(c * Layout::kChunkColumns)), row},
              slot);
  }

  /// Zeroes the slab's rows from `valid` on (whole swizzled rows: a row's
  /// 16-byte pieces stay within it) and shows them to wgmma.
  void zeroPastRows(Value slot, Value valid, Value tid) const {
    OpBuilder &b = e.b;
    Location loc = e.loc;
    Type bf16 = b.getBF16Type();
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
  }

  /// Warpgroup g's wgmma over the slab in `slot`, into `acc`.
  Value multiply(Value acc, Value slot, Value g, Type fragment) const {
    OpBuilder &b = e.b;
    Location loc = e.loc;
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
    return acc;
  }
};

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
  int64_t tiles = experts * mTiles * nTiles;
  TensorInfo out = layer.define(op.getOut(), {});
  Type outElement =
      cast<RankedTensorType>(op.getOut().getType()).getElementType();
  int64_t outBytes = outElement.getIntOrFloatBitWidth() / 8;
  unsigned mapA =
      layer.plan.addTensorMap(grad.buffer, 2, grad.rowCount(), n,
                              Layout::kSlabRows, Layout::kChunkColumns);
  unsigned mapB =
      layer.plan.addTensorMap(lhs.buffer, 2, lhs.rowCount(), kDim,
                              Layout::kSlabRows, Layout::kChunkColumns);
  // The result as [E][N][K], a box a warpgroup's 64 rows by 128 bytes.
  SmallVector<int64_t> outer;
  if (grouped)
    outer = {experts, n * kDim, 1};
  unsigned mapOut = layer.plan.addTensorMap(
      out.buffer, outBytes, n, kDim, kDim, sm90a::kWgmmaM,
      sm90a::kTmaSwizzleBytes / outBytes, outer);
  SmallVector<unsigned> bufferIndices = {out.buffer};
  TensorInfo countsInfo{}, offsetsInfo{};
  if (grouped) {
    countsInfo = layer.info(op.getTokensPerExpert());
    offsetsInfo = layer.info(op.getExpertOffsets());
    bufferIndices.append({countsInfo.buffer, offsetsInfo.buffer});
  }
  Kernel k = layer.kernelOn(op, "grouped_matmul_wgrad", bufferIndices,
                            {mapA, mapB, mapOut});
  // Persistent: a block walks tiles, its producer loading the next tile's
  // rows while its consumers finish and store the last one (an expert of
  // few rows makes short tiles, which a block per tile spent mostly filling
  // its ring and storing).
  k.launch.work = {tiles, 0};
  k.launch.persistent = true;
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
  Value counts = grouped ? k.view(1, countsInfo) : Value();
  Value offsets = grouped ? k.view(2, offsetsInfo) : Value();
  auto chunkType = sharedType({Layout::kSlabRows, Layout::kChunkColumns}, bf16);
  auto mapType =
      matmulMapType(ctx, bf16, Layout::kSlabRows, Layout::kChunkColumns);
  Value descA = k.tensorMap(bufferIndices.size(), mapType);
  Value descB = k.tensorMap(bufferIndices.size() + 1, mapType);
  Value tid = k.threadId();

  // Tile t: an expert's (its rows stay in L2), and within it the tiles
  // that share one tile of the operand with more columns next to each
  // other, so that the other, smaller one is what L2 must hold (Mixtral's
  // down wgrad: lhs 4096 x 14336, the gradient 4096 x 4096 an expert;
  // swept the other way, the lhs came from DRAM 32 times).
  bool sweepRows = kDim > n;
  auto tileAt = [&](Value t) {
    WgradTile at;
    at.expert = e.divUI(t, e.index(mTiles * nTiles));
    Value within = e.remUI(t, e.index(mTiles * nTiles));
    at.mTile = sweepRows ? e.remUI(within, e.index(mTiles))
                         : e.divUI(within, e.index(nTiles));
    at.nTile = sweepRows ? e.divUI(within, e.index(mTiles))
                         : e.remUI(within, e.index(nTiles));
    at.rowStart = e.index(0);
    at.rowCount = k.linear(grad.rowCount());
    if (grouped) {
      at.rowStart = e.toIndex(e.loadRaw(offsets, {at.expert}));
      at.rowCount = e.toIndex(e.loadRaw(counts, {at.expert}));
    }
    at.slabs = e.divUI(e.iadd(at.rowCount, e.index(Layout::kSlabRows - 1)),
                       e.index(Layout::kSlabRows));
    return at;
  };
  // The producer and the consumers walk the same tiles from ring stage 0,
  // so their stages agree: `body` gets the tile and its first stage and
  // returns the stage after it.
  auto walkTiles = [&](function_ref<void(const WgradTile &, Value)> body) {
    auto loop =
        scf::ForOp::create(b, loc, k.blockId(gpu::Dimension::x), e.index(tiles),
                           gpu::GridDimOp::create(b, loc, gpu::Dimension::x),
                           ValueRange{e.index(0)});
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(loop.getBody());
    WgradTile at = tileAt(loop.getInductionVar());
    Value first = loop.getRegionIterArgs()[0];
    body(at, first);
    scf::YieldOp::create(b, loc, e.iadd(first, at.slabs));
  };

  AlignedShared shared(e);
  Ring ring{shared, l.stages, l.stageBytes()};
  Value full = createBarriers(e, l.stages);
  Value empty = createBarriers(e, l.stages);
  Value leader = e.eq(tid, e.index(0));
  initBarriers(e, leader, l.stages, {{full, 1}, {empty, kConsumers}});
  fenceBarrierInits(e, leader);
  gpu::BarrierOp::create(b, loc);

  WgradStage stages{e, k, ring, l, chunkType};
  auto roles = scf::IfOp::create(b, loc, e.ult(tid, e.index(kConsumers)),
                                 /*withElse=*/true);
  // The producer: one thread keeps the ring full, slab by slab, tile by
  // tile.
  b.setInsertionPointToStart(&roles.getElseRegion().front());
  producerRegisters(e, sm90a::kProducerRegisters);
  e.ifThen(e.eq(tid, e.index(kConsumers)), [&] {
    walkTiles([&](const WgradTile &at, Value first) {
      e.forEach(e.index(0), at.slabs, [&](Value s) {
        Value stage = e.iadd(first, s);
        Value slot = ring.slot(stage);
        ring.waitReleased(empty, stage, slot);
        stages.load(slot, full, descA, descB,
                    e.iadd(at.rowStart, e.imul(s, Layout::kSlabRows)),
                    e.imul(at.mTile, l.tileM), e.imul(at.nTile, l.tileN));
      });
    });
  });

  // The consumers: warpgroup g multiplies the tile's rows [64 g, 64 g + 64).
  b.setInsertionPointToStart(&roles.getThenRegion().front());
  consumerRegisters(e, sm90a::kConsumerRegisters);
  SmallVector<Type> fields(l.tileN / 2, f32);
  Type fragment = LLVM::LLVMStructType::getLiteral(ctx, fields);
  Value g = e.divUI(tid, 128);
  WgradEpilogue epilogue{e, shared, l, Value(), tid, g, outElement, grouped};
  epilogue.desc = k.tensorMap(bufferIndices.size() + 2,
                              matmulMapType(ctx, outElement, epilogue.box()));
  walkTiles([&](const WgradTile &at, Value first) {
    auto loop = scf::ForOp::create(b, loc, e.index(0), at.slabs, e.index(1),
                                   ValueRange{zeroFragment(b, loc, fragment)});
    {
      OpBuilder::InsertionGuard guard(b);
      b.setInsertionPointToStart(loop.getBody());
      Value s = loop.getInductionVar();
      Value stage = e.iadd(first, s);
      Value acc = loop.getRegionIterArgs()[0];
      Value slot = ring.slot(stage);
      waitBarrier(e, full, ring.parity(stage, /*released=*/false), slot);
      // The slab's rows past the expert's are zeroed.
      Value valid = e.minUI(e.isub(at.rowCount, e.imul(s, Layout::kSlabRows)),
                            e.index(Layout::kSlabRows));
      e.ifThen(e.ult(valid, e.index(Layout::kSlabRows)),
               [&] { stages.zeroPastRows(slot, valid, tid); });
      acc = stages.multiply(acc, slot, g, fragment);
      // The previous slab's wgmma are done: its slot can be refilled.
      NVVM::WgmmaWaitGroupSyncOp::create(b, loc, 1);
      e.ifThen(e.icmp(arith::CmpIPredicate::uge, s, e.index(1)), [&] {
        mbarrierArrive(b, loc, empty, ring.slot(e.isub(stage, e.index(1))));
      });
      scf::YieldOp::create(b, loc, acc);
    }
    NVVM::WgmmaWaitGroupSyncOp::create(b, loc, 0);
    // The tile's last slot too, for the producer's next tile.
    e.ifThen(e.ult(e.index(0), at.slabs), [&] {
      mbarrierArrive(b, loc, empty,
                     ring.slot(e.isub(e.iadd(first, at.slabs), e.index(1))));
    });
    epilogue.store(fenceFragment(b, loc, loop.getResult(0)), at);
  });
  epilogue.drain();
  b.setInsertionPointAfter(roles);
  return k.finish(op);
}
