//===- FusedLayer.cpp - a bucket's chain of kernels as one kernel ---------===//
//
// moe-fuse-layer marks the small buckets whose plan becomes one kernel.
// Once such a bucket's kernels are built as usual, each becomes a step of a
// single cooperative kernel of one block per multiprocessor:
//
//  - a step runs its kernel's blocks (the grid the plan would launch at the
//    bucket's size, y fastest) as virtual blocks: sub-block s of block i
//    takes s G + i, (s + S) G + i, ... of S sub-blocks, so a step of fewer
//    virtual blocks than multiprocessors has one on each;
//  - a step of few threads runs as several sub-blocks side by side (a
//    decode tile's 160 threads twice in 320), each with its own shared
//    memory, its own named barriers and its warpgroups aligned, so that a
//    multiprocessor streams two tiles' weights as two blocks would;
//  - steps meet at a grid barrier: a counter in the workspace header, which
//    the host sets to the token count before each call, so the k-th
//    barrier is passed at T + k * G arrivals and nothing is reset; two
//    steps of one virtual block each (both on block 0) meet at block 0's
//    own barrier.
//
// The steps' code is their kernels' own, so the numerics are the chain's.
//
//===----------------------------------------------------------------------===//

#include "codegen/nvidia/KernelBuilder.h"

#include "codegen/nvidia/Hopper.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/NVGPU/IR/NVGPUDialect.h"
#include "mlir/IR/IRMapping.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::nvidia;

namespace {
/// Shared memory a block of the fused kernel may take (static and dynamic),
/// less room for the mbarriers that are placed later.
constexpr int64_t kBlockSharedBytes = 227 * 1024 - 1024;
/// Named barriers a sub-block may use: ids [0, 4) of its kernel become
/// [1 + 4s, 5 + 4s) for sub-block s (barrier 0 is the whole block's), so at
/// most three sub-blocks fit the sixteen.
constexpr int64_t kBarriersPerSubBlock = 4, kMaxSubBlocks = 3;
/// The most tokens, and accumulators a matmul step's thread keeps, for the
/// small steps to run in pairs.
constexpr int64_t kMaxPairedTokens = 16, kMaxPairedAccumulators = 64;
int64_t barrierBase(int64_t subBlock) {
  return 1 + subBlock * kBarriersPerSubBlock;
}

/// One kernel of the chain as a step of the fused kernel.
struct Step {
  Launch *launch;
  gpu::GPUFuncOp func;
  /// Virtual blocks: gridX x gridY at the bucket's size.
  int64_t gridX = 0, gridY = 0;
  /// Threads of the kernel, whole warpgroups first; sub-blocks side by side.
  int64_t threads = 0, subBlocks = 1;
  int64_t staticBytes = 0;
  /// The fused kernel's arguments for the kernel's.
  SmallVector<unsigned> args;
  int64_t blocks() const { return gridX * gridY; }
  int64_t warpgroupThreads() const { return threads / 128 * 128; }
  int64_t restThreads() const { return threads % 128; }
};

/// The ids of `op`'s named barrier when it is one that namedBarrierSync or
/// namedBarrierArrive emitted: its id operand.
Value namedBarrierId(LLVM::InlineAsmOp op) {
  StringRef text = op.getAsmString();
  if ((text.starts_with("bar.sync $0,") ||
       text.starts_with("bar.arrive $0,")) &&
      op.getOperands().size() == 1)
    return op.getOperands()[0];
  return {};
}

/// Why `func` cannot run as a step of sub-blocks (its barriers cannot be
/// renumbered), or "".
std::string subBlockReason(gpu::GPUFuncOp func) {
  std::string reason;
  func.walk([&](LLVM::InlineAsmOp op) {
    StringRef text = op.getAsmString().ltrim();
    if (!text.starts_with("bar.") && !text.starts_with("barrier."))
      return;
    Value id = namedBarrierId(op);
    APInt value;
    if (!id || !matchPattern(id, m_ConstantInt(&value)) ||
        value.getSExtValue() < 0 ||
        value.getSExtValue() >= kBarriersPerSubBlock)
      reason = "a named barrier it cannot renumber";
  });
  return reason;
}

/// Why `launch`'s kernel cannot be a step of a fused kernel, or "".
std::string stepReason(const Launch &launch, gpu::GPUFuncOp func) {
  if (!func)
    return "its kernel is not in the module";
  if (launch.cluster > 1)
    return "it launches clusters";
  if (launch.persistent)
    return "it is persistent";
  if (launch.block % 32 != 0)
    return "its block is not whole warps";
  if (!func.getBody().hasOneBlock() || func.getNumPrivateAttributions())
    return "its body is not one block";
  std::string reason;
  func.walk([&](Operation *op) {
    if (isa<gpu::ReturnOp>(op) && op->getParentOp() != func)
      reason = "it returns early";
    else if (isa<NVVM::SetMaxRegisterOp>(op))
      reason = "it moves registers between warpgroups";
    else if (isa<nvgpu::TmaAsyncStoreOp>(op))
      reason = "it stores with TMA";
    else if (auto id = dyn_cast<gpu::ThreadIdOp>(op);
             id && id.getDimension() != gpu::Dimension::x)
      reason = "its block is not one-dimensional";
    else if (isa<gpu::ClusterIdOp, gpu::ClusterDimOp, gpu::ClusterBlockIdOp,
                 gpu::ClusterDimBlocksOp, gpu::GlobalIdOp>(op))
      reason = "it asks for its cluster or global position";
  });
  return reason;
}

/// Builds the fused kernel.
class FusedEmitter {
public:
  FusedEmitter(gpu::GPUModuleOp module, LaunchPlan &plan,
               MutableArrayRef<Step> steps, int64_t threads, Location loc)
      : module(module), plan(plan), steps(steps), threads(threads), loc(loc),
        b(module.getContext()), e(b, loc) {}

