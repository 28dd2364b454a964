//===- DecodeMatmul.cpp - the expert matmul's decode tile -----------------===//
//
// moe.grouped_matmul (and its dense form) for a bucket of few tokens, its
// operands swapped (matmul_config swap_ab). A decode step gives each expert
// a few rows, so a 128-row tile would be mostly padding and the grid would
// hold few blocks; here the weights are wgmma's M side, in fragments of 64
// rows, and an expert's rows (8 to 64) its N side. A block of one consumer
// warpgroup and a producer warp streams tileN weight rows, 128 bytes of K a
// stage, through a ring small enough that two blocks share a
// multiprocessor, so the weight reads spread over the whole GPU.
//
// A thread's fragment element i of fragment f is weight row
// 64f + 16 warp + lane/4 + 8((i/2)%2) of the tile and row (token)
// 8(i/4) + 2(lane%4) + i%2: a gated tile's gate fragment f and up fragment
// f + fragments/2 hold the same output, so the activation runs in
// registers. FP8 multiplies each scale block into a fresh partial and adds
// partial x row scale x weight scale to the accumulator, as the grouped
// matmul does; the scales are read from global memory (L1) before the
// stage's wait. A quantizing epilogue reduces each output block's
// statistics across the warps through shared memory.
//
//===----------------------------------------------------------------------===//

#include "codegen/nvidia/kernels/DecodeMatmul.h"
#include "codegen/common/FP8.h"
#include "codegen/common/Numerics.h"
#include "codegen/nvidia/kernels/Matmul.h"
#include "codegen/nvidia/support/Hopper.h"
#include "codegen/nvidia/support/Ring.h"

#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/NVGPU/IR/NVGPUDialect.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::nvidia;

static constexpr int64_t kSliceBytes = MatmulEncoding::kSliceBytes;
static constexpr int64_t kFragmentRows = MatmulConfig::kSwapFragmentRows;
// Named barriers of the consumer warpgroup: 1 the split-K ticket, 2 the
// epilogue's block statistics.
static constexpr int64_t kTicketBarrier = 1, kStatsBarrier = 2;

namespace {
class DecodeEmitter {
public:
  DecodeEmitter(LayerKernels &layer, GroupedMatmulOp op,
                const MatmulConfig &config, const TensorInfo &lhs, Kernel &k)
      : layer(layer), op(op), c(config), enc(config.enc), lhs(lhs), k(k),
        e(k.e), b(k.b), ctx(b.getContext()) {
    SmallVector<Type> fields(c.tileM / 2, b.getF32Type());
    fragment = LLVM::LLVMStructType::getLiteral(ctx, fields);
  }

  LogicalResult emit(ArrayRef<Value> buffers, ArrayRef<unsigned> indices,
                     const TensorInfo &partials);

private:
  void emitViews(ArrayRef<Value> buffers, ArrayRef<unsigned> indices,
                 const TensorInfo &partials);
  void emitSharedMemory();
  void emitTile(Value rowTile);
  void emitProducer(Value pos);
  void emitConsumer(Value pos);
  SmallVector<Value> emitMainLoop(Value pos);
  void emitScaledStage(SmallVector<Value> &accs, Value kt, Value slot,
                       Value stage);
  void emitSplitSum(SmallVector<Value> &finals);
  void emitStore(ArrayRef<Value> finals);
  void emitQuantizedStore(ArrayRef<Value> finals);

  int64_t fragments() const { return c.swapFragments(); }
  int64_t outFragments() const {
    return c.gated ? fragments() / 2 : fragments();
  }
  /// The first weight row (within the expert) of fragment `f`.
  Value fragmentRow(int64_t f);
  /// This thread's weight row of fragment `f`, row half `h`.
  Value weightRow(int64_t f, int64_t h);
  /// This thread's row (token) of fragment element `i`.
  Value rowOf(int64_t i);
  Value element(Value fragmentValue, int64_t i);
  Value slotTile(Value slot, int64_t offset, int64_t rows);
  Value kBlockOf(Value kt, int64_t s);
  Value mma(Value acc, Value slot, int64_t f, int64_t kk, bool accumulate);
  Value addBias(Value v, Value wr);
  /// Output `gf`'s value at fragment element i (bias and activation
  /// applied).
  Value output(ArrayRef<Value> finals, int64_t gf, int64_t i);
  void consumerBarrier(int64_t id);

