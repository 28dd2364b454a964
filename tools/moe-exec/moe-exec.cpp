//===- moe-exec.cpp - run a compiled layer on safetensors inputs ----------===//
//
// moe-exec libNAME.so --inputs in.safetensors --outputs out.safetensors
// [--repeat N]. Reads the layer's description from the library itself, checks
// every input against it by name, dtype and shape, runs the layer and writes
// its outputs. No MLIR or LLVM inside: it ships with the runtime.
//
//===----------------------------------------------------------------------===//

#include "runtime/CudaDriver.h"
#include "runtime/Json.h"
#include "runtime/Safetensors.h"
#include "runtime/moe_ep.h"

#include "moe_transport.h"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

using namespace moe::rt;

namespace {
const char *kUsage =
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

int fail(const std::string &message) {
  std::fprintf(stderr, "moe-exec: %s\n", message.c_str());
  return 1;
}

std::string shapeText(const std::vector<int64_t> &shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    text += (i ? ", " : "") +
            (shape[i] < 0 ? std::string("T") : std::to_string(shape[i]));
  return text + "]";
}

struct Arg {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape; // -1: the token count
  bool isOutput;
};

/// Reads the layer's arguments from its JSON description.
/// An expert-parallel layer's entry points (ranks 1 for other layers).
struct EpInfo {
  int64_t ranks = 1;
  std::string init, finalize, status; // status: GPU layers only
};

/// Expert weights: rank r of N takes the r-th of N slices of their experts.
bool isExpertWeight(const std::string &name) {
  return name == "w13" || name == "w2" || name == "w13_scale" ||
         name == "w2_scale" || name == "w13_bias" || name == "w2_bias";
}

bool parseInfo(const char *text, std::string &forward, std::string &target,
               std::string &workspaceSize, std::vector<Arg> &args, EpInfo &ep,
               std::string &error) {
  Json info;
  if (!parseJson(text, text + std::strlen(text), info, error))
    return false;
  const Json *version = info.get("abi_version");
  const Json *symbol = info.get("forward");
  const Json *list = info.get("args");
  if (!version || !version->isInteger || version->integer != 1 || !symbol ||
      symbol->kind != Json::String || !list || list->kind != Json::Array) {
    error = "the library's layer description is not ABI version 1";
    return false;
  }
  forward = symbol->text;
  const Json *targetName = info.get("target");
  target =
      targetName && targetName->kind == Json::String ? targetName->text : "cpu";
  if (const Json *size = info.get("workspace_size"))
    workspaceSize = size->text;
  if (const Json *parallel = info.get("ep")) {
    const Json *ranks = parallel->get("ranks");
    const Json *init = parallel->get("init");
    const Json *finalize = parallel->get("finalize");
    if (!ranks || !ranks->isInteger || ranks->integer < 2 || !init ||
        init->kind != Json::String || !finalize ||
        finalize->kind != Json::String) {
      error = "the library's expert-parallel description is malformed";
      return false;
    }
    const Json *status = parallel->get("status");
    ep = {ranks->integer, init->text, finalize->text,
          status && status->kind == Json::String ? status->text : ""};
  }
  for (const Json &item : list->items) {
    const Json *name = item.get("name"), *dtype = item.get("dtype");
    const Json *shape = item.get("shape"), *output = item.get("output");
    Arg arg;
    if (!name || !dtype || !shape || !output || shape->kind != Json::Array ||
        !parseDType(dtype->text, arg.dtype)) {
      error = "the library's layer description has a malformed argument";
      return false;
    }
    arg.name = name->text;
    arg.isOutput = output->boolean;
    for (const Json &dim : shape->items)
      arg.shape.push_back(dim.integer);
    args.push_back(std::move(arg));
  }
  return true;
}
/// What the ranks tell the parent, in memory they share.
struct RankReport {
  int status; // 0: ran; 1: failed (message says why)
  double microseconds;
  char message[1000];
};

/// Runs the layer as `ranks` processes on this host; the parent gathers
/// their outputs (written in place into shared memory) and their reports.
/// What a rank calls in an expert-parallel library.
struct EpEntries {
  std::string forwardName;
  void *forward = nullptr;
  int32_t (*init)(const moe_ep_config_t *) = nullptr;
  void (*finalize)() = nullptr;
  const char *(*lastError)() = nullptr;
  int32_t (*status)() = nullptr;               // GPU
  int64_t (*workspaceSize)(int64_t) = nullptr; // GPU
};

/// Rank r's pass over the layer on GPU r mod (GPUs present): its slices of
/// the inputs copied over, the forward run `repeat` times, its slice of the
/// output copied back into `out` (host memory). Returns an error or "".
std::string runGpuRank(const std::vector<Arg> &args,
                       const std::vector<std::vector<uint8_t>> &storage,
                       const std::vector<size_t> &offsets,
                       const std::vector<size_t> &bytes, int64_t mine,
                       int64_t rank, long repeat, const EpEntries &entries,
                       const std::string &target, const moe_ep_config_t &config,
                       std::vector<uint8_t *> &out, double &microseconds) {
  std::string error;
  int count = CudaDevice::count(error);
  if (count <= 0)
    return "cannot run " + target +
           " code: " + (count == 0 ? std::string("no GPU") : error);
  std::unique_ptr<CudaDevice> cuda = CudaDevice::open(int(rank % count), error);
  if (!cuda)
    return "cannot run " + target + " code: " + error;
  if (target == "sm_90a" && cuda->computeCapability() != 90)
    return "the layer is compiled for sm_90a, but GPU " +
           std::to_string(rank % count) + " (" + cuda->name() + ") is sm_" +
           std::to_string(cuda->computeCapability());
  std::vector<CudaDevice::DevicePtr> buffers;
  auto release = [&] {
    for (CudaDevice::DevicePtr p : buffers)
      cuda->free(p);
  };
  std::vector<void *> pointers(args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    CudaDevice::DevicePtr p = cuda->allocate(bytes[i] ? bytes[i] : 1, error);
    if (!p) {
      release();
      return error;
    }
    buffers.push_back(p);
    if (!args[i].isOutput && bytes[i] &&
        !cuda->copyToDevice(p, storage[i].data() + offsets[i], bytes[i],
                            error)) {
      release();
      return error;
    }
    pointers[i] = reinterpret_cast<void *>(p);
  }
  CudaDevice::DevicePtr workspace =
      cuda->allocate(size_t(entries.workspaceSize(mine)) + 1, error);
  if (!workspace) {
    release();
    return error;
  }
  buffers.push_back(workspace);
  if (entries.init(&config) != 0) {
    release();
    return std::string("init failed: ") + entries.lastError();
  }
  // Fault injection for tests: this rank dies before its forward, and the
  // others must say so.
  if (const char *kill = std::getenv("MOE_EP_TEST_KILL_RANK"))
    if (std::atoi(kill) == rank)
      std::raise(SIGKILL);
  auto forward =
      reinterpret_cast<int32_t (*)(void *const *, int64_t, void *, void *)>(
          entries.forward);
  auto runs = [&](long n) -> std::string {
    for (long run = 0; run < n; ++run)
      if (forward(pointers.data(), mine, nullptr,
                  reinterpret_cast<void *>(workspace)) != 0)
        return entries.forwardName + " failed: " + entries.lastError();
    if (!cuda->synchronize(error))
      return error;
    if (entries.status() != 0)
      return entries.forwardName + " failed: " + entries.lastError();
    return "";
  };
  // One forward first (module loads, first touches), then the timed ones.
  std::string why = runs(1);
  auto start = std::chrono::steady_clock::now();
  if (why.empty() && repeat > 1)
    why = runs(repeat);
  microseconds = std::chrono::duration<double, std::micro>(
                     std::chrono::steady_clock::now() - start)
                     .count() /
                 double(repeat > 1 ? repeat : 1);
  for (size_t i = 0; why.empty() && i < args.size(); ++i)
    if (args[i].isOutput && bytes[i] &&
        !cuda->copyToHost(out[i], buffers[i], bytes[i], error))
      why = error;
  entries.finalize();
  release();
  return why;
}

int runExpertParallel(const std::vector<Arg> &args,
                      const std::vector<std::vector<uint8_t>> &storage,
                      int64_t tokens, int64_t ranks, long repeat,
                      const std::string &outputPath, const EpEntries &entries,
                      bool gpu, const std::string &target, const char *domain,
                      int timeoutMs, int64_t maxTokensGiven, bool proxy) {
  const std::string &forwardName = entries.forwardName;
  auto init = entries.init;
  auto finalize = entries.finalize;
  auto lastError = entries.lastError;
  auto forward =
      reinterpret_cast<int32_t (*)(void *const *, int64_t)>(entries.forward);
  std::vector<int64_t> first(ranks + 1, 0);
  for (int64_t r = 0; r < ranks; ++r)
    first[r + 1] = first[r] + tokens / ranks + (r < tokens % ranks);
  int64_t maxTokens = maxTokensGiven >= 0
                          ? maxTokensGiven
                          : tokens / ranks + (tokens % ranks != 0);

  // Outputs and reports live in a shared mapping the ranks write into.
  std::vector<size_t> outputOffset(args.size(), 0), rowBytes(args.size(), 0);
  size_t shared = sizeof(RankReport) * size_t(ranks);
  for (size_t i = 0; i < args.size(); ++i) {
    size_t row = dtypeSize(args[i].dtype);
    for (size_t d = 1; d < args[i].shape.size(); ++d)
      row *= size_t(args[i].shape[d]);
    rowBytes[i] = row;
    if (!args[i].isOutput)
      continue;
    outputOffset[i] = shared;
    shared += (row * size_t(tokens) + 63) / 64 * 64;
  }
  void *mapping = mmap(nullptr, shared, PROT_READ | PROT_WRITE,
                       MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mapping == MAP_FAILED)
    return fail("cannot map " + std::to_string(shared) +
                " bytes for the ranks' outputs");
  auto *base = static_cast<uint8_t *>(mapping);
  auto *reports = reinterpret_cast<RankReport *>(base);

  int listenFd = -1, port = 0;
  if (moe_transport_bootstrap_listen("127.0.0.1", 0, &listenFd, &port) !=
      MOE_TRANSPORT_OK)
    return fail(std::string("cannot listen for the ranks' bootstrap: ") +
                moe_transport_last_error());
  // FI_PROVIDER, when set, is the user's choice; else shm between processes
  // of one host.
  const char *provider = std::getenv("FI_PROVIDER") ? nullptr : "shm";

  std::vector<pid_t> pids(ranks, -1);
  for (int64_t r = 0; r < ranks; ++r) {
    reports[r].status = 1;
    std::snprintf(reports[r].message, sizeof reports[r].message,
                  "exited before it reported");
    pid_t pid = fork();
    if (pid < 0) {
      for (int64_t q = 0; q < r; ++q)
        kill(pids[q], SIGKILL);
      return fail("cannot start rank " + std::to_string(r));
    }
    if (pid > 0) {
      pids[r] = pid;
      continue;
    }
    // Rank r.
    RankReport &report = reports[r];
    if (r != 0)
      close(listenFd);
    moe_ep_config_t config = {};
    config.rank = int32_t(r);
    config.world_size = int32_t(ranks);
    config.bootstrap_host = "127.0.0.1";
    config.bootstrap_port = port;
    config.listen_fd = r == 0 ? listenFd : -1;
    config.max_tokens = maxTokens;
    config.provider = provider;
    config.domain = domain;
    config.timeout_ms = timeoutMs;
    config.proxy = proxy ? 1 : 0;
    auto finish = [&](int status, const std::string &message) {
      report.status = status;
      std::snprintf(report.message, sizeof report.message, "%s",
                    message.c_str());
      _exit(status);
    };
    int64_t mine = first[r + 1] - first[r];
    std::vector<size_t> offsets(args.size(), 0), bytes(args.size(), 0);
    std::vector<uint8_t *> out(args.size(), nullptr);
    for (size_t i = 0; i < args.size(); ++i) {
      const Arg &arg = args[i];
      bool perToken = !arg.shape.empty() && arg.shape[0] < 0;
      if (perToken) {
        offsets[i] = size_t(first[r]) * rowBytes[i];
        bytes[i] = size_t(mine) * rowBytes[i];
      } else if (isExpertWeight(arg.name)) {
        bytes[i] = storage[i].size() / size_t(ranks);
        offsets[i] = bytes[i] * size_t(r);
      } else {
        bytes[i] = arg.isOutput ? 0 : storage[i].size();
      }
      if (arg.isOutput)
        out[i] = base + outputOffset[i] + offsets[i];
    }
    if (gpu) {
      double us = 0;
      std::string why = runGpuRank(args, storage, offsets, bytes, mine, r,
                                   repeat, entries, target, config, out, us);
      report.microseconds = us;
      finish(why.empty() ? 0 : 1, why);
    }
    if (init(&config) != 0)
      finish(1, std::string("init failed: ") + lastError());
    std::vector<void *> pointers(args.size());
    for (size_t i = 0; i < args.size(); ++i)
      pointers[i] = args[i].isOutput
                        ? static_cast<void *>(out[i])
                        : const_cast<uint8_t *>(storage[i].data()) + offsets[i];
    auto start = std::chrono::steady_clock::now();
    for (long run = 0; run < repeat; ++run)
      if (forward(pointers.data(), mine) != 0) {
        std::string why = lastError();
        finalize();
        finish(1, forwardName + " failed: " + why);
      }
    report.microseconds = std::chrono::duration<double, std::micro>(
                              std::chrono::steady_clock::now() - start)
                              .count() /
                          double(repeat);
    finalize();
    finish(0, "");
  }
  close(listenFd);

  bool failed = false;
  std::string failures;
  for (int64_t r = 0; r < ranks; ++r) {
    int status = 0;
    waitpid(pids[r], &status, 0);
    if (WIFSIGNALED(status)) {
      failures += "rank " + std::to_string(r) + " was killed by signal " +
                  std::to_string(WTERMSIG(status)) + "\n";
      failed = true;
    } else if (WEXITSTATUS(status) != 0 || reports[r].status != 0) {
      failures +=
          "rank " + std::to_string(r) + ": " + reports[r].message + "\n";
      failed = true;
    }
  }
  if (failed) {
    std::fprintf(stderr, "moe-exec: %s", failures.c_str());
    munmap(mapping, shared);
    return 1;
  }
  if (repeat > 1) {
    double slowest = 0;
    for (int64_t r = 0; r < ranks; ++r)
      slowest = std::max(slowest, reports[r].microseconds);
    std::printf("%s: %ld runs, %lld tokens over %lld ranks, %.1f us per run "
                "(slowest rank)\n",
                forwardName.c_str(), repeat, static_cast<long long>(tokens),
                static_cast<long long>(ranks), slowest);
  }
  std::vector<TensorToWrite> outputs;
  for (size_t i = 0; i < args.size(); ++i)
    if (args[i].isOutput) {
      std::vector<int64_t> shape = args[i].shape;
      for (int64_t &d : shape)
        d = d < 0 ? tokens : d;
      outputs.push_back(
          {args[i].name, args[i].dtype, shape, base + outputOffset[i]});
    }
  std::string error;
  bool written = writeSafetensors(outputPath, outputs, error);
  munmap(mapping, shared);
  if (!written)
    return fail(error);
  return 0;
}
} // namespace