  /// The fused kernel `name`, and its launch in place of the steps'.
  void emit(StringRef name);

private:
  void emitStep(Step &step, int64_t subBlock);
  void cloneBody(Step &step, int64_t subBlock, Value localTid, Value bx,
                 Value by);
  void gridBarrier(int64_t k);
  void blockBarrier();
  /// Whether `step` takes every thread of the block as one sub-block (its
  /// barriers stay the block's own).
  bool wholeBlock(const Step &step) const {
    return step.subBlocks == 1 && step.threads == threads;
  }

  gpu::GPUModuleOp module;
  LaunchPlan &plan;
  MutableArrayRef<Step> steps;
  int64_t threads;
  Location loc;
  OpBuilder b;
  Emitter e;
  gpu::GPUFuncOp fused;
  Value tid, blockId, gridDim, tokens32, counter;
};
} // namespace

void FusedEmitter::emit(StringRef name) {
  // The union of the steps' arguments, then the barrier's counter, then
  // the token count's address.
  SmallVector<KernelArg> args;
  auto argIndex = [&](KernelArg arg) {
    for (auto [i, have] : llvm::enumerate(args))
      if (have.kind == arg.kind && have.index == arg.index)
        return unsigned(i);
    args.push_back(arg);
    return unsigned(args.size() - 1);
  };
  for (Step &step : steps)
    for (const KernelArg &arg : step.launch->args)
      if (arg.kind != KernelArgKind::Tokens)
        step.args.push_back(argIndex(arg));
  unsigned counterArg = argIndex({KernelArgKind::Buffer, plan.addCounters(1)});
  fused = createKernelFunc(b, module, name, args, loc);
  fused.setKnownBlockSizeAttr(b.getDenseI32ArrayAttr({int32_t(threads), 1, 1}));
  b.setInsertionPointToStart(&fused.getBody().front());
  tid = gpu::ThreadIdOp::create(b, loc, gpu::Dimension::x);
  blockId = gpu::BlockIdOp::create(b, loc, gpu::Dimension::x);
  gridDim = gpu::GridDimOp::create(b, loc, gpu::Dimension::x);
  tokens32 = LLVM::LoadOp::create(b, loc, b.getI32Type(),
                                  fused.getArgument(args.size()), 4);
  counter = fused.getArgument(counterArg);
  int64_t sharedBytes = 0, gridBarriers = 0;
  for (auto [k, step] : llvm::enumerate(steps)) {
    for (int64_t s = 0; s < step.subBlocks; ++s)
      emitStep(step, s);
    sharedBytes =
        std::max(sharedBytes, step.subBlocks * step.launch->sharedBytes);
    // Nothing waits for a prefetch.
    if (k + 1 == steps.size() || step.launch->prefetchOnly)
      continue;
    // Two steps of one virtual block each both run on block 0: its own
    // barrier orders them, and the others need not wait.
    if (step.blocks() == 1 && steps[k + 1].blocks() == 1)
      blockBarrier();
    else
      gridBarrier(++gridBarriers);
  }
  gpu::ReturnOp::create(b, loc);

  Launch launch;
  launch.kernel = name.str();
  // One block per multiprocessor (persistent), all resident (cooperative).
  launch.work = {int64_t(1) << 20, 0};
  launch.persistent = true;
  launch.cooperative = true;
  launch.block = threads;
  launch.sharedBytes = sharedBytes;
  launch.args = args;
  launch.args.push_back({KernelArgKind::Tokens, 0});
  llvm::SmallPtrSet<Operation *, 8> erased;
  for (Launch &chained : plan.getLaunches()) {
    auto func = module.lookupSymbol<gpu::GPUFuncOp>(chained.kernel);
    if (func && erased.insert(func).second)
      func.erase();
  }
  plan.getLaunches().clear();
  plan.getLaunches().push_back(std::move(launch));
}

