//===- BuildKernels.cpp - L1 moe ops to sm_90a kernels and a plan ---------===//
//
// Walks a layer function's L1 ops in order and hands each to its kernel
// family; the families share the buffers of the tensors between them
// (KernelBuilder.h) and append their launches to the plan.
//
//===----------------------------------------------------------------------===//

#include "codegen/nvidia/passes/Passes.h"

#include "codegen/nvidia/kernels/Kernels.h"
#include "codegen/nvidia/passes/FuseLaunches.h"
#include "runtime/EpLayout.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Verifier.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/TypeSwitch.h"

namespace mlir::moe::nvidia {
#define GEN_PASS_DEF_BUILDKERNELS
#include "codegen/nvidia/passes/Passes.h.inc"
} // namespace mlir::moe::nvidia

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::nvidia;

static LogicalResult buildKernel(LayerKernels &layer, Operation *op) {
  return TypeSwitch<Operation *, LogicalResult>(op)
      .Case([&](RouteOp o) { return buildRoute(layer, o); })
      .Case([&](RouteGradOp o) { return buildRouteGrad(layer, o); })
      .Case([&](DispatchOp o) {
        return failure(failed(o.checkOneRank()) ||
                       failed(buildDispatch(layer, o)));
      })
      .Case([&](EpDispatchSendOp o) { return buildEpDispatchSend(layer, o); })
      .Case([&](EpDispatchRecvOp o) { return buildEpDispatchRecv(layer, o); })
      .Case([&](EpCombineSendOp o) { return buildEpCombineSend(layer, o); })
      .Case([&](EpCombineRecvOp o) { return buildEpCombineRecv(layer, o); })
      .Case([&](GroupedMatmulOp o) { return buildGroupedMatmul(layer, o); })
      .Case([&](ActivationOp o) { return buildActivation(layer, o); })
      .Case([&](ActivationGradOp o) { return buildActivationGrad(layer, o); })
      .Case([&](GroupedMatmulWgradOp o) {
        return takesSimtMatmul(o) ? buildSimtWgrad(layer, o)
                                  : buildGroupedMatmulWgrad(layer, o);
      })
      .Case([&](GroupedMatmulDgradOp o) { return buildSimtDgrad(layer, o); })
      .Case([&](GatherDotOp o) { return buildGatherDot(layer, o); })
      .Case([&](CombineOp o) { return buildCombine(layer, o); })
      .Case([&](QuantizeOp o) { return buildQuantize(layer, o); })
      .Case([&](DequantizeOp o) { return buildDequantize(layer, o); })
      .Case([&](PadOp o) { return buildPad(layer, o); })
      .Case([&](TransposeOp o) { return buildTranspose(layer, o); })
      .Case([&](ScatterOp o) { return buildScatter(layer, o); })
      .Case([&](TiledAttentionOp o) { return buildAttention(layer, o); })
      .Case([&](AttentionOp o) {
        return o.emitOpError()
               << "must be split first (run moe-split-attention)";
      })
      .Case([&](LayerOp o) {
        return o.emitOpError()
               << "must be decomposed first (run moe-decompose)";
      })
      .Default([&](Operation *other) {
        return other->emitOpError() << "has no sm_90a kernel";
      });
}

/// Builds `func`'s kernels for calls of at most `maxTokens` tokens (0: any)
/// into `gpuModule`, and returns their plan.
/// `argRows` gives the rows of dynamic arguments other than the token
/// count (a backward's saved tensors), by argument number; `resultRows`,
/// when given, gets the rows of each result.
static FailureOr<std::unique_ptr<LaunchPlan>>
buildPlan(func::FuncOp func, gpu::GPUModuleOp gpuModule,
          llvm::StringSet<> &names, int64_t epMaxTokens, int64_t maxTokens,
          const DenseMap<unsigned, TokenLinear> &argRows,
          SmallVectorImpl<TokenLinear> *resultRows) {
  auto plan = std::make_unique<LaunchPlan>(func.getContext());
  plan->maxTokens = maxTokens;
  LayerKernels layer(gpuModule, *plan, names, maxTokens);
  layer.epMaxTokens = epMaxTokens;
  layer.expertParallel = !func.getBody().getOps<EpDispatchSendOp>().empty();
  if (auto fused =
          func->getAttrOfType<DenseI64ArrayAttr>(kFusedBucketsAttrName))
    layer.fused =
        maxTokens > 0 && llvm::is_contained(fused.asArrayRef(), maxTokens);
  Block &body = func.getBody().front();
  FunctionType type = func.getFunctionType();
  // Buffer i is argument i: the inputs, then the outputs.
  unsigned numArgs = type.getNumInputs() + type.getNumResults();
  for (unsigned i = 0; i < numArgs; ++i)
    plan->addArgument(i);
  for (BlockArgument arg : body.getArguments()) {
    auto tensor = dyn_cast<RankedTensorType>(arg.getType());
    if (!tensor)
      return func.emitOpError() << "takes only ranked tensors";
    for (int64_t d = 1; d < tensor.getRank(); ++d)
      if (tensor.isDynamicDim(d))
        return func.emitOpError()
               << "argument " << arg.getArgNumber()
               << " may be dynamic only in its first (token) dimension";
    TokenLinear rows =
        tensor.getRank() == 0 ? TokenLinear{}
        : tensor.isDynamicDim(0)
            ? argRows.lookup_or(arg.getArgNumber(), TokenLinear{0, 1})
            : TokenLinear{tensor.getDimSize(0), 0};
    layer.bind(arg, arg.getArgNumber(), rows);
  }
  auto ret = cast<func::ReturnOp>(body.getTerminator());
  for (auto [i, value] : llvm::enumerate(ret.getOperands())) {
    if (!value.getDefiningOp() || layer.isOutput(value))
      return func.emitOpError()
             << "must return distinct values computed by moe ops";
    layer.bindOutput(value, type.getNumInputs() + i);
  }
  bool backward = func->hasAttr("moe.gradients");
  for (Operation &op : body.without_terminator()) {
    if (failed(buildKernel(layer, &op)))
      return failure();
    layer.skipAfterEpFailure |= backward && isa<EpDispatchRecvOp>(op);
    if (auto route = dyn_cast<RouteOp>(op);
        route && layer.fused && failed(buildExpertPrefetch(layer, route)))
      return failure();
  }
  if (layer.fused)
    fuseLaunches(gpuModule, *plan, names, func.getOperation());
  if (resultRows)
    for (Value value : ret.getOperands())
      resultRows->push_back(layer.info(value).rows);
  return plan;
}

