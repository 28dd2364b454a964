//===- Options.cpp - moe-exec's command line ------------------------------===//

#include "tools/moe-exec/Options.h"
#include "tools/moe-exec/LayerLibrary.h"

#include <climits>
#include <cstdlib>

using namespace moe::exec;

const char *const moe::exec::kUsage =
    "usage: moe-exec LIBRARY.so --inputs IN.safetensors [--inputs ...] "
    "--outputs OUT.safetensors [--repeat N] [--device=cpu|cuda]\n"
    "\n"
    "Runs a layer compiled by moe-compile. The inputs files hold, between\n"
    "them, one tensor per input the layer takes, named as its header says\n"
    "(hidden_states [T, H] bf16, router_weight, w13, w2, ...; moe-pack writes\n"
    "a checkpoint layer's weights); T may be 0. OUT receives the outputs\n"
    "(out [T, H] bf16). --repeat N runs the layer N times and prints the mean\n"
    "time per run.\n"
    "\n"
    "A layer compiled for a GPU (moe-compile --target=sm_90a) runs with\n"
    "--device=cuda on device 0: inputs are copied there, the layer runs on "
    "the\n"
    "default stream with a workspace of the size it asks for, and the outputs\n"
    "are copied back. --device defaults to the layer's target.\n"
    "\n"
    "--ep-ranks N runs a layer compiled with ep_size N (expert parallel) as N\n"
    "local processes connected over libfabric (the provider FI_PROVIDER\n"
    "names, else shm; --ep-domain picks its domain, e.g. lo for tcp).\n"
    "The inputs are those of the whole layer, all experts' weights\n"
    "included: rank r takes the r-th of N near-equal contiguous slices of\n"
    "the tokens (the first T mod N ranks one more) and its experts' slice\n"
    "of each expert weight. The output is written whole, in token order.\n"
    "--ep-timeout-ms bounds each wait on a peer (default 30000);\n"
    "--ep-max-tokens sizes the buffers for that many tokens per rank\n"
    "(default: the largest slice); --ep-proxy moves a GPU layer's tokens\n"
    "through host memory and the transport's proxy, as between hosts.\n";

namespace {

/// Reads `text` whole as a decimal integer into `into`; false when it is
/// not one or lies outside [least, most].
bool parseCount(const std::string &text, long least, long most, long &into) {
  char *end = nullptr;
  into = std::strtol(text.c_str(), &end, 10);
  return into >= least && *end == '\0' && into <= most;
}

/// Reads the argument `a` (with its value, argv[i + 1], when it takes one)
/// into `options`. Returns why it is malformed, or "".
std::string parseArgument(const std::string &a, int argc, char **argv, int &i,
                          Options &options) {
  auto value = [&](std::string &into) {
    if (i + 1 >= argc)
      return false;
    into = argv[++i];
    return true;
  };
  std::string text;
  EpOptions &ep = options.ep;
  if (a == "--inputs") {
    if (!value(text))
      return "--inputs needs a file";
    options.inputPaths.push_back(text);
  } else if (a == "--outputs") {
    if (!value(options.outputPath))
      return "--outputs needs a file";
  } else if (a.rfind("--device=", 0) == 0) {
    options.device = a.substr(9);
    if (options.device != "cpu" && options.device != "cuda")
      return "--device is cpu or cuda, not '" + options.device + "'";
  } else if (a == "--ep-ranks" || a == "--ep-timeout-ms") {
    bool ranks = a == "--ep-ranks";
    if (!value(text) || !parseCount(text, 1, ranks ? 64 : 3600000,
                                    ranks ? ep.ranks : ep.timeoutMs))
      return a + " needs a positive integer" + (ranks ? " (at most 64)" : "");
  } else if (a == "--ep-max-tokens") {
    if (!value(text) || !parseCount(text, 0, LONG_MAX, ep.maxTokens))
      return "--ep-max-tokens needs a count of 0 or more";
  } else if (a == "--ep-proxy") {
    ep.proxy = true;
  } else if (a == "--ep-domain") {
    if (!value(ep.domain))
      return "--ep-domain needs a libfabric domain name";
  } else if (a == "--repeat") {
    if (!value(text) || !parseCount(text, 1, LONG_MAX, options.repeat))
      return "--repeat needs a positive integer";
  } else if (!a.empty() && a[0] == '-') {
    return "unknown option '" + a + "'\n" + kUsage;
  } else if (options.library.empty()) {
    options.library = a;
  } else {
    return "more than one library given\n" + std::string(kUsage);
  }
  return "";
}

} // namespace

bool moe::exec::parseOptions(int argc, char **argv, Options &options,
                             bool &help, std::string &error) {
  help = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      help = true;
      return true;
    }
    error = parseArgument(a, argc, argv, i, options);
    if (!error.empty())
      return false;
  }
  if (options.library.empty() || options.inputPaths.empty() ||
      options.outputPath.empty()) {
    error = std::string("missing arguments\n") + kUsage;
    return false;
  }
  return true;
}

bool moe::exec::checkOptionsFitLayer(const Options &options,
                                     const LayerInfo &info,
                                     const std::string &library,
                                     std::string &error) {
  long ranks = options.ep.ranks;
  if (info.ep.ranks > 1 && ranks != info.ep.ranks) {
    error = library + " is expert parallel over " +
            std::to_string(info.ep.ranks) + " ranks: run it with --ep-ranks " +
            std::to_string(info.ep.ranks) +
            (ranks ? " (not " + std::to_string(ranks) + ")" : "");
    return false;
  }
  if (info.ep.ranks == 1 && ranks) {
    error = "--ep-ranks runs a layer compiled with ep_size > 1; " + library +
            " holds all its experts on one rank";
    return false;
  }
  bool gpu = info.onGpu();
  if (options.ep.proxy && (!gpu || info.ep.ranks == 1)) {
    error = "--ep-proxy applies to expert-parallel GPU layers; " + library +
            (gpu ? " holds all its experts on one rank"
                 : " runs on the CPU, whose ranks always exchange "
                   "through the transport");
    return false;
  }
  std::string device =
      options.device.empty() ? (gpu ? "cuda" : "cpu") : options.device;
  if (gpu != (device == "cuda")) {
    error = library + " was compiled for " + info.target + "; it runs with " +
            (gpu ? "--device=cuda" : "--device=cpu");
    return false;
  }
  return true;
}
