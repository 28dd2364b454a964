//===- Pipelines.cpp - every stage of each target, in order ---------------===//
//
// The only place a compilation is assembled: moe-opt registers the pass
// pipelines below by name and moe-compile runs compileLayer, whose --emit
// values are stops along these lists.
//
//===----------------------------------------------------------------------===//

#include "passes/Pipelines.h"

#include "codegen/cpu/Passes.h"
#include "codegen/nvidia/Passes.h"
#include "passes/Passes.h"

#include "mlir/Conversion/AffineToStandard/AffineToStandard.h"
#include "mlir/Conversion/ArithToLLVM/ArithToLLVM.h"
#include "mlir/Conversion/ControlFlowToLLVM/ControlFlowToLLVM.h"
#include "mlir/Conversion/FuncToLLVM/ConvertFuncToLLVMPass.h"
#include "mlir/Conversion/GPUToNVVM/GPUToNVVMPass.h"
#include "mlir/Conversion/MathToLLVM/MathToLLVM.h"
#include "mlir/Conversion/MemRefToLLVM/MemRefToLLVM.h"
#include "mlir/Conversion/NVGPUToNVVM/NVGPUToNVVM.h"
#include "mlir/Conversion/NVVMToLLVM/NVVMToLLVM.h"
#include "mlir/Conversion/ReconcileUnrealizedCasts/ReconcileUnrealizedCasts.h"
#include "mlir/Conversion/SCFToControlFlow/SCFToControlFlow.h"
#include "mlir/Dialect/Arith/Transforms/Passes.h"
#include "mlir/Dialect/GPU/Transforms/Passes.h"
#include "mlir/Dialect/MemRef/Transforms/Passes.h"
#include "mlir/Pass/PassRegistry.h"
#include "mlir/Transforms/Passes.h"
#include "llvm/Support/Path.h"

using namespace mlir;
using namespace mlir::moe;

void moe::buildCpuPipeline(OpPassManager &pm, Stop stop,
                           bool fuseQuantization) {
  pm.addPass(createDecompose());
  if (fuseQuantization)
    pm.addPass(createFuseQuantization());
  pm.addPass(createExpertParallel());
  pm.addPass(createSplitAttention());
  if (stop == Stop::L1)
    return;
  pm.addPass(cpu::createLowerToLoops());
  pm.addPass(createCanonicalizerPass());
  // bf16 conversions become integer arithmetic (round to nearest even), so
  // the object needs no compiler runtime for them.
  arith::ArithExpandOpsPassOptions expand;
  expand.includeBf16 = true;
  pm.addPass(arith::createArithExpandOpsPass(expand));
  pm.addPass(createSCFToControlFlowPass());
  pm.addPass(createConvertMathToLLVMPass());
  pm.addPass(createArithToLLVMConversionPass());
  pm.addPass(createFinalizeMemRefToLLVMConversionPass());
  pm.addPass(createConvertControlFlowToLLVMPass());
  pm.addPass(createConvertFuncToLLVMPass());
  pm.addPass(createReconcileUnrealizedCastsPass());
}

void moe::buildSm90aPipeline(OpPassManager &pm, Stop stop, StringRef cudaPath,
                             bool fuseQuantization, int64_t epMaxTokens,
                             const PipelineOptions *options) {
  pm.addPass(createDecompose());
  if (fuseQuantization)
    pm.addPass(createFuseQuantization());
  pm.addPass(createExpertParallel());
  pm.addPass(createLegalize());
  SplitAttentionOptions attention;
  if (options)
    attention.pingPong = options->pingPong;
  pm.addPass(createSplitAttention(attention));
  if (!options || options->tokenBuckets) {
    BucketizeOptions buckets;
    if (options)
      buckets.buckets = llvm::to_vector(options->bucketSizes);
    pm.addPass(createBucketize(buckets));
  }
  if (stop == Stop::L1)
    return;
  nvidia::BuildKernelsOptions kernelOptions;
  kernelOptions.epMaxTokens = epMaxTokens;
  pm.addPass(nvidia::createBuildKernels(kernelOptions));
  if (stop == Stop::Kernels)
    return;
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
  pm.addPass(nvidia::createMarkTensorMapParams());
  pm.addPass(nvidia::createExternDynamicShared());
  // The toolkit also gives libdevice, which math functions (expf) call.
  std::string toolkit =
      cudaPath.empty() ? nvidia::defaultCudaPath() : cudaPath.str();
  GpuModuleToBinaryPassOptions toPtx;
  toPtx.toolkitPath = toolkit;
  toPtx.compilationTarget = "isa";
  pm.addPass(createGpuModuleToBinaryPass(toPtx));
  if (stop == Stop::PTX)
    return;
  nvidia::AssembleCubinOptions assemble;
  assemble.cudaPath = toolkit;
  pm.addPass(nvidia::createAssembleCubin(assemble));
}

