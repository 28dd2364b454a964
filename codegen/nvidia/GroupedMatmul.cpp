//===- GroupedMatmul.cpp - the expert matmul kernel -----------------------===//
//
// moe.grouped_matmul (and its dense form) on the tensor cores, for bf16 and
// FP8 (E4M3) operands. A block computes a tile of 128 rows x 256 weight rows
// with three warpgroups: a producer, one of whose threads loads 128-byte K
// slices of both operands (64 bf16 or 128 E4M3) with TMA into a 4-slot
// shared-memory ring (128-byte swizzle; a "loaded" and a "released" mbarrier
// per slot), and two consumers that each issue wgmma for 64 of the rows,
// both operands K-major, and release each slot when done with it.
// bf16 accumulates the whole K in one m64n256k16 fragment.
// FP8 multiplies each scale block (128 of K for FP8 block-128, 32 for MXFP8)
// into a fresh f32 partial with m64n128k32 and adds partial x row scale x
// column scale to the accumulator, as the CPU backend does: the tensor
// cores' FP8 sums are short, and the scales differ per block. The epilogue
// adds the bias, applies the gated activation (a tile holds 128 gate and the
// matching 128 up columns) and stores bf16 from registers, or quantizes each
// row's blocks first (out_quant). A grouped matmul
// finds its block's expert and rows from the device's counts, so its grid is
// an upper bound and spare blocks exit.
//
//===----------------------------------------------------------------------===//

#include "codegen/common/Numerics.h"
#include "codegen/nvidia/Hopper.h"
#include "codegen/nvidia/KernelBuilder.h"

#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/NVGPU/IR/NVGPUDialect.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::nvidia;

namespace {
// Split-K aims for at most this many busy blocks (one per SM), with at most
// kMaxSplits splits.
constexpr int64_t kSplitTarget = 132, kMaxSplits = 8, kMinSplitTiles = 32;
// A tile is 128 rows x 256 columns (B rows), 128 bytes of K per stage; each
// of its two warpgroups computes 64 rows.
constexpr int64_t kTileM = 128, kTileN = 256, kSliceBytes = 128;
constexpr int64_t kWarpGroups = 2, kGroupRows = kTileM / kWarpGroups;
constexpr int64_t kFragment = kGroupRows * kTileN / 128; // f32 per thread
constexpr int64_t kStages = 4; // A ring of 48 KiB stages.
// Registers per thread after setmaxnreg: 128 x 24 + 256 x 240 <= 64 Ki.
constexpr int64_t kProducerRegisters = 24, kConsumerRegisters = 240;
constexpr int64_t kStageBytes = (kTileM + kTileN) * kSliceBytes;
constexpr int64_t kHalfBytes = kTileN / 2 * kSliceBytes; // 128 B rows

/// The operands' encoding and the wgmma that multiplies them.
struct Encoding {
  explicit Encoding(QuantAttr scheme) : scheme(scheme) {
    if (!scheme)
      return;
    elementBytes = 1;
    // An FP8 partial needs registers beside the accumulator: two m64n128
    // fragments (gate and up, or the two column halves) of 64 f32 each.
    instN = 128;
    scaleK = scheme.getBlockSize();
    type = NVVM::WGMMATypes::e4m3;
  }
  bool fp8() const { return static_cast<bool>(scheme); }
  int64_t tileK() const { return kSliceBytes / elementBytes; }
  int64_t instK() const { return 32 / elementBytes; }
  int64_t halves() const { return kTileN / instN; }
  int64_t fragment() const { return instN / 2; }
  /// Scale blocks along K in one stage.
  int64_t subBlocks() const { return fp8() ? tileK() / scaleK : 1; }

  QuantAttr scheme;
  int64_t elementBytes = 2, instN = kTileN, scaleK = 0;
  NVVM::WGMMATypes type = NVVM::WGMMATypes::bf16;
};

/// The pieces of the wgmma main loop: an accumulator is an LLVM struct of
/// f32, one m64nN fragment per warpgroup.
struct Wgmma {
  Kernel &k;
  OpBuilder &b;
  Location loc;
  const Encoding &enc;
  Type fragment;

  Wgmma(Kernel &k, const Encoding &enc) : k(k), b(k.b), loc(k.e.loc), enc(enc) {
    SmallVector<Type> fields(enc.fragment(), b.getF32Type());
    fragment = LLVM::LLVMStructType::getLiteral(b.getContext(), fields);
  }
  Value zero() { return zeroFragment(b, loc, fragment); }
  /// The descriptor of a K-major tile at shared address `address` (i64):
  /// 128-byte swizzle, 1024 bytes between 8-row groups.
  Value descriptor(Value address) {
    return swizzledDescriptor(b, loc, address);
  }
  Value fence(Value acc) { return fenceFragment(b, loc, acc); }
  /// acc + A x B, or A x B alone when `accumulate` is false.
  Value mma(Value acc, Value a, Value bDesc, bool accumulate = true) {
    return wgmmaKMajor(b, loc, fragment, acc, a, bDesc, enc.instN, enc.instK(),
                       enc.type, accumulate);
  }
};
} // namespace

/// What K is in the layer, from the step moe-decompose named the matmul.
static std::string describeK(GroupedMatmulOp op) {
  auto step = dyn_cast<NameLoc>(op.getLoc());
  StringRef name = step ? step.getName().strref() : "";
  if (name == "down")
    return "the intermediate size, in the down matmul";
  if (name == "shared_down")
    return "the shared experts' intermediate size, in their down matmul";
  if (!name.empty())
    return ("the hidden size, in the " + name + " matmul").str();
  return "the length of the rows it multiplies";
}

