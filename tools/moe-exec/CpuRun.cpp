//===- CpuRun.cpp - running a CPU layer -----------------------------------===//

#include "tools/moe-exec/CpuRun.h"
#include "tools/moe-exec/LayerLibrary.h"

#include <chrono>

using namespace moe::exec;

std::string moe::exec::runOnCpu(const LayerLibrary &layer,
                                const std::vector<HostSpan> &args,
                                int64_t tokens, long repeat,
                                const moe_ep_config_t *group,
                                double &microseconds) {
  const LayerEntries &entries = layer.entries;
  auto forward =
      reinterpret_cast<int32_t (*)(void *const *, int64_t)>(entries.forward);
  std::vector<void *> pointers;
  for (const HostSpan &arg : args)
    pointers.push_back(arg.data);
  if (group && entries.init(group) != 0)
    return std::string("init failed: ") + entries.lastError();
  auto start = std::chrono::steady_clock::now();
  for (long run = 0; run < repeat; ++run)
    if (int32_t status = forward(pointers.data(), tokens)) {
      // A one-rank CPU layer exports no moe_last_error.
      if (!group)
        return layer.info.forward + " failed with status " +
               std::to_string(status);
      std::string why = entries.lastError();
      entries.finalize();
      return layer.info.forward + " failed: " + why;
    }
  microseconds = std::chrono::duration<double, std::micro>(
                     std::chrono::steady_clock::now() - start)
                     .count() /
                 double(repeat);
  if (group)
    entries.finalize();
  return "";
}
