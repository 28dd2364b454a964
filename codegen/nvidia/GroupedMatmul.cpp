//===- GroupedMatmul.cpp - the expert matmul kernel -----------------------===//
//
// moe.grouped_matmul (and its dense form) on the tensor cores. A block
// computes a tile of 128 rows x 256 weight rows: thread 0 loads 64-wide K
// slices of both operands with TMA into a 4-stage shared-memory ring
// (128-byte swizzle, one mbarrier per stage) and two warpgroups each issue
// wgmma m64n256k16 for 64 of the rows, both operands K-major. The epilogue
// adds the bias, applies the gated activation (a tile holds 128 gate and the
// matching 128 up columns) and stores bf16 from registers. A grouped matmul
// finds its block's expert and rows from the device's counts, so its grid is
// an upper bound and spare blocks exit.
//
//===----------------------------------------------------------------------===//

#include "codegen/common/Numerics.h"
#include "codegen/nvidia/KernelBuilder.h"

#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/NVGPU/IR/NVGPUDialect.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::nvidia;

namespace {
// A tile is 128 rows x 256 columns (B rows), 64 deep per stage; each of its
// two warpgroups computes 64 rows with wgmma m64n256k16.
constexpr int64_t kTileM = 128, kTileN = 256, kTileK = 64;
constexpr int64_t kWarpGroups = 2, kGroupRows = kTileM / kWarpGroups;
constexpr int64_t kFragment = kGroupRows * kTileN / 128; // f32 per thread
constexpr int64_t kStages = 4; // A ring of 48 KiB stages.
constexpr int64_t kStageBytes = (kTileM + kTileN) * kTileK * 2;

/// The pieces of the wgmma main loop: the accumulator is an LLVM struct of
/// kFragment f32 per thread, one m64n256 fragment per warpgroup.
struct Wgmma {
  Kernel &k;
  OpBuilder &b;
  Location loc;
  Type fragment;