  LayerKernels &layer;
  GroupedMatmulOp op;
  const MatmulConfig &c;
  const MatmulEncoding &enc;
  const TensorInfo &lhs;
  Kernel &k;
  Emitter &e;
  OpBuilder &b;
  MLIRContext *ctx;
  Type fragment;

  Value out, counts, offsets, bias, lhsScale, rhsScale, outScale;
  Value descA, descB, partialView, counters;
  Value tid, warp, lane;
  // The block's tile: row tile, column tile, split, its counter, K range,
  // expert and rows.
  Value mTile, nTile, splitIdx, tileU, kBegin, kCount;
  Value expert, rowStart, rowEnd, rowStartIdx, rowEndIdx, expertIdx, colTile;
  std::optional<AlignedShared> shared;
  std::optional<Ring> ring;
  Value barriers, empty;
};
} // namespace

void DecodeEmitter::emitViews(ArrayRef<Value> buffers,
                              ArrayRef<unsigned> indices,
                              const TensorInfo &partials) {
  MatmulViews views(layer, op, c, k, buffers);
  out = views.out, counts = views.counts, offsets = views.offsets;
  bias = views.bias, lhsScale = views.lhsScale, rhsScale = views.rhsScale;
  outScale = views.outScale;
  Type element = enc.fp8() ? Type(b.getI8Type()) : Type(b.getBF16Type());
  unsigned firstMap = indices.size();
  descA =
      k.tensorMap(firstMap, matmulMapType(ctx, element, c.tileM, enc.tileK()));
  descB = k.tensorMap(firstMap + 1,
                      matmulMapType(ctx, element, kFragmentRows, enc.tileK()));
  if (c.splits > 1) {
    partialView = k.view(indices.size() - 2, partials);
    counters = k.func.getArgument(indices.size() - 1);
  }
}

void DecodeEmitter::emitSharedMemory() {
  // Stages of tileN weight rows then tileM rows, 128 bytes each, aligned
  // for the 128-byte swizzle.
  shared.emplace(e);
  ring.emplace(Ring{*shared, c.stages, c.stageBytes()});
  // `barriers[s]` completes when slot s is loaded, `empty[s]` when every
  // consumer thread is done with it.
  barriers = createBarriers(e, c.stages);
  empty = createBarriers(e, c.stages);
  Value leader = e.eq(tid, e.index(0));
  initBarriers(e, leader, c.stages, {{barriers, 1}, {empty, c.consumers()}});
  fenceBarrierInits(e, leader);
}

void DecodeEmitter::emitTile(Value rowTile) {
  // Row tiles on x, column tile x split on y (splits consecutive).
  mTile = rowTile;
  Value y = k.blockId(gpu::Dimension::y);
  nTile = e.divUI(y, c.splits);
  splitIdx = e.remUI(y, c.splits);
  tileU = e.iadd(e.imul(nTile, c.rowTiles), mTile);
  kBegin = e.imul(splitIdx, c.tilesPerSplit);
  kCount = e.minUI(e.index(c.tilesPerSplit), e.isub(e.index(c.kTiles), kBegin));
  if (c.grouped) {
    auto found =
        findTile(e, tid, counts, offsets, c.experts, c.tileM, e.toI32(mTile));
    expert = found[0];
    rowStart = found[1];
    rowEnd = found[2];
  } else {
    rowStart = e.toI32(e.imul(mTile, c.tileM));
    rowEnd = e.toI32(k.linear(lhs.rows));
    expert = e.select(e.icmp(arith::CmpIPredicate::slt, rowStart, rowEnd),
                      e.i32(0), e.i32(-1));
  }
  rowStartIdx = e.toIndex(rowStart);
  rowEndIdx = e.toIndex(rowEnd);
  expertIdx =
      e.toIndex(arith::MaxSIOp::create(b, e.loc, expert, e.i32(0)).getResult());
  colTile = e.imul(nTile, c.outTile);
}