void FusedEmitter::emitStep(Step &step, int64_t s) {
  // Sub-block s has warpgroup threads [s W, (s + 1) W) and the rest of its
  // threads (a producer warp) after every sub-block's warpgroups.
  int64_t w = step.warpgroupThreads(), r = step.restThreads();
  int64_t restBase = step.subBlocks * w + s * r;
  Value inWarpgroups =
      e.andi(e.icmp(arith::CmpIPredicate::uge, tid, e.index(s * w)),
             e.ult(tid, e.index((s + 1) * w)));
  Value inRest =
      e.andi(e.icmp(arith::CmpIPredicate::uge, tid, e.index(restBase)),
             e.ult(tid, e.index(restBase + r)));
  Value localTid = e.select(inWarpgroups, e.isub(tid, e.index(s * w)),
                            e.iadd(e.isub(tid, e.index(restBase)), e.index(w)));
  OpBuilder::InsertionGuard guard(b);
  auto member = scf::IfOp::create(b, loc, e.ori(inWarpgroups, inRest),
                                  /*withElseRegion=*/false);
  b.setInsertionPointToStart(&member.getThenRegion().front());
  // Sub-block 0 of every block first: a step of fewer virtual blocks than
  // blocks takes as many multiprocessors as it has virtual blocks.
  Value first = e.iadd(e.imul(gridDim, e.index(s)), blockId);
  Value stride = e.imul(gridDim, step.subBlocks);
  auto loop = scf::ForOp::create(b, loc, first, e.index(step.blocks()), stride);
  b.setInsertionPointToStart(loop.getBody());
  // y runs fastest: a decode tile's busy row tiles (x below the experts'
  // tile count) are then the first virtual blocks, spread evenly.
  Value v = loop.getInductionVar();
  cloneBody(step, s, localTid, e.divUI(v, step.gridY), e.remUI(v, step.gridY));
  // The next virtual block may set up the shared memory this one used.
  if (wholeBlock(step))
    gpu::BarrierOp::create(b, loc);
  else
    namedBarrierSync(b, loc, e.i32(barrierBase(s)), step.threads);
}

