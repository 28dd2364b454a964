//===- KernelBuilder.h - building a layer's sm_90a kernels ------*- C++ -*-===//
//
// The calling convention every kernel shares: a gpu.func takes only buffer
// addresses, TMA descriptors (by value) and, last, the token count; it builds
// its memref views itself, so the host passes neither sizes nor strides.
// LayerKernels holds what the kernels of one layer function share: the
// buffer behind each tensor, the launch plan and the kernel names. Each
// kernel family is built by a function in its own file.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_CODEGEN_NVIDIA_SUPPORT_KERNELBUILDER_H
#define MOE_CODEGEN_NVIDIA_SUPPORT_KERNELBUILDER_H

#include "codegen/common/Emitter.h"
#include "codegen/nvidia/support/LaunchPlan.h"
#include "codegen/nvidia/support/Sm90a.h"
#include "dialects/moe/MoeOps.h"

#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "llvm/ADT/StringSet.h"

#include <map>

namespace mlir::moe::nvidia {

using common::Emitter;

/// Lists a kernel's arguments that are TMA descriptors passed by value;
/// moe-mark-tensor-map-params makes them byval + nvvm.grid_constant once the
/// kernel is an LLVM function.
constexpr const char kTensorMapArgs[] = "moe.tensor_map_args";

/// What a tensor of the layer function lives in on the device.
struct TensorInfo {
  unsigned buffer;
  MemRefType type;  // Row-major; FP8 codes as i8.
  TokenLinear rows; // The leading dimension, when it is dynamic.

  /// The rows for a call: the dynamic count, or the static size.
  TokenLinear rowCount() const {
    return type.isDynamicDim(0) ? rows : TokenLinear{type.getDimSize(0), 0};
  }
};

/// An empty kernel `name` at the end of `module` taking `args` (addresses,
/// TMA descriptors marked by value) and, last, the token count's address.
gpu::GPUFuncOp createKernelFunc(OpBuilder &b, gpu::GPUModuleOp module,
                                StringRef name, ArrayRef<KernelArg> args,
                                Location loc);
/// `name`, or `name`_1, _2, ...: the first not yet in `names`, added.
std::string uniqueKernelName(llvm::StringSet<> &names, StringRef name);

/// A gpu.func under construction and its launch.
class Kernel {
public:
  /// With `skipWord` >= 0, the kernel runs only while the i32 that many
  /// bytes past its last argument's address is 0.
  Kernel(gpu::GPUModuleOp module, StringRef name, Launch &launch,
         ArrayRef<KernelArg> args, Location loc, int64_t skipWord = -1);

  /// The memref view of parameter `i`, a buffer of `info`.
  Value view(unsigned i, const TensorInfo &info);
  /// The TMA descriptor parameter `i` as a value of `type`.
  Value tensorMap(unsigned i, Type type);
  /// fixed + perToken * T, as an index.
  Value linear(TokenLinear l);
  Value constI64(int64_t v);
  Value threadId();
  Value blockId(gpu::Dimension d);
  /// A shared-memory buffer, 16-byte aligned so vector accesses the code
  /// generator forms within it are aligned too.
  Value workgroupBuffer(ArrayRef<int64_t> shape, Type element);
  /// The rest of the kernel runs only where `condition` holds (a block past
  /// the call's tokens, whose grid was sized for a bucket, exits).
  void onlyIf(Value condition);
  /// Ends the kernel; fails, naming `op`, if its static shared memory exceeds
  /// what a kernel gets without opting in.
  LogicalResult finish(Operation *op);

  OpBuilder b;
  Emitter e;
  gpu::GPUFuncOp func;
  Value tokens;
  Launch &launch;

private:
  int64_t staticSharedBytes = 0;
  Operation *guard = nullptr;
};

/// The kernels of one layer function, built op by op in order.
class LayerKernels {
public:
  /// Kernels go into `module`, named uniquely among `names`; `maxTokens`
  /// is the most tokens the plan serves (a bucket), 0 for any.
  LayerKernels(gpu::GPUModuleOp module, LaunchPlan &plan,
               llvm::StringSet<> &names, int64_t maxTokens = 0)
      : plan(plan), maxTokens(maxTokens), module(module), names(names) {}

  /// Records that `tensor` lives in buffer `buffer`.
  void bind(Value tensor, unsigned buffer, TokenLinear rows);
  /// Makes `result` (returned to the caller) live in the output argument
  /// `arg`.
  void bindOutput(Value result, int64_t arg) { outputArgs[result] = arg; }
  bool isOutput(Value result) const { return outputArgs.count(result); }

