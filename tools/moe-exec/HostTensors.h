//===- HostTensors.h - the layer's arguments in host memory -----*- C++ -*-===//
//
// Inputs read from safetensors files and checked against the layer by name,
// dtype and shape; outputs sized for the token count and written to one
// safetensors file.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_TOOLS_MOE_EXEC_HOSTTENSORS_H
#define MOE_TOOLS_MOE_EXEC_HOSTTENSORS_H

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace moe::exec {

struct LayerArg;
struct LayerInfo;

/// One buffer per argument of the layer, in its order.
struct HostTensors {
  std::vector<std::vector<uint8_t>> storage;
  int64_t tokens = 0;
};

/// Part of one argument's buffer: what a run reads (input) or writes
/// (output) there.
struct HostSpan {
  uint8_t *data;
  size_t bytes;
};

/// Every argument's buffer whole.
std::vector<HostSpan> wholeBuffers(HostTensors &tensors);

/// Reads every input of the layer `info` describes from the files at
/// `paths`: each tensor in one file only, each file's tensors all inputs.
/// False with `error` set when one is missing, extra or does not fit.
bool readInputs(const std::vector<std::string> &paths, const LayerInfo &info,
                HostTensors &tensors, std::string &error);

/// Sizes the outputs' buffers (zeroed) for `tensors.tokens`.
void allocateOutputs(const std::vector<LayerArg> &args, HostTensors &tensors);

/// Writes the outputs' buffers to `path`; false with `error` set on failure.
bool writeOutputs(const std::string &path, const std::vector<LayerArg> &args,
                  const HostTensors &tensors, std::string &error);

} // namespace moe::exec

#endif // MOE_TOOLS_MOE_EXEC_HOSTTENSORS_H