  explicit Wgmma(Kernel &k) : k(k), b(k.b), loc(k.e.loc) {
    SmallVector<Type> fields(kFragment, b.getF32Type());
    fragment = LLVM::LLVMStructType::getLiteral(b.getContext(), fields);
  }
  Value zero() {
    Value acc = LLVM::PoisonOp::create(b, loc, fragment);
    Value z = LLVM::ConstantOp::create(b, loc, b.getF32Type(),
                                       b.getF32FloatAttr(0.0));
    for (int64_t i = 0; i < kFragment; ++i)
      acc = LLVM::InsertValueOp::create(b, loc, acc, z, ArrayRef<int64_t>{i});
    return acc;
  }
  /// The descriptor of a K-major tile at shared address `address` (i64):
  /// 128-byte swizzle, 1024 bytes between 8-row groups.
  Value descriptor(Value address) {
    Value field = LLVM::LShrOp::create(
        b, loc, LLVM::AndOp::create(b, loc, address, k.constI64(0x3FFFF)),
        k.constI64(4));
    int64_t fixedBits =
        (int64_t(1) << 62) | (int64_t(1024 >> 4) << 32) | (int64_t(1) << 16);
    return LLVM::OrOp::create(b, loc, field, k.constI64(fixedBits));
  }
  Value mma(Value acc, Value a, Value bDesc) {
    MLIRContext *ctx = b.getContext();
    auto type = [&](NVVM::WGMMATypes t) {
      return NVVM::WGMMATypesAttr::get(ctx, t);
    };
    return NVVM::WgmmaMmaAsyncOp::create(
        b, loc, fragment, acc, a, bDesc,
        NVVM::MMAShapeAttr::get(ctx, 64, kTileN, 16),
        type(NVVM::WGMMATypes::bf16), type(NVVM::WGMMATypes::bf16),
        type(NVVM::WGMMATypes::f32),
        NVVM::WGMMAScaleOutAttr::get(ctx, NVVM::WGMMAScaleOut::one),
        NVVM::WGMMAScaleInAttr::get(ctx, NVVM::WGMMAScaleIn::one),
        NVVM::WGMMAScaleInAttr::get(ctx, NVVM::WGMMAScaleIn::one),
        // Both operands K-major: NVVM's `col` for B is PTX's imm-trans-b 0.
        NVVM::MMALayoutAttr::get(ctx, NVVM::MMALayout::row),
        NVVM::MMALayoutAttr::get(ctx, NVVM::MMALayout::col),
        NVVM::MMAIntOverflowAttr());
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

LogicalResult nvidia::buildGroupedMatmul(LayerKernels &layer,
                                         GroupedMatmulOp op) {
  if (op.getLhsScale())
    return op.emitOpError()
           << "with FP8 operands has no sm_90a kernel yet; run "
              "moe-legalize-scaled-matmul first";
  auto lhsType = cast<RankedTensorType>(op.getLhs().getType());
  auto rhsType = cast<RankedTensorType>(op.getRhs().getType());
  // The verifier allows FP8 operands only with scales, caught above.
  assert(lhsType.getElementType().isBF16() &&
         rhsType.getElementType().isBF16() && "bf16 operands");
  bool grouped = static_cast<bool>(op.getTokensPerExpert());
  int64_t experts = grouped ? rhsType.getDimSize(0) : 1;
  int64_t n = rhsType.getDimSize(rhsType.getRank() - 2);
  int64_t kDim = rhsType.getDimSize(rhsType.getRank() - 1);
  // TMA reads rows whose length in bytes is a multiple of 16.
  if (kDim % 8 != 0)
    return op.emitOpError()
           << "has K = " << kDim << " (" << describeK(op)
           << "): sm_90a loads the operands with TMA, whose rows must be a "
              "multiple of 16 bytes, so K must be a multiple of 8";
  ActivationAttr activation = op.getActivationAttr();
  int64_t outN = activation ? n / 2 : n;
  // With an activation a tile computes 128 gate and the matching 128 up
  // columns, and gives 128 outputs.
  int64_t outTile = activation ? kTileN / 2 : kTileN;
  // A copy: define() may grow the map it lives in.
  TensorInfo lhs = layer.info(op.getLhs());
  layer.define(op.getOut(), lhs.rows);

  unsigned mapA =
      layer.plan.addTensorMap(lhs.buffer, 2, lhs.rows, kDim, kTileM, kTileK);
  unsigned mapB =
      layer.plan.addTensorMap(layer.info(op.getRhs()).buffer, 2,
                              {experts * n, 0}, kDim, kTileN / 2, kTileK);

  SmallVector<Value> buffers = {op.getOut()};
  if (grouped)
    buffers.append({op.getTokensPerExpert(), op.getExpertOffsets()});
  if (op.getBias())
    buffers.push_back(op.getBias());
  Kernel k = layer.kernel(op, grouped ? "grouped_matmul" : "matmul", buffers,
                          {mapA, mapB});
  Launch &launch = k.launch;
  // Row tiles on x (no 65535 limit), column tiles on y. Grouped: at most
  // ceil(rows / 128) + experts row tiles are non-empty.
  launch.work = lhs.rows;
  launch.perBlock = kTileM;
  launch.extraBlocks = grouped ? experts : 0;
  launch.gridY = llvm::divideCeil(outN, outTile);
  launch.block = kWarpGroups * 128;
  launch.sharedBytes = kStages * kStageBytes + 1024;
  Emitter &e = k.e;
  OpBuilder &b = e.b;
  MLIRContext *ctx = b.getContext();
  Value out = k.view(0, layer.info(op.getOut()));
  Value counts =
      grouped ? k.view(1, layer.info(op.getTokensPerExpert())) : Value();
  Value offsets =
      grouped ? k.view(2, layer.info(op.getExpertOffsets())) : Value();
  Value bias = op.getBias()
                   ? k.view(buffers.size() - 1, layer.info(op.getBias()))
                   : Value();

  auto workgroup =
      gpu::AddressSpaceAttr::get(ctx, gpu::AddressSpace::Workgroup);
  auto tileType = [&](int64_t rows) {
    return MemRefType::get({rows, kTileK}, b.getBF16Type(),
                           MemRefLayoutAttrInterface(), workgroup);
  };
  auto mapType = [&](int64_t rows) {
    return nvgpu::TensorMapDescriptorType::get(
        ctx, tileType(rows), nvgpu::TensorMapSwizzleKind::SWIZZLE_128B,
        nvgpu::TensorMapL2PromoKind::L2PROMO_128B,
        nvgpu::TensorMapOOBKind::OOB_ZERO,
        nvgpu::TensorMapInterleaveKind::INTERLEAVE_NONE);
  };
  Value descA = k.tensorMap(buffers.size(), mapType(kTileM));
  Value descB = k.tensorMap(buffers.size() + 1, mapType(kTileN / 2));

  Value tid = k.threadId();
  // Blocks start in x-fastest order; consecutive blocks take groups of
  // kGroupM row tiles across the column tiles, so a group's activations and
  // weight tiles stay in L2 while it runs.
  constexpr int64_t kGroupM = 8;
  Value mTiles = gpu::GridDimOp::create(b, e.loc, gpu::Dimension::x);
  Value nTiles = gpu::GridDimOp::create(b, e.loc, gpu::Dimension::y);
  Value linearId = e.iadd(
      arith::MulIOp::create(b, e.loc, k.blockId(gpu::Dimension::y), mTiles),
      k.blockId(gpu::Dimension::x));
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
    Value target = e.toI32(mTile);
    auto found = e.reduce(
        e.index(0), e.index(experts), {e.i32(-1), e.i32(0), e.i32(0), e.i32(0)},
        [&](Value x, ValueRange acc) -> SmallVector<Value> {
          Value c = e.loadRaw(counts, {x});
          Value tiles = arith::CeilDivUIOp::create(b, e.loc, c, e.i32(kTileM));
          Value seen = acc[1];
          Value here = e.andi(
              e.icmp(arith::CmpIPredicate::slt, acc[0], e.i32(0)),
              e.icmp(arith::CmpIPredicate::slt,
                     arith::SubIOp::create(b, e.loc, target, seen), tiles));
          Value start = e.iadd(
              e.loadRaw(offsets, {x}),
              arith::MulIOp::create(
                  b, e.loc, arith::SubIOp::create(b, e.loc, target, seen),
                  e.i32(kTileM)));
          Value end = e.iadd(e.loadRaw(offsets, {x}), c);
          return {e.select(here, e.toI32(x), acc[0]), e.iadd(seen, tiles),
                  e.select(here, start, acc[2]), e.select(here, end, acc[3])};
        });
    expert = found[0];
    rowStart = found[2];
    rowEnd = found[3];
  } else {
    expert = e.i32(0);
    rowStart = e.toI32(e.imul(mTile, kTileM));
    rowEnd = e.toI32(k.linear(lhs.rows));
  }
  auto active = scf::IfOp::create(
      b, e.loc, e.icmp(arith::CmpIPredicate::sge, expert, e.i32(0)),
      /*withElse=*/false);
  b.setInsertionPointToStart(&active.getThenRegion().front());

  // Shared memory: kStages x (A 128x64, B 256x64), 1024-byte aligned for
  // the 128-byte swizzle.
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

  auto barrierType = nvgpu::MBarrierGroupType::get(ctx, workgroup, kStages);
  Value barriers = nvgpu::MBarrierCreateOp::create(b, e.loc, barrierType);
  Value leader = e.eq(tid, e.index(0));
  for (int64_t s = 0; s < kStages; ++s)
    nvgpu::MBarrierInitOp::create(b, e.loc, barriers, e.index(1), e.index(s),
                                  leader);
  e.ifThen(leader, [&] {
    // The barriers' initialization must be visible to the TMA unit.
    NVVM::FenceMbarrierInitOp::create(b, e.loc);
    nvgpu::TmaPrefetchOp::create(b, e.loc, descA, Value());
    nvgpu::TmaPrefetchOp::create(b, e.loc, descB, Value());
  });
  gpu::BarrierOp::create(b, e.loc);

  Value rowStartIdx = e.toIndex(rowStart);
  Value expertIdx = e.toIndex(expert);
  Value colTile = e.imul(nTile, outTile);
  Value bRow0 = e.iadd(e.imul(expertIdx, n), colTile);
  Value bRow1 = activation ? e.iadd(bRow0, e.index(n / 2))
                           : e.iadd(bRow0, e.index(kTileN / 2));
  int64_t kTiles = llvm::divideCeil(kDim, kTileK);
  // Thread 0 loads K slice `kt` into its ring slot.
  auto issue = [&](Value kt) {
    Value slot = e.remUI(kt, kStages);
    Value col = e.imul(kt, kTileK);
    nvgpu::MBarrierArriveExpectTxOp::create(
        b, e.loc, barriers, e.index(kStageBytes), slot, Value());
    nvgpu::TmaAsyncLoadOp::create(b, e.loc, tile(slot, 0, kTileM), barriers,
                                  descA, ValueRange{col, rowStartIdx}, slot,
                                  Value(), Value());
    nvgpu::TmaAsyncLoadOp::create(
        b, e.loc, tile(slot, kTileM * kTileK * 2, kTileN / 2), barriers, descB,
        ValueRange{col, bRow0}, slot, Value(), Value());
    nvgpu::TmaAsyncLoadOp::create(
        b, e.loc, tile(slot, (kTileM + kTileN / 2) * kTileK * 2, kTileN / 2),
        barriers, descB, ValueRange{col, bRow1}, slot, Value(), Value());
  };
  e.ifThen(leader, [&] {
    e.forEach(e.index(0), e.index(std::min(kStages - 1, kTiles)),
              [&](Value kt) { issue(kt); });
  });

  Wgmma w(k);
  Value zero = w.zero();
  // This thread's warpgroup computes rows [64 g, 64 g + 64) of the tile.
  Value group = e.divUI(tid, 128);
  Value groupOffset = arith::IndexCastOp::create(
      b, e.loc, b.getI64Type(), e.imul(group, kGroupRows * kTileK * 2));
  auto loop = scf::ForOp::create(b, e.loc, e.index(0), e.index(kTiles),
                                 e.index(1), ValueRange{zero});
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(loop.getBody());
    Value kt = loop.getInductionVar();
    Value slot = e.remUI(kt, kStages);
    Value parity = arith::TruncIOp::create(
        b, e.loc, b.getI1Type(), e.toI32(e.remUI(e.divUI(kt, kStages), 2)));
    nvgpu::MBarrierTryWaitParityOp::create(b, e.loc, barriers, parity,
                                           e.index(10000000), slot);
    NVVM::WgmmaFenceAlignedOp::create(b, e.loc);
    Value acc = loop.getRegionIterArgs()[0];
    Value aBase = LLVM::AddOp::create(b, e.loc, address(slot, 0), groupOffset);
    Value bBase = address(slot, kTileM * kTileK * 2);
    for (int64_t kk = 0; kk < kTileK / 16; ++kk) {
      Value bDesc = w.descriptor(
          LLVM::AddOp::create(b, e.loc, bBase, k.constI64(kk * 32)));
      Value aDesc = w.descriptor(
          LLVM::AddOp::create(b, e.loc, aBase, k.constI64(kk * 32)));
      acc = w.mma(acc, aDesc, bDesc);
    }
    NVVM::WgmmaGroupSyncAlignedOp::create(b, e.loc);
    // The previous slice's wgmma are done: its slot can be refilled.
    NVVM::WgmmaWaitGroupSyncOp::create(b, e.loc, 1);
    gpu::BarrierOp::create(b, e.loc);
    Value next = e.iadd(kt, e.index(kStages - 1));
    e.ifThen(e.andi(leader, e.ult(next, e.index(kTiles))),
             [&] { issue(next); });
    scf::YieldOp::create(b, e.loc, acc);
  }
  NVVM::WgmmaWaitGroupSyncOp::create(b, e.loc, 0);