void FusedEmitter::cloneBody(Step &step, int64_t s, Value localTid, Value bx,
                             Value by) {
  gpu::GPUFuncOp func = step.func;
  IRMapping map;
  for (unsigned i = 0; i < step.args.size(); ++i)
    map.map(func.getArgument(i), fused.getArgument(step.args[i]));
  map.map(func.getArgument(step.args.size()),
          fused.getArgument(fused.getNumArguments() - 1));
  for (BlockArgument buffer : func.getWorkgroupAttributions()) {
    auto type = cast<MemRefType>(buffer.getType());
    BlockArgument copy = fused.addWorkgroupAttribution(type, loc);
    fused.setWorkgroupAttributionAttr(fused.getNumWorkgroupAttributions() - 1,
                                      LLVM::LLVMDialect::getAlignAttrName(),
                                      b.getI64IntegerAttr(16));
    map.map(buffer, copy);
  }
  Block &body = func.getBody().front();
  SmallVector<Operation *> cloned;
  for (Operation &op : body.without_terminator())
    cloned.push_back(b.clone(op, map));
  // A step of fewer threads than the block renumbers its barriers, which
  // its threads alone take.
  bool whole = wholeBlock(step);
  int64_t idBase = barrierBase(s);
  OpBuilder rb(b.getContext());
  SmallVector<Operation *> dead;
  auto rewrite = [&](Operation *op) {
    rb.setInsertionPoint(op);
    Emitter re(rb, op->getLoc());
    if (isa<gpu::ThreadIdOp>(op)) {
      op->getResult(0).replaceAllUsesWith(localTid);
    } else if (auto id = dyn_cast<gpu::BlockIdOp>(op)) {
      gpu::Dimension d = id.getDimension();
      op->getResult(0).replaceAllUsesWith(d == gpu::Dimension::x ? bx
                                          : d == gpu::Dimension::y
                                              ? by
                                              : re.index(0));
    } else if (auto dim = dyn_cast<gpu::GridDimOp>(op)) {
      gpu::Dimension d = dim.getDimension();
      op->getResult(0).replaceAllUsesWith(
          re.index(d == gpu::Dimension::x   ? step.gridX
                   : d == gpu::Dimension::y ? step.gridY
                                            : 1));
    } else if (auto dim = dyn_cast<gpu::BlockDimOp>(op)) {
      op->getResult(0).replaceAllUsesWith(
          re.index(dim.getDimension() == gpu::Dimension::x ? step.threads : 1));
    } else if (isa<gpu::BarrierOp>(op)) {
      if (whole)
        return;
      namedBarrierSync(rb, op->getLoc(), re.i32(idBase), step.threads);
    } else if (auto asmOp = dyn_cast<LLVM::InlineAsmOp>(op)) {
      Value id = namedBarrierId(asmOp);
      if (!id || whole)
        return;
      asmOp->setOperand(
          0, LLVM::AddOp::create(rb, op->getLoc(), id, re.i32(idBase)));
      return;
    } else if (isa<NVVM::GriddepcontrolOp>(op)) {
      // The fused kernel has no predecessor in the stream to wait for.
    } else if (auto smem = dyn_cast<gpu::DynamicSharedMemoryOp>(op)) {
      if (s == 0)
        return;
      // Sub-block s's dynamic shared memory follows the others'.
      rb.setInsertionPointAfter(op);
      int64_t bytes = step.launch->sharedBytes;
      auto view = memref::ViewOp::create(rb, op->getLoc(), smem.getType(), smem,
                                         re.index(s * bytes),
                                         ValueRange{re.index(bytes)});
      smem.getResult().replaceAllUsesExcept(view, view.getOperation());
      return;
    } else {
      return;
    }
    dead.push_back(op);
  };
  for (Operation *op : cloned)
    op->walk(rewrite);
  for (Operation *op : dead)
    op->erase();
}

void FusedEmitter::blockBarrier() {
  // Stores before TMA reads of them in the next step (the async proxy).
  inlinePtx(b, loc, {}, {}, "fence.proxy.async;", "");
  gpu::BarrierOp::create(b, loc);
}

void FusedEmitter::gridBarrier(int64_t k) {
  // The block's stores are ordered before its arrival by the block barrier
  // and the arrival's release (cumulative); the wait's acquire orders the
  // others' stores before the next step, and the proxy fences before TMA
  // reads of them.
  blockBarrier();
  e.ifThen(e.eq(tid, e.index(0)), [&] {
    Type i32 = b.getI32Type();
    inlinePtx(b, loc, {}, {counter, e.i32(1)},
              "red.release.gpu.global.add.u32 [$0], $1;", "l,r");
    // Passed once every block has arrived k times: the counter started
    // the call at the token count.
    Value target = e.iadd(
        tokens32,
        e.imul(e.i32(k), arith::IndexCastUIOp::create(b, loc, i32, gridDim)));
    auto wait = scf::WhileOp::create(b, loc, TypeRange{}, ValueRange{});
    b.createBlock(&wait.getBefore());
    Value seen = inlinePtx(b, loc, {i32}, {counter},
                           "ld.acquire.gpu.global.u32 $0, [$1];", "=r,l");
    Value early =
        e.icmp(arith::CmpIPredicate::slt, e.isub(seen, target), e.i32(0));
    scf::ConditionOp::create(b, loc, early, ValueRange{});
    b.createBlock(&wait.getAfter());
    scf::YieldOp::create(b, loc);
    b.setInsertionPointAfter(wait);
  });
  gpu::BarrierOp::create(b, loc);
  inlinePtx(b, loc, {}, {}, "fence.proxy.async;", "");
}