/// Moves what an expert-parallel backward's last exchange needs ahead of
/// everything else (keeping order within each part), so every gradient is
/// written after the step's last wait: a step that failed then writes none
/// (LayerKernels::skipAfterEpFailure). Its peers also get their rows'
/// gradients sooner.
static void exchangeFirst(func::FuncOp func) {
  Block &body = func.getBody().front();
  Operation *last = nullptr;
  for (Operation &op : body.without_terminator())
    if (isa<EpCombineRecvOp>(op))
      last = &op;
  if (!last)
    return;
  llvm::SetVector<Operation *> needed;
  SmallVector<Operation *> work = {last};
  while (!work.empty()) {
    Operation *op = work.pop_back_val();
    if (!needed.insert(op))
      continue;
    for (Value v : op->getOperands())
      if (Operation *def = v.getDefiningOp(); def && def->getBlock() == &body)
        work.push_back(def);
    // A product written over its activation input comes after that input's
    // other readers.
    if (auto matmul = dyn_cast<GroupedMatmulOp>(op);
        matmul && matmul.getInPlace())
      for (Operation *user : matmul.getActivationInput().getUsers())
        if (user != op && user->getBlock() == &body &&
            user->isBeforeInBlock(op))
          work.push_back(user);
  }
  Operation *at = &body.front();
  for (Operation &op : llvm::make_early_inc_range(body.without_terminator())) {
    if (!needed.contains(&op))
      continue;
    if (&op == at) {
      at = op.getNextNode();
      continue;
    }
    op.moveBefore(at);
  }
}

/// Adds what the plan decided to the function's interface (moe.interface,
/// when moe-export-interface described it): the workspace, the buckets and
/// an expert-parallel layer's capacity and device state.
static LogicalResult recordLaunch(func::FuncOp func, LaunchPlanAttr plan,
                                  ArrayRef<int64_t> buckets,
                                  int64_t epMaxTokens) {
  auto interface =
      func->getAttrOfType<InterfaceAttr>(InterfaceAttr::getAttrName());
  if (!interface)
    return success();
  if (interface.getTarget() != Target::SM90a)
    return func.emitOpError()
           << "has the interface of a "
           << stringifyTarget(interface.getTarget())
           << " library, but its kernels are built for sm_90a";
  ExpertParallelAttr ep = interface.getExpertParallel();
  if (ep) {
    ::moe::rt::EpDeviceLayout layout{
        ::moe::rt::EpLayout{ep.getHidden(), ep.getTopK(), ep.getExperts(),
                            ep.getRanks(), epMaxTokens}};
    ep = ExpertParallelAttr::get(
        func.getContext(), ep.getRanks(), ep.getLocalExperts(), ep.getExperts(),
        ep.getTopK(), ep.getHidden(), epMaxTokens, int64_t(layout.bytes()),
        TokenLinear(), TokenLinear());
  }
  func->setAttr(InterfaceAttr::getAttrName(),
                interface.withLaunch(plan.getWorkspaceBytes(), buckets, ep));
  return success();
}

/// `kernel` printed with a fixed name: equal texts are equal kernels.
static std::string fingerprint(gpu::GPUFuncOp kernel) {
  std::string name = kernel.getName().str(), text;
  kernel.setName("kernel");
  llvm::raw_string_ostream os(text);
  kernel->print(os, OpPrintingFlags().useLocalScope());
  kernel.setName(name);
  return text;
}

