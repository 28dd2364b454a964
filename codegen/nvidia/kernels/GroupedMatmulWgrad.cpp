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

#include "codegen/common/FP8.h"
#include "codegen/common/Numerics.h"

#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"

#include <array>
#include <functional>

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
/// expert's gradient. The expert's rows start at `firstRow` of the bf16
/// operands, or at `firstBlock` of the E4M3 codes' 128-row blocks; a kernel
/// sets the one it reads.
struct WgradTile {
  Value expert, mTile, nTile, firstRow, firstBlock, rowCount, slabs;
};

/// A block's walk over the persistent grid's tiles. Tile t is an expert's
/// (its rows stay in L2), and within it the tiles that share one tile of
/// the operand with more columns lie next to each other, so that the other,
/// smaller one is what L2 must hold (Mixtral's down wgrad: lhs 4096 x
/// 14336, the gradient 4096 x 4096 an expert; swept the other way, the lhs
/// came from DRAM 32 times).
struct WgradTiles {
  Kernel &k;
  int64_t mTiles, nTiles, tiles, slabRows;
  bool sweepRows;
  /// Sets the tile's start and row count from its expert.
  std::function<void(WgradTile &)> expertRows;

  WgradTile at(Value t) const {
    Emitter &e = k.e;
    WgradTile at;
    at.expert = e.divUI(t, e.index(mTiles * nTiles));
    Value within = e.remUI(t, e.index(mTiles * nTiles));
    at.mTile = sweepRows ? e.remUI(within, e.index(mTiles))
                         : e.divUI(within, e.index(nTiles));
    at.nTile = sweepRows ? e.divUI(within, e.index(mTiles))
                         : e.remUI(within, e.index(nTiles));
    expertRows(at);
    at.slabs =
        e.divUI(e.iadd(at.rowCount, e.index(slabRows - 1)), e.index(slabRows));
    return at;
  }

