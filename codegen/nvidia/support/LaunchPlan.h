//===- LaunchPlan.h - a layer's launch plan under construction --*- C++ -*-===//
//
// The kernel builder records, kernel by kernel, the buffers each one reads
// and writes, its grid and the TMA descriptors it needs; the result is a
// #moe.launch_plan attribute on the layer's function, which the host code
// (codegen/host/LaunchEntry.cpp) carries out on a stream.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_CODEGEN_NVIDIA_SUPPORT_LAUNCHPLAN_H
#define MOE_CODEGEN_NVIDIA_SUPPORT_LAUNCHPLAN_H

#include "dialects/moe/MoeDialect.h"

#include <deque>
#include <map>
#include <string>

namespace mlir::moe::nvidia {

/// One launch, filled in while its kernel is built.
struct Launch {
  std::string kernel;
  /// Blocks along x: ceil(work / perBlock) + extraBlocks.
  TokenLinear work;
  int64_t perBlock = 1, extraBlocks = 0;
  /// Blocks along x for `tokens` tokens.
  int64_t gridX(int64_t tokens) const {
    return llvm::divideCeil(work.fixed + work.perToken * tokens, perBlock) +
           extraBlocks;
  }
  int64_t gridY = 1, block = 128, sharedBytes = 0;
  /// The kernel strides over its blocks' work; at most one block per
  /// multiprocessor is launched.
  bool persistent = false;
  /// Blocks of a cluster along x: each block of the count above becomes a
  /// cluster of this many.
  int64_t cluster = 1;
  /// The blocks wait for each other: all must be resident (a cooperative
  /// launch).
  bool cooperative = false;
  /// The kernel only prefetches into L2 (writes nothing): in a fused
  /// kernel the next step need not wait for it.
  bool prefetchOnly = false;
  /// The f32 accumulators (FP8: and partials) a thread of a matmul tile
  /// keeps (0 elsewhere): what decides whether a fused kernel fits two
  /// tiles a block.
  int64_t accumulators = 0;
  SmallVector<KernelArg> args;
};

class LaunchPlan {
public:
  explicit LaunchPlan(MLIRContext *ctx) : ctx(ctx) {}

  /// The buffer of the caller's argument `arg`.
  unsigned addArgument(int64_t arg);
  /// A new workspace slice of `bytes`.
  unsigned addWorkspace(TokenLinear bytes);
  /// The expert-parallel state at `offset` (runtime/EpLayout.h).
  unsigned addEpState(int64_t offset);
  /// A TMA descriptor of buffer `buffer` read as a row-major [rows, cols]
  /// matrix in [boxRows, boxCols] tiles.
  unsigned addTensorMap(unsigned buffer, int64_t elementBytes, TokenLinear rows,
                        int64_t cols, int64_t boxRows, int64_t boxCols);
  /// The same with rows `rowStride` elements apart and dimensions beyond
  /// the rows, innermost first, as (size, stride, box) triples.
  unsigned addTensorMap(unsigned buffer, int64_t elementBytes, int64_t rows,
                        int64_t rowStride, int64_t cols, int64_t boxRows,
                        int64_t boxCols, ArrayRef<int64_t> outer);
  Launch &addLaunch();
  /// The launches so far, in order.
  std::deque<Launch> &getLaunches() { return launches; }
  /// Whether buffer `buffer` is one of the caller's arguments.
  bool isArgument(unsigned buffer) const {
    return cast<PlanBufferAttr>(buffers[buffer]).getKind() ==
           BufferKind::Argument;
  }
  /// Launches kernel `to` wherever a launch named a key `from`.
  void renameKernels(const std::map<std::string, std::string> &renamed);

  LaunchPlanAttr toAttr() const;

  /// A buffer of `count` i32 counters in the workspace header, which the
  /// host sets to the token count before each call.
  unsigned addCounters(int64_t count);

  /// The most tokens the plan serves (a bucket), 0 for any.
  int64_t maxTokens = 0;
  int64_t counters = 0;

private:
  MLIRContext *ctx;
  SmallVector<Attribute> buffers, tensorMaps;
  // A deque: kernels under construction hold references to their launch.
  std::deque<Launch> launches;
};

} // namespace mlir::moe::nvidia

#endif // MOE_CODEGEN_NVIDIA_SUPPORT_LAUNCHPLAN_H
