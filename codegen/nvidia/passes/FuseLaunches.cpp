//===- FuseLaunches.cpp - a fused bucket's plan ---------------------------===//
//
// moe-build-kernels' last step for a bucket that moe-fuse-layer marked: it
// decides whether the bucket's chain of kernels can run as steps of one
// fused kernel (kernels/FusedLayer.cpp), how many sub-blocks of each step
// share a block within its shared memory and named barriers, and then puts
// that kernel's launch in the plan in place of the chain's; else it keeps
// the chain, with a remark saying why.
//
//===----------------------------------------------------------------------===//

#include "codegen/nvidia/passes/FuseLaunches.h"
#include "codegen/nvidia/kernels/FusedLayer.h"
#include "codegen/nvidia/support/Sm90a.h"

#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/NVGPU/IR/NVGPUDialect.h"
#include "mlir/IR/Matchers.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::nvidia;

namespace { /// Shared memory a block of the fused kernel may take (static and
            /// dynamic),
/// less room for the mbarriers that are placed later.
constexpr int64_t kBarrierRoom = 1024;
constexpr int64_t kBlockSharedBytes = sm90a::kSharedPerBlock - kBarrierRoom;
/// The most tokens, and accumulators a matmul step's thread keeps, for the
/// small steps to run in pairs.
constexpr int64_t kMaxPairedTokens = 16, kMaxPairedAccumulators = 64;

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
} // namespace

void nvidia::fuseLaunches(gpu::GPUModuleOp module, LaunchPlan &plan,
                          llvm::StringSet<> &names, Operation *anchor) {
  int64_t maxTokens = plan.maxTokens;
  SmallVector<FusedStep> steps;
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
    FusedStep step;
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
               llvm::all_of(steps, [](const FusedStep &step) {
                 return step.launch->accumulators <= kMaxPairedAccumulators;
               });
  int64_t threads = 0;
  SmallVector<std::string> fixedBarriers;
  for (FusedStep &step : steps) {
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
    for (FusedStep &step : steps)
      bytes += step.subBlocks * step.staticBytes;
    return bytes;
  };
  auto dynamicBytes = [&] {
    int64_t bytes = 0;
    for (FusedStep &step : steps)
      bytes = std::max(bytes, step.subBlocks * step.launch->sharedBytes);
    return bytes;
  };
  while (staticBytes() > sm90a::kSharedWithoutOptIn ||
         staticBytes() + dynamicBytes() > kBlockSharedBytes) {
    FusedStep *widest = nullptr;
    for (FusedStep &step : steps)
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
  emitFusedLayer(module, plan, steps, threads, anchor->getLoc(),
                 uniqueKernelName(names, "moe_fused_layer"));
}