Value DecodeEmitter::fragmentRow(int64_t f) {
  if (!c.gated)
    return e.iadd(colTile, e.index(f * kFragmentRows));
  int64_t half = fragments() / 2;
  Value row = e.iadd(colTile, e.index((f % half) * kFragmentRows));
  return f < half ? row : e.iadd(row, e.index(c.outN));
}

Value DecodeEmitter::weightRow(int64_t f, int64_t h) {
  return e.iadd(
      fragmentRow(f),
      e.iadd(e.imul(warp, 16), e.iadd(e.divUI(lane, 4), e.index(8 * h))));
}

Value DecodeEmitter::rowOf(int64_t i) {
  return e.iadd(rowStartIdx, e.iadd(e.index((i / 4) * 8 + i % 2),
                                    e.imul(e.remUI(lane, 4), 2)));
}

Value DecodeEmitter::element(Value fragmentValue, int64_t i) {
  return LLVM::ExtractValueOp::create(b, e.loc, fragmentValue,
                                      ArrayRef<int64_t>{i});
}

Value DecodeEmitter::slotTile(Value slot, int64_t offset, int64_t rows) {
  Type element = enc.fp8() ? Type(b.getI8Type()) : Type(b.getBF16Type());
  return ring->view(sharedType({rows, enc.tileK()}, element), slot,
                    e.index(offset));
}

Value DecodeEmitter::kBlockOf(Value kt, int64_t s) {
  return e.minUI(e.iadd(e.imul(kt, enc.subBlocks()), e.index(s)),
                 e.index(c.kBlocks() - 1));
}

void DecodeEmitter::emitProducer(Value pos) {
  // The producer warp's first thread keeps the ring full; stage j of the
  // tile is the block's stage pos + j.
  e.ifThen(e.eq(tid, e.index(c.consumers())), [&] {
    nvgpu::TmaPrefetchOp::create(b, e.loc, descA, Value());
    nvgpu::TmaPrefetchOp::create(b, e.loc, descB, Value());
    Value expertRow0 = e.imul(expertIdx, c.n);
    e.forEach(e.index(0), kCount, [&](Value j) {
      Value g = e.iadd(pos, j);
      Value slot = ring->slot(g);
      ring->waitReleased(empty, g, slot);
      Value col = e.imul(e.iadd(kBegin, j), enc.tileK());
      expectBytes(e, barriers, c.stageBytes(), slot);
      for (int64_t f = 0; f < fragments(); ++f)
        tmaLoad(e,
                slotTile(slot, f * kFragmentRows * kSliceBytes, kFragmentRows),
                barriers, descB,
                ValueRange{col, e.iadd(expertRow0, fragmentRow(f))}, slot);
      tmaLoad(e, slotTile(slot, c.tileN * kSliceBytes, c.tileM), barriers,
              descA, ValueRange{col, rowStartIdx}, slot);
    });
  });
}

Value DecodeEmitter::mma(Value acc, Value slot, int64_t f, int64_t kk,
                         bool accumulate) {
  // Both operands K-major, 32 bytes of K an instruction.
  Value a = swizzledDescriptor(
      b, e.loc, ring->address(slot, f * kFragmentRows * kSliceBytes + kk * 32));
  Value bDesc = swizzledDescriptor(
      b, e.loc, ring->address(slot, c.tileN * kSliceBytes + kk * 32));
  return wgmmaKMajor(b, e.loc, fragment, acc, a, bDesc, c.tileM, enc.instK(),
                     enc.type, accumulate);
}

