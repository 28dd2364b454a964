//===- moe-exec.cpp - run a compiled layer on safetensors inputs ----------===//
//
// moe-exec libNAME.so --inputs in.safetensors --outputs out.safetensors
// [--repeat N]. Reads the layer's description from the library itself, checks
// every input against it by name, dtype and shape, runs the layer and writes
// its outputs. No MLIR or LLVM inside: it ships with the runtime.
//
//===----------------------------------------------------------------------===//

#include "tools/moe-exec/CpuRun.h"
#include "tools/moe-exec/EpProcesses.h"
#include "tools/moe-exec/GpuRun.h"
#include "tools/moe-exec/HostTensors.h"
#include "tools/moe-exec/LayerLibrary.h"
#include "tools/moe-exec/Options.h"

#include <cstdio>

using namespace moe::exec;

namespace {

int fail(const std::string &message) {
  std::fprintf(stderr, "moe-exec: %s\n", message.c_str());
  return 1;
}

/// Runs the layer on the inputs in `tensors`, leaving its outputs there.
/// Returns why it failed, or "" with `microseconds` the mean time per run.
std::string runLayer(const Options &options, LayerLibrary &layer,
                     HostTensors &tensors, double &microseconds) {
  if (layer.info.ep.ranks > 1)
    return runExpertParallel(layer, options.ep, options.repeat, tensors,
                             microseconds);
  allocateOutputs(layer.info.args, tensors);
  if (layer.info.onGpu())
    return runOnDevice0(layer, tensors, options.repeat, microseconds);
  return runOnCpu(layer, wholeBuffers(tensors), tensors.tokens, options.repeat,
                  nullptr, microseconds);
}

void printTime(const LayerLibrary &layer, long repeat, int64_t tokens,
               double microseconds) {
  int64_t ranks = layer.info.ep.ranks;
  if (ranks > 1)
    std::printf("%s: %ld runs, %lld tokens over %lld ranks, %.1f us per run "
                "(slowest rank)\n",
                layer.info.forward.c_str(), repeat,
                static_cast<long long>(tokens), static_cast<long long>(ranks),
                microseconds);
  else
    std::printf("%s: %ld runs, %lld tokens, %.1f us per run\n",
                layer.info.forward.c_str(), repeat,
                static_cast<long long>(tokens), microseconds);
}

} // namespace

int main(int argc, char **argv) {
  Options options;
  bool help = false;
  std::string error;
  if (!parseOptions(argc, argv, options, help, error))
    return fail(error);
  if (help) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  LayerLibrary layer;
  HostTensors tensors;
  if (!openLayerLibrary(options.library, layer, error) ||
      !checkOptionsFitLayer(options, layer.info, layer.path, error) ||
      !findForward(layer, error) ||
      !readInputs(options.inputPaths, layer.info, tensors, error))
    return fail(error);
  double microseconds = 0;
  error = runLayer(options, layer, tensors, microseconds);
  if (!error.empty())
    return fail(error);
  if (options.repeat > 1)
    printTime(layer, options.repeat, tensors.tokens, microseconds);
  if (!writeOutputs(options.outputPath, layer.info.args, tensors, error))
    return fail(error);
  return 0;
}