/// The expert and rows [start, end) of row tile `target` (i32) when each
/// expert's rows are cut into tiles of kTileM: (-1, 0, 0) past the last.
/// Every warp finds it on its own, its lanes each summing the tiles of a
/// run of experts and meeting through shuffles, so a block waits for one
/// round of loads rather than one per expert.
static SmallVector<Value> findTile(Emitter &e, Value tid, Value counts,
                                   Value offsets, int64_t experts,
                                   Value target) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  Value lane = e.toI32(e.remUI(tid, 32));
  int64_t per = llvm::divideCeil(experts, int64_t(32));
  Value first = arith::MulIOp::create(b, loc, lane, e.i32(per));
  // Expert `first + j`'s count, zero past the last expert.
  auto countAt = [&](Value j) {
    Value x = e.iadd(first, j);
    Value inside = e.icmp(arith::CmpIPredicate::slt, x, e.i32(experts));
    Value clamped = e.toIndex(e.select(inside, x, e.i32(experts - 1)));
    return e.select(inside, e.loadRaw(counts, {clamped}), e.i32(0));
  };
  auto tilesOf = [&](Value c) {
    return arith::CeilDivUIOp::create(b, loc, c, e.i32(kTileM)).getResult();
  };
  // This lane's tiles; the loads are independent, so they overlap.
  Value mine = e.reduce(
      e.i32(0), e.i32(per), {e.i32(0)},
      [&](Value j, ValueRange acc) -> SmallVector<Value> {
        return {e.iadd(acc[0], tilesOf(countAt(j)))};
      },
      e.i32(1))[0];
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
        Value c = countAt(j), seen = acc[3];
        Value x = e.iadd(first, j);
        Value tiles = tilesOf(c);
        Value into = arith::SubIOp::create(b, loc, target, seen);
        Value here =
            e.andi(e.icmp(arith::CmpIPredicate::slt, acc[0], e.i32(0)),
                   e.andi(e.icmp(arith::CmpIPredicate::sge, into, e.i32(0)),
                          e.icmp(arith::CmpIPredicate::slt, into, tiles)));
        Value offset = e.loadRaw(
            offsets, {e.toIndex(e.select(
                         e.icmp(arith::CmpIPredicate::slt, x, e.i32(experts)),
                         x, e.i32(experts - 1)))});
        Value start =
            e.iadd(offset, arith::MulIOp::create(b, loc, into, e.i32(kTileM)));
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

