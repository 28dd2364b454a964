//===- Options.h - moe-exec's command line ----------------------*- C++ -*-===//
//
// What the command line asks for, and whether it fits the layer the library
// holds: its expert-parallel rank count and the device it was compiled for.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_TOOLS_MOE_EXEC_OPTIONS_H
#define MOE_TOOLS_MOE_EXEC_OPTIONS_H

#include <string>
#include <vector>

namespace moe::exec {

struct LayerInfo;

/// The --help text.
extern const char *const kUsage;

/// How the ranks of an expert-parallel layer run (--ep-*).
struct EpOptions {
  long ranks = 0;      // 0: not given
  long timeoutMs = 0;  // 0: the runtime's default
  long maxTokens = -1; // -1: the largest slice of the tokens
  bool proxy = false;  // GPU layers: exchange through host memory
  std::string domain;  // empty: the provider's default
};

struct Options {
  std::string library, outputPath;
  std::string device; // empty: the layer's target
  std::vector<std::string> inputPaths;
  long repeat = 1;
  EpOptions ep;
};

/// Reads argv into `options`. False with `error` set when it is malformed;
/// `help` set when --help comes before any error (the rest is not read).
bool parseOptions(int argc, char **argv, Options &options, bool &help,
                  std::string &error);

/// Checks that `options` fit the layer described by `info`, loaded from
/// `library`; false with `error` set otherwise.
bool checkOptionsFitLayer(const Options &options, const LayerInfo &info,
                          const std::string &library, std::string &error);

} // namespace moe::exec

#endif // MOE_TOOLS_MOE_EXEC_OPTIONS_H