  // Epilogue from registers: fragment element i of a thread in warp w (of
  // its warpgroup), lane l is row 16w + l/4 + 8((i/2)%2), column
  // 8(i/4) + 2(l%4) + i%2.
  Value warp = e.remUI(e.divUI(tid, 32), 4), lane = e.remUI(tid, 32);
  Value rowBase = e.iadd(
      e.iadd(e.iadd(rowStartIdx, e.imul(group, kGroupRows)), e.imul(warp, 16)),
      e.divUI(lane, 4));
  Value colBase = e.imul(e.remUI(lane, 4), 2);
  Value rowEndIdx = e.toIndex(rowEnd);
  auto column = [&](Value acc, int64_t i) {
    return LLVM::ExtractValueOp::create(b, e.loc, acc, ArrayRef<int64_t>{i})
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
  Value acc = loop.getResult(0);
  for (int64_t rowHalf = 0; rowHalf < 2; ++rowHalf) {
    Value row = e.iadd(rowBase, e.index(rowHalf * 8));
    e.ifThen(e.ult(row, rowEndIdx), [&] {
      for (int64_t i = 0; i < perThread; ++i) {
        if ((i / 2) % 2 != rowHalf)
          continue;
        Value c =
            e.iadd(colTile, e.iadd(colBase, e.index((i / 4) * 8 + i % 2)));
        Value v = addBias(column(acc, i), c);
        if (activation) {
          Value up = addBias(column(acc, i + kFragment / 2),
                             e.iadd(c, e.index(n / 2)));
          v = common::activate(e, activation, v, up);
        }
        e.ifThen(e.ult(c, e.index(outN)), [&] { e.store(v, out, {row, c}); });
      }
    });
  }
  b.setInsertionPointAfter(active);
  return k.finish(op);
}
