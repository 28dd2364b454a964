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
#include "codegen/nvidia/kernels/KernelConfigs.h"
#include "codegen/nvidia/kernels/Kernels.h"
#include "codegen/nvidia/support/Hopper.h"
#include "codegen/nvidia/support/Ring.h"

#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/NVGPU/IR/NVGPUDialect.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::nvidia;

static constexpr int64_t kGroupRows = AttentionConfig::kGroupRows,
                         kGroups = AttentionConfig::kGroups,
                         kBlockRows = AttentionConfig::kBlockRows,
                         kChunk = AttentionConfig::kChunk,
                         kChunkBytes = AttentionConfig::kChunkBytes;

/// What moe-split-attention's schedule asks of the kernel: whether the
/// row groups take turns on the tensor cores.
static FailureOr<bool> pingPongOf(TiledAttentionOp op) {
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

/// The shape checks of the sm_90a kernel, before any configuration.
static LogicalResult checkAttentionShapes(TiledAttentionOp op) {
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
  int64_t d = qType.getDimSize(3), dv = vType.getDimSize(3);
  int64_t tileN = op.getTileN();
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
  if (failed(pingPongOf(op)))
    return op.emitOpError()
           << "has a schedule the sm_90a kernel does not run: it runs "
              "moe-split-attention's ping-pong or serial schedule";
  return success();
}

AttentionConfig nvidia::configureAttention(TiledAttentionOp op) {
  AttentionConfig c;
  auto qType = cast<RankedTensorType>(op.getQuery().getType());
  auto kType = cast<RankedTensorType>(op.getKey().getType());
  auto vType = cast<RankedTensorType>(op.getValue().getType());
  c.batch = qType.getDimSize(0), c.sq = qType.getDimSize(1);
  c.hq = qType.getDimSize(2), c.d = qType.getDimSize(3);
  c.skv = kType.getDimSize(1), c.hkv = kType.getDimSize(2);
  c.dv = vType.getDimSize(3);
  c.tileN = op.getTileN(), c.splits = op.getKvSplits();
  c.causal = op.getCausal();
  FailureOr<bool> pingPong = pingPongOf(op);
  c.pingPong = succeeded(pingPong) && *pingPong;

  // Query heads per key/value head; `pack` of them share a row tile.
  c.group = c.hq / c.hkv;
  c.pack = kBlockRows % c.group == 0 ? c.group : 1;
  c.headBlocks = c.group / c.pack;
  c.rowTiles = llvm::divideCeil(c.sq * c.pack, kBlockRows);
  c.keyTiles = llvm::divideCeil(c.skv, c.tileN);
  c.perSplit = std::max<int64_t>(llvm::divideCeil(c.keyTiles, c.splits), 1);
  c.qBytes = kBlockRows * c.d * 2, c.kBytes = c.tileN * c.d * 2,
  c.vBytes = c.tileN * c.dv * 2;
  c.fit(AttentionConfig::kMaxStages);
  // Work tiles: row tiles x heads x batch x key splits.
  c.headTiles = c.hkv * c.headBlocks * c.batch * c.splits;
  c.workTiles = c.rowTiles * c.headTiles;
  // A causal unit is a pair of row tiles of one head, the j-th longest
  // and the j-th shortest, so every unit has about the same work.
  c.perUnit = c.causal ? 2 : 1;
  c.unitsPerHead = llvm::divideCeil(c.rowTiles, c.perUnit);
  // Without key splits a row group stages its output in its rows of the
  // tile's Q buffer (free once its last qk is done) and stores it with TMA,
  // 64 rows at a time; positions past the query's end are clipped.
  c.tmaStore = c.splits == 1 && c.dv <= c.d && c.pack <= kGroupRows;
  c.rowsTotal = c.batch * c.sq * c.hq;
  return c;
}

namespace {
/// A work tile: its rows, heads and key tiles [first, first + count).
/// Tiles go head by head, so a head's K and V stay in L2 while its row
/// tiles run.
struct WorkTile {
  Value split, kvHead, batch, firstHead, firstPos, first, count;
  Value real; // false for the second half of a one-tile pair
};

/// The vector stages' results for a key tile: P (as bf16 pairs), the new
/// maxima and sums, and the rescale factors.
struct Softmax {
  SmallVector<Value> p;
  Value m[2], l[2], alpha[2];
};

/// Emits an attention kernel of a given configuration: the work-tile walk
/// both roles share, the shared-memory rings, the producer, and the row
/// groups' matrix and vector stages and output. The values several stages
/// use are members, set in emission order.
class AttentionEmitter {
public:
  AttentionEmitter(TiledAttentionOp op, const AttentionConfig &config,
                   Kernel &k)
      : op(op), cfg(config), k(k), e(k.e), b(k.b), loc(e.loc),
        ctx(b.getContext()), f32(b.getF32Type()), bf16(b.getBF16Type()),
        i32(b.getI32Type()), i64(b.getI64Type()) {}

  /// Emits the kernel body; its parameters are the output (or the split
  /// partials and statistics), then the tensor maps.
  LogicalResult emit(ArrayRef<unsigned> buffers, unsigned outBuffer,
                     const TensorInfo &partials, const TensorInfo &stats);

private:
  void emitParameters(ArrayRef<unsigned> buffers, unsigned outBuffer,
                      const TensorInfo &partials, const TensorInfo &stats);
  void emitSharedMemory();
  void emitProducer();
  void loadKeyTile(const WorkTile &w, Value kvIter, Value i);
  void emitRowGroupSetup();
  void emitRowGroupTile(WorkTile &w, Value kvIter, Value qLoads);
  scf::IfOp emitWalk(Value count, Value qLoads);
  SmallVector<Value> emitKeyTileStep(ValueRange carried, Value i);
  void emitStagedStore(WorkTile &w, Value acc, ArrayRef<Value> inverse);
  void emitOutputRows(WorkTile &w, Value acc, ArrayRef<Value> m,
                      ArrayRef<Value> l, ArrayRef<Value> inverse);

  MemRefType smemType(ArrayRef<int64_t> shape);
  nvgpu::TensorMapDescriptorType mapType(ArrayRef<int64_t> box);
  Value slt(Value a, Value c);
  WorkTile tileOf(Value unit, Value half);
  void forEachTile(function_ref<void(WorkTile &, Value, Value)> body);
  Value viewAt(Value offset, ArrayRef<int64_t> shape);
  Value addressAt(Value offset);
  Value kOffset(Value slot);
  Value vOffset(Value slot);
  void waitOn(Value group, Value slot, Value round);
  Value fragmentColumn(int64_t i);
  Value field(Value s, int64_t i);
  void waitTurn();
  void giveTurn();
  Value issueQK(Value i);
  Value issuePV(Value acc, ArrayRef<Value> p, Value i);
  void release(Value group, Value i);
  Value exp2(Value x);
  Value quadReduce(Value v, bool max);
  SmallVector<Value> maskTile(Value s, Value i);
  Softmax softmax(Value s, Value i, ArrayRef<Value> m, ArrayRef<Value> l);
  Value rescale(Value acc, Value alpha[2]);

  TiledAttentionOp op;
  const AttentionConfig &cfg;
  Kernel &k;
  Emitter &e;
  OpBuilder &b;
  Location loc;
  MLIRContext *ctx;
  Type f32, bf16, i32, i64;

  // The kernel's parameters and TMA boxes.
  Value outView, partialView, statsView, qDesc, kDesc, vDesc, oDesc;
  SmallVector<int64_t> qBox, kvBox, oBox;
  // Shared memory and its mbarriers.
  std::optional<AlignedShared> shared;
  std::optional<Ring> ring;
  Value tid, qFull, qEmpty, kFull, kEmpty, vFull, vEmpty;
  // A row group's thread: its group, leader, lane, fragment rows and
  // columns, and the turns of the ping-pong schedule.
  Value g, groupLeader, lane, rowInTile[2], colBase;
  Type sType, oType;
  Value turn[2], myTurn, otherTurn, groupOffset, scaleC, negInf;
  // The inline PTX of O += P V (P from registers).
  std::string pvText, pvConstraints;
  // The tile being walked (set per work tile): its first key tile, its K/V
  // ring position, its Q buffer, its rows' positions and the last key each
  // sees (signed: a row may see none), and the smallest of those, up to
  // which no key tile needs the causal mask.
  Value first, kvBase, qBuffer, blockLimit, position[2], limit[2];
};
} // namespace

MemRefType AttentionEmitter::smemType(ArrayRef<int64_t> shape) {
  return sharedType(shape, bf16);
}

nvgpu::TensorMapDescriptorType
AttentionEmitter::mapType(ArrayRef<int64_t> box) {
  return nvgpu::TensorMapDescriptorType::get(
      ctx, smemType(box), nvgpu::TensorMapSwizzleKind::SWIZZLE_128B,
      nvgpu::TensorMapL2PromoKind::L2PROMO_128B,
      nvgpu::TensorMapOOBKind::OOB_ZERO,
      nvgpu::TensorMapInterleaveKind::INTERLEAVE_NONE);
}

void AttentionEmitter::emitParameters(ArrayRef<unsigned> buffers,
                                      unsigned outBuffer,
                                      const TensorInfo &partials,
                                      const TensorInfo &stats) {
  int64_t splits = cfg.splits, pack = cfg.pack;
  outView =
      splits > 1
          ? Value()
          : k.view(0, TensorInfo{outBuffer,
                                 MemRefType::get({cfg.rowsTotal, cfg.dv}, bf16),
                                 {}});
  partialView = splits > 1 ? k.view(0, partials) : Value();
  statsView = splits > 1 ? k.view(1, stats) : Value();
  qBox = {1, 1, kBlockRows / pack, pack, kChunk};
  kvBox = {1, 1, cfg.tileN, kChunk};
  unsigned firstMap = buffers.size();
  qDesc = k.tensorMap(firstMap, mapType(qBox));
  kDesc = k.tensorMap(firstMap + 1, mapType(kvBox));
  vDesc = k.tensorMap(firstMap + 2, mapType(kvBox));
  oBox = {1, 1, kGroupRows / pack, pack, kChunk};
  oDesc = cfg.tmaStore ? k.tensorMap(firstMap + 3, mapType(oBox)) : Value();
}

Value AttentionEmitter::slt(Value a, Value c) {
  return e.icmp(arith::CmpIPredicate::slt, a, c);
}

WorkTile AttentionEmitter::tileOf(Value unit, Value half) {
  WorkTile w;
  int64_t sq = cfg.sq, splits = cfg.splits, pack = cfg.pack;
  Value y = e.divUI(unit, cfg.unitsPerHead);
  Value j = e.remUI(unit, cfg.unitsPerHead);
  Value rowTile = j;
  Value duplicate = arith::ConstantIntOp::create(b, loc, 0, 1);
  if (cfg.causal) {
    Value longer = e.isub(e.index(cfg.rowTiles - 1), j);
    rowTile = e.select(e.eq(half, e.index(0)), longer, j);
    // The middle tile of an odd count is its own pair.
    duplicate = e.andi(e.eq(half, e.index(1)), e.eq(longer, j));
  }
  w.split = e.remUI(y, splits);
  Value rest = e.divUI(y, splits);
  Value headBlock = e.remUI(rest, cfg.headBlocks);
  rest = e.divUI(rest, cfg.headBlocks);
  w.kvHead = e.remUI(rest, cfg.hkv);
  w.batch = e.divUI(rest, cfg.hkv);
  w.firstHead = e.imul(headBlock, pack); // within the group
  w.firstPos = e.imul(rowTile, kBlockRows / pack);
  Value first = e.minUI(e.imul(w.split, cfg.perSplit), e.index(cfg.keyTiles));
  Value last =
      e.minUI(e.iadd(first, e.index(cfg.perSplit)), e.index(cfg.keyTiles));
  if (cfg.causal) {
    // The tile's last position sees keys up to pos + skv - sq: later
    // key tiles are never loaded.
    Value lastPos = e.minUI(e.iadd(w.firstPos, e.index(kBlockRows / pack - 1)),
                            e.index(sq - 1));
    Value seen = e.isub(e.iadd(lastPos, e.index(cfg.skv + 1)), e.index(sq));
    Value tiles = e.divUI(e.iadd(seen, e.index(cfg.tileN - 1)), cfg.tileN);
    tiles = e.select(slt(seen, e.index(1)), e.index(0), tiles);
    last = e.minUI(last, tiles);
    first = e.minUI(first, last);
  }
  w.first = first;
  w.count = e.select(duplicate, e.index(0), e.isub(last, first));
  w.real = arith::XOrIOp::create(b, loc, duplicate,
                                 arith::ConstantIntOp::create(b, loc, 1, 1));
  return w;
}

void AttentionEmitter::forEachTile(
    function_ref<void(WorkTile &, Value, Value)> body) {
  // Both roles walk the same tiles, carrying the rings' K/V iteration
  // and the number of Q loads so far.
  Value step = gpu::GridDimOp::create(b, loc, gpu::Dimension::x);
  auto units = scf::ForOp::create(b, loc, k.blockId(gpu::Dimension::x),
                                  e.index(cfg.headTiles * cfg.unitsPerHead),
                                  step, ValueRange{e.index(0), e.index(0)});
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToStart(units.getBody());
  auto halves = scf::ForOp::create(b, loc, e.index(0), e.index(cfg.perUnit),
                                   e.index(1), units.getRegionIterArgs());
  b.setInsertionPointToStart(halves.getBody());
  WorkTile w = tileOf(units.getInductionVar(), halves.getInductionVar());
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
}

Value AttentionEmitter::viewAt(Value offset, ArrayRef<int64_t> shape) {
  return shared->view(smemType(shape), offset);
}

Value AttentionEmitter::addressAt(Value offset) {
  return shared->address(offset);
}

Value AttentionEmitter::kOffset(Value slot) {
  return e.iadd(e.index(cfg.kRingOffset()), e.imul(slot, cfg.kBytes));
}

Value AttentionEmitter::vOffset(Value slot) {
  return e.iadd(e.index(cfg.vRingOffset()), e.imul(slot, cfg.vBytes));
}

void AttentionEmitter::emitSharedMemory() {
  // Shared memory (sm90a::AttentionLayout), aligned for the 128-byte
  // swizzle: Q, then the K ring, then the V ring.
  shared.emplace(e);
  ring.emplace(Ring{*shared, cfg.stages, cfg.kBytes});
  int64_t qBuffers = cfg.qBuffers, stages = cfg.stages;
  qFull = createBarriers(e, qBuffers);
  qEmpty = createBarriers(e, qBuffers);
  kFull = createBarriers(e, stages);
  kEmpty = createBarriers(e, stages);
  vFull = createBarriers(e, stages);
  vEmpty = createBarriers(e, stages);
  Value leader = e.eq(tid, e.index(0));
  initBarriers(e, leader, qBuffers, {{qFull, 1}, {qEmpty, kGroups}});
  initBarriers(e, leader, stages,
               {{kFull, 1},
                {vFull, 1},
                {kEmpty, cfg.consumers()},
                {vEmpty, cfg.consumers()}});
  fenceBarrierInits(e, leader);
  gpu::BarrierOp::create(b, loc);
}

void AttentionEmitter::waitOn(Value group, Value slot, Value round) {
  waitBarrier(e, group, phaseParity(e, round), slot);
}

void AttentionEmitter::loadKeyTile(const WorkTile &w, Value kvIter, Value i) {
  // Key tile i of the work tile into the next K and V ring slots, each
  // once every consumer has released it.
  Value n = e.iadd(kvIter, i);
  Value slot = ring->slot(n);
  Value round = ring->round(n);
  Value key0 = e.imul(e.iadd(w.first, i), cfg.tileN);
  auto load = [&](Value full, Value empty, Value desc, Value offset,
                  int64_t width, int64_t bytes) {
    e.ifThen(e.icmp(arith::CmpIPredicate::uge, n, e.index(cfg.stages)),
             [&] { waitOn(empty, slot, e.iadd(round, e.index(1))); });
    expectBytes(e, full, bytes, slot);
    for (int64_t c = 0; c < width / kChunk; ++c)
      tmaLoad(
          e,
          viewAt(e.iadd(offset, e.index(c * cfg.tileN * kChunkBytes)), kvBox),
          full, desc, ValueRange{e.index(c * kChunk), key0, w.kvHead, w.batch},
          slot);
  };
  load(kFull, kEmpty, kDesc, kOffset(slot), cfg.d, cfg.kBytes);
  load(vFull, vEmpty, vDesc, vOffset(slot), cfg.dv, cfg.vBytes);
}

void AttentionEmitter::emitProducer() {
  // The producer: one thread loads Q, then each tile's K and V into the
  // next slot of their rings once every consumer has released it.
  producerRegisters(e, cfg.producerRegisters);
  int64_t qBuffers = cfg.qBuffers, qBytes = cfg.qBytes;
  e.ifThen(e.eq(tid, e.index(cfg.consumers())), [&] {
    forEachTile([&](WorkTile &w, Value kvIter, Value qLoads) {
      e.ifThen(e.ult(e.index(0), w.count), [&] {
        // A Q buffer is free once the row groups are done with the tile
        // it held before.
        Value buffer = e.remUI(qLoads, qBuffers);
        Value use = e.divUI(qLoads, qBuffers);
        e.ifThen(e.ult(e.index(0), use),
                 [&] { waitOn(qEmpty, buffer, e.isub(use, e.index(1))); });
        expectBytes(e, qFull, qBytes, buffer);
        for (int64_t c = 0; c < cfg.d / kChunk; ++c)
          tmaLoad(e,
                  viewAt(e.iadd(e.imul(buffer, qBytes),
                                e.index(c * kBlockRows * kChunkBytes)),
                         qBox),
                  qFull, qDesc,
                  ValueRange{e.index(c * kChunk), w.firstHead, w.firstPos,
                             w.kvHead, w.batch},
                  buffer);
        e.forEach(e.index(0), w.count,
                  [&](Value i) { loadKeyTile(w, kvIter, i); });
      });
    });
  });
}

Value AttentionEmitter::fragmentColumn(int64_t i) {
  return e.iadd(colBase, e.index((i / 4) * 8 + i % 2));
}

Value AttentionEmitter::field(Value s, int64_t i) {
  return LLVM::ExtractValueOp::create(b, loc, s, ArrayRef<int64_t>{i})
      .getResult();
}

void AttentionEmitter::waitTurn() {
  if (cfg.pingPong)
    namedBarrierSync(b, loc, myTurn, cfg.consumers());
}

void AttentionEmitter::giveTurn() {
  if (cfg.pingPong)
    namedBarrierArrive(b, loc, otherTurn, cfg.consumers());
}

void AttentionEmitter::emitRowGroupSetup() {
  consumerRegisters(e, cfg.consumerRegisters);
  g = e.divUI(tid, 128);
  groupLeader = e.eq(e.remUI(tid, 128), e.index(0));
  Value warp = e.remUI(e.divUI(tid, 32), 4);
  lane = e.remUI(tid, 32);
  // Fragment element i of a thread is row 16w + l/4 + 8((i/2)%2) of its
  // group's 64 and column 8(i/4) + 2(l%4) + i%2.
  rowInTile[0] =
      e.iadd(e.iadd(e.imul(g, kGroupRows), e.imul(warp, 16)), e.divUI(lane, 4));
  rowInTile[1] = e.iadd(rowInTile[0], e.index(8));
  colBase = e.imul(e.remUI(lane, 4), 2);

  auto fragmentType = [&](int64_t n) {
    SmallVector<Type> fields(n / 2, f32);
    return LLVM::LLVMStructType::getLiteral(ctx, fields);
  };
  sType = fragmentType(cfg.tileN), oType = fragmentType(cfg.dv);
  turn[0] = e.i32(1);
  turn[1] = e.i32(2);
  myTurn = e.select(e.eq(g, e.index(0)), turn[0], turn[1]);
  otherTurn = e.select(e.eq(g, e.index(0)), turn[1], turn[0]);
  groupOffset = arith::IndexCastOp::create(b, loc, i64,
                                           e.imul(g, kGroupRows * kChunkBytes));

  // O += P V as inline PTX: P (bf16 pairs) from registers.
  int64_t dv = cfg.dv, n = dv / 2;
  llvm::raw_string_ostream os(pvText);
  os << "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
     << "wgmma.mma_async.sync.aligned.m64n" << dv << "k16.f32.bf16.bf16 {";
  for (int64_t j = 0; j < n; ++j)
    os << (j ? ", " : "") << "$" << j;
  os << "}, {$" << 2 * n << ", $" << 2 * n + 1 << ", $" << 2 * n + 2 << ", $"
     << 2 * n + 3 << "}, $" << 2 * n + 4 << ", p, 1, 1, 1;\n}";
  for (int64_t j = 0; j < n; ++j)
    pvConstraints += "=f,";
  for (int64_t j = 0; j < n; ++j)
    pvConstraints += std::to_string(j) + ",";
  pvConstraints += "r,r,r,r,l";

  float c = common::attentionLog2Scale(op.getScale().convertToDouble());
  scaleC = e.f32(c), negInf = e.f32(-INFINITY);
}

Value AttentionEmitter::issueQK(Value i) {
  // S = Q K^T for key tile i of the block's range.
  Value n = e.iadd(kvBase, i);
  Value slot = ring->slot(n);
  waitOn(kFull, slot, ring->round(n));
  Value kAddress = addressAt(kOffset(slot));
  NVVM::WgmmaFenceAlignedOp::create(b, loc);
  Value acc = LLVM::PoisonOp::create(b, loc, sType);
  for (int64_t kk = 0; kk < cfg.d / 16; ++kk) {
    int64_t c = kk / 4, within = (kk % 4) * 32;
    Value qAddress = addressAt(e.imul(qBuffer, cfg.qBytes));
    Value aAddr = LLVM::AddOp::create(
        b, loc, LLVM::AddOp::create(b, loc, qAddress, groupOffset),
        k.constI64(c * kBlockRows * kChunkBytes + within));
    Value bAddr = LLVM::AddOp::create(
        b, loc, kAddress, k.constI64(c * cfg.tileN * kChunkBytes + within));
    acc = wgmmaKMajor(b, loc, sType, acc, swizzledDescriptor(b, loc, aAddr),
                      swizzledDescriptor(b, loc, bAddr), cfg.tileN, 16,
                      NVVM::WGMMATypes::bf16, /*accumulate=*/kk != 0);
  }
  NVVM::WgmmaGroupSyncAlignedOp::create(b, loc);
  return acc;
}

Value AttentionEmitter::issuePV(Value acc, ArrayRef<Value> p, Value i) {
  // O += P V for key tile i: V MN-major (chunks of 64 value columns
  // tileN * 128 bytes apart).
  Value n = e.iadd(kvBase, i);
  Value slot = ring->slot(n);
  waitOn(vFull, slot, ring->round(n));
  Value vAddress = addressAt(vOffset(slot));
  NVVM::WgmmaFenceAlignedOp::create(b, loc);
  for (int64_t kk = 0; kk < cfg.tileN / 16; ++kk) {
    Value desc = swizzledDescriptor(
        b, loc,
        LLVM::AddOp::create(b, loc, vAddress, k.constI64(kk * 16 * 128)),
        cfg.tileN * kChunkBytes, 1024);
    SmallVector<Value> operands;
    for (int64_t j = 0; j < cfg.dv / 2; ++j)
      operands.push_back(field(acc, j));
    operands.append(p.begin() + 4 * kk, p.begin() + 4 * kk + 4);
    operands.push_back(desc);
    acc = inlinePtx(b, loc, oType, operands, pvText, pvConstraints);
  }
  NVVM::WgmmaGroupSyncAlignedOp::create(b, loc);
  return acc;
}

void AttentionEmitter::release(Value group, Value i) {
  mbarrierArrive(b, loc, group, e.remUI(e.iadd(kvBase, i), cfg.stages));
}

Value AttentionEmitter::exp2(Value x) {
  return inlinePtx(b, loc, f32, x, "ex2.approx.ftz.f32 $0, $1;", "=f,f");
}

Value AttentionEmitter::quadReduce(Value v, bool max) {
  for (int64_t offset : {1, 2}) {
    Value other = gpu::ShuffleOp::create(b, loc, v, e.i32(offset), e.i32(32),
                                         gpu::ShuffleMode::XOR)
                      .getShuffleResult();
    v = max ? arith::MaximumFOp::create(b, loc, v, other).getResult()
            : e.add(v, other);
  }
  return v;
}

SmallVector<Value> AttentionEmitter::maskTile(Value s, Value i) {
  // S of key tile i, its keys past the end (or the causal diagonal) at
  // -inf; only a tile that crosses one is masked.
  int64_t n = cfg.tileN / 2;
  SmallVector<Value> x;
  for (int64_t j = 0; j < n; ++j)
    x.push_back(field(s, j));
  Value key0 = e.imul(e.iadd(first, i), cfg.tileN);
  Value tileEnd = e.iadd(key0, e.index(cfg.tileN));
  Value needMask = e.icmp(arith::CmpIPredicate::ugt, tileEnd, e.index(cfg.skv));
  if (cfg.causal)
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
      Value visible = e.ult(key, e.index(cfg.skv));
      if (cfg.causal)
        visible = e.andi(visible, e.icmp(arith::CmpIPredicate::sle, key,
                                         limit[(j / 2) % 2]));
      y.push_back(e.select(visible, x[j], negInf));
    }
    scf::YieldOp::create(b, loc, y);
  }
  return SmallVector<Value>(masked.getResults());
}

