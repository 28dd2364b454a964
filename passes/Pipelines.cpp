//===- Pipelines.cpp - every stage of each target, in order ---------------===//
//
// The only place a compilation is assembled: moe-opt registers the pass
// pipelines below by name and moe-compile runs compileLayer, whose --emit
// values are stops along these lists.
//
//===----------------------------------------------------------------------===//

#include "passes/Pipelines.h"

#include "codegen/host/Host.h"

#include "codegen/cpu/Passes.h"
#include "codegen/nvidia/passes/Passes.h"
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

using namespace mlir;
using namespace mlir::moe;

/// The stages every target starts with: the layer as its caller sees it,
/// then its L1 steps.
static void addLayerStages(OpPassManager &pm, const PipelineOptions &options,
                           Target target, StringRef layer) {
  ExportInterfaceOptions interface;
  interface.target = target;
  interface.layer = layer.str();
  pm.addPass(createExportInterface(interface));
  pm.addPass(createDecompose());
  if (options.train) {
    DifferentiateOptions differentiate;
    differentiate.recompute = options.trainRecompute;
    differentiate.bf16Grads = options.trainBf16Grads;
    pm.addPass(createDifferentiate(differentiate));
  }
  if (options.fuseQuantization)
    pm.addPass(createFuseQuantization());
  pm.addPass(createExpertParallel());
}

static void addSplitAttention(OpPassManager &pm,
                              const PipelineOptions &options) {
  SplitAttentionOptions attention;
  attention.pingPong = options.attentionPingPong;
  pm.addPass(createSplitAttention(attention));
}

void moe::buildCpuPipeline(OpPassManager &pm, const PipelineOptions &options,
                           StringRef layer) {
  addLayerStages(pm, options, Target::CPU, layer);
  addSplitAttention(pm, options);
  if (options.stopAfter == Stop::L1)
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

void moe::buildSm90aPipeline(OpPassManager &pm, const PipelineOptions &options,
                             StringRef layer) {
  Stop stop = options.stopAfter;
  addLayerStages(pm, options, Target::SM90a, layer);
  pm.addPass(createLegalize());
  addSplitAttention(pm, options);
  if (options.tokenBuckets.getValue().enabled) {
    BucketizeOptions buckets;
    buckets.buckets = llvm::to_vector(options.tokenBuckets.getValue().sizes);
    pm.addPass(createBucketize(buckets));
  }
  ConfigureMatmulsOptions matmuls;
  matmuls.matmulConfig = options.matmulConfig;
  pm.addPass(createConfigureMatmuls(matmuls));
  FuseLayerOptions fuse;
  fuse.maxTokens = options.fuseLayer;
  pm.addPass(createFuseLayer(fuse));
  if (stop == Stop::L1)
    return;
  nvidia::BuildKernelsOptions kernels;
  kernels.epMaxTokens = options.epMaxTokens;
  pm.addPass(nvidia::createBuildKernels(kernels));
  if (stop == Stop::Kernels)
    return;
  GpuNVVMAttachTargetOptions target;
  target.chip = "sm_90a";
  target.features = "+ptx85";
  target.optLevel = 3;
  pm.addPass(createGpuNVVMAttachTarget(target));
  OpPassManager &gpuModule = pm.nest<gpu::GPUModuleOp>();
  gpuModule.addPass(memref::createExpandStridedMetadataPass());
  gpuModule.addPass(createLowerAffinePass());
  gpuModule.addPass(createConvertNVGPUToNVVMPass());
  gpuModule.addPass(createSCFToControlFlowPass());
  gpuModule.addPass(createConvertGpuOpsToNVVMOps());
  gpuModule.addPass(createConvertNVVMToLLVMPass());
  gpuModule.addPass(createCanonicalizerPass());
  gpuModule.addPass(createCSEPass());
  gpuModule.addPass(createReconcileUnrealizedCastsPass());
  pm.addPass(nvidia::createMarkTensorMapParams());
  pm.addPass(nvidia::createExternDynamicShared());
  // The toolkit also gives libdevice, which math functions (expf) call.
  std::string toolkit = options.cudaPath.empty() ? nvidia::defaultCudaPath()
                                                 : options.cudaPath.getValue();
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

LogicalResult moe::compileLayer(ModuleOp module, StringRef name, Target target,
                                const PipelineOptions &options,
                                StringRef output, StringRef runtimeArchive) {
  PassManager pm(module.getContext());
  if (target == Target::SM90a)
    buildSm90aPipeline(pm, options, name);
  else
    buildCpuPipeline(pm, options, name);
  if (failed(pm.run(module)))
    return failure();
  if (options.stopAfter != Stop::Library)
    return success();
  FailureOr<InterfaceAttr> interface = host::findInterface(module, name);
  return failure(
      failed(interface) ||
      failed(host::emitLibrary(module, *interface, output, runtimeArchive)));
}

bool PipelineOptions::isOption(StringRef name, bool &takesValue) const {
  auto it = OptionsMap.find(name);
  if (it == OptionsMap.end())
    return false;
  takesValue = it->second->getValueExpectedFlag() == llvm::cl::ValueRequired;
  return true;
}

bool PipelineOptions::setFromFlag(StringRef name, StringRef value) {
  auto it = OptionsMap.find(name);
  return it != OptionsMap.end() &&
         !it->second->addOccurrence(/*pos=*/0, name, value);
}

raw_ostream &moe::operator<<(raw_ostream &os, const TokenBuckets &buckets) {
  if (!buckets.enabled)
    return os << "none";
  if (buckets.sizes.empty())
    return os << "default";
  llvm::interleave(buckets.sizes, os, ",");
  return os;
}

bool llvm::cl::parser<TokenBuckets>::parse(Option &o, StringRef argName,
                                           StringRef arg, TokenBuckets &value) {
  value = TokenBuckets();
  if (arg == "none") {
    value.enabled = false;
    return false;
  }
  if (arg == "default")
    return false;
  SmallVector<StringRef> items;
  arg.split(items, ',');
  for (StringRef item : items) {
    int64_t size;
    if (item.trim().getAsInteger(10, size) || size < 1 ||
        (!value.sizes.empty() && size <= value.sizes.back()))
      return o.error("takes ascending token counts of at least 1 ('default' "
                     "or 'none'), not '" +
                     arg + "'");
    value.sizes.push_back(size);
  }
  return false;
}

void llvm::cl::parser<TokenBuckets>::printOptionDiff(
    const Option &o, const TokenBuckets &value,
    const OptionValue<TokenBuckets> &, size_t globalWidth) const {
  printOptionName(o, globalWidth);
  outs() << "= " << value << "\n";
}

void llvm::cl::parser<TokenBuckets>::anchor() {}

void moe::registerPipelines() {
  PassPipelineRegistration<PipelineOptions>(
      "moe-cpu-pipeline",
      "The CPU target: layers (L0 or L1) through the reference backend to "
      "the LLVM dialect",
      [](OpPassManager &pm, const PipelineOptions &options) {
        buildCpuPipeline(pm, options);
      });
  PassPipelineRegistration<PipelineOptions>(
      "moe-sm90a-pipeline",
      "The sm_90a target: layers (L0 or L1) to kernels, a launch plan and a "
      "cubin (or PTX)",
      [](OpPassManager &pm, const PipelineOptions &options) {
        buildSm90aPipeline(pm, options);
      });
}
