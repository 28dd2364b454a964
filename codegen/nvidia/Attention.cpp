//===- Attention.cpp - the attention kernels ------------------------------===//
//
// moe.tiled_attention on the tensor cores, as FlashAttention-3 runs it. A
// block takes 128 query rows (query positions times the query heads that
// share a key/value head, so a decode step's heads share one K/V stream)
// with three warpgroups: a producer, one of whose threads loads Q once and
// K and V tiles with TMA into rings of mbarrier-guarded slots (128-byte
// swizzle), and the schedule's two row groups, 64 rows each. A row group
// issues S = Q K^T (both operands from shared memory) and O += P V (P from
// its registers, V MN-major) with wgmma, and runs the online softmax in f32
// registers while they run: pv of the previous tile is in flight during
// the softmax of the next. With the ping-pong schedule the groups take
// turns on the tensor cores through two named barriers, so one group's
// matmuls run beside the other's softmax. Tiles past the causal diagonal
// are never loaded; only tiles that cross it or the end of the keys are
// masked. A block with key splits writes f32 partials and the row's max
// and sum, which moe_attention_merge combines as the CPU backend does.
//
//===----------------------------------------------------------------------===//

#include "codegen/common/Numerics.h"
#include "codegen/nvidia/Hopper.h"
#include "codegen/nvidia/KernelBuilder.h"

#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/NVGPU/IR/NVGPUDialect.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::nvidia;

namespace {
constexpr int64_t kGroupRows = 64, kGroups = 2, kBlockRows = 128;
constexpr int64_t kChunk = 64, kChunkBytes = 128; // bf16 per swizzled row
constexpr int64_t kProducerRegisters = 24, kConsumerRegisters = 240;
constexpr int64_t kSharedLimit = 227 * 1024, kMaxStages = 4;
constexpr int64_t kConsumers = kGroups * 128;

/// What moe-split-attention's schedule asks of the kernel: whether the
/// row groups take turns on the tensor cores.
FailureOr<bool> pingPongOf(TiledAttentionOp op) {
  using K = AttentionStageKind;
  ArrayAttr schedule = op.getSchedule();
  // Both forms issue pv of the previous tile beside qk of this one.
  for (int64_t g = 0; g < kGroups; ++g) {
    auto qk = op.placement(K::QK, g), pv = op.placement(K::PV, g);
    if (qk.slot != pv.slot || qk.tile != 0 || pv.tile != -1)
      return failure();
  }
  bool pingPong = true, serial = schedule.size() == 2;
  for (auto [slot, stages] : llvm::enumerate(schedule)) {
    SmallVector<int64_t> matrixGroups;
    for (Attribute a : cast<ArrayAttr>(stages)) {
      auto stage = cast<StageAttr>(a);
      if (stage.isMatrix())
        matrixGroups.push_back(stage.getGroup());
      serial &= stage.isMatrix() == (slot == 0);
    }
    pingPong &= llvm::all_of(matrixGroups,
                             [&](int64_t g) { return g == int64_t(slot); });
  }
  if (pingPong && schedule.size() == kGroups)
    return true;
  if (serial)
    return false;
  return failure();
}
} // namespace

