//===- CpuRun.h - running a CPU layer ---------------------------*- C++ -*-===//

#ifndef MOE_TOOLS_MOE_EXEC_CPURUN_H
#define MOE_TOOLS_MOE_EXEC_CPURUN_H

#include "tools/moe-exec/HostTensors.h"

#include "runtime/moe_ep.h"

#include <string>
#include <vector>

namespace moe::exec {

struct LayerLibrary;

/// Runs the layer's forward `repeat` times over `tokens` tokens, on the
/// arguments at `args` (one per argument of the layer). With `group`, as
/// one rank of an expert-parallel layer: its init first, its finalize after.
/// Returns why it failed, or "" with `microseconds` the mean time per run.
std::string runOnCpu(const LayerLibrary &layer,
                     const std::vector<HostSpan> &args, int64_t tokens,
                     long repeat, const moe_ep_config_t *group,
                     double &microseconds);

} // namespace moe::exec

#endif // MOE_TOOLS_MOE_EXEC_CPURUN_H
