//===- Pipelines.h - every stage of each target, in order -------*- C++ -*-===//

#ifndef MOE_PASSES_PIPELINES_H
#define MOE_PASSES_PIPELINES_H

#include "codegen/host/Host.h"

#include "mlir/Pass/PassManager.h"

#include <string>

namespace mlir::moe {

enum class Target { CPU, SM90a };

/// Where a compilation stops, in pipeline order. A target skips the stops it
/// has not got (the CPU has no kernels, PTX or cubin).
enum class Stop {
  L1,      // Decomposed into L1 ops (and legalized for the target).
  Kernels, // sm_90a: gpu.module kernels and the launch plan beside the L1 ops.
  PTX,     // sm_90a: the kernels' PTX in a gpu.binary.
  Cubin,   // sm_90a: the cubin in a gpu.binary.
  LLVM,    // CPU: the layer function in the LLVM dialect.
  Library, // The shared library with its C entry points.
};

struct PipelineOptions {
  Target target = Target::CPU;
  Stop stop = Stop::Library;
  /// The CUDA toolkit whose ptxas assembles (empty: $CUDA_HOME, else
  /// /usr/local/cuda).
  std::string cudaPath;
  /// moe-fuse-quantization runs; off only to check that fusing changes no
  /// bit of the result.
  bool fuseQuantization = true;
  /// An expert-parallel GPU layer's capacity: the most tokens a rank
  /// passes to one forward.
  int64_t epMaxTokens = 4096;
  /// sm_90a: token buckets (moe-bucketize), ascending; empty: its default.
  bool tokenBuckets = true;
  SmallVector<int64_t> bucketSizes;
  /// Attention's row groups take turns on the tensor cores
  /// (moe-split-attention's ping-pong); off only to measure what it buys.
  bool pingPong = true;
};

/// Appends the CPU target's passes: a layer (L0 or L1) to the LLVM dialect,
/// or to `stop`.
void buildCpuPipeline(OpPassManager &pm, Stop stop = Stop::LLVM,
                      bool fuseQuantization = true);

/// Appends the sm_90a target's passes up to `stop` (at most Cubin).
/// Without `options`, the defaults (buckets on).
void buildSm90aPipeline(OpPassManager &pm, Stop stop = Stop::Cubin,
                        StringRef cudaPath = "", bool fuseQuantization = true,
                        int64_t epMaxTokens = 4096,
                        const PipelineOptions *options = nullptr);

/// Compiles `module`, whose one layer function `name` has the C arguments
/// `args`, through every stage of `options.target` up to `options.stop`.
/// At Stop::Library the shared library is written to `output`, with the
/// runtime archive `runtimeArchive` linked into GPU layers, and beside it
/// the expert-parallel runtime and lib/transport (libmoe_ep.a,
/// libmoe_transport.a) into expert-parallel CPU layers; before it the
/// module is left at the stop.
/// The archives an expert-parallel CPU layer links, beside `runtimeArchive`.
SmallVector<std::string> expertParallelArchives(StringRef runtimeArchive);

LogicalResult compileLayer(ModuleOp module, StringRef name,
                           ArrayRef<host::ArgInfo> args, ConfigAttr config,
                           const PipelineOptions &options, StringRef output,
                           StringRef runtimeArchive);

/// The one object (PTX or cubin) of the module's gpu.binary, or an error.
FailureOr<StringRef> kernelImage(ModuleOp module);

/// Registers moe-cpu-pipeline and moe-sm90a-pipeline for moe-opt.
void registerPipelines();

} // namespace mlir::moe

#endif // MOE_PASSES_PIPELINES_H
