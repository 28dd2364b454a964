//===- Kernels.cpp - sm_90a kernels for a decomposed layer ----------------===//
//
// One kernel per L1 op (dispatch takes two), built with MLIR builders in the
// gpu, nvgpu and nvvm dialects:
//   route      a block per four tokens: warps compute router logits (each
//              weight load serves the four), then one thread per token
//              chooses its experts with the reference's selection code;
//   dispatch   a plan kernel (one block: counts, offsets and each choice's
//              row, in token order, with no host synchronization) and a
//              scatter kernel (a block per token copies its rows);
//   matmul     tiles of 128 rows x 256 weight rows on the tensor cores:
//              TMA loads 64-wide K slices into a 4-stage shared-memory ring
//              (128-byte swizzle) and two warpgroups each issue wgmma
//              m64n256k16 for 64 of the rows; the epilogue adds bias,
//              applies the activation (gate and up halves of the tile) and
//              stores bf16 from registers. Grouped matmuls find their
//              expert and rows from the device's counts, so the grid is an
//              upper bound and spare blocks exit;
//   combine    a block per token gathers, weights and sums in f32;
//   quantize / dequantize   a thread per scale block.
//
//===----------------------------------------------------------------------===//

#include "codegen/nvidia/Kernels.h"

#include "codegen/cpu/Emitter.h"
#include "codegen/cpu/Numerics.h"
#include "dialects/moe/MoeOps.h"

#include "mlir/Conversion/AffineToStandard/AffineToStandard.h"
#include "mlir/Conversion/GPUToNVVM/GPUToNVVMPass.h"
#include "mlir/Conversion/NVGPUToNVVM/NVGPUToNVVM.h"
#include "mlir/Conversion/NVVMToLLVM/NVVMToLLVM.h"
#include "mlir/Conversion/ReconcileUnrealizedCasts/ReconcileUnrealizedCasts.h"
#include "mlir/Conversion/SCFToControlFlow/SCFToControlFlow.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/GPU/Transforms/Passes.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/MemRef/Transforms/Passes.h"
#include "mlir/Dialect/NVGPU/IR/NVGPUDialect.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Transforms/Passes.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::nvidia;
using cpu::Emitter;

namespace {
// A matmul tile is 128 rows x 256 columns (B rows), 64 deep per stage; each
// of its two warpgroups computes 64 rows with wgmma m64n256k16.
constexpr int64_t kTileM = 128, kTileN = 256, kTileK = 64;
constexpr int64_t kWarpGroups = 2, kGroupRows = kTileM / kWarpGroups;
constexpr int64_t kFragment = kGroupRows * kTileN / 128; // f32 per thread
constexpr int64_t kRouteWarps = 8, kRouteTokens = 4;
constexpr int64_t kStages = 4; // A ring of 48 KiB stages.
constexpr int64_t kStageBytes = (kTileM + kTileN) * kTileK * 2;
/// Lists a kernel's arguments that are TMA descriptors passed by value; they
/// become byval + nvvm.grid_constant once the kernel is an LLVM function.
constexpr const char kTensorMapArgs[] = "moe.tensor_map_args";

/// What a tensor of the function lives in on the device.
struct TensorInfo {
  unsigned buffer;
  MemRefType type; // Row-major; FP8 codes as i8.
  Linear rows;     // The leading dimension, when it is dynamic.
};

/// A gpu.func under construction: its arguments are buffer addresses,
/// TMA descriptor addresses and, last, the token count (i64).
class Kernel {
public:
  Kernel(gpu::GPUModuleOp module, StringRef name, Launch &launch,
         ArrayRef<KernelArg> args, Location loc)
      : b(module.getContext()), e(b, loc), launch(launch) {
    MLIRContext *ctx = module.getContext();
    b.setInsertionPointToEnd(module.getBody());
    Type ptr = LLVM::LLVMPointerType::get(ctx);
    SmallVector<Type> types(args.size(), ptr);
    types.push_back(b.getI64Type());
    func = gpu::GPUFuncOp::create(b, loc, name, b.getFunctionType(types, {}));
    func->setAttr(gpu::GPUDialect::getKernelFuncAttrName(), b.getUnitAttr());
    // TMA descriptors are passed by value (__grid_constant__): the launch
    // copies them, so the host needs no copy to device memory and the
    // kernel reads them through the parameter's generic address.
    SmallVector<int64_t> maps;
    for (auto [i, arg] : llvm::enumerate(args))
      if (arg.kind == KernelArg::TensorMapAddress)
        maps.push_back(i);
    if (!maps.empty())
      func->setAttr(kTensorMapArgs, b.getDenseI64ArrayAttr(maps));
    b.setInsertionPointToStart(&func.getBody().front());
    launch.kernel = name.str();
    launch.args.assign(args.begin(), args.end());
    launch.args.push_back({KernelArg::Tokens, 0});
    Value t64 = func.getArgument(args.size());
    tokens = arith::IndexCastOp::create(b, loc, b.getIndexType(), t64);
  }

  /// The memref view of argument `i`, a buffer of `info`.
  Value view(unsigned i, const TensorInfo &info) {
    MemRefType type = info.type;
    MLIRContext *ctx = b.getContext();
    Location loc = e.loc;
    Type i64 = b.getI64Type(), ptr = LLVM::LLVMPointerType::get(ctx);
    int64_t rank = type.getRank();
    auto array = LLVM::LLVMArrayType::get(i64, rank);
    auto descriptor =
        LLVM::LLVMStructType::getLiteral(ctx, {ptr, ptr, i64, array, array});
    Value d = LLVM::PoisonOp::create(b, loc, descriptor);
    Value address = func.getArgument(i);
    d = LLVM::InsertValueOp::create(b, loc, d, address, ArrayRef<int64_t>{0});
    d = LLVM::InsertValueOp::create(b, loc, d, address, ArrayRef<int64_t>{1});
    d = LLVM::InsertValueOp::create(b, loc, d, constI64(0),
                                    ArrayRef<int64_t>{2});
    SmallVector<Value> sizes;
    for (int64_t s : type.getShape())
      sizes.push_back(
          ShapedType::isDynamic(s)
              ? arith::IndexCastOp::create(b, loc, i64, linear(info.rows))
                    .getResult()
              : constI64(s));
    Value stride = constI64(1);
    for (int64_t d0 = rank - 1; d0 >= 0; --d0) {
      d = LLVM::InsertValueOp::create(b, loc, d, sizes[d0],
                                      ArrayRef<int64_t>{3, d0});
      d = LLVM::InsertValueOp::create(b, loc, d, stride,
                                      ArrayRef<int64_t>{4, d0});
      stride = LLVM::MulOp::create(b, loc, stride, sizes[d0]);
    }
    return UnrealizedConversionCastOp::create(b, loc, type, d).getResult(0);
  }