namespace {
/// L2 a prefetch may fill ahead of the matmuls: well under the H100's
/// 50 MB, so the streams that follow do not evict it before it is read.
constexpr int64_t kPrefetchBudget = 20 << 20;
/// Virtual blocks of the prefetch step, threads each.
constexpr int64_t kPrefetchBlocks = 128, kPrefetchThreads = 256;
/// The least bytes of a row worth a prefetch instruction.
constexpr int64_t kPrefetchMinBytes = 512;

/// Expert weights [E, N, K] a grouped matmul reads: which plan buffer, and
/// the bytes of each row to prefetch.
struct PrefetchedWeight {
  unsigned buffer;
  int64_t experts, rows, rowBytes, bytes;
};
} // namespace

LogicalResult nvidia::buildExpertPrefetch(LayerKernels &layer, RouteOp route) {
  auto func = route->getParentOfType<func::FuncOp>();
  auto idsType = cast<RankedTensorType>(route.getExpertIds().getType());
  int64_t topK = idsType.getDimSize(1);
  int64_t choices = layer.maxTokens * topK;
  // The experts' weights in the order the matmuls read them: each row's
  // first bytes (the first K a tile streams), as many as the budget
  // leaves.
  SmallVector<PrefetchedWeight> weights;
  int64_t budget = kPrefetchBudget;
  func.walk([&](GroupedMatmulOp matmul) {
    auto arg = dyn_cast<BlockArgument>(matmul.getRhs());
    if (!matmul.getTokensPerExpert() || !arg ||
        arg.getOwner()->getParentOp() != func.getOperation())
      return;
    auto type = cast<RankedTensorType>(arg.getType());
    if (type.getRank() != 3)
      return;
    int64_t rowBytes = type.getDimSize(2) * type.getElementTypeBitWidth() / 8;
    if (rowBytes % 16 != 0)
      return;
    int64_t rows = choices * type.getDimSize(1);
    int64_t bytes = std::min(rowBytes, budget / rows / 128 * 128);
    if (bytes < std::min(rowBytes, kPrefetchMinBytes))
      return;
    budget -= rows * bytes;
    weights.push_back({arg.getArgNumber(), type.getDimSize(0),
                       type.getDimSize(1), rowBytes, bytes});
  });
  if (weights.empty())
    return success();
  const TensorInfo &ids = layer.info(route.getExpertIds());
  SmallVector<unsigned> buffers = {ids.buffer};
  for (const PrefetchedWeight &w : weights)
    buffers.push_back(w.buffer);
  Kernel k = layer.kernelOn(route, "prefetch_experts", buffers);
  k.launch.work = {kPrefetchBlocks, 0};
  k.launch.block = kPrefetchThreads;
  k.launch.prefetchOnly = true;
  Emitter &e = k.e;
  OpBuilder &b = k.b;
  Value idsView = k.view(0, ids);
  Value choicesNow = e.imul(k.tokens, e.index(topK));
  Value first =
      e.iadd(e.imul(k.blockId(gpu::Dimension::x), e.index(kPrefetchThreads)),
             k.threadId());
  Value stride = e.index(kPrefetchBlocks * kPrefetchThreads);
  Type i8 = b.getI8Type(), i64 = b.getI64Type();
  for (auto [i, w] : llvm::enumerate(weights)) {
    Value base = k.func.getArgument(i + 1);
    // Row r of every choice c, choices fastest.
    e.forEach(
        first, e.imul(choicesNow, e.index(w.rows)),
        [&](Value item) {
          Value c = e.remUI(item, choicesNow), r = e.divUI(item, choicesNow);
          Value x = e.loadRaw(
              idsView, {e.divUI(c, e.index(topK)), e.remUI(c, e.index(topK))});
          Value held =
              e.andi(e.icmp(arith::CmpIPredicate::sge, x, e.i32(0)),
                     e.icmp(arith::CmpIPredicate::slt, x, e.i32(w.experts)));
          e.ifThen(held, [&] {
            Value row = e.iadd(e.imul(e.toIndex(x), e.index(w.rows)), r);
            Value offset = arith::IndexCastOp::create(
                b, e.loc, i64, e.imul(row, e.index(w.rowBytes)));
            Value address = LLVM::GEPOp::create(b, e.loc, base.getType(), i8,
                                                base, ValueRange{offset});
            inlinePtx(b, e.loc, {}, {address, e.i32(w.bytes)},
                      "cp.async.bulk.prefetch.L2.global [$0], $1;", "l,r");
          });
        },
        stride);
  }
  return k.finish(route);
}

