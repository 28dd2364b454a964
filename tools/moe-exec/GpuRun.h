//===- GpuRun.h - running a GPU layer ---------------------------*- C++ -*-===//
//
// The arguments are copied to the GPU, the layer runs on the default stream
// with a workspace of the size it asks for, and the outputs are copied
// back: the same for a one-rank layer and for each rank of an
// expert-parallel one.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_TOOLS_MOE_EXEC_GPURUN_H
#define MOE_TOOLS_MOE_EXEC_GPURUN_H

#include "tools/moe-exec/HostTensors.h"

#include "runtime/moe_ep.h"

#include <string>
#include <vector>

namespace moe::exec {

struct LayerLibrary;

/// Runs a one-rank layer `repeat` times on device 0, its outputs copied
/// back into `tensors` (sized). Returns why it failed, or "" with
/// `microseconds` the mean time per run.
std::string runOnDevice0(LayerLibrary &layer, HostTensors &tensors, long repeat,
                         double &microseconds);

/// Runs rank `config.rank` of an expert-parallel layer on GPU rank mod
/// (GPUs present): init, one untimed forward when `repeat` > 1, `repeat`
/// timed ones, finalize. Its inputs are read from `args`, its outputs
/// copied back there. Returns why it failed, or "" with `microseconds` the
/// mean time per timed run.
std::string runRankOnGpu(const LayerLibrary &layer,
                         const std::vector<HostSpan> &args, int64_t tokens,
                         long repeat, const moe_ep_config_t &config,
                         double &microseconds);

} // namespace moe::exec

#endif // MOE_TOOLS_MOE_EXEC_GPURUN_H