LogicalResult nvidia::buildGroupedMatmul(LayerKernels &layer,
                                         GroupedMatmulOp op) {
  auto rhsType = cast<RankedTensorType>(op.getRhs().getType());
  Encoding enc(op.getScheme());
  bool grouped = static_cast<bool>(op.getTokensPerExpert());
  int64_t experts = grouped ? rhsType.getDimSize(0) : 1;
  int64_t n = rhsType.getDimSize(rhsType.getRank() - 2);
  int64_t kDim = rhsType.getDimSize(rhsType.getRank() - 1);
  // TMA reads rows whose length in bytes is a multiple of 16.
  if ((kDim * enc.elementBytes) % 16 != 0)
    return op.emitOpError()
           << "has K = " << kDim << " (" << describeK(op)
           << "): sm_90a loads the operands with TMA, whose rows must be a "
              "multiple of 16 bytes, so K must be a multiple of "
           << 16 / enc.elementBytes;
  // Weight scales: one per 128 x 128 block (FP8 block-128) or per row and
  // K block (MXFP8, or block-128 weights quantized in 1 x 128 blocks).
  int64_t rhsScaleRows = 1;
  if (enc.fp8())
    rhsScaleRows = common::scaleRowsPerBlock(
        rhsType.getShape(),
        cast<RankedTensorType>(op.getRhsScale().getType()).getShape(),
        enc.scheme);
  bool columnScales = enc.fp8() && rhsScaleRows == 1;
  ActivationAttr activation = op.getActivationAttr();
  int64_t outN = activation ? n / 2 : n;
  // With an activation a tile computes 128 gate and the matching 128 up
  // columns, and gives 128 outputs.
  int64_t outTile = activation ? kTileN / 2 : kTileN;
  // A copy: define() may grow the map it lives in.
  FailureOr<TensorInfo> source = layer.tmaSource(op, op.getLhs());
  if (failed(source))
    return failure();
  TensorInfo lhs = *source;
  layer.define(op.getOut(), lhs.rows);
  QuantAttr outQuant = op.getOutQuantAttr();
  if (outQuant)
    layer.define(op.getOutScale(), lhs.rows);

  unsigned mapA = layer.plan.addTensorMap(lhs.buffer, enc.elementBytes,
                                          lhs.rows, kDim, kTileM, enc.tileK());
  unsigned mapB =
      layer.plan.addTensorMap(layer.info(op.getRhs()).buffer, enc.elementBytes,
                              {experts * n, 0}, kDim, kTileN / 2, enc.tileK());

  // A bucket of few tokens has few tiles, each streaming all of K from one
  // SM: its tiles split K among several blocks (their f32 partials summed
  // in split order by the tile's last block, which runs the epilogue), so
  // the weight reads spread over the GPU. Its grid is cut to the tiles its
  // rows can have: a tile holds at least one row.
  int64_t kTiles = llvm::divideCeil(kDim, enc.tileK());
  int64_t colTiles = llvm::divideCeil(outN, outTile);
  int64_t splits = 1, tilesPerSplit = kTiles, rowTiles = 0;
  if (layer.maxTokens > 0) {
    int64_t rows = std::max<int64_t>(
        lhs.rows.fixed + lhs.rows.perToken * layer.maxTokens, 1);
    rowTiles = llvm::divideCeil(rows, kTileM);
    // The tiles likely busy: one per expert that has rows, and one per
    // 128 rows.
    int64_t busy = rowTiles * colTiles;
    if (grouped) {
      busy = (std::min(experts, rows) + rowTiles) * colTiles;
      rowTiles = std::min(rowTiles + experts, rows);
    }
    // One wave: a block holds an SM (its ring takes the shared memory),
    // and a second wave costs more than its share of K saves. A split
    // streams at least kMinSplitTiles slices: on H100 a split block's fixed
    // cost (ring fill, partials, the last block's sum) outweighed what
    // shorter splits saved (bench/RESULTS.md).
    splits = std::clamp<int64_t>(
        std::min(kSplitTarget / busy, kTiles / kMinSplitTiles), 1, kMaxSplits);
    tilesPerSplit = llvm::divideCeil(kTiles, splits);
    splits = llvm::divideCeil(kTiles, tilesPerSplit);
  }
  // Split partials [splits, rows, n] f32 and one counter per tile.
  TensorInfo partials{};
  if (splits > 1)
    partials = TensorInfo{layer.plan.addWorkspace(lhs.rows * (splits * n * 4)),
                          MemRefType::get({ShapedType::kDynamic, n},
                                          Float32Type::get(op.getContext())),
                          lhs.rows * splits};
  unsigned counters =
      splits > 1 ? layer.plan.addCounters(rowTiles * colTiles) : 0;

  SmallVector<Value> buffers = {op.getOut()};
  if (grouped)
    buffers.append({op.getTokensPerExpert(), op.getExpertOffsets()});
  if (op.getBias())
    buffers.push_back(op.getBias());
  if (enc.fp8())
    buffers.append({op.getLhsScale(), op.getRhsScale()});
  if (outQuant)
    buffers.push_back(op.getOutScale());
  SmallVector<unsigned> bufferIndices;
  for (Value v : buffers)
    bufferIndices.push_back(layer.info(v).buffer);
  if (splits > 1)
    bufferIndices.append({partials.buffer, counters});
  Kernel k = layer.kernelOn(op, grouped ? "grouped_matmul" : "matmul",
                            bufferIndices, {mapA, mapB});
  Launch &launch = k.launch;
  // Row tiles on x (no 65535 limit), column tiles on y. Grouped: at most
  // ceil(rows / 128) + experts row tiles are non-empty.
  launch.work = lhs.rows;
  launch.perBlock = kTileM;
  launch.extraBlocks = grouped ? experts : 0;
  if (rowTiles > 0)
    launch.work = {rowTiles, 0}, launch.perBlock = 1, launch.extraBlocks = 0;
  launch.gridY = colTiles * splits;
  // Two consumer warpgroups and a producer warpgroup; the block size is
  // fixed (.reqntid), so ptxas plans registers for 384 threads.
  launch.block = (kWarpGroups + 1) * 128;
  k.func.setKnownBlockSizeAttr(
      k.b.getDenseI32ArrayAttr({int32_t(launch.block), 1, 1}));
  // Per-column weight scales of two stages, decoded to f32, follow the ring.
  int64_t columnScaleBytes =
      columnScales ? kStages * enc.subBlocks() * kTileN * 4 : 0;
  launch.sharedBytes = kStages * kStageBytes + columnScaleBytes + 1024;
  Emitter &e = k.e;
  OpBuilder &b = e.b;
  MLIRContext *ctx = b.getContext();
  auto view = [&](Value tensor) {
    return k.view(llvm::find(buffers, tensor) - buffers.begin(),
                  layer.info(tensor));
  };
  Value out = view(op.getOut());
  Value counts = grouped ? view(op.getTokensPerExpert()) : Value();
  Value offsets = grouped ? view(op.getExpertOffsets()) : Value();
  Value bias = op.getBias() ? view(op.getBias()) : Value();
  Value lhsScale = enc.fp8() ? view(op.getLhsScale()) : Value();
  Value rhsScale = enc.fp8() ? view(op.getRhsScale()) : Value();
  Value outScale = outQuant ? view(op.getOutScale()) : Value();

  auto workgroup =
      gpu::AddressSpaceAttr::get(ctx, gpu::AddressSpace::Workgroup);
  Type element = enc.fp8() ? Type(b.getI8Type()) : Type(b.getBF16Type());
  auto tileType = [&](int64_t rows) {
    return MemRefType::get({rows, enc.tileK()}, element,
                           MemRefLayoutAttrInterface(), workgroup);
  };
  auto mapType = [&](int64_t rows) {
    return nvgpu::TensorMapDescriptorType::get(
        ctx, tileType(rows), nvgpu::TensorMapSwizzleKind::SWIZZLE_128B,
        nvgpu::TensorMapL2PromoKind::L2PROMO_128B,
        nvgpu::TensorMapOOBKind::OOB_ZERO,
        nvgpu::TensorMapInterleaveKind::INTERLEAVE_NONE);
  };
  unsigned firstMap = bufferIndices.size();
  Value descA = k.tensorMap(firstMap, mapType(kTileM));
  Value descB = k.tensorMap(firstMap + 1, mapType(kTileN / 2));
  Value partialView =
      splits > 1 ? k.view(bufferIndices.size() - 2, partials) : Value();

  Value tid = k.threadId();
  // Blocks start in x-fastest order; consecutive blocks take groups of
  // kGroupM row tiles across the column tiles, so a group's activations and
  // weight tiles stay in L2 while it runs.
  constexpr int64_t kGroupM = 8;
  Value mTiles = gpu::GridDimOp::create(b, e.loc, gpu::Dimension::x);
  // y is column tile x split (splits consecutive).
  Value nTiles =
      e.divUI(gpu::GridDimOp::create(b, e.loc, gpu::Dimension::y), splits);
  Value splitIdx = e.remUI(k.blockId(gpu::Dimension::y), splits);
  Value colY = e.divUI(k.blockId(gpu::Dimension::y), splits);
  Value linearId = e.iadd(arith::MulIOp::create(b, e.loc, colY, mTiles),
                          k.blockId(gpu::Dimension::x));
  // This split's K slices [kBegin, kBegin + kCount).
  Value kBegin = e.imul(splitIdx, tilesPerSplit);
  Value kCount =
      e.minUI(e.index(tilesPerSplit), e.isub(e.index(kTiles), kBegin));
  Value perGroup = e.imul(nTiles, kGroupM);
  Value firstM =
      e.imul(arith::DivUIOp::create(b, e.loc, linearId, perGroup), kGroupM);
  Value groupRows = e.minUI(e.index(kGroupM),
                            arith::SubIOp::create(b, e.loc, mTiles, firstM));
  Value inGroup = arith::RemUIOp::create(b, e.loc, linearId, perGroup);
  Value mTile =
      e.iadd(firstM, arith::RemUIOp::create(b, e.loc, inGroup, groupRows));
  Value nTile = arith::DivUIOp::create(b, e.loc, inGroup, groupRows);

  // This block's expert and rows [rowStart, rowEnd).
  Value expert, rowStart, rowEnd;
  if (grouped) {
    auto found =
        findTile(e, k.threadId(), counts, offsets, experts, e.toI32(mTile));
    expert = found[0];
    rowStart = found[1];
    rowEnd = found[2];
  } else {
    // A tile past the call's rows (a grid sized for a bucket) has none.
    rowStart = e.toI32(e.imul(mTile, kTileM));
    rowEnd = e.toI32(k.linear(lhs.rows));
    expert = e.select(e.icmp(arith::CmpIPredicate::slt, rowStart, rowEnd),
                      e.i32(0), e.i32(-1));
  }
  auto active = scf::IfOp::create(
      b, e.loc, e.icmp(arith::CmpIPredicate::sge, expert, e.i32(0)),
      /*withElse=*/false);
  b.setInsertionPointToStart(&active.getThenRegion().front());

  // Shared memory: kStages x (A 128 rows, B 256 rows) of 128 bytes,
  // 1024-byte aligned for the 128-byte swizzle.
  auto bytesType = MemRefType::get({ShapedType::kDynamic}, b.getI8Type(),
                                   MemRefLayoutAttrInterface(), workgroup);
  Value smem = gpu::DynamicSharedMemoryOp::create(b, e.loc, bytesType);
  Value base = memref::ExtractAlignedPointerAsIndexOp::create(b, e.loc, smem);
  Value pad = e.remUI(e.isub(e.index(1024), e.remUI(base, 1024)), 1024);
  auto tile = [&](Value slot, int64_t offset, int64_t rows) {
    Value shift =
        e.iadd(e.iadd(pad, e.imul(slot, kStageBytes)), e.index(offset));
    return memref::ViewOp::create(b, e.loc, tileType(rows), smem, shift,
                                  ValueRange{})
        .getResult();
  };
  auto address = [&](Value slot, int64_t offset) {
    Value a = e.iadd(e.iadd(base, pad),
                     e.iadd(e.imul(slot, kStageBytes), e.index(offset)));
    return arith::IndexCastOp::create(b, e.loc, b.getI64Type(), a).getResult();
  };
  // [2 stages][sub-blocks][256 columns] f32, after the ring.
  // [kStages][sub-blocks][256 columns] f32, after the ring: each stage's
  // per-column weight scales, written by the producer warpgroup.
  Value columnScaleTile;
  if (columnScales)
    columnScaleTile = memref::ViewOp::create(
        b, e.loc,
        MemRefType::get({kStages, enc.subBlocks(), kTileN}, b.getF32Type(),
                        MemRefLayoutAttrInterface(), workgroup),
        smem, e.iadd(pad, e.index(kStages * kStageBytes)), ValueRange{});

  // `barriers[s]` completes when slot s is loaded (TMA bytes), `empty[s]`
  // when every consumer thread is done reading it.
  auto barrierType = nvgpu::MBarrierGroupType::get(ctx, workgroup, kStages);
  Value barriers = nvgpu::MBarrierCreateOp::create(b, e.loc, barrierType);
  Value empty = nvgpu::MBarrierCreateOp::create(b, e.loc, barrierType);
  constexpr int64_t kConsumers = kWarpGroups * 128;
  Value leader = e.eq(tid, e.index(0));
  // With per-column scales every producer thread also arrives on a slot's
  // barrier once it has stored its columns' scales there.
  int64_t fullArrivals = columnScales ? 1 + 128 : 1;
  for (int64_t s = 0; s < kStages; ++s) {
    nvgpu::MBarrierInitOp::create(b, e.loc, barriers, e.index(fullArrivals),
                                  e.index(s), leader);
    nvgpu::MBarrierInitOp::create(b, e.loc, empty, e.index(kConsumers),
                                  e.index(s), leader);
  }
  e.ifThen(leader, [&] {
    // The barriers' initialization must be visible to the TMA unit.
    NVVM::FenceMbarrierInitOp::create(b, e.loc);
  });

  Value rowStartIdx = e.toIndex(rowStart);
  Value rowEndIdx = e.toIndex(rowEnd);
  Value expertIdx = e.toIndex(expert);
  Value colTile = e.imul(nTile, outTile);
  // The first weight row (within the expert) of each 128-column half.
  Value halfRow0 = colTile;
  Value halfRow1 = activation ? e.iadd(colTile, e.index(n / 2))
                              : e.iadd(colTile, e.index(kTileN / 2));
  Value bRow0 = e.iadd(e.imul(expertIdx, n), halfRow0);
  Value bRow1 = e.iadd(e.imul(expertIdx, n), halfRow1);
  // Thread 0 loads K slice `kt` into ring slot `slot`.
  auto issue = [&](Value kt, Value slot) {
    Value col = e.imul(kt, enc.tileK());
    nvgpu::MBarrierArriveExpectTxOp::create(
        b, e.loc, barriers, e.index(kStageBytes), slot, Value());
    nvgpu::TmaAsyncLoadOp::create(b, e.loc, tile(slot, 0, kTileM), barriers,
                                  descA, ValueRange{col, rowStartIdx}, slot,
                                  Value(), Value());
    nvgpu::TmaAsyncLoadOp::create(
        b, e.loc, tile(slot, kTileM * kSliceBytes, kTileN / 2), barriers, descB,
        ValueRange{col, bRow0}, slot, Value(), Value());
    nvgpu::TmaAsyncLoadOp::create(
        b, e.loc, tile(slot, kTileM * kSliceBytes + kHalfBytes, kTileN / 2),
        barriers, descB, ValueRange{col, bRow1}, slot, Value(), Value());
  };

  // Fragment element i of a thread in warp w (of its warpgroup), lane l is
  // row 16w + l/4 + 8((i/2)%2) and column 8(i/4) + 2(l%4) + i%2 of its
  // m64nN result.
  Value group = e.divUI(tid, 128);
  Value warp = e.remUI(e.divUI(tid, 32), 4), lane = e.remUI(tid, 32);
  Value rowBase = e.iadd(
      e.iadd(e.iadd(rowStartIdx, e.imul(group, kGroupRows)), e.imul(warp, 16)),
      e.divUI(lane, 4));
  Value colBase = e.imul(e.remUI(lane, 4), 2);
  auto fragmentColumn = [&](int64_t i) {
    return e.iadd(colBase, e.index((i / 4) * 8 + i % 2));
  };

  // FP8 scales. A stage's scales are loaded one stage ahead into registers
  // (the loop carries them) so their latency hides behind the wgmma.
  int64_t kBlocks = enc.fp8() ? llvm::divideCeil(kDim, enc.scaleK) : 0;
  int64_t sub = enc.subBlocks();
  // This thread's two rows, clamped into the block's rows for the loads.
  Value lastRow = e.isub(rowEndIdx, e.index(1));
  Value scaleRows[2] = {e.minUI(rowBase, lastRow),
                        e.minUI(e.iadd(rowBase, e.index(8)), lastRow)};
  // Square weight blocks: the block row of each half's first column; a half
  // whose first row is not a multiple of 128 (the up half when n/2 is not)
  // spans two blocks, and its columns from `split` on use the second.
  int64_t weightBlockRows = llvm::divideCeil(n, int64_t(128));
  int64_t split[2] = {128, 128};
  if (activation && (n / 2) % 128 != 0)
    split[1] = 128 - (n / 2) % 128;
  Value halfRows[2] = {halfRow0, halfRow1};
  auto kBlockOf = [&](Value kt, int64_t s) {
    return e.minUI(e.iadd(e.imul(kt, sub), e.index(s)), e.index(kBlocks - 1));
  };
  // The scales of stage `kt`: per sub-block, both rows' scales, then for
  // square weight blocks each half's one or two block scales.
  auto loadScales = [&](Value kt) {
    SmallVector<Value> values;
    for (int64_t s = 0; s < sub; ++s) {
      Value kb = kBlockOf(kt, s);
      // A sub-block past K (MXFP8, K not a multiple of 128) adds nothing.
      Value past =
          e.icmp(arith::CmpIPredicate::uge, e.iadd(e.imul(kt, sub), e.index(s)),
                 e.index(kBlocks));
      for (Value row : scaleRows) {
        Value scale = common::loadScale(e, lhsScale, {row, kb});
        if (kBlocks % sub != 0)
          scale = e.select(past, e.f32(0.0), scale);
        values.push_back(scale);
      }
      if (columnScales)
        continue;
      for (int64_t h = 0; h < 2; ++h) {
        Value blockRow = e.divUI(halfRows[h], 128);
        for (int64_t part = 0; part < (split[h] < 128 ? 2 : 1); ++part) {
          Value r = e.minUI(e.iadd(blockRow, e.index(part)),
                            e.index(weightBlockRows - 1));
          SmallVector<Value> index;
          if (grouped)
            index.push_back(expertIdx);
          index.append({r, kb});
          values.push_back(common::loadScale(e, rhsScale, index));
        }
      }
    }
    return values;
  };
  // Per-column weight scales: producer thread p stores tile columns p and
  // p + 128 of a stage (weight rows clamped into the expert).
  auto storeColumnScales = [&](Value kt, Value slot, Value p) {
    for (int64_t h = 0; h < 2; ++h) {
      Value row =
          e.minUI(e.iadd(h == 0 ? halfRow0 : halfRow1, p), e.index(n - 1));
      for (int64_t s = 0; s < sub; ++s) {
        SmallVector<Value> index;
        if (grouped)
          index.push_back(expertIdx);
        index.append({row, kBlockOf(kt, s)});
        memref::StoreOp::create(
            b, e.loc, common::loadScale(e, rhsScale, index), columnScaleTile,
            ValueRange{slot, e.index(s), e.iadd(p, e.index(h * 128))});
      }
    }
  };
  Value consumer = e.ult(tid, e.index(kConsumers));
  gpu::BarrierOp::create(b, e.loc);

  // Warp specialization: the producer warpgroup gives up registers and one
  // of its threads keeps the ring full, waiting only for a slot to be
  // released; the consumers take the registers and never wait on each
  // other, so one's promotion or epilogue overlaps the other's wgmma.
  auto arrive = [&](Value group, Value slot) {
    mbarrierArrive(b, e.loc, group, slot);
  };
  auto roles = scf::IfOp::create(b, e.loc, consumer, /*withElse=*/true);
  b.setInsertionPointToStart(&roles.getElseRegion().front());
  NVVM::SetMaxRegisterOp::create(b, e.loc, kProducerRegisters,
                                 NVVM::SetMaxRegisterAction::decrease);
  Value producerLead = e.eq(tid, e.index(kConsumers));
  // The producer threads taking part: the lead alone, or all of them when
  // they also stage column scales.
  Value producing =
      columnScales ? arith::ConstantIntOp::create(b, e.loc, 1, 1).getResult()
                   : producerLead;
  e.ifThen(producing, [&] {
    e.ifThen(producerLead, [&] {
      nvgpu::TmaPrefetchOp::create(b, e.loc, descA, Value());
      nvgpu::TmaPrefetchOp::create(b, e.loc, descB, Value());
    });
    e.forEach(e.index(0), kCount, [&](Value j) {
      Value kt = e.iadd(kBegin, j);
      Value slot = e.remUI(j, kStages);
      // From the second round on, wait for the slot's previous use.
      e.ifThen(e.icmp(arith::CmpIPredicate::uge, j, e.index(kStages)), [&] {
        Value parity = arith::TruncIOp::create(
            b, e.loc, b.getI1Type(),
            e.toI32(e.remUI(e.iadd(e.divUI(j, kStages), e.index(1)), 2)));
        nvgpu::MBarrierTryWaitParityOp::create(b, e.loc, empty, parity,
                                               e.index(10000000), slot);
      });
      e.ifThen(producerLead, [&] { issue(kt, slot); });
      if (columnScales) {
        storeColumnScales(kt, slot, e.isub(tid, e.index(kConsumers)));
        arrive(barriers, slot);
      }
    });
  });
  b.setInsertionPointToStart(&roles.getThenRegion().front());
  NVVM::SetMaxRegisterOp::create(b, e.loc, kConsumerRegisters,
                                 NVVM::SetMaxRegisterAction::increase);
  // Every consumer thread releases slot `slot`.
  auto release = [&](Value slot) { arrive(empty, slot); };

  Wgmma w(k, enc);
  Value zero = w.zero();
  SmallVector<Value> init(enc.halves(), zero);
  int64_t scaleValues = 0;
  if (enc.fp8()) {
    SmallVector<Value> first = loadScales(kBegin);
    scaleValues = first.size();
    init.append(first);
  }
  // This thread's warpgroup computes rows [64 g, 64 g + 64) of the tile.
  Value groupOffset = arith::IndexCastOp::create(
      b, e.loc, b.getI64Type(), e.imul(group, kGroupRows * kSliceBytes));
  auto loop =
      scf::ForOp::create(b, e.loc, e.index(0), kCount, e.index(1), init);
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(loop.getBody());
    Value j = loop.getInductionVar();
    Value kt = e.iadd(kBegin, j);
    Value slot = e.remUI(j, kStages);
    ValueRange carried = loop.getRegionIterArgs();
    SmallVector<Value> accs(carried.take_front(enc.halves()));
    ValueRange scales = carried.drop_front(enc.halves());
    // The next stage's scales, needed only after this stage's wgmma.
    Value next = e.iadd(kt, e.index(1));
    SmallVector<Value> nextScales;
    if (enc.fp8())
      nextScales = loadScales(next);
    Value parity = arith::TruncIOp::create(
        b, e.loc, b.getI1Type(), e.toI32(e.remUI(e.divUI(j, kStages), 2)));
    nvgpu::MBarrierTryWaitParityOp::create(b, e.loc, barriers, parity,
                                           e.index(10000000), slot);
    Value aBase = LLVM::AddOp::create(b, e.loc, address(slot, 0), groupOffset);
    Value bBase = address(slot, kTileM * kSliceBytes);
    // wgmma over instructions [first, last) of the slice into `acc` for
    // columns of half `h` (all 256 for bf16).
    auto multiply = [&](Value acc, int64_t h, int64_t first, int64_t last,
                        bool accumulate) {
      for (int64_t kk = first; kk < last; ++kk) {
        Value bDesc = w.descriptor(LLVM::AddOp::create(
            b, e.loc, bBase, k.constI64(h * kHalfBytes + kk * 32)));
        Value aDesc = w.descriptor(
            LLVM::AddOp::create(b, e.loc, aBase, k.constI64(kk * 32)));
        acc = w.mma(acc, aDesc, bDesc, accumulate || kk != first);
      }
      return acc;
    };
    int64_t perSlice = enc.tileK() / enc.instK();
    if (!enc.fp8()) {
      NVVM::WgmmaFenceAlignedOp::create(b, e.loc);
      accs[0] = multiply(accs[0], 0, 0, perSlice, /*accumulate=*/true);
      NVVM::WgmmaGroupSyncAlignedOp::create(b, e.loc);
      // The previous slice's wgmma are done: its slot can be refilled.
      NVVM::WgmmaWaitGroupSyncOp::create(b, e.loc, 1);
      e.ifThen(e.icmp(arith::CmpIPredicate::uge, j, e.index(1)),
               [&] { release(e.remUI(e.isub(j, e.index(1)), kStages)); });
    } else {
      Value stage = slot;
      int64_t perBlock = perSlice / sub;
      // Each scale block into a fresh partial, then scaled into the
      // accumulator: acc += partial * (row scale * column scale).
      for (int64_t s = 0; s < sub; ++s) {
        ValueRange blockScales =
            scales.slice(s * (scaleValues / sub), scaleValues / sub);
        for (int64_t h = 0; h < enc.halves(); ++h) {
          NVVM::WgmmaFenceAlignedOp::create(b, e.loc);
          // The first wgmma ignores its input: no registers for it.
          Value partial =
              multiply(LLVM::PoisonOp::create(b, e.loc, w.fragment), h,
                       s * perBlock, (s + 1) * perBlock, /*accumulate=*/false);
          NVVM::WgmmaGroupSyncAlignedOp::create(b, e.loc);
          NVVM::WgmmaWaitGroupSyncOp::create(b, e.loc, 0);
          partial = w.fence(partial);
          Value acc = accs[h];
          // Square blocks: this half's first (and second) block scale.
          int64_t first = 2;
          for (int64_t g = 0; g < h; ++g)
            first += split[g] < 128 ? 2 : 1;
          for (int64_t i = 0; i < enc.fragment(); ++i) {
            Value rowScale = blockScales[(i / 2) % 2];
            Value columnScale;
            if (columnScales) {
              Value c = e.iadd(fragmentColumn(i), e.index(h * 128));
              columnScale = memref::LoadOp::create(
                  b, e.loc, columnScaleTile, ValueRange{stage, e.index(s), c});
            } else if (split[h] == 128) {
              columnScale = blockScales[first];
            } else {
              Value inFirst = e.ult(fragmentColumn(i), e.index(split[h]));
              columnScale =
                  e.select(inFirst, blockScales[first], blockScales[first + 1]);
            }
            Value p = LLVM::ExtractValueOp::create(b, e.loc, partial,
                                                   ArrayRef<int64_t>{i});
            Value a = LLVM::ExtractValueOp::create(b, e.loc, acc,
                                                   ArrayRef<int64_t>{i});
            // MXFP8 promotes four times per 128 of K, which bounds it: one
            // multiply-add there (one rounding), the CPU's two steps else.
            Value scale = e.mul(rowScale, columnScale);
            Value sum =
                columnScales
                    ? math::FmaOp::create(b, e.loc, p, scale, a).getResult()
                    : e.add(a, e.mul(p, scale));
            acc = LLVM::InsertValueOp::create(b, e.loc, acc, sum,
                                              ArrayRef<int64_t>{i});
          }
          accs[h] = w.fence(acc);
        }
      }
      release(slot);
    }
    SmallVector<Value> yielded(accs);
    yielded.append(nextScales);
    scf::YieldOp::create(b, e.loc, yielded);
  }
  if (!enc.fp8())
    NVVM::WgmmaWaitGroupSyncOp::create(b, e.loc, 0);

  SmallVector<Value> finals;
  for (int64_t h = 0; h < enc.halves(); ++h)
    finals.push_back(loop.getResult(h));
  // The weight row (output column before the activation) of fragment
  // element i of half h.
  auto weightRow = [&](int64_t h, int64_t i) {
    int64_t c = h * enc.instN + (i / 4) * 8 + i % 2;
    Value inHalf = e.iadd(colBase, e.index(c % 128));
    return e.iadd(c < 128 ? halfRow0 : halfRow1, inHalf);
  };
  if (splits > 1) {
    // Every split stores its partial; the tile's last block to count
    // itself in adds them in split order, the same sum whichever is last.
    auto partialAt = [&](Value s, Value row, Value wr) {
      return SmallVector<Value>{e.iadd(e.imul(s, k.linear(lhs.rows)), row), wr};
    };
    for (int64_t h = 0; h < enc.halves(); ++h)
      for (int64_t i = 0; i < enc.fragment(); ++i) {
        Value row = e.iadd(rowBase, e.index(((i / 2) % 2) * 8));
        Value wr = weightRow(h, i);
        e.ifThen(e.andi(e.ult(row, rowEndIdx), e.ult(wr, e.index(n))), [&] {
          memref::StoreOp::create(
              b, e.loc,
              LLVM::ExtractValueOp::create(b, e.loc, finals[h],
                                           ArrayRef<int64_t>{i}),
              partialView, partialAt(splitIdx, row, wr));
        });
      }
    Value ticket = k.workgroupBuffer({1}, b.getI32Type());
    auto consumerBarrier = [&] {
      inlinePtx(b, e.loc, {}, {}, "bar.sync 1, 256;", "");
    };
    auto fence = [&] { inlinePtx(b, e.loc, {}, {}, "fence.acq_rel.gpu;", ""); };
    fence();
    consumerBarrier();
    e.ifThen(e.eq(tid, e.index(0)), [&] {
      // The tile's counter starts the forward at the token count (the host
      // writes both); the last split sees it at T + splits - 1.
      Value tileIdx =
          e.iadd(e.imul(colY, mTiles), k.blockId(gpu::Dimension::x));
      Value counter = LLVM::GEPOp::create(
          b, e.loc, LLVM::LLVMPointerType::get(ctx), b.getI32Type(),
          k.func.getArgument(bufferIndices.size() - 1),
          ValueRange{
              arith::IndexCastOp::create(b, e.loc, b.getI64Type(), tileIdx)});
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
    // Only a thread's rows that hold data are summed (a decode tile has a
    // row or two of its 128).
    for (int64_t rowHalf = 0; rowHalf < 2; ++rowHalf) {
      Value row = e.iadd(rowBase, e.index(rowHalf * 8));
      auto summed = scf::IfOp::create(b, e.loc, TypeRange(ValueRange(finals)),
                                      e.ult(row, rowEndIdx), true);
      {
        OpBuilder::InsertionGuard guard(b);
        b.setInsertionPointToStart(&summed.getElseRegion().front());
        scf::YieldOp::create(b, e.loc, finals);
        b.setInsertionPointToStart(&summed.getThenRegion().front());
        SmallVector<Value> sums(finals);
        for (int64_t h = 0; h < enc.halves(); ++h)
          for (int64_t i = 0; i < enc.fragment(); ++i) {
            if ((i / 2) % 2 != rowHalf)
              continue;
            Value wr = e.minUI(weightRow(h, i), e.index(n - 1));
            Value mine = LLVM::ExtractValueOp::create(b, e.loc, finals[h],
                                                      ArrayRef<int64_t>{i});
            Value total;
            for (int64_t s = 0; s < splits; ++s) {
              Value theirs = memref::LoadOp::create(
                  b, e.loc, partialView, partialAt(e.index(s), row, wr));
              Value term = e.select(e.eq(splitIdx, e.index(s)), mine, theirs);
              total = s == 0 ? term : e.add(total, term);
            }
            sums[h] = LLVM::InsertValueOp::create(b, e.loc, sums[h], total,
                                                  ArrayRef<int64_t>{i});
          }
        scf::YieldOp::create(b, e.loc, sums);
      }
      finals.assign(summed.getResults().begin(), summed.getResults().end());
    }
  }
  // Epilogue from registers: element i of the m64n256 tile is element
  // i % fragment of half i / fragment.
  auto column = [&](int64_t i) {
    return LLVM::ExtractValueOp::create(b, e.loc, finals[i / enc.fragment()],
                                        ArrayRef<int64_t>{i % enc.fragment()})
        .getResult();
  };
  auto addBias = [&](Value v, Value col) {
    if (!bias)
      return v;
    // Out-of-range columns are masked at the store; clamp the read.
    Value safe = e.minUI(col, e.index(n - 1));
    return e.add(v, grouped ? e.load(bias, {expertIdx, safe})
                            : e.load(bias, {safe}));
  };
  // With an activation, gate column c is element i and its up column
  // c + kTileN / 2 is element i + kFragment / 2.
  int64_t perThread = activation ? kFragment / 2 : kFragment;
  // Output column c of the tile and its value (bias and activation applied).
  auto output = [&](int64_t i, Value c) {
    Value v = addBias(column(i), c);
    if (activation) {
      Value up = addBias(column(i + kFragment / 2), e.iadd(c, e.index(n / 2)));
      v = common::activate(e, activation, v, up);
    }
    return v;
  };
  if (!outQuant) {
    for (int64_t rowHalf = 0; rowHalf < 2; ++rowHalf) {
      Value row = e.iadd(rowBase, e.index(rowHalf * 8));
      e.ifThen(e.ult(row, rowEndIdx), [&] {
        for (int64_t i = 0; i < perThread; ++i) {
          if ((i / 2) % 2 != rowHalf)
            continue;
          Value c = e.iadd(colTile, fragmentColumn(i));
          Value v = output(i, c);
          e.ifThen(e.ult(c, e.index(outN)), [&] { e.store(v, out, {row, c}); });
        }
      });
    }
    b.setInsertionPointAfter(active);
    return k.finish(op);
  }

  // Quantized on the way out: a row's block of `bs` columns is held by the
  // four lanes that share the row, elements i with i/4 in the block's range
  // of 8-column groups. Each value is rounded to bf16 first, as the unfused
  // matmul stores it; the lanes combine their statistics by shuffles, which
  // every lane runs (rows past the segment are computed, not stored).
  int64_t bs = outQuant.getBlockSize();
  assert(outTile % bs == 0 && "the tile holds whole quantization blocks");
  Type bf16 = b.getBF16Type();
  for (int64_t rowHalf = 0; rowHalf < 2; ++rowHalf) {
    Value row = e.iadd(rowBase, e.index(rowHalf * 8));
    Value rowValid = e.ult(row, rowEndIdx);
    for (int64_t block = 0; block < outTile / bs; ++block) {
      SmallVector<std::pair<Value, Value>> values; // (column, value)
      Value amax = e.f32(0.0), special = e.f32(0.0);
      for (int64_t i = 0; i < perThread; ++i) {
        if ((i / 2) % 2 != rowHalf || (i / 4) * 8 / bs != block)
          continue;
        Value c = e.iadd(colTile, fragmentColumn(i));
        Value v = arith::ExtFOp::create(
            b, e.loc, b.getF32Type(),
            arith::TruncFOp::create(b, e.loc, bf16, output(i, c)).getResult());
        // Columns past N are no part of any block.
        v = e.select(e.ult(c, e.index(outN)), v, e.f32(0.0));
        Value isSpecial;
        Value magnitude = common::blockStats(e, v, isSpecial);
        amax = arith::MaxNumFOp::create(b, e.loc, amax, magnitude);
        special = arith::MaximumFOp::create(b, e.loc, special, isSpecial);
        values.push_back({c, v});
      }
      reduceBlockStats(e, amax, special, 4);
      common::BlockScale scale = common::blockScale(e, outQuant, amax, special);
      Value first = e.iadd(colTile, e.index(block * bs));
      e.ifThen(rowValid, [&] {
        for (auto [c, v] : values) {
          Value code = scale.encode(e, v);
          e.ifThen(e.ult(c, e.index(outN)), [&] {
            e.storeRaw(code, out, {row, c});
          });
        }
        e.ifThen(
            e.andi(e.eq(e.remUI(lane, 4), e.index(0)),
                   e.ult(first, e.index(outN))),
            [&] {
              e.storeRaw(scale.stored, outScale, {row, e.divUI(first, bs)});
            });
      });
    }
  }
  b.setInsertionPointAfter(active);
  return k.finish(op);
}
