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

#include "codegen/nvidia/kernels/FusedLayer.h"
#include "codegen/nvidia/support/Hopper.h"

#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/IR/IRMapping.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::nvidia;

Value nvidia::namedBarrierId(LLVM::InlineAsmOp op) {
  StringRef text = op.getAsmString();
  if ((text.starts_with("bar.sync $0,") ||
       text.starts_with("bar.arrive $0,")) &&
      op.getOperands().size() == 1)
    return op.getOperands()[0];
  return {};
}

namespace {
int64_t barrierBase(int64_t subBlock) {
  return 1 + subBlock * kBarriersPerSubBlock;
}

/// Builds the fused kernel.
class FusedEmitter {
public:
  FusedEmitter(gpu::GPUModuleOp module, LaunchPlan &plan,
               MutableArrayRef<FusedStep> steps, int64_t threads, Location loc)
      : module(module), plan(plan), steps(steps), threads(threads), loc(loc),
        b(module.getContext()), e(b, loc) {}

  /// The fused kernel `name`, and its launch in place of the steps'.
  void emit(StringRef name);

private:
  void emitStep(FusedStep &step, int64_t subBlock);
  void cloneBody(FusedStep &step, int64_t subBlock, Value localTid, Value bx,
                 Value by);
  void gridBarrier(int64_t k);
  void blockBarrier();
  /// Whether `step` takes every thread of the block as one sub-block (its
  /// barriers stay the block's own).
  bool wholeBlock(const FusedStep &step) const {
    return step.subBlocks == 1 && step.threads == threads;
  }

  gpu::GPUModuleOp module;
  LaunchPlan &plan;
  MutableArrayRef<FusedStep> steps;
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
  for (FusedStep &step : steps)
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

void FusedEmitter::emitStep(FusedStep &step, int64_t s) {
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

void FusedEmitter::cloneBody(FusedStep &step, int64_t s, Value localTid,
                             Value bx, Value by) {
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

void nvidia::emitFusedLayer(gpu::GPUModuleOp module, LaunchPlan &plan,
                            MutableArrayRef<FusedStep> steps, int64_t threads,
                            Location loc, StringRef name) {
  FusedEmitter(module, plan, steps, threads, loc).emit(name);
}