SmallVector<Value> DecodeEmitter::emitMainLoop(Value pos) {
  SmallVector<Value> init(fragments(), zeroFragment(b, e.loc, fragment));
  int64_t steps = enc.tileK() / enc.instK();
  auto loop =
      scf::ForOp::create(b, e.loc, e.index(0), kCount, e.index(1), init);
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(loop.getBody());
    Value j = loop.getInductionVar();
    Value g = e.iadd(pos, j);
    Value slot = ring->slot(g);
    SmallVector<Value> accs(loop.getRegionIterArgs());
    if (enc.fp8()) {
      emitScaledStage(accs, e.iadd(kBegin, j), slot, g);
      mbarrierArrive(b, e.loc, empty, slot);
    } else {
      waitBarrier(e, barriers, ring->parity(g, /*released=*/false), slot);
      NVVM::WgmmaFenceAlignedOp::create(b, e.loc);
      for (int64_t f = 0; f < fragments(); ++f)
        for (int64_t kk = 0; kk < steps; ++kk)
          accs[f] = mma(accs[f], slot, f, kk, /*accumulate=*/true);
      NVVM::WgmmaGroupSyncAlignedOp::create(b, e.loc);
      // The previous stage's wgmma are done: its slot can be refilled.
      NVVM::WgmmaWaitGroupSyncOp::create(b, e.loc, 1);
      e.ifThen(e.icmp(arith::CmpIPredicate::uge, j, e.index(1)), [&] {
        mbarrierArrive(b, e.loc, empty, ring->slot(e.isub(g, e.index(1))));
      });
    }
    scf::YieldOp::create(b, e.loc, accs);
  }
  SmallVector<Value> finals(loop.getResults());
  if (!enc.fp8()) {
    NVVM::WgmmaWaitGroupSyncOp::create(b, e.loc, 0);
    for (Value &acc : finals)
      acc = fenceFragment(b, e.loc, acc);
    // The last stage's slot, for the block's next tile.
    e.ifThen(e.icmp(arith::CmpIPredicate::uge, kCount, e.index(1)), [&] {
      mbarrierArrive(b, e.loc, empty,
                     ring->slot(e.isub(e.iadd(pos, kCount), e.index(1))));
    });
  }
  return finals;
}

void DecodeEmitter::emitScaledStage(SmallVector<Value> &accs, Value kt,
                                    Value slot, Value stage) {
  int64_t sub = enc.subBlocks(), kBlocks = c.kBlocks();
  int64_t perBlock = enc.tileK() / enc.instK() / sub;
  // The stage's scales, loaded before its wait so their latency overlaps
  // it: per sub-block, each of this thread's rows (tokens, clamped into
  // the tile's) and each of its weight rows.
  SmallVector<SmallVector<Value>> rowScales(sub), weightScales(sub);
  for (int64_t s = 0; s < sub; ++s) {
    Value kb = kBlockOf(kt, s);
    for (int64_t i = 0; i < c.tileM / 2; ++i) {
      if ((i / 2) % 2 != 0)
        continue;
      Value row = e.minUI(rowOf(i), e.isub(rowEndIdx, e.index(1)));
      Value scale = common::loadScale(e, lhsScale, {row, kb});
      // A sub-block past K (MXFP8, K not a multiple of 128) adds nothing.
      if (kBlocks % sub != 0)
        scale = e.select(e.icmp(arith::CmpIPredicate::uge,
                                e.iadd(e.imul(kt, sub), e.index(s)),
                                e.index(kBlocks)),
                         e.f32(0.0), scale);
      rowScales[s].push_back(scale);
    }
    for (int64_t f = 0; f < fragments(); ++f)
      for (int64_t h = 0; h < 2; ++h) {
        Value wr = e.minUI(weightRow(f, h), e.index(c.n - 1));
        if (c.rhsScaleRows > 1)
          wr = e.divUI(wr, c.rhsScaleRows);
        SmallVector<Value> index;
        if (c.grouped)
          index.push_back(expertIdx);
        index.append({wr, kb});
        weightScales[s].push_back(common::loadScale(e, rhsScale, index));
      }
  }
  waitBarrier(e, barriers, ring->parity(stage, /*released=*/false), slot);
  // Each scale block into fresh partials, then scaled into the
  // accumulators: acc += partial * (row scale * weight scale).
  for (int64_t s = 0; s < sub; ++s) {
    NVVM::WgmmaFenceAlignedOp::create(b, e.loc);
    SmallVector<Value> partials;
    for (int64_t f = 0; f < fragments(); ++f) {
      Value p = LLVM::PoisonOp::create(b, e.loc, fragment);
      for (int64_t kk = s * perBlock; kk < (s + 1) * perBlock; ++kk)
        p = mma(p, slot, f, kk, /*accumulate=*/kk != s * perBlock);
      partials.push_back(p);
    }
    NVVM::WgmmaGroupSyncAlignedOp::create(b, e.loc);
    NVVM::WgmmaWaitGroupSyncOp::create(b, e.loc, 0);
    for (int64_t f = 0; f < fragments(); ++f) {
      Value p = fenceFragment(b, e.loc, partials[f]);
      Value acc = accs[f];
      for (int64_t i = 0; i < c.tileM / 2; ++i) {
        // Rows i/4 and i%2 of the thread's: its scale is entry
        // 2(i/4) + i%2 of the row-half-0 elements.
        Value rowScale = rowScales[s][(i / 4) * 2 + i % 2];
        Value weightScale = weightScales[s][f * 2 + (i / 2) % 2];
        Value scale = e.mul(rowScale, weightScale);
        Value sum = math::FmaOp::create(b, e.loc, element(p, i), scale,
                                        element(acc, i));
        acc = LLVM::InsertValueOp::create(b, e.loc, acc, sum,
                                          ArrayRef<int64_t>{i});
      }
      accs[f] = fenceFragment(b, e.loc, acc);
    }
  }
}