Softmax AttentionEmitter::softmax(Value s, Value i, ArrayRef<Value> m,
                                  ArrayRef<Value> l) {
  // The vector stages of key tile i: mask, max, exp, sum.
  int64_t n = cfg.tileN / 2;
  SmallVector<Value> x = maskTile(s, i);
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
    shift[h] = e.select(none, e.f32(0.0), e.mul(r.m[h], scaleC));
    r.alpha[h] = exp2(e.sub(e.mul(m[h], scaleC), shift[h]));
  }
  SmallVector<Value> p;
  Value sum[2] = {e.f32(0.0), e.f32(0.0)};
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
}

Value AttentionEmitter::rescale(Value acc, Value alpha[2]) {
  for (int64_t j = 0; j < cfg.dv / 2; ++j)
    acc = LLVM::InsertValueOp::create(b, loc, acc,
                                      e.mul(field(acc, j), alpha[(j / 2) % 2]),
                                      ArrayRef<int64_t>{j});
  return acc;
}

SmallVector<Value> AttentionEmitter::emitKeyTileStep(ValueRange carried,
                                                     Value i) {
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
  return next;
}

scf::IfOp AttentionEmitter::emitWalk(Value count, Value qLoads) {
  // The work tile's key tiles: O and each row's max and sum, or zeros and
  // -inf where it has none.
  SmallVector<Type> resultTypes = {oType, f32, f32, f32, f32};
  auto walked = scf::IfOp::create(b, loc, resultTypes, e.ult(e.index(0), count),
                                  /*withElse=*/true);
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToStart(&walked.getElseRegion().front());
  scf::YieldOp::create(b, loc,
                       ValueRange{zeroFragment(b, loc, oType), negInf, negInf,
                                  e.f32(0.0), e.f32(0.0)});
  b.setInsertionPointToStart(&walked.getThenRegion().front());
  // The second group opens the first group's turn.
  if (cfg.pingPong)
    e.ifThen(e.eq(g, e.index(1)),
             [&] { namedBarrierArrive(b, loc, turn[0], cfg.consumers()); });
  // The first tile: qk and its softmax, no pv yet.
  waitTurn();
  waitOn(qFull, qBuffer, e.divUI(qLoads, cfg.qBuffers));
  Value s = issueQK(e.index(0));
  giveTurn();
  NVVM::WgmmaWaitGroupSyncOp::create(b, loc, 0);
  s = fenceFragment(b, loc, s);
  release(kEmpty, e.index(0));
  Softmax st =
      softmax(s, e.index(0), {negInf, negInf}, {e.f32(0.0), e.f32(0.0)});
  SmallVector<Value> init = {zeroFragment(b, loc, oType), st.m[0], st.m[1],
                             st.l[0], st.l[1]};
  init.append(st.p);
  auto loop = scf::ForOp::create(b, loc, e.index(1), count, e.index(1), init);
  {
    OpBuilder::InsertionGuard inner(b);
    b.setInsertionPointToStart(loop.getBody());
    scf::YieldOp::create(
        b, loc,
        emitKeyTileStep(loop.getRegionIterArgs(), loop.getInductionVar()));
  }
  ValueRange done = loop.getResults();
  SmallVector<Value> p(done.drop_front(5));
  // The last tile's pv; the second group opens no further turn.
  waitTurn();
  Value acc = issuePV(done[0], p, e.isub(count, e.index(1)));
  if (cfg.pingPong)
    e.ifThen(e.eq(g, e.index(0)), [&] { giveTurn(); });
  NVVM::WgmmaWaitGroupSyncOp::create(b, loc, 0);
  acc = fenceFragment(b, loc, acc);
  release(vEmpty, e.isub(count, e.index(1)));
  // Q's buffer may take the next tile's once the group's output has
  // left it (its leader arrives; wgmma's wait is the warpgroup's).
  if (!cfg.tmaStore)
    e.ifThen(groupLeader, [&] { mbarrierArrive(b, loc, qEmpty, qBuffer); });
  scf::YieldOp::create(b, loc,
                       ValueRange{acc, done[1], done[2], done[3], done[4]});
  return walked;
}

