//===- Pipelines.h - every stage of each target, in order -------*- C++ -*-===//

#ifndef MOE_PASSES_PIPELINES_H
#define MOE_PASSES_PIPELINES_H

#include "dialects/moe/MoeDialect.h"

#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassOptions.h"

#include <string>

namespace mlir::moe {

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

/// moe-bucketize's buckets as a pipeline option: `default` (1, 2, 4, ...,
/// 4096), `none`, or ascending counts `N,N,...`.
struct TokenBuckets {
  bool enabled = true;
  SmallVector<int64_t> sizes; // empty: the default
  bool operator==(const TokenBuckets &o) const {
    return enabled == o.enabled && sizes == o.sizes;
  }
};
raw_ostream &operator<<(raw_ostream &os, const TokenBuckets &buckets);
} // namespace mlir::moe

namespace llvm::cl {
/// Parses `default`, `none` or ascending counts of at least 1.
template <>
class parser<mlir::moe::TokenBuckets>
    : public basic_parser<mlir::moe::TokenBuckets> {
public:
  parser(Option &o) : basic_parser(o) {}
  bool parse(Option &o, StringRef argName, StringRef arg,
             mlir::moe::TokenBuckets &value);
  StringRef getValueName() const override { return "N,N,...|default|none"; }
  void printOptionDiff(const Option &o, const mlir::moe::TokenBuckets &value,
                       const OptionValue<mlir::moe::TokenBuckets> &defaultValue,
                       size_t globalWidth) const;
  void anchor() override;
};
} // namespace llvm::cl

namespace mlir::moe {

/// Every option of a compilation, for both tools: moe-opt takes them as the
/// options of --moe-cpu-pipeline and --moe-sm90a-pipeline, moe-compile as
/// flags of the same names (`--token-buckets=1,8`), so a library can be
/// rebuilt stage by stage.
struct PipelineOptions : public PassPipelineOptions<PipelineOptions> {
  Option<Stop> stopAfter{
      *this, "stop-after",
      llvm::cl::desc("The last stage to run (default: cubin for sm_90a, llvm "
                     "for the CPU)"),
      llvm::cl::init(Stop::Library),
      llvm::cl::values(
          clEnumValN(Stop::L1, "l1", "decomposed and legalized L1 ops"),
          clEnumValN(Stop::Kernels, "kernels",
                     "gpu.module kernels and the launch plan"),
          clEnumValN(Stop::PTX, "ptx", "the kernels' PTX in a gpu.binary"),
          clEnumValN(Stop::Cubin, "cubin", "the cubin in a gpu.binary"),
          clEnumValN(Stop::LLVM, "llvm", "the CPU layer in the LLVM dialect"))};
  Option<std::string> cudaPath{
      *this, "cuda-path",
      llvm::cl::desc("CUDA toolkit whose ptxas assembles the kernels "
                     "(default: $CUDA_HOME, else /usr/local/cuda)")};
  Option<bool> train{
      *this, "train",
      llvm::cl::desc("Also build the layer's training forward and backward "
                     "(moe-differentiate: @<layer>_train, @<layer>_backward)"),
      llvm::cl::init(false)};
  Option<bool> trainRecompute{
      *this, "train-recompute",
      llvm::cl::desc("With train: the backward recomputes each gate/up "
                     "matmul's output rather than the forward saving it"),
      llvm::cl::init(false)};
  Option<bool> trainBf16Grads{
      *this, "train-bf16-grads",
      llvm::cl::desc("With train: the backward writes weights' and biases' "
                     "gradients in bf16, as the weights are, rather than "
                     "f32 (half their memory)"),
      llvm::cl::init(false)};
  Option<bool> fuseQuantization{
      *this, "fuse-quantization",
      llvm::cl::desc("Quantize activations in the kernels that produce them "
                     "(moe-fuse-quantization; default on). Off, each "
                     "quantize is a step of its own: for checking that "
                     "fusing changes nothing"),
      llvm::cl::init(true)};
  Option<int64_t> epMaxTokens{
      *this, "ep-max-tokens",
      llvm::cl::desc("An expert-parallel sm_90a layer's capacity: the most "
                     "tokens a rank passes to one forward (default 4096, at "
                     "most 2^20); it sizes the receive buffers, and init "
                     "refuses a larger max_tokens"),
      llvm::cl::init(4096)};
  Option<TokenBuckets> tokenBuckets{
      *this, "token-buckets",
      llvm::cl::desc("sm_90a: ascending token counts, comma-separated, each "
                     "given kernels specialized to it and a CUDA graph "
                     "replayed for calls of at most its tokens "
                     "(moe-bucketize); 'default' (1, 2, 4, ..., 4096) or "
                     "'none'"),
      llvm::cl::init(TokenBuckets())};
  Option<std::string> matmulConfig{
      *this, "matmul-config",
      llvm::cl::desc("sm_90a: fields pinned on every grouped matmul's "
                     "kernel configuration, as comma-separated key=value "
                     "pairs (tile=MxNxK, stages, warpgroups, cluster=MxN, "
                     "multicast, raster, group, split-k, swap-ab, "
                     "persistent, epilogue; moe-configure-matmuls); the "
                     "rest is the cost model's"),
      llvm::cl::init("")};
  Option<int64_t> fuseLayer{
      *this, "fuse-layer",
      llvm::cl::desc("sm_90a: the largest token bucket whose layer runs as "
                     "one persistent kernel instead of a chain "
                     "(moe-fuse-layer; 0, the default: none)"),
      // Off until the fused kernel beats the chain it replaces: measured
      // 3-19% slower at 1-64 tokens (bench/RESULTS.md).
      llvm::cl::init(0)};
  Option<bool> attentionPingPong{
      *this, "attention-ping-pong",
      llvm::cl::desc("Attention's two row groups take turns, one's matmuls "
                     "beside the other's softmax (moe-split-attention; "
                     "default on). Off measures what the overlap buys"),
      llvm::cl::init(true)};

  /// Whether `name` is one of the options, and whether it needs a value.
  bool isOption(StringRef name, bool &takesValue) const;
  /// Sets option `name` from a command-line `value` as cl would; false,
  /// with cl's message, if the value is not one it takes.
  bool setFromFlag(StringRef name, StringRef value);
};

/// Appends the CPU target's passes: a layer (L0 or L1) to the LLVM dialect,
/// or to `options.stopAfter`. `layer` names the function a library is built
/// of (moe-export-interface's option).
void buildCpuPipeline(OpPassManager &pm, const PipelineOptions &options,
                      StringRef layer = "");

/// Appends the sm_90a target's passes up to `options.stopAfter` (at most
/// the cubin).
void buildSm90aPipeline(OpPassManager &pm, const PipelineOptions &options,
                        StringRef layer = "");

/// Compiles `module`, whose one layer function is `name`, for `target`
/// through every stage up to `options.stopAfter`. At Stop::Library the
/// shared library and its header are written to `output` (libNAME.so,
/// libNAME.h), linked with the runtime archive `runtimeArchive`
/// (libmoert.a) and the expert-parallel ones beside it where it needs
/// them; before it the module is left at the stop.
LogicalResult compileLayer(ModuleOp module, StringRef name, Target target,
                           const PipelineOptions &options, StringRef output,
                           StringRef runtimeArchive);

/// Registers moe-cpu-pipeline and moe-sm90a-pipeline for moe-opt.
void registerPipelines();

} // namespace mlir::moe

#endif // MOE_PASSES_PIPELINES_H