void DecodeEmitter::consumerBarrier(int64_t id) {
  namedBarrierSync(b, e.loc, e.i32(id), 128);
}

void DecodeEmitter::emitSplitSum(SmallVector<Value> &finals) {
  // Every split stores its partial; the tile's last block to count itself
  // in adds them in split order, the same sum whichever is last.
  for (int64_t f = 0; f < fragments(); ++f)
    for (int64_t i = 0; i < c.tileM / 2; ++i) {
      Value row = rowOf(i), wr = weightRow(f, (i / 2) % 2);
      e.ifThen(e.andi(e.ult(row, rowEndIdx), e.ult(wr, e.index(c.n))), [&] {
        memref::StoreOp::create(b, e.loc, element(finals[f], i), partialView,
                                splitPartialAt(k, lhs.rows, splitIdx, row, wr));
      });
    }
  enterLastSplit(k, tid, counters, tileU, c.splits,
                 [&] { consumerBarrier(kTicketBarrier); });
  SmallVector<Value> mine;
  SmallVector<std::pair<Value, Value>> at;
  for (int64_t f = 0; f < fragments(); ++f)
    for (int64_t i = 0; i < c.tileM / 2; ++i) {
      at.push_back({e.minUI(rowOf(i), e.isub(rowEndIdx, e.index(1))),
                    e.minUI(weightRow(f, (i / 2) % 2), e.index(c.n - 1))});
      mine.push_back(element(finals[f], i));
    }
  SmallVector<Value> totals =
      sumSplits(k, partialView, lhs.rows, c.splits, splitIdx, mine, at);
  for (int64_t f = 0; f < fragments(); ++f)
    for (int64_t i = 0; i < c.tileM / 2; ++i)
      finals[f] = LLVM::InsertValueOp::create(b, e.loc, finals[f],
                                              totals[f * (c.tileM / 2) + i],
                                              ArrayRef<int64_t>{i});
}

Value DecodeEmitter::addBias(Value v, Value wr) {
  if (!bias)
    return v;
  Value safe = e.minUI(wr, e.index(c.n - 1));
  return e.add(v, c.grouped ? e.load(bias, {expertIdx, safe})
                            : e.load(bias, {safe}));
}

Value DecodeEmitter::output(ArrayRef<Value> finals, int64_t gf, int64_t i) {
  int64_t h = (i / 2) % 2;
  Value v = addBias(element(finals[gf], i), weightRow(gf, h));
  if (!c.gated)
    return v;
  int64_t upF = gf + fragments() / 2;
  Value up = addBias(element(finals[upF], i), weightRow(upF, h));
  return common::activate(e, op.getActivationAttr(), v, up);
}

void DecodeEmitter::emitStore(ArrayRef<Value> finals) {
  for (int64_t gf = 0; gf < outFragments(); ++gf)
    for (int64_t i = 0; i < c.tileM / 2; ++i) {
      Value row = rowOf(i);
      // The output column: the gate (or only) weight row.
      Value col = weightRow(gf, (i / 2) % 2);
      Value v = output(finals, gf, i);
      e.ifThen(e.andi(e.ult(row, rowEndIdx), e.ult(col, e.index(c.outN))), [&] {
        e.store(v, out, {row, col});
      });
    }
}