  Value linear(Linear l) {
    return e.iadd(e.index(l.fixed),
                  arith::MulIOp::create(b, e.loc, e.index(l.perToken), tokens));
  }
  Value constI64(int64_t v) {
    return LLVM::ConstantOp::create(b, e.loc, b.getI64Type(),
                                    b.getI64IntegerAttr(v));
  }
  Value threadId() {
    return gpu::ThreadIdOp::create(b, e.loc, gpu::Dimension::x);
  }
  Value blockId(gpu::Dimension d) {
    return gpu::BlockIdOp::create(b, e.loc, d);
  }
  Value workgroupBuffer(ArrayRef<int64_t> shape, Type element) {
    auto space = gpu::AddressSpaceAttr::get(b.getContext(),
                                            gpu::AddressSpace::Workgroup);
    return func.addWorkgroupAttribution(
        MemRefType::get(shape, element, MemRefLayoutAttrInterface(), space),
        e.loc);
  }
  void finish() { gpu::ReturnOp::create(b, e.loc); }

  OpBuilder b;
  Emitter e;
  gpu::GPUFuncOp func;
  Value tokens;
  Launch &launch;
};

/// The alignment of `width` elements: buffers are 16-byte aligned and rows
/// a multiple of the vector, so whole vectors are naturally aligned.
llvm::MaybeAlign vectorAlign(int64_t width, Type element) {
  return llvm::Align(width * element.getIntOrFloatBitWidth() / 8);
}

/// `width` consecutive elements of `buffer` at `index`, as f32.
Value loadF32Vector(Emitter &e, Value buffer, ValueRange index, int64_t width) {
  Type element = cast<MemRefType>(buffer.getType()).getElementType();
  Value v = vector::LoadOp::create(
      e.b, e.loc, VectorType::get({width}, element), buffer, index,
      /*nontemporal=*/false, vectorAlign(width, element));
  if (element.isF32())
    return v;
  return arith::ExtFOp::create(e.b, e.loc,
                               VectorType::get({width}, e.b.getF32Type()), v);
}

Value divUI(Emitter &e, Value x, int64_t y) {
  return arith::DivUIOp::create(e.b, e.loc, x, e.index(y));
}
Value remUI(Emitter &e, Value x, int64_t y) {
  return arith::RemUIOp::create(e.b, e.loc, x, e.index(y));
}
Value mulI(Emitter &e, Value x, int64_t y) {
  return arith::MulIOp::create(e.b, e.loc, x, e.index(y));
}
Value minUI(Emitter &e, Value x, Value y) {
  return arith::MinUIOp::create(e.b, e.loc, x, y);
}
Value eqI(Emitter &e, Value x, Value y) {
  return e.icmp(arith::CmpIPredicate::eq, x, y);
}
Value ultI(Emitter &e, Value x, Value y) {
  return e.icmp(arith::CmpIPredicate::ult, x, y);
}

/// Lowers one function's ops, in order, into kernels and launches.
class KernelLowering {
public:
  KernelLowering(gpu::GPUModuleOp module, Plan &plan)
      : module(module), plan(plan) {}

  LogicalResult lower(Operation *op) {
    loc = op->getLoc();
    return TypeSwitch<Operation *, LogicalResult>(op)
        .Case([&](RouteOp o) { return lowerRoute(o); })
        .Case([&](DispatchOp o) { return lowerDispatch(o); })
        .Case([&](GroupedMatmulOp o) { return lowerMatmul(o); })
        .Case([&](CombineOp o) { return lowerCombine(o); })
        .Case([&](QuantizeOp o) { return lowerQuantize(o); })
        .Case([&](DequantizeOp o) { return lowerDequantize(o); })
        .Case([&](LayerOp o) {
          return o.emitOpError()
                 << "must be decomposed first (run moe-decompose)";
        })
        .Default([&](Operation *other) {
          return other->emitOpError() << "has no sm_90a lowering";
        });
  }

  DenseMap<Value, TensorInfo> tensors;
  DenseMap<Value, unsigned> outputBuffers;

private:
  /// The buffer for `result`, whose leading dimension (if dynamic) is
  /// `rows`: the caller's output buffer or a new workspace slice.
  const TensorInfo &define(Value result, Linear rows) {
    MemRefType type = cpu::bufferType(result.getType());
    int64_t rowBytes = type.getElementTypeBitWidth() / 8;
    bool dynamic = type.getRank() > 0 && type.isDynamicDim(0);
    if (!dynamic && type.getRank() > 0)
      rows = Linear{type.getDimSize(0), 0};
    for (int64_t d = dynamic ? 1 : 0; d < type.getRank(); ++d)
      rowBytes *= type.getDimSize(d);
    unsigned index;
    auto it = outputBuffers.find(result);
    if (it != outputBuffers.end()) {
      index = it->second;
    } else {
      index = plan.buffers.size();
      Buffer buffer;
      buffer.bytes =
          dynamic ? Linear{rows.fixed * rowBytes, rows.perToken * rowBytes}
                  : Linear{rowBytes, 0};
      plan.buffers.push_back(buffer);
    }
    return tensors[result] = TensorInfo{index, type, rows};
  }
  const TensorInfo &info(Value v) { return tensors.find(v)->second; }
  std::string name(StringRef what) {
    return ("k" + Twine(plan.launches.size()) + "_" + what).str();
  }
  Kernel kernel(StringRef what, ArrayRef<Value> buffers,
                ArrayRef<unsigned> maps = {}) {
    SmallVector<KernelArg> args;
    for (Value v : buffers)
      args.push_back({KernelArg::BufferAddress, info(v).buffer});
    for (unsigned m : maps)
      args.push_back({KernelArg::TensorMapAddress, m});
    plan.launches.emplace_back();
    return Kernel(module, name(what), plan.launches.back(), args, loc);
  }