/// Builds `func`'s kernels into a new gpu.module and attaches its plan, and
/// one plan per token bucket (moe.token_buckets, set by moe-bucketize). A
/// bucket's kernel equal to one built before is dropped and the earlier
/// one launched, so only what a bucket specializes is compiled twice.
static LogicalResult buildLayer(func::FuncOp func, int64_t epMaxTokens,
                                const DenseMap<unsigned, TokenLinear> &argRows,
                                SmallVectorImpl<TokenLinear> *resultRows) {
  if (!func.getBody().hasOneBlock())
    return func.emitOpError() << "must have a single block to be lowered";
  ModuleOp module = func->getParentOfType<ModuleOp>();
  OpBuilder b = OpBuilder::atBlockEnd(module.getBody());
  auto gpuModule = gpu::GPUModuleOp::create(
      b, func.getLoc(), (func.getName() + "_kernels").str());
  llvm::StringSet<> names;
  SmallVector<std::unique_ptr<LaunchPlan>> plans;
  SmallVector<int64_t> sizes = {0};
  if (auto buckets =
          func->getAttrOfType<DenseI64ArrayAttr>(kTokenBucketsAttrName))
    llvm::append_range(sizes, buckets.asArrayRef());
  std::map<std::string, std::string> built;
  for (int64_t size : sizes) {
    size_t before = std::distance(gpuModule.getOps<gpu::GPUFuncOp>().begin(),
                                  gpuModule.getOps<gpu::GPUFuncOp>().end());
    FailureOr<std::unique_ptr<LaunchPlan>> plan =
        buildPlan(func, gpuModule, names, epMaxTokens, size, argRows,
                  size == 0 ? resultRows : nullptr);
    if (failed(plan))
      return failure();
    std::map<std::string, std::string> renamed;
    for (auto kernel : llvm::make_early_inc_range(
             llvm::drop_begin(gpuModule.getOps<gpu::GPUFuncOp>(), before))) {
      auto [it, added] =
          built.try_emplace(fingerprint(kernel), kernel.getName().str());
      if (added)
        continue;
      renamed[kernel.getName().str()] = it->second;
      kernel.erase();
    }
    (*plan)->renameKernels(renamed);
    plans.push_back(std::move(*plan));
  }
  if (failed(verify(gpuModule)))
    return failure();
  LaunchPlanAttr anyCount = plans.front()->toAttr();
  func->setAttr(LaunchPlanAttr::getAttrName(), anyCount);
  if (plans.size() > 1) {
    SmallVector<Attribute> buckets;
    for (auto &plan : llvm::drop_begin(plans))
      buckets.push_back(plan->toAttr());
    func->setAttr(kBucketPlansAttrName, b.getArrayAttr(buckets));
  }
  return recordLaunch(func, anyCount, ArrayRef(sizes).drop_front(),
                      epMaxTokens);
}

namespace {
struct BuildKernelsPass
    : public nvidia::impl::BuildKernelsBase<BuildKernelsPass> {
  using BuildKernelsBase::BuildKernelsBase;
  LogicalResult initialize(MLIRContext *context) override {
    // The runtime's bound on a rank's capacity (moe_ep.h's max_tokens).
    if (epMaxTokens < 1 || epMaxTokens > (int64_t(1) << 20))
      return emitError(UnknownLoc::get(context))
             << "ep-max-tokens must be in [1, 2^20], not "
             << static_cast<int64_t>(epMaxTokens);
    return success();
  }
  void runOnOperation() override {
    SmallVector<func::FuncOp> layers;
    for (auto func : getOperation().getOps<func::FuncOp>()) {
      bool hasMoeOps = false;
      func.walk([&](Operation *op) {
        hasMoeOps |= isa<MoeDialect>(op->getDialect());
      });
      if (hasMoeOps)
        layers.push_back(func);
    }
    // A backward reads what its training forward saved, whose rows (a
    // dispatched layout's, say) are not the token count's: the training
    // forward's results tell them.
    llvm::StringMap<SmallVector<TokenLinear>> savedRows;
    for (func::FuncOp func : layers) {
      DenseMap<unsigned, TokenLinear> argRows;
      if (func->hasAttr("moe.gradients"))
        exchangeFirst(func);
      StringRef name = func.getName();
      if (func->hasAttr("moe.gradients") && name.consume_back("_backward")) {
        auto found = savedRows.find((name + "_train").str());
        if (found == savedRows.end()) {
          func.emitOpError() << "reads the tensors @" << name
                             << "_train saves, which must come first";
          return signalPassFailure();
        }
        // Arguments: the inputs, the output's gradient, then the saved
        // tensors (the training forward's results after its output).
        unsigned first = func.getNumArguments() - (found->second.size() - 1);
        for (auto [i, rows] :
             llvm::enumerate(ArrayRef(found->second).drop_front()))
          argRows[first + i] = rows;
      }
      SmallVector<TokenLinear> resultRows;
      if (failed(buildLayer(func, epMaxTokens, argRows, &resultRows)))
        return signalPassFailure();
      if (func->hasAttr("moe.saved"))
        savedRows[func.getName()] = std::move(resultRows);
    }
  }
};
} // namespace