void DecodeEmitter::emitQuantizedStore(ArrayRef<Value> finals) {
  // An output block of bs columns of one row spans bs / 16 of the
  // (fragment, warp) groups of 16 weight rows: each warp reduces its
  // group's statistics over the lanes that share a row, stores them in
  // shared memory, and after a barrier each thread combines its block's.
  // Values are rounded to bf16 first, as the unfused matmul stores them.
  QuantAttr outQuant = op.getOutQuantAttr();
  int64_t bs = c.outBlock, groups = outFragments() * 4;
  Type f32 = b.getF32Type(), bf16 = b.getBF16Type();
  Value stats = k.workgroupBuffer({2, groups, c.tileM}, f32);
  SmallVector<SmallVector<Value>> values(outFragments());
  for (int64_t gf = 0; gf < outFragments(); ++gf) {
    Value group = e.iadd(e.index(gf * 4), warp);
    for (int64_t i = 0; i < c.tileM / 2; ++i) {
      Value col = weightRow(gf, (i / 2) % 2);
      Value v = arith::ExtFOp::create(
          b, e.loc, f32,
          arith::TruncFOp::create(b, e.loc, bf16, output(finals, gf, i))
              .getResult());
      // Columns past N are no part of any block.
      v = e.select(e.ult(col, e.index(c.outN)), v, e.f32(0.0));
      values[gf].push_back(v);
    }
    // Elements i and i + 2 are the same row's two weight rows.
    for (int64_t i = 0; i < c.tileM / 2; ++i) {
      if ((i / 2) % 2 != 0)
        continue;
      Value special0, special1;
      Value m0 = common::blockStats(e, values[gf][i], special0);
      Value m1 = common::blockStats(e, values[gf][i + 2], special1);
      Value amax = arith::MaxNumFOp::create(b, e.loc, m0, m1);
      Value special = arith::MaximumFOp::create(b, e.loc, special0, special1);
      for (int64_t offset = 4; offset < 32; offset *= 2) {
        auto shuffle = [&](Value x) {
          return gpu::ShuffleOp::create(b, e.loc, x, offset, 32,
                                        gpu::ShuffleMode::XOR)
              .getShuffleResult();
        };
        amax = arith::MaxNumFOp::create(b, e.loc, amax, shuffle(amax));
        special =
            arith::MaximumFOp::create(b, e.loc, special, shuffle(special));
      }
      Value tokenCol = e.isub(rowOf(i), rowStartIdx);
      e.ifThen(e.ult(lane, e.index(4)), [&] {
        memref::StoreOp::create(b, e.loc, amax, stats,
                                ValueRange{e.index(0), group, tokenCol});
        memref::StoreOp::create(b, e.loc, special, stats,
                                ValueRange{e.index(1), group, tokenCol});
      });
    }
  }
  consumerBarrier(kStatsBarrier);
  for (int64_t gf = 0; gf < outFragments(); ++gf) {
    // This thread's block: groups [first, first + bs / 16).
    Value firstRow = e.iadd(e.index(gf * kFragmentRows), e.imul(warp, 16));
    Value block = e.divUI(firstRow, bs);
    Value first = e.imul(block, bs / 16);
    for (int64_t i = 0; i < c.tileM / 2; ++i) {
      if ((i / 2) % 2 != 0)
        continue;
      Value tokenCol = e.isub(rowOf(i), rowStartIdx);
      Value amax = e.f32(0.0), special = e.f32(0.0);
      for (int64_t g = 0; g < bs / 16; ++g) {
        Value at = e.iadd(first, e.index(g));
        amax = arith::MaxNumFOp::create(
            b, e.loc, amax,
            memref::LoadOp::create(b, e.loc, stats,
                                   ValueRange{e.index(0), at, tokenCol}));
        special = arith::MaximumFOp::create(
            b, e.loc, special,
            memref::LoadOp::create(b, e.loc, stats,
                                   ValueRange{e.index(1), at, tokenCol}));
      }
      common::BlockScale scale = common::blockScale(e, outQuant, amax, special);
      Value row = rowOf(i);
      e.ifThen(e.ult(row, rowEndIdx), [&] {
        for (int64_t h = 0; h < 2; ++h) {
          Value col = weightRow(gf, h);
          Value code = scale.encode(e, values[gf][i + 2 * h]);
          e.ifThen(e.ult(col, e.index(c.outN)), [&] {
            e.storeRaw(code, out, {row, col});
          });
        }
        // The block's first group's first lanes store its scale.
        Value blockCol = e.iadd(colTile, e.imul(block, bs));
        e.ifThen(
            e.andi(e.andi(e.ult(lane, e.index(4)),
                          e.eq(e.remUI(firstRow, bs), e.index(0))),
                   e.ult(blockCol, e.index(c.outN))),
            [&] {
              e.storeRaw(scale.stored, outScale, {row, e.divUI(blockCol, bs)});
            });
      });
    }
  }
}