SmallVector<std::string> moe::expertParallelArchives(StringRef runtimeArchive) {
  SmallVector<std::string> archives;
  for (StringRef file : {"libmoe_ep.a", "libmoe_transport.a"}) {
    SmallString<256> path(llvm::sys::path::parent_path(runtimeArchive));
    llvm::sys::path::append(path, file);
    archives.push_back(path.str().str());
  }
  return archives;
}

FailureOr<StringRef> moe::kernelImage(ModuleOp module) {
  for (auto binary : module.getOps<gpu::BinaryOp>())
    for (Attribute object : binary.getObjects())
      return cast<gpu::ObjectAttr>(object).getObject().getValue();
  return module.emitError() << "no kernels were compiled";
}

LogicalResult moe::compileLayer(ModuleOp module, StringRef name,
                                ArrayRef<host::ArgInfo> args, ConfigAttr config,
                                const PipelineOptions &options,
                                StringRef output, StringRef runtimeArchive) {
  PassManager pm(module.getContext());
  bool gpu = options.target == Target::SM90a;
  Stop passesStop = options.stop;
  if (passesStop == Stop::Library)
    passesStop = gpu ? Stop::Cubin : Stop::LLVM;
  if (gpu)
    buildSm90aPipeline(pm, passesStop, options.cudaPath,
                       options.fuseQuantization, options.epMaxTokens, &options);
  else
    buildCpuPipeline(pm, passesStop, options.fuseQuantization);
  if (failed(pm.run(module)))
    return failure();
  if (options.stop != Stop::Library)
    return success();
  if (!gpu) {
    bool expertParallel = config && config.getEpSize() > 1;
    SmallVector<std::string> archives, libraries;
    if (expertParallel) {
      archives = expertParallelArchives(runtimeArchive);
      libraries = {"fabric", "pthread"};
    }
    return failure(
        failed(host::addEntryPoints(module, name, args, config)) ||
        failed(host::emitSharedLibrary(module, output, archives, libraries)));
  }
  // The host side of a GPU layer: its plan carried out by launches of the
  // embedded cubin, in a module of its own.
  auto func = module.lookupSymbol<func::FuncOp>(name);
  auto plan =
      func ? func->getAttrOfType<LaunchPlanAttr>(LaunchPlanAttr::getAttrName())
           : LaunchPlanAttr();
  if (!plan)
    return module.emitError()
           << "the layer function @" << name << " has no launch plan";
  FailureOr<StringRef> cubin = moe::kernelImage(module);
  if (failed(cubin))
    return failure();
  SmallVector<LaunchPlanAttr> buckets;
  if (auto list = func->getAttrOfType<ArrayAttr>(kBucketPlansAttrName))
    for (Attribute bucket : list)
      buckets.push_back(cast<LaunchPlanAttr>(bucket));
  OwningOpRef<ModuleOp> host = ModuleOp::create(module.getLoc());
  bool expertParallel = config && config.getEpSize() > 1;
  SmallVector<std::string> archives = {runtimeArchive.str()}, libraries;
  if (expertParallel) {
    // The EP runtime calls into libmoert: it links first.
    SmallVector<std::string> ep = expertParallelArchives(runtimeArchive);
    archives = {ep[0], runtimeArchive.str(), ep[1]};
    libraries = {"fabric", "pthread"};
  }
  return failure(
      failed(host::addLaunchEntryPoints(*host, name, args, config, plan,
                                        buckets, *cubin,
                                        options.epMaxTokens)) ||
      failed(host::emitSharedLibrary(*host, output, archives, libraries)));
}

namespace {
struct Sm90aOptions : public PassPipelineOptions<Sm90aOptions> {
  Option<Stop> stopAfter{
      *this, "stop-after", llvm::cl::desc("The last stage to run"),
      llvm::cl::init(Stop::Cubin),
      llvm::cl::values(
          clEnumValN(Stop::L1, "l1", "decomposed and legalized L1 ops"),
          clEnumValN(Stop::Kernels, "kernels",
                     "gpu.module kernels and the launch plan"),
          clEnumValN(Stop::PTX, "ptx", "the kernels' PTX in a gpu.binary"),
          clEnumValN(Stop::Cubin, "cubin", "the cubin in a gpu.binary"))};
  Option<std::string> cudaPath{
      *this, "cuda-path",
      llvm::cl::desc("CUDA toolkit whose ptxas assembles (default: "
                     "$CUDA_HOME, else /usr/local/cuda)")};
};
} // namespace

void moe::registerPipelines() {
  PassPipelineRegistration<>(
      "moe-cpu-pipeline",
      "The CPU target: layers (L0 or L1) through the reference backend to "
      "the LLVM dialect",
      [](OpPassManager &pm) { buildCpuPipeline(pm); });
  PassPipelineRegistration<Sm90aOptions>(
      "moe-sm90a-pipeline",
      "The sm_90a target: layers (L0 or L1) to kernels, a launch plan and a "
      "cubin (or PTX)",
      [](OpPassManager &pm, const Sm90aOptions &options) {
        buildSm90aPipeline(pm, options.stopAfter, options.cudaPath);
      });
}