LogicalResult nvidia::buildAttention(LayerKernels &layer, TiledAttentionOp op) {
  auto qType = cast<RankedTensorType>(op.getQuery().getType());
  auto kType = cast<RankedTensorType>(op.getKey().getType());
  auto vType = cast<RankedTensorType>(op.getValue().getType());
  const char *names[] = {"batch", "query positions", "heads", "head size"};
  for (auto [tensor, type] : {std::pair{"query", qType}, {"key", kType}})
    for (int64_t d = 0; d < 4; ++d)
      if (type.isDynamicDim(d))
        return op.emitOpError()
               << "has a dynamic " << names[d] << " in '" << tensor
               << "': the sm_90a attention kernel takes static shapes";
  int64_t batch = qType.getDimSize(0), sq = qType.getDimSize(1);
  int64_t hq = qType.getDimSize(2), d = qType.getDimSize(3);
  int64_t skv = kType.getDimSize(1), hkv = kType.getDimSize(2);
  int64_t dv = vType.getDimSize(3);
  int64_t tileN = op.getTileN(), splits = op.getKvSplits();
  for (auto [what, size] : {std::pair{"head size", d}, {"value head size", dv}})
    if (size % kChunk != 0 || size > 256)
      return op.emitOpError()
             << "has " << what << " " << size
             << ": the sm_90a kernel takes 64, 128, 192 or 256 (whole "
                "128-byte rows for TMA's swizzle, at most wgmma's N of 256)";
  if (op.getTileM() != kGroupRows || op.getGroups() != kGroups)
    return op.emitOpError()
           << "has row groups of " << op.getTileM() << " x " << op.getGroups()
           << ": the sm_90a kernel runs two groups of 64 "
              "rows (one warpgroup each)";
  if (tileN != 64 && tileN != 128)
    return op.emitOpError() << "has key tiles of " << tileN
                            << ": the sm_90a kernel takes 64 or 128";
  // Registers: S (tileN / 2) and O (dv / 2) f32 per thread, with P.
  if (tileN / 2 + dv / 2 > 160)
    return op.emitOpError()
           << "has key tiles of " << tileN << " with value head size " << dv
           << ": S and O would not fit a thread's registers; use tile-n=64";
  FailureOr<bool> pingPong = pingPongOf(op);
  if (failed(pingPong))
    return op.emitOpError()
           << "has a schedule the sm_90a kernel does not run: it runs "
              "moe-split-attention's ping-pong or serial schedule";
  // Nothing to compute (the verifier keeps head counts positive): no launch.
  if (batch == 0 || sq == 0)
    return success();

  // Query heads per key/value head; `pack` of them share a row tile.
  int64_t group = hq / hkv;
  int64_t pack = kBlockRows % group == 0 ? group : 1;
  int64_t headBlocks = group / pack;
  int64_t rowTiles = llvm::divideCeil(sq * pack, kBlockRows);
  int64_t keyTiles = llvm::divideCeil(skv, tileN);
  int64_t perSplit = std::max<int64_t>(llvm::divideCeil(keyTiles, splits), 1);
  int64_t qBytes = kBlockRows * d * 2, kBytes = tileN * d * 2,
          vBytes = tileN * dv * 2;
  // Two Q buffers where two K/V slots still fit: the producer loads the
  // next tile's Q while the row groups finish this one.
  int64_t qBuffers =
      2 * qBytes + 2 * (kBytes + vBytes) + 1024 <= kSharedLimit ? 2 : 1;
  int64_t stages =
      std::min(kMaxStages,
               (kSharedLimit - qBuffers * qBytes - 1024) / (kBytes + vBytes));
  if (stages < 2)
    return op.emitOpError() << "needs " << qBytes + 2 * (kBytes + vBytes)
                            << " bytes of shared memory for Q and two K/V "
                               "slots; sm_90a has "
                            << kSharedLimit;
  // Work tiles: row tiles x heads x batch x key splits.
  int64_t headTiles = hkv * headBlocks * batch * splits;
  int64_t workTiles = rowTiles * headTiles;
  // A causal unit is a pair of row tiles of one head, the j-th longest
  // and the j-th shortest, so every unit has about the same work.
  int64_t perUnit = op.getCausal() ? 2 : 1;
  int64_t unitsPerHead = llvm::divideCeil(rowTiles, perUnit);
  if (workTiles >= (int64_t(1) << 31))
    return op.emitOpError()
           << "has " << workTiles << " tiles of 128 rows; at most 2^31 run";

  // TMA: Q as (d, head in group, position, key/value head, batch), a box
  // of [128 / pack positions][pack heads][64]: row r of the tile is
  // position r / pack, head r % pack. K and V as (d, position, head,
  // batch): rows past the keys read as zeros.
  unsigned qMap = layer.plan.addTensorMap(
      layer.info(op.getQuery()).buffer, 2, group, d, d, pack, kChunk,
      {sq, hq * d, kBlockRows / pack, hkv, group * d, 1, batch, sq * hq * d,
       1});
  auto kvMap = [&](Value tensor, int64_t width) {
    return layer.plan.addTensorMap(
        layer.info(tensor).buffer, 2, std::max<int64_t>(skv, 1), hkv * width,
        width, tileN, kChunk,
        {hkv, width, 1, batch, std::max<int64_t>(skv, 1) * hkv * width, 1});
  };
  unsigned kMap = kvMap(op.getKey(), d), vMap = kvMap(op.getValue(), dv);
  // Without key splits a row group stages its output in its rows of the
  // tile's Q buffer (free once its last qk is done) and stores it with TMA,
  // 64 rows at a time; positions past the query's end are clipped.
  bool tmaStore = splits == 1 && dv <= d && pack <= kGroupRows;

  const TensorInfo &out = layer.define(op.getOut(), {});
  int64_t rowsTotal = batch * sq * hq;
  MLIRContext *ctx = op.getContext();
  Type f32 = Float32Type::get(ctx), bf16 = BFloat16Type::get(ctx);
  // Key splits: f32 partial outputs [splits * rows, dv] and (max, sum).
  TensorInfo partials{}, stats{};
  SmallVector<unsigned> buffers = {out.buffer};
  if (splits > 1) {
    partials =
        TensorInfo{layer.plan.addWorkspace({splits * rowsTotal * dv * 4, 0}),
                   MemRefType::get({splits * rowsTotal, dv}, f32),
                   {}};
    stats = TensorInfo{layer.plan.addWorkspace({splits * rowsTotal * 8, 0}),
                       MemRefType::get({splits * rowsTotal, 2}, f32),
                       {}};
    buffers = {partials.buffer, stats.buffer};
  }
  SmallVector<unsigned> maps = {qMap, kMap, vMap};
  if (tmaStore)
    maps.push_back(
        layer.plan.addTensorMap(out.buffer, 2, group, dv, dv, pack, kChunk,
                                {sq, hq * dv, kGroupRows / pack, hkv,
                                 group * dv, 1, batch, sq * hq * dv, 1}));
  Kernel k = layer.kernelOn(op, "attention", buffers, maps);
  Launch &launch = k.launch;
  // Persistent: each block strides over the work tiles, so its producer
  // loads the next tile's Q, K and V while its row groups finish one.
  launch.work = {headTiles * unitsPerHead, 0};
  launch.persistent = true;
  launch.block = (kGroups + 1) * 128;
  launch.sharedBytes = qBuffers * qBytes + stages * (kBytes + vBytes) + 1024;
  k.func.setKnownBlockSizeAttr(
      k.b.getDenseI32ArrayAttr({int32_t(launch.block), 1, 1}));
  Emitter &e = k.e;
  OpBuilder &b = e.b;
  Location loc = e.loc;
  Type i32 = b.getI32Type(), i64 = b.getI64Type();
  Value outView =
      splits > 1 ? Value()
                 : k.view(0, TensorInfo{out.buffer,
                                        MemRefType::get({rowsTotal, dv}, bf16),
                                        {}});
  Value partialView = splits > 1 ? k.view(0, partials) : Value();
  Value statsView = splits > 1 ? k.view(1, stats) : Value();
  auto workgroup =
      gpu::AddressSpaceAttr::get(ctx, gpu::AddressSpace::Workgroup);
  auto smemType = [&](ArrayRef<int64_t> shape) {
    return MemRefType::get(shape, bf16, MemRefLayoutAttrInterface(), workgroup);
  };
  auto mapType = [&](ArrayRef<int64_t> box) {
    return nvgpu::TensorMapDescriptorType::get(
        ctx, smemType(box), nvgpu::TensorMapSwizzleKind::SWIZZLE_128B,
        nvgpu::TensorMapL2PromoKind::L2PROMO_128B,
        nvgpu::TensorMapOOBKind::OOB_ZERO,
        nvgpu::TensorMapInterleaveKind::INTERLEAVE_NONE);
  };
  SmallVector<int64_t> qBox = {1, 1, kBlockRows / pack, pack, kChunk};
  SmallVector<int64_t> kvBox = {1, 1, tileN, kChunk};
  unsigned firstMap = buffers.size();
  Value qDesc = k.tensorMap(firstMap, mapType(qBox));
  Value kDesc = k.tensorMap(firstMap + 1, mapType(kvBox));
  Value vDesc = k.tensorMap(firstMap + 2, mapType(kvBox));
  SmallVector<int64_t> oBox = {1, 1, kGroupRows / pack, pack, kChunk};
  Value oDesc = tmaStore ? k.tensorMap(firstMap + 3, mapType(oBox)) : Value();

  Value tid = k.threadId();
  auto slt = [&](Value a, Value c) {
    return e.icmp(arith::CmpIPredicate::slt, a, c);
  };
  // A work tile: its rows, heads and key tiles [first, first + count).
  // Tiles go head by head, so a head's K and V stay in L2 while its row
  // tiles run.
  struct Tile {
    Value split, kvHead, batch, firstHead, firstPos, first, count;
    Value real; // false for the second half of a one-tile pair
  };
  auto tileOf = [&](Value unit, Value half) {
    Tile w;
    Value y = e.divUI(unit, unitsPerHead);
    Value j = e.remUI(unit, unitsPerHead);
    Value rowTile = j;
    Value duplicate = arith::ConstantIntOp::create(b, loc, 0, 1);
    if (op.getCausal()) {
      Value longer = e.isub(e.index(rowTiles - 1), j);
      rowTile = e.select(e.eq(half, e.index(0)), longer, j);
      // The middle tile of an odd count is its own pair.
      duplicate = e.andi(e.eq(half, e.index(1)), e.eq(longer, j));
    }
    w.split = e.remUI(y, splits);
    Value rest = e.divUI(y, splits);
    Value headBlock = e.remUI(rest, headBlocks);
    rest = e.divUI(rest, headBlocks);
    w.kvHead = e.remUI(rest, hkv);
    w.batch = e.divUI(rest, hkv);
    w.firstHead = e.imul(headBlock, pack); // within the group
    w.firstPos = e.imul(rowTile, kBlockRows / pack);
    Value first = e.minUI(e.imul(w.split, perSplit), e.index(keyTiles));
    Value last = e.minUI(e.iadd(first, e.index(perSplit)), e.index(keyTiles));
    if (op.getCausal()) {
      // The tile's last position sees keys up to pos + skv - sq: later
      // key tiles are never loaded.
      Value lastPos = e.minUI(
          e.iadd(w.firstPos, e.index(kBlockRows / pack - 1)), e.index(sq - 1));
      Value seen = e.isub(e.iadd(lastPos, e.index(skv + 1)), e.index(sq));
      Value tiles = e.divUI(e.iadd(seen, e.index(tileN - 1)), tileN);
      tiles = e.select(slt(seen, e.index(1)), e.index(0), tiles);
      last = e.minUI(last, tiles);
      first = e.minUI(first, last);
    }
    w.first = first;
    w.count = e.select(duplicate, e.index(0), e.isub(last, first));
    w.real = arith::XOrIOp::create(b, loc, duplicate,
                                   arith::ConstantIntOp::create(b, loc, 1, 1));
    return w;
  };
  // Both roles walk the same tiles, carrying the rings' K/V iteration
  // and the number of Q loads so far.
  auto forEachTile = [&](function_ref<void(Tile &, Value, Value)> body) {
    Value step = gpu::GridDimOp::create(b, loc, gpu::Dimension::x);
    auto units = scf::ForOp::create(b, loc, k.blockId(gpu::Dimension::x),
                                    e.index(headTiles * unitsPerHead), step,
                                    ValueRange{e.index(0), e.index(0)});
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(units.getBody());
    auto halves = scf::ForOp::create(b, loc, e.index(0), e.index(perUnit),
                                     e.index(1), units.getRegionIterArgs());
    b.setInsertionPointToStart(halves.getBody());
    Tile w = tileOf(units.getInductionVar(), halves.getInductionVar());
    Value kvIter = halves.getRegionIterArgs()[0];
    Value qLoads = halves.getRegionIterArgs()[1];
    body(w, kvIter, qLoads);
    Value loaded = e.ult(e.index(0), w.count);
    scf::YieldOp::create(
        b, loc,
        ValueRange{e.iadd(kvIter, w.count),
                   e.iadd(qLoads, e.select(loaded, e.index(1), e.index(0)))});
    b.setInsertionPointAfter(halves);
    scf::YieldOp::create(b, loc, halves.getResults());
  };

  // Shared memory, 1024-byte aligned: Q, then the K ring, then the V ring.
  auto bytesType = MemRefType::get({ShapedType::kDynamic}, b.getI8Type(),
                                   MemRefLayoutAttrInterface(), workgroup);
  Value smem = gpu::DynamicSharedMemoryOp::create(b, loc, bytesType);
  Value base = memref::ExtractAlignedPointerAsIndexOp::create(b, loc, smem);
  Value pad = e.remUI(e.isub(e.index(1024), e.remUI(base, 1024)), 1024);
  auto viewAt = [&](Value offset, ArrayRef<int64_t> shape) {
    return memref::ViewOp::create(b, loc, smemType(shape), smem,
                                  e.iadd(pad, offset), ValueRange{})
        .getResult();
  };
  auto addressAt = [&](Value offset) {
    return arith::IndexCastOp::create(b, loc, i64,
                                      e.iadd(e.iadd(base, pad), offset))
        .getResult();
  };
  auto kOffset = [&](Value slot) {
    return e.iadd(e.index(qBuffers * qBytes), e.imul(slot, kBytes));
  };
  auto vOffset = [&](Value slot) {
    return e.iadd(e.index(qBuffers * qBytes + stages * kBytes),
                  e.imul(slot, vBytes));
  };

  auto barrierType = [&](int64_t n) {
    return nvgpu::MBarrierGroupType::get(ctx, workgroup, n);
  };
  Value qFull = nvgpu::MBarrierCreateOp::create(b, loc, barrierType(qBuffers));
  Value qEmpty = nvgpu::MBarrierCreateOp::create(b, loc, barrierType(qBuffers));
  Value kFull = nvgpu::MBarrierCreateOp::create(b, loc, barrierType(stages));
  Value kEmpty = nvgpu::MBarrierCreateOp::create(b, loc, barrierType(stages));
  Value vFull = nvgpu::MBarrierCreateOp::create(b, loc, barrierType(stages));
  Value vEmpty = nvgpu::MBarrierCreateOp::create(b, loc, barrierType(stages));
  Value leader = e.eq(tid, e.index(0));
  for (int64_t q = 0; q < qBuffers; ++q) {
    nvgpu::MBarrierInitOp::create(b, loc, qFull, e.index(1), e.index(q),
                                  leader);
    nvgpu::MBarrierInitOp::create(b, loc, qEmpty, e.index(kGroups), e.index(q),
                                  leader);
  }
  for (int64_t s = 0; s < stages; ++s)
    for (auto [group, arrivals] : {std::pair{kFull, int64_t(1)},
                                   {vFull, 1},
                                   {kEmpty, kConsumers},
                                   {vEmpty, kConsumers}})
      nvgpu::MBarrierInitOp::create(b, loc, group, e.index(arrivals),
                                    e.index(s), leader);
  e.ifThen(leader, [&] { NVVM::FenceMbarrierInitOp::create(b, loc); });
  gpu::BarrierOp::create(b, loc);

  auto parityOf = [&](Value round) {
    return arith::TruncIOp::create(b, loc, b.getI1Type(),
                                   e.toI32(e.remUI(round, 2)))
        .getResult();
  };
  auto waitOn = [&](Value group, Value slot, Value round) {
    nvgpu::MBarrierTryWaitParityOp::create(b, loc, group, parityOf(round),
                                           e.index(10000000), slot);
  };

  Value consumer = e.ult(tid, e.index(kConsumers));
  auto roles = scf::IfOp::create(b, loc, consumer, /*withElse=*/true);
  // The producer: one thread loads Q, then each tile's K and V into the
  // next slot of their rings once every consumer has released it.
  b.setInsertionPointToStart(&roles.getElseRegion().front());
  NVVM::SetMaxRegisterOp::create(b, loc, kProducerRegisters,
                                 NVVM::SetMaxRegisterAction::decrease);
  e.ifThen(e.eq(tid, e.index(kConsumers)), [&] {
    forEachTile([&](Tile &w, Value kvIter, Value qLoads) {
      e.ifThen(e.ult(e.index(0), w.count), [&] {
        // A Q buffer is free once the row groups are done with the tile
        // it held before.
        Value buffer = e.remUI(qLoads, qBuffers);
        Value use = e.divUI(qLoads, qBuffers);
        e.ifThen(e.ult(e.index(0), use),
                 [&] { waitOn(qEmpty, buffer, e.isub(use, e.index(1))); });
        nvgpu::MBarrierArriveExpectTxOp::create(b, loc, qFull, e.index(qBytes),
                                                buffer, Value());
        for (int64_t c = 0; c < d / kChunk; ++c)
          nvgpu::TmaAsyncLoadOp::create(
              b, loc,
              viewAt(e.iadd(e.imul(buffer, qBytes),
                            e.index(c * kBlockRows * kChunkBytes)),
                     qBox),
              qFull, qDesc,
              ValueRange{e.index(c * kChunk), w.firstHead, w.firstPos, w.kvHead,
                         w.batch},
              buffer, Value(), Value());
        e.forEach(e.index(0), w.count, [&](Value i) {
          Value n = e.iadd(kvIter, i);
          Value slot = e.remUI(n, stages);
          Value round = e.divUI(n, stages);
          Value key0 = e.imul(e.iadd(w.first, i), tileN);
          auto load = [&](Value full, Value empty, Value desc, Value offset,
                          int64_t width, int64_t bytes) {
            e.ifThen(e.icmp(arith::CmpIPredicate::uge, n, e.index(stages)),
                     [&] { waitOn(empty, slot, e.iadd(round, e.index(1))); });
            nvgpu::MBarrierArriveExpectTxOp::create(
                b, loc, full, e.index(bytes), slot, Value());
            for (int64_t c = 0; c < width / kChunk; ++c)
              nvgpu::TmaAsyncLoadOp::create(
                  b, loc,
                  viewAt(e.iadd(offset, e.index(c * tileN * kChunkBytes)),
                         kvBox),
                  full, desc,
                  ValueRange{e.index(c * kChunk), key0, w.kvHead, w.batch},
                  slot, Value(), Value());
          };
          load(kFull, kEmpty, kDesc, kOffset(slot), d, kBytes);
          load(vFull, vEmpty, vDesc, vOffset(slot), dv, vBytes);
        });
      });
    });
  });

  // The row groups.
  b.setInsertionPointToStart(&roles.getThenRegion().front());
  NVVM::SetMaxRegisterOp::create(b, loc, kConsumerRegisters,
                                 NVVM::SetMaxRegisterAction::increase);
  Value g = e.divUI(tid, 128);
  Value groupLeader = e.eq(e.remUI(tid, 128), e.index(0));
  Value warp = e.remUI(e.divUI(tid, 32), 4), lane = e.remUI(tid, 32);
  // Fragment element i of a thread is row 16w + l/4 + 8((i/2)%2) of its
  // group's 64 and column 8(i/4) + 2(l%4) + i%2.
  Value rowInTile[2];
  rowInTile[0] =
      e.iadd(e.iadd(e.imul(g, kGroupRows), e.imul(warp, 16)), e.divUI(lane, 4));
  rowInTile[1] = e.iadd(rowInTile[0], e.index(8));
  Value colBase = e.imul(e.remUI(lane, 4), 2);
  auto fragmentColumn = [&](int64_t i) {
    return e.iadd(colBase, e.index((i / 4) * 8 + i % 2));
  };
  // The tile being walked (set per work tile below): its first key tile,
  // its K/V ring position, its rows' positions and the last key each sees
  // (signed: a row may see none), and the smallest of those, up to which
  // no key tile needs the causal mask.
  Value first, kvBase, blockLimit, position[2], limit[2];

  auto fragmentType = [&](int64_t n) {
    SmallVector<Type> fields(n / 2, f32);
    return LLVM::LLVMStructType::getLiteral(ctx, fields);
  };
  Type sType = fragmentType(tileN), oType = fragmentType(dv);
  auto constF32 = [&](double v) { return e.f32(v); };
  auto field = [&](Value s, int64_t i) {
    return LLVM::ExtractValueOp::create(b, loc, s, ArrayRef<int64_t>{i})
        .getResult();
  };
  Value turn[2] = {e.i32(1), e.i32(2)};
  Value myTurn = e.select(e.eq(g, e.index(0)), turn[0], turn[1]);
  Value otherTurn = e.select(e.eq(g, e.index(0)), turn[1], turn[0]);
  auto waitTurn = [&] {
    if (*pingPong)
      namedBarrierSync(b, loc, myTurn, kConsumers);
  };
  auto giveTurn = [&] {
    if (*pingPong)
      namedBarrierArrive(b, loc, otherTurn, kConsumers);
  };

  // S = Q K^T for key tile i of the block's range.
  Value qBuffer; // the tile's Q buffer, set per work tile
  Value groupOffset = arith::IndexCastOp::create(
      b, loc, i64, e.imul(g, kGroupRows * kChunkBytes));
  auto issueQK = [&](Value i) {
    Value n = e.iadd(kvBase, i);
    Value slot = e.remUI(n, stages);
    waitOn(kFull, slot, e.divUI(n, stages));
    Value kAddress = addressAt(kOffset(slot));
    NVVM::WgmmaFenceAlignedOp::create(b, loc);
    Value acc = LLVM::PoisonOp::create(b, loc, sType);
    for (int64_t kk = 0; kk < d / 16; ++kk) {
      int64_t c = kk / 4, within = (kk % 4) * 32;
      Value qAddress = addressAt(e.imul(qBuffer, qBytes));
      Value aAddr = LLVM::AddOp::create(
          b, loc, LLVM::AddOp::create(b, loc, qAddress, groupOffset),
          k.constI64(c * kBlockRows * kChunkBytes + within));
      Value bAddr = LLVM::AddOp::create(
          b, loc, kAddress, k.constI64(c * tileN * kChunkBytes + within));
      acc = wgmmaKMajor(b, loc, sType, acc, swizzledDescriptor(b, loc, aAddr),
                        swizzledDescriptor(b, loc, bAddr), tileN, 16,
                        NVVM::WGMMATypes::bf16, /*accumulate=*/kk != 0);
    }
    NVVM::WgmmaGroupSyncAlignedOp::create(b, loc);
    return acc;
  };
  // O += P V for key tile i: P (bf16 pairs) from registers, V MN-major
  // (chunks of 64 value columns tileN * 128 bytes apart).
  std::string pvText;
  {
    int64_t n = dv / 2;
    llvm::raw_string_ostream os(pvText);
    os << "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
       << "wgmma.mma_async.sync.aligned.m64n" << dv << "k16.f32.bf16.bf16 {";
    for (int64_t j = 0; j < n; ++j)
      os << (j ? ", " : "") << "$" << j;
    os << "}, {$" << 2 * n << ", $" << 2 * n + 1 << ", $" << 2 * n + 2 << ", $"
       << 2 * n + 3 << "}, $" << 2 * n + 4 << ", p, 1, 1, 1;\n}";
  }
  std::string pvConstraints;
  for (int64_t j = 0; j < dv / 2; ++j)
    pvConstraints += "=f,";
  for (int64_t j = 0; j < dv / 2; ++j)
    pvConstraints += std::to_string(j) + ",";
  pvConstraints += "r,r,r,r,l";
  auto issuePV = [&](Value acc, ArrayRef<Value> p, Value i) {
    Value n = e.iadd(kvBase, i);
    Value slot = e.remUI(n, stages);
    waitOn(vFull, slot, e.divUI(n, stages));
    Value vAddress = addressAt(vOffset(slot));
    NVVM::WgmmaFenceAlignedOp::create(b, loc);
    for (int64_t kk = 0; kk < tileN / 16; ++kk) {
      Value desc = swizzledDescriptor(
          b, loc,
          LLVM::AddOp::create(b, loc, vAddress, k.constI64(kk * 16 * 128)),
          tileN * kChunkBytes, 1024);
      SmallVector<Value> operands;
      for (int64_t j = 0; j < dv / 2; ++j)
        operands.push_back(field(acc, j));
      operands.append(p.begin() + 4 * kk, p.begin() + 4 * kk + 4);
      operands.push_back(desc);
      acc = inlinePtx(b, loc, oType, operands, pvText, pvConstraints);
    }
    NVVM::WgmmaGroupSyncAlignedOp::create(b, loc);
    return acc;
  };
  auto release = [&](Value group, Value i) {
    mbarrierArrive(b, loc, group, e.remUI(e.iadd(kvBase, i), stages));
  };

  float c = common::attentionLog2Scale(op.getScale().convertToDouble());
  Value scaleC = constF32(c), negInf = constF32(-INFINITY);
  auto exp2 = [&](Value x) {
    return inlinePtx(b, loc, f32, x, "ex2.approx.ftz.f32 $0, $1;", "=f,f");
  };
  auto quadReduce = [&](Value v, bool max) {
    for (int64_t offset : {1, 2}) {
      Value other = gpu::ShuffleOp::create(b, loc, v, e.i32(offset), e.i32(32),
                                           gpu::ShuffleMode::XOR)
                        .getShuffleResult();
      v = max ? arith::MaximumFOp::create(b, loc, v, other).getResult()
              : e.add(v, other);
    }
    return v;
  };
  // The vector stages of key tile i: mask, max, exp, sum; returns P (as
  // bf16 pairs), the new maxima and sums, and the rescale factors.
  struct Softmax {
    SmallVector<Value> p;
    Value m[2], l[2], alpha[2];
  };
  auto softmax = [&](Value s, Value i, ArrayRef<Value> m, ArrayRef<Value> l) {
    int64_t n = tileN / 2;
    SmallVector<Value> x;
    for (int64_t j = 0; j < n; ++j)
      x.push_back(field(s, j));
    Value key0 = e.imul(e.iadd(first, i), tileN);
    Value tileEnd = e.iadd(key0, e.index(tileN));
    Value needMask = e.icmp(arith::CmpIPredicate::ugt, tileEnd, e.index(skv));
    if (op.getCausal())
      needMask = e.ori(needMask, slt(blockLimit, e.isub(tileEnd, e.index(1))));
    auto masked = scf::IfOp::create(b, loc, SmallVector<Type>(n, f32), needMask,
                                    /*withElse=*/true);
    {
      OpBuilder::InsertionGuard guard(b);
      b.setInsertionPointToStart(&masked.getElseRegion().front());
      scf::YieldOp::create(b, loc, x);
      b.setInsertionPointToStart(&masked.getThenRegion().front());
      SmallVector<Value> y;
      for (int64_t j = 0; j < n; ++j) {
        Value key = e.iadd(key0, fragmentColumn(j));
        Value visible = e.ult(key, e.index(skv));
        if (op.getCausal())
          visible = e.andi(visible, e.icmp(arith::CmpIPredicate::sle, key,
                                           limit[(j / 2) % 2]));
        y.push_back(e.select(visible, x[j], negInf));
      }
      scf::YieldOp::create(b, loc, y);
    }
    x.assign(masked.getResults().begin(), masked.getResults().end());
    Softmax r;
    Value shift[2];
    for (int64_t h = 0; h < 2; ++h) {
      Value top = negInf;
      for (int64_t j = 0; j < n; ++j)
        if ((j / 2) % 2 == h)
          top = arith::MaximumFOp::create(b, loc, top, x[j]);
      r.m[h] = arith::MaximumFOp::create(b, loc, m[h], quadReduce(top, true));
      Value none = arith::CmpFOp::create(b, loc, arith::CmpFPredicate::OEQ,
                                         r.m[h], negInf);
      shift[h] = e.select(none, constF32(0.0), e.mul(r.m[h], scaleC));
      r.alpha[h] = exp2(e.sub(e.mul(m[h], scaleC), shift[h]));
    }
    SmallVector<Value> p;
    Value sum[2] = {constF32(0.0), constF32(0.0)};
    for (int64_t j = 0; j < n; ++j) {
      int64_t h = (j / 2) % 2;
      Value v = exp2(math::FmaOp::create(
          b, loc, x[j], scaleC,
          arith::NegFOp::create(b, loc, shift[h]).getResult()));
      sum[h] = e.add(sum[h], v);
      p.push_back(v);
    }
    for (int64_t h = 0; h < 2; ++h)
      r.l[h] = e.add(e.mul(l[h], r.alpha[h]), sum[h]);
    // Pairs (2j, 2j + 1) are one row's adjacent columns: one bf16x2
    // register each, in wgmma's A fragment order.
    for (int64_t j = 0; j < n; j += 2)
      r.p.push_back(inlinePtx(b, loc, i32, ValueRange{p[j + 1], p[j]},
                              "cvt.rn.bf16x2.f32 $0, $1, $2;", "=r,f,f"));
    return r;
  };
  auto rescale = [&](Value acc, Value alpha[2]) {
    for (int64_t j = 0; j < dv / 2; ++j)
      acc = LLVM::InsertValueOp::create(
          b, loc, acc, e.mul(field(acc, j), alpha[(j / 2) % 2]),
          ArrayRef<int64_t>{j});
    return acc;
  };

  forEachTile([&](Tile &w, Value kvIter, Value qLoads) {
    first = w.first;
    kvBase = kvIter;
    Value count = w.count;
    for (int64_t h = 0; h < 2; ++h) {
      position[h] = e.iadd(w.firstPos, e.divUI(rowInTile[h], pack));
      limit[h] = e.isub(e.iadd(position[h], e.index(skv)), e.index(sq));
    }
    blockLimit = e.isub(e.iadd(w.firstPos, e.index(skv)), e.index(sq));
    SmallVector<Type> resultTypes = {oType, f32, f32, f32, f32};
    qBuffer = e.remUI(qLoads, qBuffers);
    auto walked =
        scf::IfOp::create(b, loc, resultTypes, e.ult(e.index(0), count),
                          /*withElse=*/true);
    {
      OpBuilder::InsertionGuard guard(b);
      b.setInsertionPointToStart(&walked.getElseRegion().front());
      scf::YieldOp::create(b, loc,
                           ValueRange{zeroFragment(b, loc, oType), negInf,
                                      negInf, constF32(0.0), constF32(0.0)});
      b.setInsertionPointToStart(&walked.getThenRegion().front());
      // The second group opens the first group's turn.
      if (*pingPong)
        e.ifThen(e.eq(g, e.index(1)),
                 [&] { namedBarrierArrive(b, loc, turn[0], kConsumers); });
      // The first tile: qk and its softmax, no pv yet.
      waitTurn();
      waitOn(qFull, qBuffer, e.divUI(qLoads, qBuffers));
      Value s = issueQK(e.index(0));
      giveTurn();
      NVVM::WgmmaWaitGroupSyncOp::create(b, loc, 0);
      s = fenceFragment(b, loc, s);
      release(kEmpty, e.index(0));
      Softmax st = softmax(s, e.index(0), {negInf, negInf},
                           {constF32(0.0), constF32(0.0)});
      SmallVector<Value> init = {zeroFragment(b, loc, oType), st.m[0], st.m[1],
                                 st.l[0], st.l[1]};
      init.append(st.p);
      auto loop =
          scf::ForOp::create(b, loc, e.index(1), count, e.index(1), init);
      {
        OpBuilder::InsertionGuard inner(b);
        b.setInsertionPointToStart(loop.getBody());
        Value i = loop.getInductionVar();
        ValueRange carried = loop.getRegionIterArgs();
        SmallVector<Value> p(carried.drop_front(5));
        Value prev = e.isub(i, e.index(1));
        // Matrix stages: qk of this tile, pv of the previous one.
        waitTurn();
        Value s = issueQK(i);
        Value acc = issuePV(carried[0], p, prev);
        giveTurn();
        // Vector stages while pv runs (and the other group's matmuls).
        NVVM::WgmmaWaitGroupSyncOp::create(b, loc, 1);
        s = fenceFragment(b, loc, s);
        release(kEmpty, i);
        Softmax st =
            softmax(s, i, {carried[1], carried[2]}, {carried[3], carried[4]});
        NVVM::WgmmaWaitGroupSyncOp::create(b, loc, 0);
        acc = fenceFragment(b, loc, acc);
        // The previous P stays live until its pv is done: were its registers
        // reused for the new P, ptxas would serialize the wgmma.
        inlinePtx(b, loc, {}, p, "",
                  llvm::join(SmallVector<std::string>(p.size(), "r"), ","));
        release(vEmpty, prev);
        acc = rescale(acc, st.alpha);
        SmallVector<Value> next = {acc, st.m[0], st.m[1], st.l[0], st.l[1]};
        next.append(st.p);
        scf::YieldOp::create(b, loc, next);
      }
      ValueRange done = loop.getResults();
      SmallVector<Value> p(done.drop_front(5));
      // The last tile's pv; the second group opens no further turn.
      waitTurn();
      Value acc = issuePV(done[0], p, e.isub(count, e.index(1)));
      if (*pingPong)
        e.ifThen(e.eq(g, e.index(0)), [&] { giveTurn(); });
      NVVM::WgmmaWaitGroupSyncOp::create(b, loc, 0);
      acc = fenceFragment(b, loc, acc);
      release(vEmpty, e.isub(count, e.index(1)));
      // Q's buffer may take the next tile's once the group's output has
      // left it (its leader arrives; wgmma's wait is the warpgroup's).
      if (!tmaStore)
        e.ifThen(groupLeader, [&] { mbarrierArrive(b, loc, qEmpty, qBuffer); });
      scf::YieldOp::create(b, loc,
                           ValueRange{acc, done[1], done[2], done[3], done[4]});
    }
    Value acc = walked.getResult(0);
    Value m[2] = {walked.getResult(1), walked.getResult(2)};
    Value l[2] = {quadReduce(walked.getResult(3), false),
                  quadReduce(walked.getResult(4), false)};

    Value inverse[2];
    for (int64_t h = 0; h < 2; ++h) {
      Value seen = arith::CmpFOp::create(b, loc, arith::CmpFPredicate::OGT,
                                         l[h], constF32(0.0));
      inverse[h] = e.select(seen, e.div(constF32(1.0), l[h]), constF32(0.0));
    }
    auto staged = scf::IfOp::create(
        b, loc, TypeRange{},
        tmaStore ? e.andi(w.real, e.ult(e.index(0), count))
                 : arith::ConstantIntOp::create(b, loc, 0, 1).getResult(),
        /*withElse=*/true);
    if (tmaStore) {
      OpBuilder::InsertionGuard guard(b);
      b.setInsertionPointToStart(&staged.getThenRegion().front());
      // bf16 pairs into the Q buffer's 128-byte swizzled rows (16-byte
      // unit u of row r sits at unit u ^ (r % 8)), as TMA reads them.
      Value words = memref::ViewOp::create(
                        b, loc,
                        MemRefType::get({launch.sharedBytes / 4 - 256}, i32,
                                        MemRefLayoutAttrInterface(), workgroup),
                        smem, pad, ValueRange{})
                        .getResult();
      Value bufferBase = e.imul(qBuffer, qBytes);
      for (int64_t h = 0; h < 2; ++h) {
        Value r = rowInTile[h];
        Value rowBase = e.iadd(bufferBase, e.imul(r, kChunkBytes));
        for (int64_t j = 0; j < dv / 2; j += 4) {
          int64_t i0 = j + 2 * h, col0 = (i0 / 4) * 8;
          int64_t chunk = col0 / kChunk, unit = (col0 % kChunk) / 8;
          Value swizzled = e.imul(
              arith::XOrIOp::create(b, loc, e.index(unit), e.remUI(r, 8)), 16);
          Value byte =
              e.iadd(e.iadd(rowBase, e.index(chunk * kBlockRows * kChunkBytes)),
                     e.iadd(swizzled, e.imul(colBase, 2)));
          Value pair =
              inlinePtx(b, loc, i32,
                        ValueRange{e.mul(field(acc, i0 + 1), inverse[h]),
                                   e.mul(field(acc, i0), inverse[h])},
                        "cvt.rn.bf16x2.f32 $0, $1, $2;", "=r,f,f");
          e.storeRaw(pair, words, {e.divUI(byte, 4)});
        }
      }
      // The stores reach TMA (the async proxy) once the group is done.
      inlinePtx(b, loc, {}, {}, "fence.proxy.async.shared::cta;", "");
      namedBarrierSync(b, loc, e.toI32(e.iadd(g, e.index(3))), 128);
      e.ifThen(groupLeader, [&] {
        Value firstRowPos = e.iadd(w.firstPos, e.imul(g, kGroupRows / pack));
        for (int64_t c = 0; c < dv / kChunk; ++c)
          nvgpu::TmaAsyncStoreOp::create(
              b, loc,
              viewAt(e.iadd(bufferBase,
                            e.iadd(e.index(c * kBlockRows * kChunkBytes),
                                   e.imul(g, kGroupRows * kChunkBytes))),
                     oBox),
              oDesc,
              ValueRange{e.index(c * kChunk), w.firstHead, firstRowPos,
                         w.kvHead, w.batch},
              Value());
        inlinePtx(b, loc, {}, {}, "cp.async.bulk.commit_group;", "");
        // The buffer is read: Q's next tile may take it.
        inlinePtx(b, loc, {}, {}, "cp.async.bulk.wait_group.read 0;", "");
        mbarrierArrive(b, loc, qEmpty, qBuffer);
      });
    }
    b.setInsertionPointToStart(&staged.getElseRegion().front());
    // Output rows: position, then the query head.
    Value headBase = e.iadd(e.imul(w.kvHead, group), w.firstHead);
    for (int64_t h = 0; h < 2; ++h) {
      Value head = e.iadd(headBase, e.remUI(rowInTile[h], pack));
      Value row =
          e.iadd(e.imul(e.iadd(e.imul(w.batch, sq), position[h]), hq), head);
      e.ifThen(e.andi(w.real, e.ult(position[h], e.index(sq))), [&] {
        if (splits == 1) {
          auto pairType = VectorType::get({2}, bf16);
          for (int64_t j = 0; j < dv / 2; j += 4) {
            int64_t i0 = j + 2 * h;
            Value pair = vector::FromElementsOp::create(
                b, loc, VectorType::get({2}, f32),
                ValueRange{e.mul(field(acc, i0), inverse[h]),
                           e.mul(field(acc, i0 + 1), inverse[h])});
            Value rounded = arith::TruncFOp::create(b, loc, pairType, pair);
            vector::StoreOp::create(b, loc, rounded, outView,
                                    {row, fragmentColumn(i0)});
          }
          return;
        }
        Value at = e.iadd(e.imul(w.split, rowsTotal), row);
        for (int64_t j = 0; j < dv / 2; j += 4) {
          int64_t i0 = j + 2 * h;
          Value pair = vector::FromElementsOp::create(
              b, loc, VectorType::get({2}, f32),
              ValueRange{field(acc, i0), field(acc, i0 + 1)});
          vector::StoreOp::create(b, loc, pair, partialView,
                                  {at, fragmentColumn(i0)});
        }
        e.ifThen(e.eq(e.remUI(lane, 4), e.index(0)), [&] {
          e.storeRaw(e.mul(m[h], scaleC), statsView, {at, e.index(0)});
          e.storeRaw(l[h], statsView, {at, e.index(1)});
        });
      });
    }
    b.setInsertionPointAfter(staged);
  });
  b.setInsertionPointAfter(roles);
  if (failed(k.finish(op)))
    return failure();
  if (splits == 1)
    return success();

  // The merge: a block per row, a thread per value column, in the CPU
  // backend's order (ranges in order, then one multiply by 1 / sum).
  Kernel merge = layer.kernelOn(op, "attention_merge",
                                {partials.buffer, stats.buffer, out.buffer});
  merge.launch.work = {rowsTotal, 0};
  merge.launch.block = dv;
  Emitter &me = merge.e;
  Value mPartials = merge.view(0, partials), mStats = merge.view(1, stats);
  Value mOut = merge.view(
      2, TensorInfo{out.buffer, MemRefType::get({rowsTotal, dv}, bf16), {}});
  Value row = merge.blockId(gpu::Dimension::x);
  Value col = merge.threadId();
  Value mNegInf = me.f32(-INFINITY), mZero = me.f32(0.0);
  auto at = [&](int64_t s) { return me.iadd(me.index(s * rowsTotal), row); };
  Value top = mNegInf;
  for (int64_t s = 0; s < splits; ++s)
    top = arith::MaximumFOp::create(me.b, me.loc, top,
                                    me.loadRaw(mStats, {at(s), me.index(0)}));
  Value none = arith::CmpFOp::create(me.b, me.loc, arith::CmpFPredicate::OEQ,
                                     top, mNegInf);
  Value shift = me.select(none, mZero, top);
  Value total = mZero, sum = mZero;
  for (int64_t s = 0; s < splits; ++s) {
    Value w = math::Exp2Op::create(
        me.b, me.loc, me.sub(me.loadRaw(mStats, {at(s), me.index(0)}), shift));
    total = me.add(total, me.mul(me.loadRaw(mStats, {at(s), me.index(1)}), w));
    sum = me.add(sum, me.mul(me.loadRaw(mPartials, {at(s), col}), w));
  }
  Value seen = arith::CmpFOp::create(me.b, me.loc, arith::CmpFPredicate::OGT,
                                     total, mZero);
  Value inverse = me.select(seen, me.div(me.f32(1.0), total), mZero);
  me.store(me.mul(sum, inverse), mOut, {row, col});
  return merge.finish(op);
}