void DecodeEmitter::emitConsumer(Value pos) {
  SmallVector<Value> finals = emitMainLoop(pos);
  OpBuilder::InsertionGuard guard(b);
  if (c.splits > 1)
    emitSplitSum(finals);
  if (c.outBlock)
    emitQuantizedStore(finals);
  else
    emitStore(finals);
}

LogicalResult DecodeEmitter::emit(ArrayRef<Value> buffers,
                                  ArrayRef<unsigned> indices,
                                  const TensorInfo &partials) {
  emitViews(buffers, indices, partials);
  tid = k.threadId();
  warp = e.remUI(e.divUI(tid, 32), 4);
  lane = e.remUI(tid, 32);
  emitSharedMemory();
  gpu::BarrierOp::create(b, e.loc);
  // Row tiles x, x + grid, ...: the grid holds one per tile of the bucket
  // (a decode tile always has one: checkSwapConfig), fewer where rows
  // arrive from other ranks; the tiles the experts' rows fill (grouped) or
  // the bucket's. The ring's position runs on.
  Value tiles = c.grouped ? countTiles(e, tid, counts, c.experts, c.tileM)
                          : e.index(c.rowTiles);
  auto walk =
      scf::ForOp::create(b, e.loc, k.blockId(gpu::Dimension::x), tiles,
                         gpu::GridDimOp::create(b, e.loc, gpu::Dimension::x),
                         ValueRange{e.index(0)});
  b.setInsertionPointToStart(walk.getBody());
  Value pos = walk.getRegionIterArgs()[0];
  emitTile(walk.getInductionVar());
  // A row tile past the rows of the call has nothing to do.
  auto active = scf::IfOp::create(
      b, e.loc, TypeRange{b.getIndexType()},
      e.icmp(arith::CmpIPredicate::sge, expert, e.i32(0)), /*withElse=*/true);
  b.setInsertionPointToStart(&active.getElseRegion().front());
  scf::YieldOp::create(b, e.loc, pos);
  b.setInsertionPointToStart(&active.getThenRegion().front());
  auto roles = scf::IfOp::create(b, e.loc, e.ult(tid, e.index(c.consumers())),
                                 /*withElse=*/true);
  b.setInsertionPointToStart(&roles.getElseRegion().front());
  emitProducer(pos);
  b.setInsertionPointToStart(&roles.getThenRegion().front());
  emitConsumer(pos);
  b.setInsertionPointAfter(roles);
  scf::YieldOp::create(b, e.loc, e.iadd(pos, kCount));
  b.setInsertionPointAfter(active);
  scf::YieldOp::create(b, e.loc, active.getResult(0));
  b.setInsertionPointAfter(walk);
  return k.finish(op);
}

LogicalResult nvidia::emitDecodeMatmul(LayerKernels &layer, GroupedMatmulOp op,
                                       const MatmulConfig &c,
                                       const TensorInfo &lhs, Kernel &k,
                                       ArrayRef<Value> buffers,
                                       ArrayRef<unsigned> indices,
                                       const TensorInfo &partials) {
  return DecodeEmitter(layer, op, c, lhs, k).emit(buffers, indices, partials);
}