  /// The buffer for `result`, whose leading dimension (if dynamic) is
  /// `rows`: the caller's output buffer or a new workspace slice.
  const TensorInfo &define(Value result, TokenLinear rows);
  const TensorInfo &info(Value v) { return tensors.find(v)->second; }

  /// Where a kernel that reads `tensor` with TMA finds it. A bucket's graph
  /// encodes its descriptors for the bucket's size, which may be more rows
  /// than a caller's argument has: such an argument is first copied (its
  /// call's rows, by a kernel built for `op`) into a workspace slice of the
  /// bucket's size, whose rows past the call's are never stored.
  FailureOr<TensorInfo> tmaSource(Operation *op, Value tensor);

  /// A kernel of `family` for `op`, reading and writing `buffers` (in that
  /// parameter order) and then the TMA descriptors `maps`. Its name is
  /// moe_<family>[_<step>], the step being the op's name location (as
  /// moe-decompose sets it) unless the family names it already, made unique
  /// in the module.
  Kernel kernel(Operation *op, StringRef family, ArrayRef<Value> buffers,
                ArrayRef<unsigned> maps = {});
  /// The same, its parameters plan buffers by index.
  Kernel kernelOn(Operation *op, StringRef family,
                  ArrayRef<unsigned> bufferIndices,
                  ArrayRef<unsigned> maps = {});

  /// The plan buffer of the expert-parallel state at `offset`.
  unsigned epState(int64_t offset = 0) {
    auto [it, added] = epStateBuffers.try_emplace(offset, 0);
    if (added)
      it->second = plan.addEpState(offset);
    return it->second;
  }
  /// The compiled capacity of an expert-parallel layer: the most tokens a
  /// rank passes to one forward.
  int64_t epMaxTokens = 4096;
  /// The layer exchanges tokens with other ranks.
  bool expertParallel = false;
  /// Set once a backward's first exchange has waited: its kernels (but the
  /// exchanges') then run only while the group's state records no failure,
  /// so a failed step writes no gradient.
  bool skipAfterEpFailure = false;

  LaunchPlan &plan;
  /// The bucket being built: the most tokens a call brings, 0 for any. A
  /// family may specialize its kernels to it.
  const int64_t maxTokens;
  /// The kernels become steps of one fused kernel (moe-fuse-layer): none
  /// may take more than kFusedStepThreads threads.
  bool fused = false;
  static constexpr int64_t kFusedStepThreads = 256;

private:
  std::string uniqueName(std::string name);

  gpu::GPUModuleOp module;
  DenseMap<Value, TensorInfo> tensors;
  DenseMap<Value, int64_t> outputArgs;
  DenseMap<Value, TensorInfo> staged;
  std::map<int64_t, unsigned> epStateBuffers;
  llvm::StringSet<> &names;
};

/// The alignment of `width` elements: buffers are 16-byte aligned and rows a
/// multiple of the vector, so whole vectors are naturally aligned.
llvm::MaybeAlign vectorAlign(int64_t width, Type element);

/// The widest vector (8 or 1 elements) that rows of `rowElements` 16-bit
/// elements split into evenly.
inline int64_t vectorWidth(int64_t rowElements) {
  return rowElements % 8 == 0 ? 8 : 1;
}

/// `width` consecutive elements of `buffer` at `index`, as f32.
Value loadF32Vector(Emitter &e, Value buffer, ValueRange index, int64_t width);

/// `v` combined across the 32 lanes of a warp by an xor butterfly
/// (offsets 16 down to 1), each step combine(v, the partner's v); every
/// lane gets the result. Every lane of the warp must execute it.
Value warpButterfly(Emitter &e, Value v,
                    function_ref<Value(Value, Value)> combine);

/// Combines a quantization block's statistics (amax, special; see
/// common::blockStats) across groups of `lanes` consecutive lanes of a warp
/// (a power of two up to 32): every lane of the group gets the block's.
/// Every lane of the warp must execute it.
void reduceBlockStats(Emitter &e, Value &amax, Value &special, int64_t lanes);

/// Quantizes `values` (a vector of bf16), this lane's part of a block held by
/// groups of `lanes` consecutive lanes: returns the vector of E4M3 codes
/// (i8) and the block's stored scale (every lane of the group gets it).
/// Every lane of the warp must execute it.
std::pair<Value, Value> quantizeVector(Emitter &e, QuantAttr scheme,
                                       Value values, int64_t lanes);

} // namespace mlir::moe::nvidia

#endif // MOE_CODEGEN_NVIDIA_SUPPORT_KERNELBUILDER_H
