//===- LayerLibrary.h - a compiled layer's library --------------*- C++ -*-===//
//
// The shared library moe-compile writes: loaded with dlopen, its layer
// described by the JSON its moe_layer_info() returns (ABI version 1), and
// the entry points a run calls looked up by the names that description
// gives.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_TOOLS_MOE_EXEC_LAYERLIBRARY_H
#define MOE_TOOLS_MOE_EXEC_LAYERLIBRARY_H

#include "runtime/Safetensors.h"
#include "runtime/moe_ep.h"

#include <cstdint>
#include <string>
#include <vector>

namespace moe::exec {

/// One argument of the layer's forward, inputs and outputs alike.
struct LayerArg {
  std::string name;
  rt::DType dtype;
  std::vector<int64_t> shape; // -1: the token count
  bool isOutput;
};

/// An expert-parallel layer's entry points; `ranks` is 1 for other layers.
struct EpInfo {
  int64_t ranks = 1;
  std::string init, finalize, status; // status: GPU layers only
};

/// What the layer's description says.
struct LayerInfo {
  std::string forward;       // the forward's symbol
  std::string target;        // "cpu", or the GPU it was compiled for
  std::string workspaceSize; // GPU layers: the symbol that sizes it
  std::vector<LayerArg> args;
  EpInfo ep;

  bool onGpu() const { return target != "cpu"; }
};

/// Reads the layer's description; false with `error` set when it is not
/// ABI version 1 or is malformed.
bool parseLayerInfo(const char *text, LayerInfo &info, std::string &error);

/// Expert weights: rank r of N takes the r-th of N slices of their experts.
bool isExpertWeight(const std::string &name);

/// What a run calls in the library. Those a run does not need stay null.
struct LayerEntries {
  void *forward = nullptr; // cast by the CPU or GPU run
  const char *(*lastError)() = nullptr;
  int64_t (*workspaceSize)(int64_t) = nullptr; // GPU layers
  // Expert-parallel layers.
  int32_t (*init)(const moe_ep_config_t *) = nullptr;
  void (*finalize)() = nullptr;
  int32_t (*status)() = nullptr; // GPU layers
};

/// A loaded layer library. It stays loaded until the process ends.
struct LayerLibrary {
  std::string path; // as named in messages
  void *handle = nullptr;
  LayerInfo info;
  LayerEntries entries;
};

/// Loads the library at `path` and reads its description; false with
/// `error` set when it cannot be loaded or is not a compiled layer.
bool openLayerLibrary(const std::string &path, LayerLibrary &layer,
                      std::string &error);

/// Looks up the forward; false with `error` set when it is missing.
bool findForward(LayerLibrary &layer, std::string &error);

/// Looks up what a one-rank GPU run calls besides the forward.
bool findGpuEntries(LayerLibrary &layer, std::string &error);

/// Looks up what an expert-parallel rank calls besides the forward.
bool findEpEntries(LayerLibrary &layer, std::string &error);

} // namespace moe::exec

#endif // MOE_TOOLS_MOE_EXEC_LAYERLIBRARY_H