  LogicalResult lowerRoute(RouteOp op);
  LogicalResult lowerDispatch(DispatchOp op);
  LogicalResult lowerMatmul(GroupedMatmulOp op);
  LogicalResult lowerCombine(CombineOp op);
  LogicalResult lowerQuantize(QuantizeOp op);
  LogicalResult lowerDequantize(DequantizeOp op);
  LogicalResult lowerBlocks(Operation *op, Value input, Value output,
                            Value scales, QuantAttr scheme, bool quantize);

  gpu::GPUModuleOp module;
  Plan &plan;
  Location loc = UnknownLoc::get(module.getContext());
};
} // namespace

static GridDim fixed(int64_t count) { return GridDim{Linear{count, 0}, 1, 0}; }

//===----------------------------------------------------------------------===//
// route
//===----------------------------------------------------------------------===//

LogicalResult KernelLowering::lowerRoute(RouteOp op) {
  RouterAttr router = op.getRouter();
  auto weightType = cast<RankedTensorType>(op.getRouterWeight().getType());
  int64_t experts = weightType.getDimSize(0), h = weightType.getDimSize(1);
  int64_t topK =
      cast<RankedTensorType>(op.getExpertIds().getType()).getDimSize(1);
  Linear tokens = info(op.getHiddenStates()).rows;
  define(op.getExpertIds(), tokens);
  define(op.getWeights(), tokens);
  SmallVector<Value> buffers = {op.getHiddenStates(), op.getRouterWeight()};
  if (op.getBias())
    buffers.push_back(op.getBias());
  buffers.append({op.getExpertIds(), op.getWeights()});
  Kernel k = kernel("route", buffers);
  // kRouteTokens tokens per block share each load of the router weights.
  k.launch.gridX = GridDim{tokens, kRouteTokens, 0};
  k.launch.gridY = fixed(1);
  k.launch.block = kRouteWarps * 32;
  Emitter &e = k.e;
  SmallVector<Value> views;
  for (auto [i, v] : llvm::enumerate(buffers))
    views.push_back(k.view(i, info(v)));
  Value hidden = views[0], weight = views[1];
  Value bias = op.getBias() ? views[2] : Value();
  Value ids = views[views.size() - 2], weights = views.back();

  Type f32 = e.b.getF32Type(), i8 = e.b.getI8Type();
  int64_t nGroup = router.getNGroup();
  // One row of scratch per token of the block.
  cpu::RouteScratch all;
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
  Value firstToken = mulI(e, k.blockId(gpu::Dimension::x), kRouteTokens);
  Value lastToken = arith::SubIOp::create(e.b, e.loc, tokenCount, e.index(1));
  // Tokens past the end read the last one and are chosen for by no one.
  SmallVector<Value> loadRows;
  for (int64_t p = 0; p < kRouteTokens; ++p)
    loadRows.push_back(minUI(e, e.iadd(firstToken, e.index(p)), lastToken));
  Value tid = k.threadId();
  Value warp = divUI(e, tid, 32), lane = remUI(e, tid, 32);
  // Each warp takes `unroll` experts at a time, every kRouteWarps-th group;
  // lanes split the hidden dimension with 16-byte loads and meet through
  // shuffles. Each load of a weight serves every token of the block, each
  // load of a token every expert of the pass.
  int64_t width = h % 8 == 0 ? 8 : 1;
  // Two experts a pass: four would keep 128 f32 accumulators per thread
  // and one block per SM.
  int64_t unroll = experts % (kRouteWarps * 2) == 0 ? 2 : 1;
  auto f32Vec = VectorType::get({width}, f32);
  auto loadVec = [&](Value buffer, ValueRange index) {
    return loadF32Vector(e, buffer, index, width);
  };
  e.forEach(
      mulI(e, warp, unroll), e.index(experts),
      [&](Value first) {
        Value zero = arith::ConstantOp::create(
            e.b, e.loc, DenseElementsAttr::get(f32Vec, e.b.getF32FloatAttr(0)));
        SmallVector<Value> xs, init(kRouteTokens * unroll, zero);
        for (int64_t u = 0; u < unroll; ++u)
          xs.push_back(e.iadd(first, e.index(u)));
        // acc[p * unroll + u]: token p, expert u.
        SmallVector<Value> lanes = e.reduce(
            mulI(e, lane, width), e.index(h), init,
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
            e.ifThen(eqI(e, lane, e.index(0)), [&] {
              auto [s, choice] =
                  cpu::expertScore(e, router.getKind(), partial,
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
  Value chooses = e.andi(
      eqI(e, lane, e.index(0)),
      e.andi(ultI(e, warp, e.index(kRouteTokens)), ultI(e, t, tokenCount)));
  e.ifThen(chooses, [&] {
    cpu::RouteScratch mine{row(all.score, warp), row(all.choice, warp),
                           row(all.taken, warp), row(all.groupScore, warp),
                           row(all.groupTaken, warp)};
    cpu::selectExperts(e, router, experts, topK, mine, ids, weights, t);
  });
  k.finish();
  return success();
}

//===----------------------------------------------------------------------===//
// dispatch
//===----------------------------------------------------------------------===//

LogicalResult KernelLowering::lowerDispatch(DispatchOp op) {
  auto countsType = cast<RankedTensorType>(op.getTokensPerExpert().getType());
  int64_t experts = countsType.getDimSize(0);
  int64_t topK = cast<RankedTensorType>(op.getRows().getType()).getDimSize(1);
  int64_t h =
      cast<RankedTensorType>(op.getHiddenStates().getType()).getDimSize(1);
  int64_t align = op.getAlign();
  constexpr int64_t threads = 1024;
  if (experts > threads)
    return op.emitOpError()
           << "has " << experts
           << " experts; the sm_90a dispatch handles at most " << threads;
  define(op.getTokensPerExpert(), {});
  define(op.getExpertOffsets(), {});
  Linear tokens = info(op.getHiddenStates()).rows;
  define(op.getRows(), tokens);
  // Rows for every choice, plus each expert's alignment padding.
  define(op.getDispatched(),
         {tokens.fixed * topK + experts * (align - 1), tokens.perToken * topK});

  {
    // The plan, in one block: counts by shared-memory atomics, offsets by one
    // thread, then each choice takes the next row of its expert. Rows within
    // an expert are in no particular order; each row's result depends only
    // on its token, so the layer's output does not change.
    Kernel k =
        kernel("dispatch_plan", {op.getExpertIds(), op.getTokensPerExpert(),
                                 op.getExpertOffsets(), op.getRows()});
    k.launch.gridX = fixed(1);
    k.launch.gridY = fixed(1);
    k.launch.block = threads;
    Emitter &e = k.e;
    Value ids = k.view(0, info(op.getExpertIds()));
    Value counts = k.view(1, info(op.getTokensPerExpert()));
    Value offsets = k.view(2, info(op.getExpertOffsets()));
    Value rows = k.view(3, info(op.getRows()));
    Type i32 = e.b.getI32Type();
    Value count = k.workgroupBuffer({experts}, i32);
    Value cursor = k.workgroupBuffer({experts}, i32);
    Value tid = k.threadId();
    Value choices = mulI(e, k.linear(tokens), topK);
    auto isLocal = [&](Value id) {
      return e.andi(e.icmp(arith::CmpIPredicate::sge, id, e.i32(0)),
                    e.icmp(arith::CmpIPredicate::slt, id, e.i32(experts)));
    };
    auto at = [&](Value p) -> SmallVector<Value> {
      return {divUI(e, p, topK), remUI(e, p, topK)};
    };
    auto increment = [&](Value buffer, Value id) {
      return memref::AtomicRMWOp::create(e.b, e.loc, arith::AtomicRMWKind::addi,
                                         e.i32(1), buffer,
                                         ValueRange{e.toIndex(id)})
          .getResult();
    };
    e.forEach(
        tid, e.index(experts),
        [&](Value x) { e.storeRaw(e.i32(0), count, {x}); }, e.index(threads));
    gpu::BarrierOp::create(e.b, e.loc);
    e.forEach(
        tid, choices,
        [&](Value p) {
          Value id = e.loadRaw(ids, at(p));
          e.ifThen(isLocal(id), [&] { increment(count, id); });
        },
        e.index(threads));
    gpu::BarrierOp::create(e.b, e.loc);
    e.ifThen(eqI(e, tid, e.index(0)), [&] {
      Value total = e.reduce(
          e.index(0), e.index(experts), {e.i32(0)},
          [&](Value x, ValueRange acc) -> SmallVector<Value> {
            Value c = e.loadRaw(count, {x});
            e.storeRaw(c, counts, {x});
            e.storeRaw(acc[0], offsets, {x});
            e.storeRaw(acc[0], cursor, {x});
            Value padded = arith::MulIOp::create(
                e.b, e.loc,
                arith::CeilDivUIOp::create(e.b, e.loc, c, e.i32(align)),
                e.i32(align));
            return {e.iadd(acc[0], padded)};
          })[0];
      e.storeRaw(total, offsets, {e.index(experts)});
    });
    gpu::BarrierOp::create(e.b, e.loc);
    e.forEach(
        tid, choices,
        [&](Value p) {
          Value id = e.loadRaw(ids, at(p));
          Value local = isLocal(id);
          auto row = scf::IfOp::create(e.b, e.loc, TypeRange{i32}, local,
                                       /*withElse=*/true);
          OpBuilder::InsertionGuard guard(e.b);
          e.b.setInsertionPointToStart(&row.getThenRegion().front());
          scf::YieldOp::create(e.b, e.loc, increment(cursor, id));
          e.b.setInsertionPointToStart(&row.getElseRegion().front());
          scf::YieldOp::create(e.b, e.loc, e.i32(-1));
          e.b.setInsertionPointAfter(row);
          e.storeRaw(row.getResult(0), rows, at(p));
        },
        e.index(threads));
    k.finish();
  }
  {
    // The scatter: a block per token copies its row to each chosen slot.
    SmallVector<Value> buffers = {op.getHiddenStates(), op.getRows(),
                                  op.getDispatched()};
    if (op.getScale())
      buffers.push_back(op.getScale());
    Kernel k = kernel("dispatch_scatter", buffers);
    k.launch.gridX = GridDim{tokens, 1, 0};
    k.launch.gridY = fixed(1);
    k.launch.block = 128;
    Emitter &e = k.e;
    Value hidden = k.view(0, info(op.getHiddenStates()));
    Value rows = k.view(1, info(op.getRows()));
    Value dispatched = k.view(2, info(op.getDispatched()));
    Value scale = op.getScale() ? k.view(3, info(op.getScale())) : Value();
    Value t = k.blockId(gpu::Dimension::x), tid = k.threadId();
    int64_t width = h % 8 == 0 ? 8 : 1;
    Type bf16 = e.b.getBF16Type();
    auto vecType = VectorType::get({width}, bf16);
    e.forEach(e.index(0), e.index(topK), [&](Value j) {
      Value row = e.loadRaw(rows, {t, j});
      e.ifThen(e.icmp(arith::CmpIPredicate::sge, row, e.i32(0)), [&] {
        Value r = e.toIndex(row);
        Value s = scale ? e.loadRaw(scale, {t, j}) : Value();
        e.forEach(
            mulI(e, tid, width), e.index(h),
            [&](Value c) {
              Value v =
                  vector::LoadOp::create(e.b, e.loc, vecType, hidden, {t, c},
                                         false, vectorAlign(width, bf16));
              if (s) {
                auto f32Vec = VectorType::get({width}, e.b.getF32Type());
                Value wide = arith::ExtFOp::create(e.b, e.loc, f32Vec, v);
                Value splat =
                    vector::BroadcastOp::create(e.b, e.loc, f32Vec, s);
                v = arith::TruncFOp::create(e.b, e.loc, vecType,
                                            e.mul(wide, splat));
              }
              vector::StoreOp::create(e.b, e.loc, v, dispatched, {r, c}, false,
                                      vectorAlign(width, bf16));
            },
            e.index(128 * width));
      });
    });
    k.finish();
  }
  return success();
}

//===----------------------------------------------------------------------===//
// grouped_matmul
//===----------------------------------------------------------------------===//

namespace {
/// The pieces of the wgmma main loop: the accumulator is an LLVM struct of
/// kFragment f32 per thread, one m64n256 fragment per warpgroup.
struct Wgmma {
  OpBuilder &b;
  Location loc;
  Type fragment;

  Wgmma(OpBuilder &b, Location loc) : b(b), loc(loc) {
    SmallVector<Type> fields(kFragment, b.getF32Type());
    fragment = LLVM::LLVMStructType::getLiteral(b.getContext(), fields);
  }
  Value i64(int64_t v) {
    return LLVM::ConstantOp::create(b, loc, b.getI64Type(),
                                    b.getI64IntegerAttr(v));
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
        b, loc, LLVM::AndOp::create(b, loc, address, i64(0x3FFFF)), i64(4));
    int64_t fixedBits =
        (int64_t(1) << 62) | (int64_t(1024 >> 4) << 32) | (int64_t(1) << 16);
    return LLVM::OrOp::create(b, loc, field, i64(fixedBits));
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

LogicalResult KernelLowering::lowerMatmul(GroupedMatmulOp op) {
  if (op.getLhsScale())
    return op.emitOpError()
           << "with FP8 operands has no sm_90a kernel yet; run "
              "moe-legalize-scaled-matmul first";
  auto lhsType = cast<RankedTensorType>(op.getLhs().getType());
  auto rhsType = cast<RankedTensorType>(op.getRhs().getType());
  if (!lhsType.getElementType().isBF16() || !rhsType.getElementType().isBF16())
    return op.emitOpError() << "on sm_90a needs bf16 operands";
  bool grouped = static_cast<bool>(op.getTokensPerExpert());
  int64_t experts = grouped ? rhsType.getDimSize(0) : 1;
  int64_t n = rhsType.getDimSize(rhsType.getRank() - 2);
  int64_t kDim = rhsType.getDimSize(rhsType.getRank() - 1);
  if (kDim % 8 != 0)
    return op.emitOpError()
           << "has K = " << kDim << "; sm_90a's TMA loads need a multiple of 8";
  ActivationAttr activation = op.getActivationAttr();
  int64_t outN = activation ? n / 2 : n;
  // With an activation a tile computes 128 gate and the matching 128 up
  // columns, and gives 128 outputs.
  int64_t outTile = activation ? kTileN / 2 : kTileN;
  // A copy: define() may grow the map it lives in.
  TensorInfo lhs = info(op.getLhs());
  define(op.getOut(), lhs.rows);

  unsigned mapA = plan.tensorMaps.size();
  plan.tensorMaps.push_back(
      TensorMap{lhs.buffer, 2, lhs.rows, kDim, kTileM, kTileK});
  unsigned mapB = plan.tensorMaps.size();
  plan.tensorMaps.push_back(TensorMap{info(op.getRhs()).buffer, 2,
                                      Linear{experts * n, 0}, kDim, kTileN / 2,
                                      kTileK});

  SmallVector<Value> buffers = {op.getOut()};
  if (grouped)
    buffers.append({op.getTokensPerExpert(), op.getExpertOffsets()});
  if (op.getBias())
    buffers.push_back(op.getBias());
  Kernel k =
      kernel(activation ? "matmul_glu" : "matmul", buffers, {mapA, mapB});
  Launch &launch = k.launch;
  // Row tiles on x (no 65535 limit), column tiles on y. Grouped: at most
  // ceil(rows / 128) + experts row tiles are non-empty.
  launch.gridX = grouped ? GridDim{lhs.rows, kTileM, experts}
                         : GridDim{lhs.rows, kTileM, 0};
  launch.gridY = fixed(llvm::divideCeil(outN, outTile));
  launch.block = kWarpGroups * 128;
  launch.sharedBytes = kStages * kStageBytes + 1024;
  Emitter &e = k.e;
  OpBuilder &b = e.b;
  MLIRContext *ctx = b.getContext();
  Value out = k.view(0, info(op.getOut()));
  Value counts = grouped ? k.view(1, info(op.getTokensPerExpert())) : Value();
  Value offsets = grouped ? k.view(2, info(op.getExpertOffsets())) : Value();
  Value bias =
      op.getBias() ? k.view(buffers.size() - 1, info(op.getBias())) : Value();
  Value mapAPtr = k.func.getArgument(buffers.size());
  Value mapBPtr = k.func.getArgument(buffers.size() + 1);

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
  Value descA =
      UnrealizedConversionCastOp::create(b, e.loc, mapType(kTileM), mapAPtr)
          .getResult(0);
  Value descB =
      UnrealizedConversionCastOp::create(b, e.loc, mapType(kTileN / 2), mapBPtr)
          .getResult(0);

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
  Value perGroup = mulI(e, nTiles, kGroupM);
  Value firstM =
      mulI(e, arith::DivUIOp::create(b, e.loc, linearId, perGroup), kGroupM);
  Value groupRows = minUI(e, e.index(kGroupM),
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
    rowStart = e.toI32(mulI(e, mTile, kTileM));
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
  Value pad = remUI(
      e, arith::SubIOp::create(b, e.loc, e.index(1024), remUI(e, base, 1024)),
      1024);
  auto tile = [&](Value slot, int64_t offset, int64_t rows) {
    Value shift =
        e.iadd(e.iadd(pad, mulI(e, slot, kStageBytes)), e.index(offset));
    return memref::ViewOp::create(b, e.loc, tileType(rows), smem, shift,
                                  ValueRange{})
        .getResult();
  };
  auto address = [&](Value slot, int64_t offset) {
    Value a = e.iadd(e.iadd(base, pad),
                     e.iadd(mulI(e, slot, kStageBytes), e.index(offset)));
    return arith::IndexCastOp::create(b, e.loc, b.getI64Type(), a).getResult();
  };

  auto barrierType = nvgpu::MBarrierGroupType::get(ctx, workgroup, kStages);
  Value barriers = nvgpu::MBarrierCreateOp::create(b, e.loc, barrierType);
  Value leader = eqI(e, tid, e.index(0));
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
  Value colTile = mulI(e, nTile, outTile);
  Value bRow0 = e.iadd(mulI(e, expertIdx, n), colTile);
  Value bRow1 = activation ? e.iadd(bRow0, e.index(n / 2))
                           : e.iadd(bRow0, e.index(kTileN / 2));
  int64_t kTiles = llvm::divideCeil(kDim, kTileK);
  // Thread 0 loads K slice `kt` into its ring slot.
  auto issue = [&](Value kt) {
    Value slot = remUI(e, kt, kStages);
    Value col = mulI(e, kt, kTileK);
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

  Wgmma w(b, e.loc);
  Value zero = w.zero();
  // This thread's warpgroup computes rows [64 g, 64 g + 64) of the tile.
  Value group = divUI(e, tid, 128);
  Value groupOffset = arith::IndexCastOp::create(
      b, e.loc, b.getI64Type(), mulI(e, group, kGroupRows * kTileK * 2));
  auto loop = scf::ForOp::create(b, e.loc, e.index(0), e.index(kTiles),
                                 e.index(1), ValueRange{zero});
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(loop.getBody());
    Value kt = loop.getInductionVar();
    Value slot = remUI(e, kt, kStages);
    Value parity = arith::TruncIOp::create(
        b, e.loc, b.getI1Type(), e.toI32(remUI(e, divUI(e, kt, kStages), 2)));
    nvgpu::MBarrierTryWaitParityOp::create(b, e.loc, barriers, parity,
                                           e.index(10000000), slot);
    NVVM::WgmmaFenceAlignedOp::create(b, e.loc);
    Value acc = loop.getRegionIterArgs()[0];
    Value aBase = LLVM::AddOp::create(b, e.loc, address(slot, 0), groupOffset);
    Value bBase = address(slot, kTileM * kTileK * 2);
    for (int64_t kk = 0; kk < kTileK / 16; ++kk) {
      Value bDesc =
          w.descriptor(LLVM::AddOp::create(b, e.loc, bBase, w.i64(kk * 32)));
      Value aDesc =
          w.descriptor(LLVM::AddOp::create(b, e.loc, aBase, w.i64(kk * 32)));
      acc = w.mma(acc, aDesc, bDesc);
    }
    NVVM::WgmmaGroupSyncAlignedOp::create(b, e.loc);
    // The previous slice's wgmma are done: its slot can be refilled.
    NVVM::WgmmaWaitGroupSyncOp::create(b, e.loc, 1);
    gpu::BarrierOp::create(b, e.loc);
    Value next = e.iadd(kt, e.index(kStages - 1));
    e.ifThen(e.andi(leader, ultI(e, next, e.index(kTiles))),
             [&] { issue(next); });
    scf::YieldOp::create(b, e.loc, acc);
  }
  NVVM::WgmmaWaitGroupSyncOp::create(b, e.loc, 0);

  // Epilogue from registers: fragment element i of a thread in warp w (of
  // its warpgroup), lane l is row 16w + l/4 + 8((i/2)%2), column
  // 8(i/4) + 2(l%4) + i%2.
  Value warp = remUI(e, divUI(e, tid, 32), 4), lane = remUI(e, tid, 32);
  Value rowBase = e.iadd(e.iadd(e.iadd(rowStartIdx, mulI(e, group, kGroupRows)),
                                mulI(e, warp, 16)),
                         divUI(e, lane, 4));
  Value colBase = mulI(e, remUI(e, lane, 4), 2);
  Value rowEndIdx = e.toIndex(rowEnd);
  auto column = [&](Value acc, int64_t i) {
    return LLVM::ExtractValueOp::create(b, e.loc, acc, ArrayRef<int64_t>{i})
        .getResult();
  };
  auto addBias = [&](Value v, Value col) {
    if (!bias)
      return v;
    // Out-of-range columns are masked at the store; clamp the read.
    Value safe = minUI(e, col, e.index(n - 1));
    return e.add(v, grouped ? e.load(bias, {expertIdx, safe})
                            : e.load(bias, {safe}));
  };
  // With an activation, gate column c is element i and its up column
  // c + kTileN / 2 is element i + kFragment / 2.
  int64_t perThread = activation ? kFragment / 2 : kFragment;
  Value acc = loop.getResult(0);
  for (int64_t rowHalf = 0; rowHalf < 2; ++rowHalf) {
    Value row = e.iadd(rowBase, e.index(rowHalf * 8));
    e.ifThen(ultI(e, row, rowEndIdx), [&] {
      for (int64_t i = 0; i < perThread; ++i) {
        if ((i / 2) % 2 != rowHalf)
          continue;
        Value c =
            e.iadd(colTile, e.iadd(colBase, e.index((i / 4) * 8 + i % 2)));
        Value v = addBias(column(acc, i), c);
        if (activation) {
          Value up = addBias(column(acc, i + kFragment / 2),
                             e.iadd(c, e.index(n / 2)));
          v = cpu::activate(e, activation, v, up);
        }
        e.ifThen(ultI(e, c, e.index(outN)), [&] { e.store(v, out, {row, c}); });
      }
    });
  }
  b.setInsertionPointAfter(active);
  k.finish();
  return success();
}

//===----------------------------------------------------------------------===//
// combine
//===----------------------------------------------------------------------===//

LogicalResult KernelLowering::lowerCombine(CombineOp op) {
  int64_t h = cast<RankedTensorType>(op.getExpertOut().getType()).getDimSize(1);
  int64_t topK = cast<RankedTensorType>(op.getRows().getType()).getDimSize(1);
  Linear tokens = info(op.getRows()).rows;
  define(op.getOut(), tokens);
  SmallVector<Value> buffers = {op.getExpertOut(), op.getRows(), op.getOut()};
  for (Value v : {op.getWeights(), op.getShared(), op.getGate()})
    if (v)
      buffers.push_back(v);
  Kernel k = kernel("combine", buffers);
  k.launch.gridX = GridDim{tokens, 1, 0};
  k.launch.gridY = fixed(1);
  k.launch.block = 128;
  Emitter &e = k.e;
  OpBuilder &b = e.b;
  unsigned next = 3;
  Value expertOut = k.view(0, info(op.getExpertOut()));
  Value rows = k.view(1, info(op.getRows()));
  Value out = k.view(2, info(op.getOut()));
  Value weights =
      op.getWeights() ? k.view(next++, info(op.getWeights())) : Value();
  Value shared =
      op.getShared() ? k.view(next++, info(op.getShared())) : Value();
  Value gate = op.getGate() ? k.view(next++, info(op.getGate())) : Value();
  Value t = k.blockId(gpu::Dimension::x), tid = k.threadId();
  int64_t width = h % 8 == 0 ? 8 : 1;
  auto f32Vec = VectorType::get({width}, b.getF32Type());
  Type outElement = cast<MemRefType>(out.getType()).getElementType();
  auto loadVec = [&](Value buffer, ValueRange index) {
    return loadF32Vector(e, buffer, index, width);
  };
  auto splat = [&](Value s) {
    return vector::BroadcastOp::create(b, e.loc, f32Vec, s).getResult();
  };
  Value gateScale = gate ? e.sigmoid(e.load(gate, {t, e.index(0)})) : Value();
  e.forEach(
      mulI(e, tid, width), e.index(h),
      [&](Value c) {
        Value zero = arith::ConstantOp::create(
            b, e.loc, DenseElementsAttr::get(f32Vec, b.getF32FloatAttr(0.0)));
        // The same order as the reference: choices first, then the shared
        // expert.
        Value sum = e.reduce(
            e.index(0), e.index(topK), {zero},
            [&](Value j, ValueRange acc) -> SmallVector<Value> {
              Value row = e.loadRaw(rows, {t, j});
              Value valid = e.icmp(arith::CmpIPredicate::sge, row, e.i32(0));
              auto sel = scf::IfOp::create(b, e.loc, TypeRange{f32Vec}, valid,
                                           /*withElse=*/true);
              OpBuilder::InsertionGuard guard(b);
              b.setInsertionPointToStart(&sel.getThenRegion().front());
              Value term = loadVec(expertOut, {e.toIndex(row), c});
              if (weights)
                term = e.mul(term, splat(e.loadRaw(weights, {t, j})));
              scf::YieldOp::create(b, e.loc, e.add(acc[0], term));
              b.setInsertionPointToStart(&sel.getElseRegion().front());
              scf::YieldOp::create(b, e.loc, acc[0]);
              return {sel.getResult(0)};
            })[0];
        if (shared) {
          Value s = loadVec(shared, {t, c});
          sum = e.add(sum, gate ? e.mul(s, splat(gateScale)) : s);
        }
        Value result =
            outElement.isF32()
                ? sum
                : arith::TruncFOp::create(
                      b, e.loc, VectorType::get({width}, outElement), sum)
                      .getResult();
        vector::StoreOp::create(b, e.loc, result, out, {t, c}, false,
                                vectorAlign(width, outElement));
      },
      e.index(128 * width));
  k.finish();
  return success();
}

//===----------------------------------------------------------------------===//
// quantize / dequantize
//===----------------------------------------------------------------------===//

LogicalResult KernelLowering::lowerBlocks(Operation *op, Value input,
                                          Value output, Value scales,
                                          QuantAttr scheme, bool quantize) {
  // `input` is the bf16 side for quantize, the codes for dequantize.
  Value data = quantize ? output : input;
  auto dataType = cast<RankedTensorType>(data.getType());
  int64_t rank = dataType.getRank();
  if (rank != 2 && rank != 3)
    return op->emitOpError() << "of rank " << rank
                             << " has no sm_90a lowering (ranks 2 and 3 do)";
  int64_t rowsPerBlock = cpu::scaleRowsPerBlock(
      dataType.getShape(), cast<RankedTensorType>(scales.getType()).getShape(),
      scheme);
  bool dynamic = dataType.isDynamicDim(0);
  if (dynamic && rowsPerBlock != 1)
    return op->emitOpError() << "quantizes token rows in 128-row blocks; "
                                "sm_90a quantizes token rows one by one";
  int64_t kBlock = scheme.getBlockSize(), kDim = dataType.getDimSize(rank - 1);
  int64_t kBlocks = llvm::divideCeil(kDim, kBlock);
  Linear rows = info(input).rows;
  define(output, rows);
  if (quantize)
    define(scales, rows);
  Kernel k = kernel(quantize ? "quantize" : "dequantize",
                    quantize ? SmallVector<Value>{input, output, scales}
                             : SmallVector<Value>{input, scales, output});
  // One thread per block: prefix x rowBlocks x kBlocks of them.
  int64_t prefix = rank == 3 ? dataType.getDimSize(0) : 1;
  Linear blockRows =
      dynamic ? rows
              : Linear{int64_t(llvm::divideCeil(dataType.getDimSize(rank - 2),
                                                rowsPerBlock)),
                       0};
  int64_t perRowBlock = prefix * kBlocks;
  k.launch.gridX = GridDim{
      Linear{blockRows.fixed * perRowBlock, blockRows.perToken * perRowBlock},
      128, 0};
  k.launch.gridY = fixed(1);
  k.launch.block = 128;
  Emitter &e = k.e;
  Value in = k.view(0, info(input));
  Value second = k.view(1, info(quantize ? output : scales));
  Value third = k.view(2, info(quantize ? scales : output));
  Value rowCount = e.dim(in, rank - 2);
  Value rowBlocks =
      arith::CeilDivUIOp::create(e.b, e.loc, rowCount, e.index(rowsPerBlock));
  Value id = e.iadd(mulI(e, k.blockId(gpu::Dimension::x), 128), k.threadId());
  Value total = arith::MulIOp::create(e.b, e.loc, mulI(e, rowBlocks, kBlocks),
                                      e.index(prefix));
  e.ifThen(ultI(e, id, total), [&] {
    Value kb = remUI(e, id, kBlocks);
    Value rest = divUI(e, id, kBlocks);
    Value rb = arith::RemUIOp::create(e.b, e.loc, rest, rowBlocks);
    SmallVector<Value> prefixIndex;
    if (rank == 3)
      prefixIndex.push_back(
          arith::DivUIOp::create(e.b, e.loc, rest, rowBlocks));
    Value firstRow = mulI(e, rb, rowsPerBlock);
    Value lastRow = minUI(e, e.iadd(firstRow, e.index(rowsPerBlock)), rowCount);
    Value firstCol = mulI(e, kb, kBlock);
    Value lastCol = minUI(e, e.iadd(firstCol, e.index(kBlock)), e.index(kDim));
    if (quantize)
      cpu::quantizeBlock(e, scheme, in, second, third, prefixIndex, rb, kb,
                         firstRow, lastRow, firstCol, lastCol);
    else
      cpu::dequantizeBlock(e, in, second, third, prefixIndex, rb, kb, firstRow,
                           lastRow, firstCol, lastCol);
  });
  k.finish();
  return success();
}

LogicalResult KernelLowering::lowerQuantize(QuantizeOp op) {
  return lowerBlocks(op, op.getInput(), op.getData(), op.getScales(),
                     op.getScheme(), /*quantize=*/true);
}

LogicalResult KernelLowering::lowerDequantize(DequantizeOp op) {
  return lowerBlocks(op, op.getData(), op.getOutput(), op.getScales(),
                     op.getScheme(), /*quantize=*/false);
}

//===----------------------------------------------------------------------===//
// Entry points
//===----------------------------------------------------------------------===//

FailureOr<Plan> nvidia::lowerToKernels(func::FuncOp func, ModuleOp module) {
  if (!func.getBody().hasOneBlock())
    return func.emitOpError() << "must have a single block to be lowered";
  OpBuilder b = OpBuilder::atBlockEnd(module.getBody());
  auto gpuModule = gpu::GPUModuleOp::create(b, func.getLoc(), "kernels");
  Plan plan;
  KernelLowering lowering(gpuModule, plan);
  Block &body = func.getBody().front();
  FunctionType type = func.getFunctionType();
  unsigned numArgs = type.getNumInputs() + type.getNumResults();
  for (unsigned i = 0; i < numArgs; ++i)
    plan.buffers.push_back(Buffer{int(i), {}});
  for (BlockArgument arg : body.getArguments()) {
    auto tensor = dyn_cast<RankedTensorType>(arg.getType());
    if (!tensor)
      return func.emitOpError() << "takes only ranked tensors";
    Linear rows = tensor.getRank() == 0    ? Linear{}
                  : tensor.isDynamicDim(0) ? Linear{0, 1}
                                           : Linear{tensor.getDimSize(0), 0};
    lowering.tensors[arg] =
        TensorInfo{arg.getArgNumber(), cpu::bufferType(tensor), rows};
  }
  auto ret = cast<func::ReturnOp>(body.getTerminator());
  for (auto [i, value] : llvm::enumerate(ret.getOperands())) {
    if (!value.getDefiningOp() || lowering.outputBuffers.count(value))
      return func.emitOpError()
             << "must return distinct values computed by moe ops";
    lowering.outputBuffers[value] = type.getNumInputs() + i;
  }
  for (Operation &op : body.without_terminator())
    if (failed(lowering.lower(&op)))
      return failure();
  if (failed(verify(gpuModule)))
    return failure();
  return plan;
}

FailureOr<std::string> nvidia::compileKernels(ModuleOp module,
                                              StringRef cudaPath, bool ptx) {
  PassManager pm(module.getContext());
  GpuNVVMAttachTargetOptions target;
  target.chip = "sm_90a";
  target.features = "+ptx85";
  target.optLevel = 3;
  pm.addPass(createGpuNVVMAttachTarget(target));
  OpPassManager &kernels = pm.nest<gpu::GPUModuleOp>();
  kernels.addPass(memref::createExpandStridedMetadataPass());
  kernels.addPass(createLowerAffinePass());
  kernels.addPass(createConvertNVGPUToNVVMPass());
  kernels.addPass(createSCFToControlFlowPass());
  kernels.addPass(createConvertGpuOpsToNVVMOps());
  kernels.addPass(createConvertNVVMToLLVMPass());
  kernels.addPass(createCanonicalizerPass());
  kernels.addPass(createCSEPass());
  kernels.addPass(createReconcileUnrealizedCastsPass());
  if (failed(pm.run(module)))
    return failure();
  // Once the kernels are LLVM functions marked nvvm.kernel, their by-value
  // descriptors become __grid_constant__ parameters.
  module.walk([](LLVM::LLVMFuncOp f) {
    auto maps = f->getAttrOfType<DenseI64ArrayAttr>(kTensorMapArgs);
    if (!maps)
      return;
    f->removeAttr(kTensorMapArgs);
    MLIRContext *ctx = f.getContext();
    for (int64_t i : maps.asArrayRef()) {
      f.setArgAttr(i, LLVM::LLVMDialect::getByValAttrName(),
                   TypeAttr::get(LLVM::LLVMArrayType::get(
                       IntegerType::get(ctx, 8), 128)));
      f.setArgAttr(i, LLVM::LLVMDialect::getAlignAttrName(),
                   IntegerAttr::get(IntegerType::get(ctx, 64), 64));
      f.setArgAttr(i, NVVM::NVVMDialect::getGridConstantAttrName(),
                   UnitAttr::get(ctx));
    }
  });
  PassManager serialize(module.getContext());
  GpuModuleToBinaryPassOptions binary;
  binary.toolkitPath = cudaPath.str();
  binary.compilationTarget = ptx ? "isa" : "bin";
  serialize.addPass(createGpuModuleToBinaryPass(binary));
  if (failed(serialize.run(module)))
    return failure();
  for (auto binaryOp : module.getOps<gpu::BinaryOp>())
    for (Attribute object : binaryOp.getObjects())
      return cast<gpu::ObjectAttr>(object).getObject().str();
  return module.emitError() << "no kernels were compiled";
}