  /// The producer and the consumers walk the same tiles from ring stage 0,
  /// so their stages agree: `body` gets the tile and its first stage.
  void walk(function_ref<void(const WgradTile &, Value)> body) const {
    OpBuilder &b = k.b;
    Location loc = k.e.loc;
    auto loop = scf::ForOp::create(
        b, loc, k.blockId(gpu::Dimension::x), k.e.index(tiles),
        gpu::GridDimOp::create(b, loc, gpu::Dimension::x),
        ValueRange{k.e.index(0)});
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(loop.getBody());
    WgradTile tile = at(loop.getInductionVar());
    Value first = loop.getRegionIterArgs()[0];
    body(tile, first);
    scf::YieldOp::create(b, loc, k.e.iadd(first, tile.slabs));
  }
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

static LogicalResult buildQuantizedWgrad(LayerKernels &layer,
                                         GroupedMatmulWgradOp op);

LogicalResult nvidia::buildGroupedMatmulWgrad(LayerKernels &layer,
                                              GroupedMatmulWgradOp op) {
  if (op.getQuant())
    return buildQuantizedWgrad(layer, op);
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

  WgradTiles walker{k,
                    mTiles,
                    nTiles,
                    tiles,
                    Layout::kSlabRows,
                    kDim > n,
                    [&](WgradTile &at) {
                      at.firstRow = e.index(0);
                      at.rowCount = k.linear(grad.rowCount());
                      if (grouped) {
                        at.firstRow =
                            e.toIndex(e.loadRaw(offsets, {at.expert}));
                        at.rowCount = e.toIndex(e.loadRaw(counts, {at.expert}));
                      }
                    }};
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
    walker.walk([&](const WgradTile &at, Value first) {
      e.forEach(e.index(0), at.slabs, [&](Value s) {
        Value stage = e.iadd(first, s);
        Value slot = ring.slot(stage);
        ring.waitReleased(empty, stage, slot);
        stages.load(slot, full, descA, descB,
                    e.iadd(at.firstRow, e.imul(s, Layout::kSlabRows)),
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
  walker.walk([&](const WgradTile &at, Value first) {
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

//===----------------------------------------------------------------------===//
// In E4M3 (quant = fp8_block128)
//===----------------------------------------------------------------------===//
//
// FP8 wgmma reads both operands K-major, and K is the rows here. So each
// operand is first quantized into blocks of 128 of an expert's rows, a
// kernel a block: each block is a [columns, 128] matrix of codes (a
// column's 128 rows in one 128-byte row) with one f32 scale a column, and
// rows past the expert's are zero. The matmul then loads one block of both
// operands a stage with TMA, multiplies it into a fresh fragment and
// promotes that: acc += partial x row scale x column scale, the two
// consumer warpgroups taking turns to issue so one promotes while the
// other's wgmma runs.

static constexpr int64_t kBlockRows = 128;
/// Named barriers 4 + g: consumer warpgroup g's turn to issue.
static constexpr int64_t kTurnBarrier = 4;

namespace {
/// Where an operand's blocks live: codes [blocks x columns, 128] (i8) and
/// scales [blocks x columns] (f32), block b's column c at b x columns + c.
/// Blocks are numbered expert by expert.
struct RowBlocks {
  TensorInfo codes, scales;
  int64_t columns;
};
} // namespace

/// Workspace for the blocks of an operand of `rows` rows and `columns`
/// columns: each expert's last block may be partial, so there are at most
/// rows / 128 + experts + 1.
static RowBlocks rowBlocks(LayerKernels &layer, MLIRContext *ctx,
                           TokenLinear rows, int64_t columns, int64_t experts) {
  TokenLinear entries;
  entries.fixed = llvm::divideCeil(rows.fixed * columns, kBlockRows) +
                  columns * (experts + 1);
  entries.perToken = llvm::divideCeil(rows.perToken * columns, kBlockRows);
  RowBlocks blocks;
  blocks.columns = columns;
  blocks.codes = TensorInfo{layer.plan.addWorkspace(entries * kBlockRows),
                            MemRefType::get({ShapedType::kDynamic, kBlockRows},
                                            IntegerType::get(ctx, 8)),
                            entries};
  blocks.scales = TensorInfo{
      layer.plan.addWorkspace(entries * 4),
      MemRefType::get({ShapedType::kDynamic}, Float32Type::get(ctx)), entries};
  return blocks;
}

/// The first block of `expert`: those before it take ceil(count / 128)
/// each.
static Value firstBlockOf(Emitter &e, Value counts, Value expert) {
  return e.reduce(e.index(0), expert, {e.index(0)},
                  [&](Value x, ValueRange acc) -> SmallVector<Value> {
                    Value c = e.toIndex(e.loadRaw(counts, {x}));
                    return {e.iadd(acc[0], e.divUI(e.iadd(c, e.index(127)),
                                                   e.index(kBlockRows)))};
                  })[0];
}

/// Pure inline PTX of one 32-bit result from 32-bit operands: LLVM may CSE
/// and move it.
static Value pureAsm32(Emitter &e, StringRef asmText, StringRef constraints,
                       ValueRange operands) {
  return LLVM::InlineAsmOp::create(
             e.b, e.loc, e.b.getI32Type(), operands, asmText, constraints,
             /*has_side_effects=*/false, /*is_align_stack=*/false,
             LLVM::tailcallkind::TailCallKind::None, LLVM::AsmDialectAttr(),
             ArrayAttr())
      .getResult(0);
}

/// The two f32 values of a 32-bit word of two bf16 (low half first).
static std::array<Value, 2> unpackBf16Pair(Emitter &e, Value word) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  Type f32 = b.getF32Type();
  Value lo = arith::ShLIOp::create(b, loc, word, e.i32(16));
  Value hi = arith::AndIOp::create(
      b, loc, word,
      arith::ConstantIntOp::create(b, loc, b.getI32Type(), 0xFFFF0000));
  return {arith::BitcastOp::create(b, loc, f32, lo).getResult(),
          arith::BitcastOp::create(b, loc, f32, hi).getResult()};
}

/// The two f32 values of a 32-bit word of two f16 (low half first).
static std::array<Value, 2> unpackF16Pair(Emitter &e, Value word) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  Value f16s = vector::BitCastOp::create(
      b, loc, VectorType::get({2}, b.getF16Type()),
      vector::BroadcastOp::create(b, loc, VectorType::get({1}, b.getI32Type()),
                                  word));
  std::array<Value, 2> out;
  for (int64_t i = 0; i < 2; ++i)
    out[i] = arith::ExtFOp::create(
        b, loc, b.getF32Type(),
        vector::ExtractOp::create(b, loc, f16s, i).getResult());
  return out;
}

/// The E4M3 codes of `lo` and `hi` as one 16-bit pair (lo's the low byte),
/// as encodeE4M3 gives each: one conversion of both, and encodeE4M3's own
/// path where either is NaN (its sign kept).
static Value encodeE4M3Pair(Emitter &e, Value lo, Value hi) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  Type i16 = b.getI16Type();
  Value anyNan =
      arith::CmpFOp::create(b, loc, arith::CmpFPredicate::UNO, lo, hi);
  auto branch = scf::IfOp::create(b, loc, TypeRange{i16}, anyNan,
                                  /*withElse=*/true);
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(&branch.getThenRegion().front());
    Value l = arith::ExtUIOp::create(b, loc, i16, encodeE4M3(e, lo));
    Value h = arith::ExtUIOp::create(b, loc, i16, encodeE4M3(e, hi));
    Value pair = arith::OrIOp::create(
        b, loc, l,
        arith::ShLIOp::create(b, loc, h,
                              arith::ConstantIntOp::create(b, loc, i16, 8)));
    scf::YieldOp::create(b, loc, pair);
    b.setInsertionPointToStart(&branch.getElseRegion().front());
    Value both = NVVM::ConvertF32x2ToF8x2Op::create(
        b, loc, i16, hi, lo, NVVM::FPRoundingMode::RN,
        NVVM::SaturationMode::SATFINITE, false, b.getType<Float8E4M3FNType>());
    scf::YieldOp::create(b, loc, both);
  }
  return branch.getResult(0);
}

/// The scales of a chunk's columns from each thread's largest magnitudes
/// (`amax`, one a column of the thread's): the warp's rows by shuffles
/// (lanes l, l ^ 4, l ^ 8, ... hold a column's other rows), then every
/// warp's through shared memory (`partials`, [chunk parity][row warp]
/// [column], so a chunk's writes never meet the last one's reads).
static SmallVector<common::BlockScale>
columnScales(Emitter &e, QuantAttr quant, SmallVector<Value> amax, Value chunk,
             Value partials, Value rowWarp, Value columnInChunk,
             int64_t rowWarps) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  Value parity = e.remUI(chunk, e.index(2));
  for (size_t j = 0; j < amax.size(); ++j) {
    for (int64_t offset = 4; offset < 32; offset *= 2)
      amax[j] = arith::MaxNumFOp::create(
          b, loc, amax[j],
          gpu::ShuffleOp::create(b, loc, amax[j], offset, 32,
                                 gpu::ShuffleMode::XOR)
              .getShuffleResult());
    memref::StoreOp::create(
        b, loc, amax[j], partials,
        ValueRange{parity, rowWarp, e.iadd(columnInChunk, e.index(j))});
  }
  gpu::BarrierOp::create(b, loc);
  SmallVector<common::BlockScale> scales;
  for (size_t j = 0; j < amax.size(); ++j) {
    Value c = e.iadd(columnInChunk, e.index(j)), both = amax[j];
    for (int64_t q = 0; q < rowWarps; ++q)
      both = arith::MaxNumFOp::create(
          b, loc, both,
          memref::LoadOp::create(b, loc, partials,
                                 ValueRange{parity, e.index(q), c}));
    scales.push_back(common::blockScale(e, quant, both, e.f32(0.0)));
  }
  return scales;
}

/// One 128-column chunk of a block whose rows are whole 16-byte (bf16) or
/// 8-byte (E4M3) vectors. A thread keeps its rows packed (two values a
/// register: bf16 as loaded, E4M3 decoded to f16 pairs, each row's scale
/// zero past the expert's rows), so four blocks fit a multiprocessor rather
/// than one: the unpacked f32 values took 144 registers.
struct RowBlockChunk {
  Kernel &k;
  QuantAttr quant;
  Value in, inScales, codes, scales, partials;
  int64_t columns, rows, rowWarps;
  Value block, rowStart, valid, lastRow, firstRow, columnInChunk, rowWarp;

  static constexpr int64_t kWidth = 8;

  /// A row's pair of values, zero past the expert's rows.
  Value maskedPair(Value rowOk, Value word) const {
    return k.e.select(rowOk, word, k.e.i32(0));
  }

  void emit(Value chunk) const {
    Emitter &e = k.e;
    OpBuilder &b = k.b;
    Location loc = e.loc;
    Type i8 = b.getI8Type(), i32 = b.getI32Type();
    Value col0 = e.iadd(e.imul(chunk, e.index(128)), columnInChunk);
    Value at = e.minUI(col0, e.index(columns - kWidth));
    // words[i][q]: row firstRow + i, columns col0 + 2q and 2q + 1.
    SmallVector<SmallVector<Value>> words(rows);
    SmallVector<Value> rowScales(rows);
    for (int64_t i = 0; i < rows; ++i) {
      Value r = e.iadd(firstRow, e.index(i));
      Value row = e.minUI(e.iadd(rowStart, r), lastRow);
      Value rowOk = e.ult(r, valid);
      if (inScales) {
        // Aligned: one 8-byte load, not eight of a byte.
        Value raw = vector::BitCastOp::create(
            b, loc, VectorType::get({2}, i32),
            vector::LoadOp::create(b, loc, VectorType::get({kWidth}, i8), in,
                                   ValueRange{row, at}, false,
                                   vectorAlign(kWidth, i8)));
        Value scale =
            common::loadScale(e, inScales,
                              {row, e.divUI(e.minUI(col0, e.index(columns - 1)),
                                            e.index(kBlockRows))});
        rowScales[i] = e.select(rowOk, scale, e.f32(0.0));
        for (int64_t q = 0; q < 2; ++q) {
          Value four = vector::ExtractOp::create(b, loc, raw, q);
          for (int64_t h = 0; h < 2; ++h)
            words[i].push_back(maskedPair(
                rowOk,
                pureAsm32(e,
                          h == 0 ? "{ .reg .b16 l, u; mov.b32 {l, u}, $1; "
                                   "cvt.rn.f16x2.e4m3x2 $0, l; }"
                                 : "{ .reg .b16 l, u; mov.b32 {l, u}, $1; "
                                   "cvt.rn.f16x2.e4m3x2 $0, u; }",
                          "=r,r", {four})));
        }
      } else {
        Value raw = vector::BitCastOp::create(
            b, loc, VectorType::get({kWidth / 2}, i32),
            vector::LoadOp::create(b, loc,
                                   VectorType::get({kWidth}, b.getBF16Type()),
                                   in, ValueRange{row, at}, false,
                                   vectorAlign(kWidth, b.getBF16Type())));
        for (int64_t q = 0; q < kWidth / 2; ++q)
          words[i].push_back(
              maskedPair(rowOk, vector::ExtractOp::create(b, loc, raw, q)));
      }
    }
    // Each column's largest magnitude over the thread's rows: bf16 pairs
    // compared packed (their signs cleared); E4M3 rows scaled first.
    SmallVector<Value> amax(kWidth, e.f32(0.0));
    if (inScales) {
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t q = 0; q < kWidth / 2; ++q) {
          std::array<Value, 2> v = unpackF16Pair(e, words[i][q]);
          for (int64_t h = 0; h < 2; ++h)
            amax[2 * q + h] = arith::MaxNumFOp::create(
                b, loc, amax[2 * q + h],
                math::AbsFOp::create(b, loc, e.mul(v[h], rowScales[i])));
        }
    } else {
      for (int64_t q = 0; q < kWidth / 2; ++q) {
        Value m = e.i32(0);
        for (int64_t i = 0; i < rows; ++i)
          m = pureAsm32(e,
                        "{ .reg .b32 a; and.b32 a, $2, 0x7FFF7FFF; "
                        "max.bf16x2 $0, $1, a; }",
                        "=r,r,r", {m, words[i][q]});
        std::array<Value, 2> v = unpackBf16Pair(e, m);
        amax[2 * q] = v[0];
        amax[2 * q + 1] = v[1];
      }
    }
    SmallVector<common::BlockScale> chunkScales = columnScales(
        e, quant, amax, chunk, partials, rowWarp, columnInChunk, rowWarps);
    SmallVector<Value> inverse(kWidth);
    for (int64_t j = 0; j < kWidth; ++j) {
      const common::BlockScale &scale = chunkScales[j];
      inverse[j] = e.div(e.f32(1.0), scale.stored);
      Value col = e.iadd(col0, e.index(j));
      e.ifThen(arith::AndIOp::create(b, loc, e.ult(col, e.index(columns)),
                                     e.eq(firstRow, e.index(0))),
               [&] {
                 e.storeRaw(scale.stored, scales,
                            {e.iadd(e.imul(block, e.index(columns)), col)});
               });
    }
    // Column j's codes of the thread's rows: one 8-byte store, each value
    // unpacked where it is encoded.
    for (int64_t j = 0; j < kWidth; ++j) {
      Value col = e.iadd(col0, e.index(j));
      e.ifThen(e.ult(col, e.index(columns)), [&] {
        SmallVector<Value> pairs;
        auto value = [&](int64_t i) {
          if (!inScales)
            return e.mul(unpackBf16Pair(e, words[i][j / 2])[j % 2], inverse[j]);
          // Not the amax pass's conversion, which LLVM would reuse, keeping
          // every row's f32 values live across the barrier.
          Value half = arith::BitcastOp::create(
              b, loc, b.getF32Type(),
              pureAsm32(e,
                        j % 2 ? "{ .reg .b16 l, u; mov.b32 {l, u}, $1; "
                                "cvt.f32.f16 $0, u; }"
                              : "{ .reg .b16 l, u; mov.b32 {l, u}, $1; "
                                "cvt.f32.f16 $0, l; }",
                        "=r,r", {words[i][j / 2]}));
          return e.mul(e.mul(half, rowScales[i]), inverse[j]);
        };
        for (int64_t i = 0; i < rows; i += 2)
          pairs.push_back(encodeE4M3Pair(e, value(i), value(i + 1)));
        Value bytes = vector::BitCastOp::create(
            b, loc, VectorType::get({rows}, i8),
            vector::FromElementsOp::create(
                b, loc, VectorType::get({rows / 2}, b.getI16Type()), pairs));
        vector::StoreOp::create(
            b, loc, bytes, codes,
            ValueRange{e.iadd(e.imul(block, e.index(columns)), col), firstRow},
            false, vectorAlign(rows, i8));
      });
    }
  }
};

/// Block `block`'s rows, [first, first + count): with groups, blocks are
/// numbered expert by expert, ceil(count / 128) an expert; a block past the
/// last has no rows.
static std::pair<Value, Value> blockRows(Kernel &k, Value block, Value counts,
                                         Value offsets, int64_t experts,
                                         TokenLinear rowCount) {
  Emitter &e = k.e;
  OpBuilder &b = k.b;
  Location loc = e.loc;
  if (!counts) {
    Value rows = k.linear(rowCount);
    Value first = e.imul(block, e.index(kBlockRows));
    Value inside = e.ult(first, rows);
    return {first,
            e.select(inside, e.minUI(e.isub(rows, first), e.index(kBlockRows)),
                     e.index(0))};
  }
  auto found = e.reduce(
      e.index(0), e.index(experts), {e.index(0), e.index(0), e.index(0)},
      [&](Value x, ValueRange acc) -> SmallVector<Value> {
        Value c = e.toIndex(e.loadRaw(counts, {x}));
        Value n =
            e.divUI(e.iadd(c, e.index(kBlockRows - 1)), e.index(kBlockRows));
        Value j = e.isub(block, acc[0]);
        Value inside = arith::AndIOp::create(
            b, loc, e.icmp(arith::CmpIPredicate::uge, block, acc[0]),
            e.ult(block, e.iadd(acc[0], n)));
        Value first = e.iadd(e.toIndex(e.loadRaw(offsets, {x})),
                             e.imul(j, e.index(kBlockRows)));
        Value rowsLeft = e.minUI(e.isub(c, e.imul(j, e.index(kBlockRows))),
                                 e.index(kBlockRows));
        return {e.iadd(acc[0], n), e.select(inside, first, acc[1]),
                e.select(inside, rowsLeft, acc[2])};
      });
  return {found[1], found[2]};
}

/// Quantizes `source` ([R, columns] bf16, or E4M3 codes with
/// `sourceScales` [R, ceil(columns / 128)]) into `blocks`, a block of rows
/// a CTA, 128 columns at a time. Warp w takes 32 of the columns (w % 4)
/// and 8 x `rows` of the rows (w / 4); lane l of it 8 columns (l % 4) by
/// `rows` rows (l / 4), read 16 (or 8) bytes a row and kept packed
/// (RowBlockChunk) where the rows split into such pieces: a column's largest
/// magnitude is the warp's (three shuffles) and then every warp's (through
/// shared memory), and its rows' codes are one store.
static LogicalResult buildRowBlockQuantize(LayerKernels &layer,
                                           GroupedMatmulWgradOp op,
                                           Value source, Value sourceScales,
                                           const RowBlocks &blocks,
                                           int64_t experts) {
  bool grouped = static_cast<bool>(op.getTokensPerExpert());
  TensorInfo src = layer.info(source);
  SmallVector<unsigned> indices = {src.buffer, blocks.codes.buffer,
                                   blocks.scales.buffer};
  TensorInfo srcScales{}, countsInfo{}, offsetsInfo{};
  if (sourceScales) {
    srcScales = layer.info(sourceScales);
    indices.push_back(srcScales.buffer);
  }
  if (grouped) {
    countsInfo = layer.info(op.getTokensPerExpert());
    offsetsInfo = layer.info(op.getExpertOffsets());
    indices.append({countsInfo.buffer, offsetsInfo.buffer});
  }
  Kernel k = layer.kernelOn(op, "wgrad_quantize", indices);
  k.launch.work = src.rowCount();
  k.launch.perBlock = kBlockRows;
  k.launch.extraBlocks = grouped ? experts : 0;
  // A thread keeps the values of 8 columns in `rows` rows; a warp covers
  // 32 columns and 8 x `rows` rows of the block's 128. (4 rows a thread
  // from E4M3 codes, 512 threads, measured no faster for DeepSeek-V3's
  // rows and slower for Qwen3-MoE's.)
  const int64_t rows = 8;
  const int64_t rowWarps = kBlockRows / (8 * rows);
  k.launch.block = 4 * rowWarps * 32;
  Emitter &e = k.e;
  OpBuilder &b = k.b;
  Location loc = e.loc;
  Type f32 = b.getF32Type(), i8 = b.getI8Type();
  Value in = k.view(0, src);
  Value codes = k.view(1, blocks.codes), scales = k.view(2, blocks.scales);
  unsigned next = 3;
  Value inScales = sourceScales ? k.view(next++, srcScales) : Value();
  Value counts = grouped ? k.view(next++, countsInfo) : Value();
  Value offsets = grouped ? k.view(next++, offsetsInfo) : Value();
  Value tid = k.threadId(), block = k.blockId(gpu::Dimension::x);
  int64_t columns = blocks.columns;

  // The block's rows: [rowStart, rowStart + valid).
  Value rowStart, valid;
  std::tie(rowStart, valid) =
      blockRows(k, block, counts, offsets, experts, src.rowCount());
  k.onlyIf(e.ult(e.index(0), valid));

  constexpr int64_t width = 8, chunkColumns = 128;
  Value warp = e.divUI(tid, e.index(32)), lane = e.remUI(tid, e.index(32));
  Value rowWarp = e.divUI(warp, e.index(4));
  Value firstRow = e.iadd(e.imul(rowWarp, e.index(8 * rows)),
                          e.imul(e.divUI(lane, e.index(4)), e.index(rows)));
  Value columnInChunk =
      e.iadd(e.imul(e.remUI(warp, e.index(4)), e.index(32)),
             e.imul(e.remUI(lane, e.index(4)), e.index(width)));
  // [chunk parity][row warp][column]: each warp's largest magnitudes.
  Value partials = k.workgroupBuffer({2, rowWarps, chunkColumns}, f32);
  Value lastRow = e.iadd(rowStart, e.isub(valid, e.index(1)));
  Value chunks = e.index(llvm::divideCeil(columns, chunkColumns));
  // Whole 16-byte rows of a thread's columns when every row is aligned.
  if (columns % width == 0) {
    RowBlockChunk chunk{
        k,        op.getQuantAttr(), in,       inScales,      codes,  scales,
        partials, columns,           rows,     rowWarps,      block,  rowStart,
        valid,    lastRow,           firstRow, columnInChunk, rowWarp};
    e.forEach(e.index(0), chunks, [&](Value c) { chunk.emit(c); });
    return k.finish(op);
  }
  e.forEach(e.index(0), chunks, [&](Value chunk) {
    Value col0 = e.iadd(e.imul(chunk, e.index(chunkColumns)), columnInChunk);
    // values[i][j]: row firstRow + i, column col0 + j; zero past the
    // expert's rows and the columns.
    // Every row's loads first, so they are in flight together.
    SmallVector<Value> rowScales(rows), rowValid(rows);
    SmallVector<SmallVector<Value>> scalar(rows);
    for (int64_t i = 0; i < rows; ++i) {
      Value r = e.iadd(firstRow, e.index(i));
      Value row = e.minUI(e.iadd(rowStart, r), lastRow);
      rowValid[i] = e.ult(r, valid);
      for (int64_t j = 0; j < width; ++j) {
        Value c = e.minUI(e.iadd(col0, e.index(j)), e.index(columns - 1));
        scalar[i].push_back(e.loadRaw(in, {row, c}));
      }
      if (inScales)
        rowScales[i] =
            common::loadScale(e, inScales,
                              {row, e.divUI(e.minUI(col0, e.index(columns - 1)),
                                            e.index(kBlockRows))});
    }
    // values[i][j]: row firstRow + i, column col0 + j; zero past the
    // expert's rows and the columns.
    SmallVector<SmallVector<Value>> values(rows);
    SmallVector<Value> amax(width, e.f32(0.0));
    for (int64_t i = 0; i < rows; ++i) {
      SmallVector<Value> row8;
      for (Value v : scalar[i])
        row8.push_back(inScales
                           ? decodeE4M3(e, v)
                           : arith::ExtFOp::create(b, loc, f32, v).getResult());
      Value rowScale = inScales ? rowScales[i] : Value();
      Value rowOk = rowValid[i];
      for (int64_t j = 0; j < width; ++j) {
        Value v = rowScale ? e.mul(row8[j], rowScale) : row8[j];
        Value ok = arith::AndIOp::create(
            b, loc, rowOk, e.ult(e.iadd(col0, e.index(j)), e.index(columns)));
        v = e.select(ok, v, e.f32(0.0));
        Value special;
        amax[j] = arith::MaxNumFOp::create(b, loc, amax[j],
                                           common::blockStats(e, v, special));
        values[i].push_back(v);
      }
    }
    SmallVector<common::BlockScale> chunkScales =
        columnScales(e, op.getQuantAttr(), amax, chunk, partials, rowWarp,
                     columnInChunk, rowWarps);
    for (int64_t j = 0; j < width; ++j) {
      Value col = e.iadd(col0, e.index(j));
      const common::BlockScale &scale = chunkScales[j];
      Value inverse = e.div(e.f32(1.0), scale.stored);
      e.ifThen(e.ult(col, e.index(columns)), [&] {
        SmallVector<Value> bytes;
        for (int64_t i = 0; i < rows; ++i)
          bytes.push_back(encodeE4M3(e, e.mul(values[i][j], inverse)));
        Value at = e.iadd(e.imul(block, e.index(columns)), col);
        vector::StoreOp::create(b, loc,
                                vector::FromElementsOp::create(
                                    b, loc, VectorType::get({rows}, i8), bytes),
                                codes, ValueRange{at, firstRow}, false,
                                vectorAlign(rows, i8));
        e.ifThen(e.eq(firstRow, e.index(0)),
                 [&] { e.storeRaw(scale.stored, scales, {at}); });
      });
    }
  });
  return k.finish(op);
}

namespace {
/// The E4M3 weight-gradient kernel's shared memory: the ring of stages
/// (128 rows of both operands' codes, 128 bytes each: the bf16 layout's
/// stage size), the epilogue's buffers, then each stage's scales.
struct QuantizedWgradLayout : Layout {
  static constexpr int64_t kMaxStages = 6;
  int64_t scaleOffset() const { return epilogueOffset() + epilogueBytes(); }
  int64_t scaleBytes() const { return (tileM + tileN) * 4; }
  int64_t totalBytes() const {
    return scaleOffset() + stages * scaleBytes() + sm90a::kSwizzleAlign;
  }
  /// [128, tileN] tiles: 192 columns where K has more than 128, which
  /// reads 20% fewer bytes a product than 128 (two 64 x 192 fragments a
  /// consumer thread, the sums and a block's product, fit its registers;
  /// 256 would not).
  explicit QuantizedWgradLayout(int64_t k) {
    tileN = k > 128 ? 192 : 128;
    int64_t fits =
        (sm90a::kSharedPerBlock - sm90a::kSwizzleAlign - epilogueBytes()) /
        (stageBytes() + scaleBytes() + 2 * sm90a::kMbarrierBytes);
    stages = std::min(fits, kMaxStages);
  }
};
} // namespace

namespace {
/// A stage of the E4M3 weight gradient: one block of 128 rows of both
/// operands' codes, and their scales.
struct QuantizedWgradStage {
  Emitter &e;
  Kernel &k;
  const Ring &ring;
  const QuantizedWgradLayout &l;
  Value scaleTile, full, descA, descB;
  int64_t n, kDim;
  Value scalesA, scalesB;

  /// Producer thread p's part of loading stage s of tile `at` into `slot`.
  void load(const WgradTile &at, Value s, Value slot, Value p) const {
    OpBuilder &b = e.b;
    Location loc = e.loc;
    Type i8 = b.getI8Type();
    auto tileType = sharedType({l.tileM, kBlockRows}, i8);
    auto bTileType = sharedType({l.tileN, kBlockRows}, i8);
    Value blk = e.iadd(at.firstBlock, s);
    // Thread p stages the tile's columns p, p + 128, ... of an operand.
    auto stageScale = [&](Value scales, int64_t columns, Value tile,
                          int64_t count, int64_t place) {
      for (int64_t o = 0; o < count; o += 128) {
        Value inTile = e.iadd(p, e.index(o));
        Value col = e.iadd(e.imul(tile, e.index(count)), inTile);
        Value at2 = e.iadd(e.imul(blk, e.index(columns)),
                           e.minUI(col, e.index(columns - 1)));
        e.ifThen(e.ult(inTile, e.index(count)), [&] {
          Value scale = e.select(e.ult(col, e.index(columns)),
                                 e.loadRaw(scales, {at2}), e.f32(0.0));
          memref::StoreOp::create(
              b, loc, scale, scaleTile,
              ValueRange{slot, e.iadd(inTile, e.index(place))});
        });
      }
    };
    // The codes' loads go first: the scales' global reads overlap them.
    e.ifThen(e.eq(p, e.index(0)), [&] {
      expectBytes(e, full, l.stageBytes(), slot);
      tmaLoad(
          e, ring.view(tileType, slot, e.index(0)), full, descA,
          ValueRange{e.index(0), e.iadd(e.imul(blk, e.index(n)),
                                        e.imul(at.mTile, e.index(l.tileM)))},
          slot);
      tmaLoad(
          e, ring.view(bTileType, slot, e.index(l.tileM * kBlockRows)), full,
          descB,
          ValueRange{e.index(0), e.iadd(e.imul(blk, e.index(kDim)),
                                        e.imul(at.nTile, e.index(l.tileN)))},
          slot);
    });
    stageScale(scalesA, n, at.mTile, l.tileM, 0);
    stageScale(scalesB, kDim, at.nTile, l.tileN, l.tileM);
    mbarrierArrive(b, loc, full, slot);
  }

  /// Warpgroup g's wgmma over the block in `slot`, into a fresh fragment.
  Value multiply(Value slot, Value g, Type fragment) const {
    OpBuilder &b = e.b;
    Location loc = e.loc;
    Value aAddress = LLVM::AddOp::create(
        b, loc, ring.address(slot, 0),
        arith::IndexCastOp::create(b, loc, b.getI64Type(),
                                   e.imul(g, sm90a::kWgmmaM * kBlockRows)));
    Value bAddress = ring.address(slot, l.tileM * kBlockRows);
    NVVM::WgmmaFenceAlignedOp::create(b, loc);
    int64_t instK = sm90a::wgmmaK(1);
    Value partial = LLVM::PoisonOp::create(b, loc, fragment);
    for (int64_t kk = 0; kk < kBlockRows / instK; ++kk) {
      auto descriptor = [&](Value address) {
        return swizzledDescriptor(
            b, loc,
            LLVM::AddOp::create(b, loc, address, k.constI64(kk * instK)));
      };
      partial = wgmmaKMajor(b, loc, fragment, partial, descriptor(aAddress),
                            descriptor(bAddress), l.tileN, instK,
                            NVVM::WGMMATypes::e4m3, /*accumulate=*/kk > 0);
    }
    return partial;
  }

  /// acc + partial x (row scale x column scale).
  Value promote(Value acc, Value partial, Value slot, Value fragmentRow,
                Value pairColumn) const {
    OpBuilder &b = e.b;
    Location loc = e.loc;
    auto pairType = VectorType::get({2}, b.getF32Type());
    // acc += partial x (row scale x column scale): fragment element i
    // is row fragmentRow + 8 ((i / 2) % 2), column 8 (i / 4) + 2 (l % 4)
    // + i % 2.
    Value rowScales[2];
    for (int64_t h = 0; h < 2; ++h)
      rowScales[h] = memref::LoadOp::create(
          b, loc, scaleTile,
          ValueRange{slot, e.iadd(fragmentRow, e.index(8 * h))});
    for (int64_t j = 0; j < l.tileN / 8; ++j) {
      Value columns = vector::LoadOp::create(
          b, loc, pairType, scaleTile,
          ValueRange{slot, e.iadd(pairColumn, e.index(l.tileM + 8 * j))});
      for (int64_t i = 4 * j; i < 4 * j + 4; ++i) {
        Value scale = e.mul(rowScales[(i / 2) % 2],
                            vector::ExtractOp::create(b, loc, columns, i % 2));
        Value pi =
            LLVM::ExtractValueOp::create(b, loc, partial, ArrayRef<int64_t>{i});
        Value ai =
            LLVM::ExtractValueOp::create(b, loc, acc, ArrayRef<int64_t>{i});
        Value sum = math::FmaOp::create(b, loc, pi, scale, ai).getResult();
        acc =
            LLVM::InsertValueOp::create(b, loc, acc, sum, ArrayRef<int64_t>{i});
      }
    }
    return acc;
  }
};
} // namespace

static LogicalResult buildQuantizedWgrad(LayerKernels &layer,
                                         GroupedMatmulWgradOp op) {
  MLIRContext *ctx = op.getContext();
  int64_t n = cast<RankedTensorType>(op.getOutGrad().getType()).getDimSize(1);
  int64_t kDim = cast<RankedTensorType>(op.getLhs().getType()).getDimSize(1);
  bool grouped = static_cast<bool>(op.getTokensPerExpert());
  int64_t experts =
      grouped ? cast<RankedTensorType>(op.getTokensPerExpert().getType())
                    .getDimSize(0)
              : 1;
  TokenLinear rows = layer.info(op.getOutGrad()).rowCount();
  RowBlocks a = rowBlocks(layer, ctx, rows, n, experts);
  RowBlocks bBlocks = rowBlocks(layer, ctx, rows, kDim, experts);
  if (failed(buildRowBlockQuantize(layer, op, op.getOutGrad(), Value(), a,
                                   experts)) ||
      failed(buildRowBlockQuantize(layer, op, op.getLhs(), op.getLhsScale(),
                                   bBlocks, experts)))
    return failure();

  QuantizedWgradLayout l(kDim);
  int64_t mTiles = llvm::divideCeil(n, l.tileM);
  int64_t nTiles = llvm::divideCeil(kDim, l.tileN);
  int64_t tiles = experts * mTiles * nTiles;
  TensorInfo out = layer.define(op.getOut(), {});
  Type outElement =
      cast<RankedTensorType>(op.getOut().getType()).getElementType();
  int64_t outBytes = outElement.getIntOrFloatBitWidth() / 8;
  unsigned mapA = layer.plan.addTensorMap(a.codes.buffer, 1, a.codes.rows,
                                          kBlockRows, l.tileM, kBlockRows);
  unsigned mapB =
      layer.plan.addTensorMap(bBlocks.codes.buffer, 1, bBlocks.codes.rows,
                              kBlockRows, l.tileN, kBlockRows);
  SmallVector<int64_t> outer;
  if (grouped)
    outer = {experts, n * kDim, 1};
  unsigned mapOut = layer.plan.addTensorMap(
      out.buffer, outBytes, n, kDim, kDim, sm90a::kWgmmaM,
      sm90a::kTmaSwizzleBytes / outBytes, outer);
  SmallVector<unsigned> bufferIndices = {out.buffer, a.scales.buffer,
                                         bBlocks.scales.buffer};
  TensorInfo countsInfo{};
  if (grouped) {
    countsInfo = layer.info(op.getTokensPerExpert());
    bufferIndices.push_back(countsInfo.buffer);
  }
  Kernel k = layer.kernelOn(op, "grouped_matmul_wgrad", bufferIndices,
                            {mapA, mapB, mapOut});
  k.launch.work = {tiles, 0};
  k.launch.persistent = true;
  k.launch.block = kConsumers + 128;
  k.func.setKnownBlockSizeAttr(
      k.b.getDenseI32ArrayAttr({int32_t(k.launch.block), 1, 1}));
  k.launch.sharedBytes = l.totalBytes();
  k.launch.accumulators = l.tileN;

  Emitter &e = k.e;
  OpBuilder &b = k.b;
  Location loc = e.loc;
  Type i8 = b.getI8Type(), f32 = b.getF32Type();
  Value scalesA = k.view(1, a.scales), scalesB = k.view(2, bBlocks.scales);
  Value counts = grouped ? k.view(3, countsInfo) : Value();
  Value descA = k.tensorMap(bufferIndices.size(),
                            matmulMapType(ctx, i8, l.tileM, kBlockRows));
  Value descB = k.tensorMap(bufferIndices.size() + 1,
                            matmulMapType(ctx, i8, l.tileN, kBlockRows));
  Value tid = k.threadId();

  WgradTiles walker{
      k, mTiles, nTiles, tiles, kBlockRows, kDim > n, [&](WgradTile &at) {
        at.firstBlock =
            grouped ? firstBlockOf(e, counts, at.expert) : e.index(0);
        at.rowCount = grouped ? e.toIndex(e.loadRaw(counts, {at.expert}))
                              : k.linear(rows);
      }};
  AlignedShared shared(e);
  Ring ring{shared, l.stages, l.stageBytes()};
  Value scaleTile = shared.view(sharedType({l.stages, l.tileM + l.tileN}, f32),
                                e.index(l.scaleOffset()));
  Value full = createBarriers(e, l.stages);
  Value empty = createBarriers(e, l.stages);
  Value leader = e.eq(tid, e.index(0));
  // A stage is full once its codes have landed (the first producer
  // thread's expected bytes, one arrival) and every producer thread has
  // staged its scales.
  initBarriers(e, leader, l.stages, {{full, 128 + 1}, {empty, kConsumers}});
  fenceBarrierInits(e, leader);
  gpu::BarrierOp::create(b, loc);
  QuantizedWgradStage stages{e,     k,     ring, l,    scaleTile, full,
                             descA, descB, n,    kDim, scalesA,   scalesB};

  auto roles = scf::IfOp::create(b, loc, e.ult(tid, e.index(kConsumers)),
                                 /*withElse=*/true);
  // The producers: each thread stages a row scale of both operands, and
  // the first loads the block's codes.
  b.setInsertionPointToStart(&roles.getElseRegion().front());
  producerRegisters(e, sm90a::kProducerRegisters);
  Value p = e.isub(tid, e.index(kConsumers));
  walker.walk([&](const WgradTile &at, Value first) {
    e.forEach(e.index(0), at.slabs, [&](Value s) {
      Value stage = e.iadd(first, s);
      Value slot = ring.slot(stage);
      ring.waitReleased(empty, stage, slot);
      stages.load(at, s, slot, p);
    });
  });

  // The consumers: warpgroup g multiplies the tile's rows [64 g, 64 g + 64).
  b.setInsertionPointToStart(&roles.getThenRegion().front());
  consumerRegisters(e, sm90a::kConsumerRegisters);
  SmallVector<Type> fields(l.tileN / 2, f32);
  Type fragment = LLVM::LLVMStructType::getLiteral(ctx, fields);
  Value g = e.divUI(tid, 128);
  Value myTurn = e.toI32(e.iadd(g, e.index(kTurnBarrier)));
  Value otherTurn = arith::XOrIOp::create(b, loc, myTurn, e.i32(1));
  Value firstGroup = e.eq(g, e.index(0));
  // Warpgroup 0 takes the first turn, and at the end the turn warpgroup 1
  // passed it last, so every arrival is waited for.
  e.ifThen(arith::XOrIOp::create(b, loc, firstGroup,
                                 arith::ConstantIntOp::create(b, loc, 1, 1)),
           [&] { namedBarrierArrive(b, loc, otherTurn, kConsumers); });
  Value warp = e.remUI(e.divUI(tid, 32), 4), lane = e.remUI(tid, 32);
  Value fragmentRow = e.iadd(e.imul(g, sm90a::kWgmmaM),
                             e.iadd(e.imul(warp, 16), e.divUI(lane, 4)));
  Value pairColumn = e.imul(e.remUI(lane, 4), 2);
  WgradEpilogue epilogue{e, shared, l, Value(), tid, g, outElement, grouped};
  epilogue.desc = k.tensorMap(bufferIndices.size() + 2,
                              matmulMapType(ctx, outElement, epilogue.box()));
  walker.walk([&](const WgradTile &at, Value first) {
    auto loop = scf::ForOp::create(b, loc, e.index(0), at.slabs, e.index(1),
                                   ValueRange{zeroFragment(b, loc, fragment)});
    {
      OpBuilder::InsertionGuard guard(b);
      b.setInsertionPointToStart(loop.getBody());
      Value stage = e.iadd(first, loop.getInductionVar());
      Value acc = loop.getRegionIterArgs()[0];
      Value slot = ring.slot(stage);
      waitBarrier(e, full, ring.parity(stage, /*released=*/false), slot);
      namedBarrierSync(b, loc, myTurn, kConsumers);
      Value partial = stages.multiply(slot, g, fragment);
      NVVM::WgmmaGroupSyncAlignedOp::create(b, loc);
      namedBarrierArrive(b, loc, otherTurn, kConsumers);
      NVVM::WgmmaWaitGroupSyncOp::create(b, loc, 0);
      partial = fenceFragment(b, loc, partial);
      acc = stages.promote(acc, partial, slot, fragmentRow, pairColumn);
      acc = fenceFragment(b, loc, acc);
      mbarrierArrive(b, loc, empty, slot);
      scf::YieldOp::create(b, loc, acc);
    }
    epilogue.store(loop.getResult(0), at);
  });
  e.ifThen(firstGroup, [&] { namedBarrierSync(b, loc, myTurn, kConsumers); });
  epilogue.drain();
  b.setInsertionPointAfter(roles);
  return k.finish(op);
}