void nvidia::fuseLaunches(gpu::GPUModuleOp module, LaunchPlan &plan,
                          llvm::StringSet<> &names, Operation *anchor) {
  int64_t maxTokens = plan.maxTokens;
  SmallVector<Step> steps;
  auto keepChain = [&](const Twine &why) {
    anchor->emitRemark() << "bucket " << maxTokens
                         << " keeps its chain of kernels: " << why;
    // A chain's kernels start only when the one before ends: a prefetch
    // there would only add a launch.
    std::deque<Launch> &launches = plan.getLaunches();
    for (auto it = launches.begin(); it != launches.end();) {
      if (!it->prefetchOnly) {
        ++it;
        continue;
      }
      if (auto func = module.lookupSymbol<gpu::GPUFuncOp>(it->kernel))
        func.erase();
      it = launches.erase(it);
    }
  };
  for (Launch &launch : plan.getLaunches()) {
    auto func = module.lookupSymbol<gpu::GPUFuncOp>(launch.kernel);
    std::string reason = stepReason(launch, func);
    if (!reason.empty())
      return keepChain(launch.kernel +
                       " cannot be a step of one kernel: " + reason);
    Step step;
    step.launch = &launch;
    step.func = func;
    step.gridX = launch.gridX(maxTokens);
    step.gridY = launch.gridY;
    step.threads = launch.block;
    for (BlockArgument buffer : func.getWorkgroupAttributions()) {
      auto type = cast<MemRefType>(buffer.getType());
      step.staticBytes += llvm::alignTo(
          type.getNumElements() * type.getElementTypeBitWidth() / 8, 16);
    }
    if (step.blocks() > 0)
      steps.push_back(step);
  }
  if (steps.empty())
    return;
  // A step of a warpgroup and a warp or less runs twice side by side, so a
  // multiprocessor keeps two decode tiles' loads in flight; but only in
  // small buckets whose tiles keep few accumulators: 320 threads get at
  // most 168 registers, and Qwen3-30B-A3B's FP8 tiles at 32 and 64 tokens
  // (128 accumulators) spilled under that, as did MXFP8's.
  bool pairs = maxTokens <= kMaxPairedTokens &&
               llvm::all_of(steps, [](const Step &step) {
                 return step.launch->accumulators <= kMaxPairedAccumulators;
               });
  int64_t threads = 0;
  SmallVector<std::string> fixedBarriers;
  for (Step &step : steps) {
    fixedBarriers.push_back(subBlockReason(step.func));
    bool twice = pairs && step.threads <= 192 && fixedBarriers.back().empty();
    threads = std::max(threads, step.threads * (twice ? 2 : 1));
  }
  for (auto [step, why] : llvm::zip(steps, fixedBarriers)) {
    if (!why.empty() && step.threads != threads)
      return keepChain(step.launch->kernel +
                       " cannot be a step of one kernel: " + why +
                       " for fewer threads");
    step.subBlocks =
        why.empty() ? std::min(threads / step.threads, kMaxSubBlocks) : 1;
  }
  // Fewer sub-blocks until the shared memory fits.
  auto staticBytes = [&] {
    int64_t bytes = 0;
    for (Step &step : steps)
      bytes += step.subBlocks * step.staticBytes;
    return bytes;
  };
  auto dynamicBytes = [&] {
    int64_t bytes = 0;
    for (Step &step : steps)
      bytes = std::max(bytes, step.subBlocks * step.launch->sharedBytes);
    return bytes;
  };
  while (staticBytes() > kStaticSharedLimit ||
         staticBytes() + dynamicBytes() > kBlockSharedBytes) {
    Step *widest = nullptr;
    for (Step &step : steps)
      if (step.subBlocks > 1 &&
          (!widest ||
           step.subBlocks * (step.launch->sharedBytes + step.staticBytes) >
               widest->subBlocks *
                   (widest->launch->sharedBytes + widest->staticBytes)))
        widest = &step;
    if (!widest)
      return keepChain("its kernels' shared memory does not fit one block");
    --widest->subBlocks;
  }
  FusedEmitter(module, plan, steps, threads, anchor->getLoc())
      .emit(uniqueKernelName(names, "moe_fused_layer"));
}