int main(int argc, char **argv) {
  std::string library, outputPath, device;
  std::vector<std::string> inputPaths;
  long repeat = 1, epRanks = 0, epTimeoutMs = 0, epMaxTokens = -1;
  bool epProxy = false;
  std::string epDomain;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](std::string &into) {
      if (i + 1 >= argc)
        return false;
      into = argv[++i];
      return true;
    };
    std::string text;
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (a == "--inputs") {
      if (!value(text))
        return fail("--inputs needs a file");
      inputPaths.push_back(text);
    } else if (a == "--outputs") {
      if (!value(outputPath))
        return fail("--outputs needs a file");
    } else if (a.rfind("--device=", 0) == 0) {
      device = a.substr(9);
      if (device != "cpu" && device != "cuda")
        return fail("--device is cpu or cuda, not '" + device + "'");
    } else if (a == "--ep-ranks" || a == "--ep-timeout-ms") {
      long &into = a == "--ep-ranks" ? epRanks : epTimeoutMs;
      char *end = nullptr;
      if (!value(text) || (into = std::strtol(text.c_str(), &end, 10)) < 1 ||
          *end != '\0' || into > (a == "--ep-ranks" ? 64 : 3600000))
        return fail(a + " needs a positive integer" +
                    (a == "--ep-ranks" ? " (at most 64)" : ""));
    } else if (a == "--ep-max-tokens") {
      char *end = nullptr;
      if (!value(text) ||
          (epMaxTokens = std::strtol(text.c_str(), &end, 10)) < 0 ||
          *end != '\0')
        return fail("--ep-max-tokens needs a count of 0 or more");
    } else if (a == "--ep-proxy") {
      epProxy = true;
    } else if (a == "--ep-domain") {
      if (!value(epDomain))
        return fail("--ep-domain needs a libfabric domain name");
    } else if (a == "--repeat") {
      char *end = nullptr;
      if (!value(text) || (repeat = std::strtol(text.c_str(), &end, 10)) < 1 ||
          *end != '\0')
        return fail("--repeat needs a positive integer");
    } else if (!a.empty() && a[0] == '-') {
      return fail("unknown option '" + a + "'\n" + kUsage);
    } else if (library.empty()) {
      library = a;
    } else {
      return fail("more than one library given\n" + std::string(kUsage));
    }
  }
  if (library.empty() || inputPaths.empty() || outputPath.empty())
    return fail(std::string("missing arguments\n") + kUsage);

  // dlopen searches the library path for bare names: name the file itself.
  if (library.find('/') == std::string::npos)
    library = "./" + library;
  void *handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle)
    return fail(std::string("cannot load ") + dlerror());
  auto info =
      reinterpret_cast<const char *(*)()>(dlsym(handle, "moe_layer_info"));
  if (!info)
    return fail(library + " is not a layer compiled by moe-compile (no "
                          "moe_layer_info)");
  std::string forwardName, target, workspaceName, error;
  std::vector<Arg> args;
  EpInfo ep;
  if (!parseInfo(info(), forwardName, target, workspaceName, args, ep, error))
    return fail(library + ": " + error);
  if (ep.ranks > 1 && epRanks != ep.ranks)
    return fail(library + " is expert parallel over " +
                std::to_string(ep.ranks) + " ranks: run it with --ep-ranks " +
                std::to_string(ep.ranks) +
                (epRanks ? " (not " + std::to_string(epRanks) + ")" : ""));
  if (ep.ranks == 1 && epRanks)
    return fail("--ep-ranks runs a layer compiled with ep_size > 1; " +
                library + " holds all its experts on one rank");
  bool gpu = target != "cpu";
  if (epProxy && (!gpu || ep.ranks == 1))
    return fail("--ep-proxy applies to expert-parallel GPU layers; " + library +
                (gpu ? " holds all its experts on one rank"
                     : " runs on the CPU, whose ranks always exchange "
                       "through the transport"));
  if (device.empty())
    device = gpu ? "cuda" : "cpu";
  if (gpu != (device == "cuda"))
    return fail(library + " was compiled for " + target + "; it runs with " +
                (gpu ? "--device=cuda" : "--device=cpu"));
  void *forward = dlsym(handle, forwardName.c_str());
  if (!forward)
    return fail(library + " lacks its entry point " + forwardName);

  std::vector<std::unique_ptr<SafetensorsFile>> inputs;
  // Each tensor name in one file only: which one is meant is not a guess.
  std::map<std::string, size_t> fileOf;
  for (const std::string &path : inputPaths) {
    auto file = SafetensorsFile::read(path, error);
    if (!file)
      return fail(error);
    for (const TensorInfo &tensor : file->tensors())
      if (!fileOf.emplace(tensor.name, inputs.size()).second)
        return fail("tensor '" + tensor.name + "' is in both " +
                    inputPaths[fileOf[tensor.name]] + " and " + path);
    inputs.push_back(std::move(file));
  }
  std::string inputNames;
  for (const std::string &path : inputPaths)
    inputNames += (inputNames.empty() ? "" : ", ") + path;

  // Match inputs by name; the token count comes from the first that has it.
  int64_t tokens = -1;
  std::string tokensFrom;
  std::vector<std::vector<uint8_t>> storage(args.size());
  std::set<std::string> used;
  for (size_t i = 0; i < args.size(); ++i) {
    const Arg &arg = args[i];
    if (arg.isOutput)
      continue;
    auto where = fileOf.find(arg.name);
    if (where == fileOf.end())
      return fail("input '" + arg.name + "' is missing from " + inputNames);
    const SafetensorsFile &file = *inputs[where->second];
    const TensorInfo *tensor = file.find(arg.name);
    used.insert(arg.name);
    if (tensor->dtype != arg.dtype)
      return fail("input '" + arg.name + "' is " + dtypeName(tensor->dtype) +
                  ", but the layer takes " + dtypeName(arg.dtype));
    // An expert-parallel layer's inputs hold every rank's experts.
    std::vector<int64_t> whole = arg.shape;
    if (ep.ranks > 1 && isExpertWeight(arg.name))
      whole[0] *= ep.ranks;
    bool fits = tensor->shape.size() == arg.shape.size();
    for (size_t d = 0; fits && d < arg.shape.size(); ++d) {
      if (arg.shape[d] >= 0) {
        fits = tensor->shape[d] == whole[d];
      } else if (tokens < 0) {
        tokens = tensor->shape[d];
        tokensFrom = arg.name;
      } else if (tensor->shape[d] != tokens) {
        return fail("input '" + arg.name + "' has " +
                    std::to_string(tensor->shape[d]) + " tokens, but '" +
                    tokensFrom + "' has " + std::to_string(tokens));
      }
    }
    if (!fits)
      return fail("input '" + arg.name + "' has shape " +
                  shapeText(tensor->shape) + ", but the layer takes " +
                  shapeText(whole) +
                  (whole != arg.shape ? " (all ranks' experts)" : ""));
    // Copied: the file's data need not be aligned for its dtype.
    const uint8_t *data = file.data(*tensor);
    storage[i].assign(data, data + tensor->bytes);
  }
  for (const auto &[name, index] : fileOf)
    if (!used.count(name)) {
      std::string takes;
      for (const Arg &arg : args)
        if (!arg.isOutput)
          takes += (takes.empty() ? "" : ", ") + arg.name;
      return fail("unexpected tensor '" + name + "' in " + inputPaths[index] +
                  " (the layer takes " + takes + ")");
    }
  if (tokens < 0)
    tokens = 0;

  if (ep.ranks > 1) {
    EpEntries entries;
    entries.forwardName = forwardName;
    entries.forward = forward;
    entries.init = reinterpret_cast<int32_t (*)(const moe_ep_config_t *)>(
        dlsym(handle, ep.init.c_str()));
    entries.finalize =
        reinterpret_cast<void (*)()>(dlsym(handle, ep.finalize.c_str()));
    entries.lastError =
        reinterpret_cast<const char *(*)()>(dlsym(handle, "moe_last_error"));
    if (gpu) {
      entries.status =
          reinterpret_cast<int32_t (*)()>(dlsym(handle, ep.status.c_str()));
      entries.workspaceSize = reinterpret_cast<int64_t (*)(int64_t)>(
          dlsym(handle, workspaceName.c_str()));
    }
    if (!entries.init || !entries.finalize || !entries.lastError ||
        (gpu && (!entries.status || !entries.workspaceSize)))
      return fail(library + " lacks its expert-parallel entry points");
    return runExpertParallel(args, storage, tokens, ep.ranks, repeat,
                             outputPath, entries, gpu, target,
                             epDomain.empty() ? nullptr : epDomain.c_str(),
                             int(epTimeoutMs), epMaxTokens, epProxy);
  }

  std::vector<void *> pointers(args.size());
  std::vector<TensorToWrite> outputs;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].isOutput) {
      size_t bytes = dtypeSize(args[i].dtype);
      std::vector<int64_t> shape = args[i].shape;
      for (int64_t &d : shape)
        bytes *= static_cast<size_t>(d = d < 0 ? tokens : d);
      storage[i].assign(bytes, 0);
      outputs.push_back({args[i].name, args[i].dtype, shape, nullptr});
    }
    // Empty tensors still get a valid, unread address.
    storage[i].reserve(1);
    pointers[i] = storage[i].data();
  }
  for (size_t i = 0, o = 0; i < args.size(); ++i)
    if (args[i].isOutput)
      outputs[o++].data = storage[i].data();

  auto start = std::chrono::steady_clock::now();
  auto end = start;
  if (gpu) {
    // Device copies of every argument, then the layer on the default stream.
    std::unique_ptr<CudaDevice> cuda = CudaDevice::open(0, error);
    if (!cuda)
      return fail("cannot run " + target + " code: " + error);
    if (target == "sm_90a" && cuda->computeCapability() != 90)
      return fail("the layer is compiled for sm_90a, but device 0 (" +
                  cuda->name() + ") is sm_" +
                  std::to_string(cuda->computeCapability()));
    auto workspaceSize = reinterpret_cast<int64_t (*)(int64_t)>(
        dlsym(handle, workspaceName.c_str()));
    auto gpuForward =
        reinterpret_cast<int32_t (*)(void *const *, int64_t, void *, void *)>(
            forward);
    auto lastError =
        reinterpret_cast<const char *(*)()>(dlsym(handle, "moe_last_error"));
    if (!workspaceSize || !lastError)
      return fail(library + " lacks its workspace or error entry points");
    std::vector<CudaDevice::DevicePtr> buffers;
    auto release = [&] {
      for (CudaDevice::DevicePtr p : buffers)
        cuda->free(p);
    };
    auto allocate = [&](size_t bytes) {
      CudaDevice::DevicePtr p = cuda->allocate(bytes ? bytes : 1, error);
      if (p)
        buffers.push_back(p);
      return p;
    };
    std::vector<void *> devicePointers(args.size());
    for (size_t i = 0; i < args.size(); ++i) {
      CudaDevice::DevicePtr p = allocate(storage[i].size());
      if (!p || (!args[i].isOutput && !storage[i].empty() &&
                 !cuda->copyToDevice(p, storage[i].data(), storage[i].size(),
                                     error))) {
        release();
        return fail(error);
      }
      devicePointers[i] = reinterpret_cast<void *>(p);
    }
    CudaDevice::DevicePtr workspace = allocate(size_t(workspaceSize(tokens)));
    if (!workspace) {
      release();
      return fail(error);
    }
    start = std::chrono::steady_clock::now();
    for (long run = 0; run < repeat; ++run)
      if (gpuForward(devicePointers.data(), tokens, nullptr,
                     reinterpret_cast<void *>(workspace)) != 0) {
        std::string why = lastError();
        release();
        return fail(forwardName + " failed: " + why);
      }
    bool ok = cuda->synchronize(error);
    end = std::chrono::steady_clock::now();
    for (size_t i = 0; ok && i < args.size(); ++i)
      if (args[i].isOutput && !storage[i].empty())
        ok = cuda->copyToHost(
            storage[i].data(),
            reinterpret_cast<CudaDevice::DevicePtr>(devicePointers[i]),
            storage[i].size(), error);
    release();
    if (!ok)
      return fail(error);
  } else {
    auto cpuForward =
        reinterpret_cast<int32_t (*)(void *const *, int64_t)>(forward);
    for (long run = 0; run < repeat; ++run)
      if (int32_t status = cpuForward(pointers.data(), tokens))
        return fail(forwardName + " failed with status " +
                    std::to_string(status));
    end = std::chrono::steady_clock::now();
  }
  if (repeat > 1) {
    double us = std::chrono::duration<double, std::micro>(end - start).count();
    std::printf("%s: %ld runs, %lld tokens, %.1f us per run\n",
                forwardName.c_str(), repeat, static_cast<long long>(tokens),
                us / double(repeat));
  }
  if (!writeSafetensors(outputPath, outputs, error))
    return fail(error);
  return 0;
}
