//===- LaunchPlan.cpp - a layer's launch plan under construction ----------===//

#include "codegen/nvidia/support/LaunchPlan.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::nvidia;

unsigned LaunchPlan::addArgument(int64_t arg) {
  buffers.push_back(
      PlanBufferAttr::get(ctx, BufferKind::Argument, arg, TokenLinear()));
  return buffers.size() - 1;
}

unsigned LaunchPlan::addWorkspace(TokenLinear bytes) {
  buffers.push_back(PlanBufferAttr::get(ctx, BufferKind::Workspace, 0, bytes));
  return buffers.size() - 1;
}

unsigned LaunchPlan::addEpState(int64_t offset) {
  buffers.push_back(
      PlanBufferAttr::get(ctx, BufferKind::EpState, 0, TokenLinear{offset, 0}));
  return buffers.size() - 1;
}

unsigned LaunchPlan::addCounters(int64_t count) {
  // After the token count: word 1 + counters.
  buffers.push_back(PlanBufferAttr::get(ctx, BufferKind::Counters, 0,
                                        TokenLinear{4 + 4 * counters, 0}));
  counters += count;
  return buffers.size() - 1;
}

unsigned LaunchPlan::addTensorMap(unsigned buffer, int64_t elementBytes,
                                  TokenLinear rows, int64_t cols,
                                  int64_t boxRows, int64_t boxCols) {
  tensorMaps.push_back(TensorMapAttr::get(ctx, buffer, elementBytes, rows, cols,
                                          boxRows, boxCols, 0, {}));
  return tensorMaps.size() - 1;
}

unsigned LaunchPlan::addTensorMap(unsigned buffer, int64_t elementBytes,
                                  int64_t rows, int64_t rowStride, int64_t cols,
                                  int64_t boxRows, int64_t boxCols,
                                  ArrayRef<int64_t> outer) {
  tensorMaps.push_back(TensorMapAttr::get(ctx, buffer, elementBytes,
                                          TokenLinear{rows, 0}, cols, boxRows,
                                          boxCols, rowStride, outer));
  return tensorMaps.size() - 1;
}

Launch &LaunchPlan::addLaunch() {
  launches.emplace_back();
  return launches.back();
}

void LaunchPlan::renameKernels(
    const std::map<std::string, std::string> &renamed) {
  for (Launch &l : launches) {
    auto it = renamed.find(l.kernel);
    if (it != renamed.end())
      l.kernel = it->second;
  }
}

LaunchPlanAttr LaunchPlan::toAttr() const {
  Builder b(ctx);
  SmallVector<Attribute> launchAttrs;
  for (const Launch &l : launches)
    launchAttrs.push_back(KernelLaunchAttr::get(
        ctx, FlatSymbolRefAttr::get(ctx, l.kernel), l.work, l.perBlock,
        l.extraBlocks, l.gridY, l.block, l.sharedBytes, l.args, l.persistent,
        l.cluster, l.cooperative));
  return LaunchPlanAttr::get(ctx, b.getArrayAttr(buffers),
                             b.getArrayAttr(tensorMaps),
                             b.getArrayAttr(launchAttrs), maxTokens, counters);
}