void AttentionEmitter::emitStagedStore(WorkTile &w, Value acc,
                                       ArrayRef<Value> inverse) {
  // bf16 pairs into the Q buffer's 128-byte swizzled rows (16-byte
  // unit u of row r sits at unit u ^ (r % 8)), as TMA reads them.
  Value words =
      memref::ViewOp::create(
          b, loc,
          sharedType({(cfg.sharedBytes() - sm90a::kSwizzleAlign) / 4}, i32),
          shared->bytes, shared->pad, ValueRange{})
          .getResult();
  Value bufferBase = e.imul(qBuffer, cfg.qBytes);
  for (int64_t h = 0; h < 2; ++h) {
    Value r = rowInTile[h];
    Value rowBase = e.iadd(bufferBase, e.imul(r, kChunkBytes));
    for (int64_t j = 0; j < cfg.dv / 2; j += 4) {
      int64_t i0 = j + 2 * h, col0 = (i0 / 4) * 8;
      int64_t chunk = col0 / kChunk, unit = (col0 % kChunk) / 8;
      Value swizzled = e.imul(
          arith::XOrIOp::create(b, loc, e.index(unit), e.remUI(r, 8)), 16);
      Value byte =
          e.iadd(e.iadd(rowBase, e.index(chunk * kBlockRows * kChunkBytes)),
                 e.iadd(swizzled, e.imul(colBase, 2)));
      Value pair = inlinePtx(b, loc, i32,
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
    Value firstRowPos = e.iadd(w.firstPos, e.imul(g, kGroupRows / cfg.pack));
    for (int64_t c = 0; c < cfg.dv / kChunk; ++c)
      nvgpu::TmaAsyncStoreOp::create(
          b, loc,
          viewAt(
              e.iadd(bufferBase, e.iadd(e.index(c * kBlockRows * kChunkBytes),
                                        e.imul(g, kGroupRows * kChunkBytes))),
              oBox),
          oDesc,
          ValueRange{e.index(c * kChunk), w.firstHead, firstRowPos, w.kvHead,
                     w.batch},
          Value());
    inlinePtx(b, loc, {}, {}, "cp.async.bulk.commit_group;", "");
    // The buffer is read: Q's next tile may take it.
    inlinePtx(b, loc, {}, {}, "cp.async.bulk.wait_group.read 0;", "");
    mbarrierArrive(b, loc, qEmpty, qBuffer);
  });
}

void AttentionEmitter::emitOutputRows(WorkTile &w, Value acc, ArrayRef<Value> m,
                                      ArrayRef<Value> l,
                                      ArrayRef<Value> inverse) {
  // Output rows: position, then the query head.
  Value headBase = e.iadd(e.imul(w.kvHead, cfg.group), w.firstHead);
  for (int64_t h = 0; h < 2; ++h) {
    Value head = e.iadd(headBase, e.remUI(rowInTile[h], cfg.pack));
    Value row = e.iadd(
        e.imul(e.iadd(e.imul(w.batch, cfg.sq), position[h]), cfg.hq), head);
    e.ifThen(e.andi(w.real, e.ult(position[h], e.index(cfg.sq))), [&] {
      if (cfg.splits == 1) {
        auto pairType = VectorType::get({2}, bf16);
        for (int64_t j = 0; j < cfg.dv / 2; j += 4) {
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
      Value at = e.iadd(e.imul(w.split, cfg.rowsTotal), row);
      for (int64_t j = 0; j < cfg.dv / 2; j += 4) {
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
}

void AttentionEmitter::emitRowGroupTile(WorkTile &w, Value kvIter,
                                        Value qLoads) {
  first = w.first;
  kvBase = kvIter;
  Value count = w.count;
  for (int64_t h = 0; h < 2; ++h) {
    position[h] = e.iadd(w.firstPos, e.divUI(rowInTile[h], cfg.pack));
    limit[h] = e.isub(e.iadd(position[h], e.index(cfg.skv)), e.index(cfg.sq));
  }
  blockLimit = e.isub(e.iadd(w.firstPos, e.index(cfg.skv)), e.index(cfg.sq));
  qBuffer = e.remUI(qLoads, cfg.qBuffers);
  scf::IfOp walked = emitWalk(count, qLoads);
  Value acc = walked.getResult(0);
  Value m[2] = {walked.getResult(1), walked.getResult(2)};
  Value l[2] = {quadReduce(walked.getResult(3), false),
                quadReduce(walked.getResult(4), false)};

  Value inverse[2];
  for (int64_t h = 0; h < 2; ++h) {
    Value seen = arith::CmpFOp::create(b, loc, arith::CmpFPredicate::OGT, l[h],
                                       e.f32(0.0));
    inverse[h] = e.select(seen, e.div(e.f32(1.0), l[h]), e.f32(0.0));
  }
  auto staged = scf::IfOp::create(
      b, loc, TypeRange{},
      cfg.tmaStore ? e.andi(w.real, e.ult(e.index(0), count))
                   : arith::ConstantIntOp::create(b, loc, 0, 1).getResult(),
      /*withElse=*/true);
  if (cfg.tmaStore) {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(&staged.getThenRegion().front());
    emitStagedStore(w, acc, inverse);
  }
  b.setInsertionPointToStart(&staged.getElseRegion().front());
  emitOutputRows(w, acc, m, l, inverse);
  b.setInsertionPointAfter(staged);
}

LogicalResult AttentionEmitter::emit(ArrayRef<unsigned> buffers,
                                     unsigned outBuffer,
                                     const TensorInfo &partials,
                                     const TensorInfo &stats) {
  emitParameters(buffers, outBuffer, partials, stats);
  tid = k.threadId();
  emitSharedMemory();
  Value consumer = e.ult(tid, e.index(cfg.consumers()));
  auto roles = scf::IfOp::create(b, loc, consumer, /*withElse=*/true);
  b.setInsertionPointToStart(&roles.getElseRegion().front());
  emitProducer();
  // The row groups.
  b.setInsertionPointToStart(&roles.getThenRegion().front());
  emitRowGroupSetup();
  forEachTile([&](WorkTile &w, Value kvIter, Value qLoads) {
    emitRowGroupTile(w, kvIter, qLoads);
  });
  b.setInsertionPointAfter(roles);
  return k.finish(op);
}

/// The merge of key splits: a block per row, a thread per value column, in
/// the CPU backend's order (ranges in order, then one multiply by 1 / sum).
static LogicalResult
buildAttentionMerge(LayerKernels &layer, TiledAttentionOp op,
                    const AttentionConfig &cfg, const TensorInfo &partials,
                    const TensorInfo &stats, unsigned outBuffer) {
  int64_t rowsTotal = cfg.rowsTotal, dv = cfg.dv;
  Kernel merge = layer.kernelOn(op, "attention_merge",
                                {partials.buffer, stats.buffer, outBuffer});
  merge.launch.work = {rowsTotal, 0};
  merge.launch.block = dv;
  Emitter &me = merge.e;
  Value mPartials = merge.view(0, partials), mStats = merge.view(1, stats);
  Value mOut = merge.view(
      2, TensorInfo{outBuffer,
                    MemRefType::get({rowsTotal, dv}, me.b.getBF16Type()),
                    {}});
  Value row = merge.blockId(gpu::Dimension::x);
  Value col = merge.threadId();
  Value mNegInf = me.f32(-INFINITY), mZero = me.f32(0.0);
  auto at = [&](int64_t s) { return me.iadd(me.index(s * rowsTotal), row); };
  Value top = mNegInf;
  for (int64_t s = 0; s < cfg.splits; ++s)
    top = arith::MaximumFOp::create(me.b, me.loc, top,
                                    me.loadRaw(mStats, {at(s), me.index(0)}));
  Value none = arith::CmpFOp::create(me.b, me.loc, arith::CmpFPredicate::OEQ,
                                     top, mNegInf);
  Value shift = me.select(none, mZero, top);
  Value total = mZero, sum = mZero;
  for (int64_t s = 0; s < cfg.splits; ++s) {
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

LogicalResult nvidia::buildAttention(LayerKernels &layer, TiledAttentionOp op) {
  if (failed(checkAttentionShapes(op)))
    return failure();
  AttentionConfig cfg = configureAttention(op);
  // Nothing to compute (the verifier keeps head counts positive): no launch.
  if (cfg.batch == 0 || cfg.sq == 0)
    return success();
  int64_t qBytes = cfg.qBytes, kBytes = cfg.kBytes, vBytes = cfg.vBytes;
  if (cfg.stages < 2)
    return op.emitOpError() << "needs " << qBytes + 2 * (kBytes + vBytes)
                            << " bytes of shared memory for Q and two K/V "
                               "slots; sm_90a has "
                            << sm90a::kSharedPerBlock;
  if (cfg.workTiles >= (int64_t(1) << 31))
    return op.emitOpError()
           << "has " << cfg.workTiles << " tiles of 128 rows; at most 2^31 run";

  // TMA: Q as (d, head in group, position, key/value head, batch), a box
  // of [128 / pack positions][pack heads][64]: row r of the tile is
  // position r / pack, head r % pack. K and V as (d, position, head,
  // batch): rows past the keys read as zeros.
  int64_t batch = cfg.batch, sq = cfg.sq, hq = cfg.hq, d = cfg.d, hkv = cfg.hkv,
          dv = cfg.dv, group = cfg.group, pack = cfg.pack;
  unsigned qMap = layer.plan.addTensorMap(
      layer.info(op.getQuery()).buffer, 2, group, d, d, pack, kChunk,
      {sq, hq * d, kBlockRows / pack, hkv, group * d, 1, batch, sq * hq * d,
       1});
  auto kvMap = [&](Value tensor, int64_t width) {
    int64_t keys = std::max<int64_t>(cfg.skv, 1);
    return layer.plan.addTensorMap(
        layer.info(tensor).buffer, 2, keys, hkv * width, width, cfg.tileN,
        kChunk, {hkv, width, 1, batch, keys * hkv * width, 1});
  };
  unsigned kMap = kvMap(op.getKey(), d), vMap = kvMap(op.getValue(), dv);

  const TensorInfo &out = layer.define(op.getOut(), {});
  unsigned outBuffer = out.buffer;
  Type f32 = Float32Type::get(op.getContext());
  // Key splits: f32 partial outputs [splits * rows, dv] and (max, sum).
  TensorInfo partials{}, stats{};
  SmallVector<unsigned> buffers = {outBuffer};
  int64_t splitRows = cfg.splits * cfg.rowsTotal;
  if (cfg.splits > 1) {
    partials = TensorInfo{layer.plan.addWorkspace({splitRows * dv * 4, 0}),
                          MemRefType::get({splitRows, dv}, f32),
                          {}};
    stats = TensorInfo{layer.plan.addWorkspace({splitRows * 8, 0}),
                       MemRefType::get({splitRows, 2}, f32),
                       {}};
    buffers = {partials.buffer, stats.buffer};
  }
  SmallVector<unsigned> maps = {qMap, kMap, vMap};
  if (cfg.tmaStore)
    maps.push_back(
        layer.plan.addTensorMap(outBuffer, 2, group, dv, dv, pack, kChunk,
                                {sq, hq * dv, kGroupRows / pack, hkv,
                                 group * dv, 1, batch, sq * hq * dv, 1}));
  Kernel k = layer.kernelOn(op, "attention", buffers, maps);
  // Persistent: each block strides over the work tiles, so its producer
  // loads the next tile's Q, K and V while its row groups finish one.
  Launch &launch = k.launch;
  launch.work = {cfg.headTiles * cfg.unitsPerHead, 0};
  launch.persistent = true;
  launch.block = (kGroups + 1) * 128;
  launch.sharedBytes = cfg.sharedBytes();
  k.func.setKnownBlockSizeAttr(
      k.b.getDenseI32ArrayAttr({int32_t(launch.block), 1, 1}));
  if (failed(AttentionEmitter(op, cfg, k)
                 .emit(buffers, outBuffer, partials, stats)))
    return failure();
  if (cfg.splits == 1)
    return success();
  return buildAttentionMerge(layer, op, cfg, partials, stats, outBuffer);
}
