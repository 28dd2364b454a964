//===- Library.cpp - a layer's library rendered from its interface --------===//
//
// emitLibrary is the one step after lowering: from #moe.interface alone it
// renders the entry points, the description JSON, the C header and the
// link line, then writes the library and its header.
//
//===----------------------------------------------------------------------===//

#include "codegen/host/Host.h"
#include "codegen/host/HostBuilder.h"

#include "mlir/Support/FileUtilities.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/ToolOutputFile.h"

using namespace mlir;
using namespace mlir::moe;
using host::HostBuilder;

FailureOr<InterfaceAttr> host::findInterface(ModuleOp module, StringRef name) {
  // The CPU pipeline lowers the function to an llvm.func, which keeps it.
  Operation *func = module.lookupSymbol(name);
  auto interface =
      func ? func->getAttrOfType<InterfaceAttr>(InterfaceAttr::getAttrName())
           : InterfaceAttr();
  if (!interface)
    return module.emitError()
           << "the layer function @" << name
           << " has no moe.interface (run moe-export-interface first)";
  return interface;
}

/// The safetensors name of an argument's element type.
static StringRef dtypeName(Type type) {
  if (type.isBF16())
    return "BF16";
  if (type.isF16())
    return "F16";
  if (type.isF32())
    return "F32";
  if (isa<Float8E4M3FNType>(type))
    return "F8_E4M3";
  if (isa<Float8E8M0FNUType>(type))
    return "F8_E8M0";
  return "I32";
}

/// An argument's sizes, -1 for the token count.
static SmallVector<int64_t> shapeOf(RankedTensorType type) {
  return llvm::map_to_vector(type.getShape(), [](int64_t size) {
    return ShapedType::isDynamic(size) ? int64_t(-1) : size;
  });
}

//===----------------------------------------------------------------------===//
// Description JSON
//===----------------------------------------------------------------------===//

/// The layer's configuration, as a runner or a reference needs it.
static llvm::json::Value configJson(ConfigAttr config) {
  // A function of L1 ops or attention has no layer config.
  if (!config)
    return nullptr;
  RouterAttr router = config.getRouter();
  ActivationAttr activation = config.getActivation();
  llvm::json::Object object{
      {"experts", config.getExperts()},
      {"top_k", config.getTopK()},
      {"hidden", config.getHidden()},
      {"intermediate", config.getIntermediate()},
      {"router", stringifyRouterKind(router.getKind())},
      {"renormalize", router.getRenormalize()},
      {"n_group", router.getNGroup()},
      {"topk_group", router.getTopkGroup()},
      {"scaling", router.getScaling().convertToDouble()},
      {"activation", stringifyActivationKind(activation.getKind())},
      {"alpha", activation.getAlpha().convertToDouble()},
      {"limit", activation.getLimit().convertToDouble()},
      {"shared_intermediate", config.getSharedIntermediate()},
      {"shared_gate", config.getSharedGate()}};
  if (QuantAttr quant = config.getQuant()) {
    object["quant"] = stringifyQuantKind(quant.getKind());
    object["rounding"] = stringifyScaleRounding(quant.getRounding());
  } else {
    object["quant"] = nullptr;
  }
  return object;
}

/// `base + per_token * T` as JSON.
static llvm::json::Object linearJson(TokenLinear l) {
  return llvm::json::Object{{"base", l.fixed}, {"per_token", l.perToken}};
}

static llvm::json::Object expertParallelJson(InterfaceAttr interface) {
  ExpertParallelAttr ep = interface.getExpertParallel();
  llvm::json::Object object{{"ranks", ep.getRanks()},
                            {"local_experts", ep.getLocalExperts()},
                            {"init", interface.getSymbol("ep_init")},
                            {"finalize", interface.getSymbol("ep_finalize")},
                            {"leave", interface.getSymbol("ep_leave")}};
  if (interface.getTarget() == Target::SM90a) {
    // One device allocation per rank, for a compiled capacity.
    object["max_tokens"] = ep.getMaxTokens();
    object["state_bytes"] = ep.getStateBytes();
    object["status"] = interface.getSymbol("ep_status");
    return object;
  }
  // Linear in the capacity init takes: base + per_max_token * it.
  auto linear = [](TokenLinear bytes) {
    return llvm::json::Object{{"base", bytes.fixed},
                              {"per_max_token", bytes.perToken}};
  };
  object["send_bytes"] = linear(ep.getSendBytes());
  object["recv_bytes"] = linear(ep.getRecvBytes());
  return object;
}

/// A training library's forward, backward and saved buffer.
static llvm::json::Object trainingJson(InterfaceAttr interface) {
  TrainingAttr training = interface.getTraining();
  // sm_90a's backward writes the gate/up gradient over the saved gate/up
  // output: a saved buffer serves one backward.
  bool consumesSaved = interface.getTarget() == Target::SM90a;
  llvm::json::Array saved, gradients;
  for (auto [i, tensor] : llvm::enumerate(training.getSavedList()))
    saved.push_back(llvm::json::Object{
        {"name", tensor.getName()},
        {"dtype", dtypeName(tensor.getType().getElementType())},
        {"shape", llvm::json::Array(shapeOf(tensor.getType()))},
        {"rows", linearJson(tensor.getRows())},
        {"offset", linearJson(training.getSavedOffset(i))}});
  for (ArgumentAttr grad : training.getGradientList())
    gradients.push_back(llvm::json::Object{
        {"name", grad.getName()},
        {"dtype", dtypeName(grad.getType().getElementType())},
        {"shape", llvm::json::Array(shapeOf(grad.getType()))}});
  return llvm::json::Object{
      {"forward", interface.getSymbol("forward_train")},
      {"backward", interface.getSymbol("backward")},
      {"saved_size", interface.getSymbol("saved_size")},
      {"saved_bytes", linearJson(training.getSavedBytes())},
      {"saved", std::move(saved)},
      {"gradients", std::move(gradients)},
      {"consumes_saved", consumesSaved},
      {"flags", llvm::json::Object{{"accumulate", 1}, {"bf16", 2}}}};
}

std::string host::infoJson(InterfaceAttr interface) {
  llvm::json::Array args;
  for (ArgumentAttr arg : interface.getArgList())
    args.push_back(
        llvm::json::Object{{"name", arg.getName()},
                           {"dtype", dtypeName(arg.getType().getElementType())},
                           {"shape", llvm::json::Array(shapeOf(arg.getType()))},
                           {"output", arg.getOutput()}});
  bool gpu = interface.getTarget() == Target::SM90a;
  llvm::json::Object info{{"abi_version", 1},
                          {"name", interface.getName()},
                          {"forward", interface.getSymbol("forward")},
                          {"target", stringifyTarget(interface.getTarget())},
                          {"config", configJson(interface.getConfig())},
                          {"args", std::move(args)}};
  if (interface.getExpertParallel())
    info["ep"] = expertParallelJson(interface);
  if (interface.getTraining())
    info["training"] = trainingJson(interface);
  if (gpu) {
    info["workspace"] = linearJson(interface.getWorkspace());
    info["workspace_size"] = interface.getSymbol("workspace_size");
  }
  if (!interface.getTokenBuckets().empty()) {
    info["token_buckets"] = llvm::json::Array(interface.getTokenBuckets());
    info["set_graphs"] = interface.getSymbol("set_graphs");
    info["warmup"] = interface.getSymbol("warmup");
  }
  std::string text;
  llvm::raw_string_ostream os(text);
  os << llvm::json::Value(std::move(info));
  return text;
}

//===----------------------------------------------------------------------===//
// Header
//===----------------------------------------------------------------------===//

static void printForward(llvm::raw_ostream &os, InterfaceAttr interface) {
  StringRef forward = interface.getSymbol("forward");
  if (interface.getTarget() == Target::CPU) {
    os << " * Returns 0 on success. */\n"
       << "int32_t " << forward << "(void *const *args, int64_t tokens);\n";
    return;
  }
  os << " * args are device pointers; the kernels run on `stream` (a "
        "CUstream,\n * null for the default stream) in the current context, "
        "using `workspace`\n * (device memory of "
     << interface.getSymbol("workspace_size")
     << "(tokens) bytes). Returns 0 on\n"
     << " * success, else a nonzero status (see moe_last_error). */\n"
     << "int32_t " << forward
     << "(void *const *args, int64_t tokens, void *stream,\n"
     << "    void *workspace);\n"
     << "int64_t " << interface.getSymbol("workspace_size")
     << "(int64_t tokens);\n";
}

static void printBuckets(llvm::raw_ostream &os, InterfaceAttr interface) {
  os << "/* Token buckets (moe_layer_info()'s token_buckets): a forward of "
        "at most a\n * bucket's tokens replays the bucket's CUDA graph, "
        "captured on first use\n * for its argument pointers and workspace "
        "(unless the caller is capturing\n * the stream, or graphs are off: "
        "set_graphs(0) or MOE_GRAPHS=0). warmup\n * captures every bucket's "
        "graph for these arguments and workspace\n * (workspace_size of the "
        "largest bucket) and launches nothing. */\n"
     << "void " << interface.getSymbol("set_graphs") << "(int32_t on);\n"
     << "int32_t " << interface.getSymbol("warmup")
     << "(void *const *args, void *stream, void *workspace);\n\n";
}

static void printExpertParallel(llvm::raw_ostream &os,
                                InterfaceAttr interface) {
  os << "/* Expert parallel over " << interface.getExpertParallel().getRanks()
     << " ranks (runtime/moe_ep.h): each rank calls init, then\n"
     << " * every forward together with the others, then finalize. A "
        "forward\n * takes the rank's tokens and its local experts' "
        "weights. Nonzero:\n * see moe_last_error(). */\n"
     << "struct moe_ep_config;\n"
     << "int32_t " << interface.getSymbol("ep_init")
     << "(const struct moe_ep_config *config);\n"
     << "void " << interface.getSymbol("ep_finalize") << "(void);\n"
     << "/* Leaves the group without meeting the others (a rank whose peers "
        "may\n * be gone): this rank's exchanges stop; GPU memory that peers "
        "map\n * stays until exit. */\n"
     << "void " << interface.getSymbol("ep_leave") << "(void);\n";
  if (StringRef status = interface.getSymbol("ep_status"); !status.empty())
    os << "/* Nonzero if a forward's wait for a peer ran out of time (call "
          "once\n * the forward's stream is done). */\n"
       << "int32_t " << status << "(void);\n";
  os << "\n";
}

static void printTraining(llvm::raw_ostream &os, InterfaceAttr interface) {
  bool gpu = interface.getTarget() == Target::SM90a;
  os << "/* Training (moe_layer_info()'s training). forward_train is the "
        "forward that\n * also writes what the backward reads into `saved`, "
        "saved_size(tokens)\n * bytes the caller owns. backward takes the "
        "forward's args (its outputs\n * are not read), the output's "
        "gradient and that saved buffer, and writes\n * grads[i] for each "
        "gradient training.gradients lists, in order: the\n * tokens' "
        "gradient in bf16, each weight's in f32";
  if (gpu)
    os << ". Every pointer is\n * device memory; every grads[i] is "
          "written, over what it held, and flags\n * must be 0. Both run "
          "on `stream` in workspace_size(tokens) bytes of\n * workspace, "
          "and neither waits. The backward consumes `saved` (it\n * writes "
          "gradients over saved tensors): one backward a training forward.";
  else
    os << ", or bf16 with flag 2;\n * flag 1 adds to what grads[i] holds. "
          "A null grads[i] is not written.\n * The backward refuses a saved "
          "buffer another layer, another token\n * count or no training "
          "forward wrote.";
  os << " Nonzero: see moe_last_error(). */\n"
     << "int32_t " << interface.getSymbol("forward_train")
     << "(void *const *args, int64_t tokens,"
     << (gpu ? " void *stream,\n    void *workspace," : "")
     << " void *saved);\n"
     << "int64_t " << interface.getSymbol("saved_size") << "(int64_t tokens);\n"
     << "int32_t " << interface.getSymbol("backward")
     << "(void *const *args, int64_t tokens,\n    const void *output_grad, "
     << (gpu ? "void *saved" : "const void *saved")
     << ", void *const *grads,\n    int32_t flags"
     << (gpu ? ", void *stream, void *workspace" : "") << ");\n\n";
}

std::string host::headerText(InterfaceAttr interface) {
  std::string guard = ("MOE_" + interface.getName().upper() + "_H");
  std::string text;
  llvm::raw_string_ostream os(text);
  os << "/* " << interface.getName()
     << ": a compiled MoE layer (moe-compile). */\n"
     << "#ifndef " << guard << "\n#define " << guard << "\n\n"
     << "#include <stdint.h>\n\n#ifdef __cplusplus\nextern \"C\" {\n#endif\n\n"
     << "/* args[i] points to row-major data; -1 is the token count.\n";
  for (auto [i, arg] : llvm::enumerate(interface.getArgList())) {
    os << " *   args[" << i << "] " << arg.getName() << " "
       << dtypeName(arg.getType().getElementType()) << " [";
    llvm::interleave(shapeOf(arg.getType()), os, ", ");
    os << "]" << (arg.getOutput() ? " (output)" : "") << "\n";
  }
  printForward(os, interface);
  if (StringRef lastError = interface.getSymbol("last_error");
      !lastError.empty())
    os << "/* Why the last call on this thread failed. */\n"
       << "const char *" << lastError << "(void);\n";
  os << "\n";
  if (!interface.getTokenBuckets().empty())
    printBuckets(os, interface);
  if (interface.getExpertParallel())
    printExpertParallel(os, interface);
  if (interface.getTraining())
    printTraining(os, interface);
  os << "/* The arguments above as JSON. */\n"
     << "const char *" << interface.getSymbol("layer_info") << "(void);\n\n"
     << "#ifdef __cplusplus\n}\n#endif\n\n#endif\n";
  return text;
}

//===----------------------------------------------------------------------===//
// Entry points every target shares
//===----------------------------------------------------------------------===//

/// Adds the exported function `symbol` of `params`, returning what the
/// runtime's `fn` returns when called with `operands` of its arguments.
static void addForwarder(
    ModuleOp module, StringRef symbol, ArrayRef<Type> params, RuntimeImport fn,
    function_ref<SmallVector<Value>(HostBuilder &, ValueRange)> operands) {
  OpBuilder b = OpBuilder::atBlockEnd(module.getBody());
  HostBuilder h(b, module.getLoc());
  FunctionType type = getRuntimeFunctionType(b.getContext(), fn, h.ptr);
  Type result = type.getNumResults() ? type.getResult(0)
                                     : LLVM::LLVMVoidType::get(b.getContext());
  auto entry = LLVM::LLVMFuncOp::create(
      b, h.loc, symbol, LLVM::LLVMFunctionType::get(result, params));
  b.setInsertionPointToStart(entry.addEntryBlock(b));
  Value value = h.call(fn, operands(h, entry.getArguments()));
  LLVM::ReturnOp::create(b, h.loc, value ? ValueRange{value} : ValueRange{});
}

/// init, finalize (and on the GPU, status) of an expert-parallel layer:
/// the runtime's, given the layer's shape.
static void addExpertParallelEntries(ModuleOp module, InterfaceAttr interface) {
  ExpertParallelAttr ep = interface.getExpertParallel();
  bool gpu = interface.getTarget() == Target::SM90a;
  Type ptr = LLVM::LLVMPointerType::get(module.getContext());
  LLVM::LLVMFuncOp turn =
      gpu ? host::addProxyTurn(module, ep, bool(interface.getTraining()))
          : nullptr;
  addForwarder(
      module, interface.getSymbol("ep_init"), {ptr},
      gpu ? RuntimeImport::moe_ep_cuda_init : RuntimeImport::moe_ep_init,
      [&](HostBuilder &h, ValueRange args) {
        SmallVector<Value> operands;
        if (gpu)
          operands = {h.c64(ep.getStateBytes()), h.c64(ep.getMaxTokens())};
        operands.append({h.c64(ep.getHidden()), h.c64(ep.getTopK()),
                         h.c64(ep.getExperts()), h.c64(ep.getRanks()),
                         args[0]});
        if (gpu)
          operands.push_back(LLVM::AddressOfOp::create(h.b, h.loc, turn));
        return operands;
      });
  auto none = [](HostBuilder &, ValueRange) { return SmallVector<Value>(); };
  addForwarder(module, interface.getSymbol("ep_finalize"), {},
               gpu ? RuntimeImport::moe_ep_cuda_finalize
                   : RuntimeImport::moe_ep_finalize,
               none);
  addForwarder(module, interface.getSymbol("ep_leave"), {},
               gpu ? RuntimeImport::moe_ep_cuda_leave
                   : RuntimeImport::moe_ep_leave,
               none);
  if (gpu)
    addForwarder(module, interface.getSymbol("ep_status"), {},
                 RuntimeImport::moe_ep_cuda_status, none);
}

/// moe_layer_info, returning the description JSON.
static void addLayerInfo(ModuleOp module, InterfaceAttr interface) {
  Location loc = module.getLoc();
  OpBuilder b = OpBuilder::atBlockEnd(module.getBody());
  auto info = LLVM::LLVMFuncOp::create(
      b, loc, interface.getSymbol("layer_info"),
      LLVM::LLVMFunctionType::get(LLVM::LLVMPointerType::get(b.getContext()),
                                  {}));
  b.setInsertionPointToStart(info.addEntryBlock(b));
  std::string text = host::infoJson(interface);
  text.push_back('\0');
  Value global = LLVM::createGlobalString(loc, b, "moe_layer_info_json", text,
                                          LLVM::Linkage::Internal);
  LLVM::ReturnOp::create(b, loc, global);
}

/// The entry points of `interface` in `host`.
static LogicalResult addEntries(ModuleOp host, ModuleOp module,
                                InterfaceAttr interface) {
  bool gpu = interface.getTarget() == Target::SM90a;
  if (failed(gpu ? host::addLaunchEntryPoints(host, module, interface)
                 : host::addEntryPoints(host, interface)))
    return failure();
  if (interface.getTraining() && !gpu &&
      failed(host::addTrainingEntryPoints(host, interface)))
    return failure();
  if (interface.getExpertParallel())
    addExpertParallelEntries(host, interface);
  if (StringRef lastError = interface.getSymbol("last_error");
      !lastError.empty())
    // What the last failing runtime call said (the runtime's own symbols
    // stay inside the library).
    addForwarder(
        host, lastError, {}, RuntimeImport::moert_last_error,
        [](HostBuilder &, ValueRange) { return SmallVector<Value>(); });
  addLayerInfo(host, interface);
  return success();
}

//===----------------------------------------------------------------------===//
// The library
//===----------------------------------------------------------------------===//

namespace {
/// What the library links beyond its object, in link order.
struct LinkLine {
  SmallVector<std::string> archives, libraries;
};
} // namespace

static FailureOr<LinkLine> linkLine(ModuleOp module, InterfaceAttr interface,
                                    StringRef runtimeArchive) {
  // The expert-parallel archives sit beside the runtime's.
  auto archive = [&](StringRef file) {
    SmallString<256> path(llvm::sys::path::parent_path(runtimeArchive));
    llvm::sys::path::append(path, file);
    return path.str().str();
  };
  LinkLine line;
  bool gpu = interface.getTarget() == Target::SM90a;
  // The expert-parallel runtime calls into libmoert: it links first.
  if (interface.getExpertParallel()) {
    line.archives.push_back(archive("libmoe_ep.a"));
    line.libraries = {"fabric", "pthread"};
  }
  // A training library's saved buffer and gradients are the runtime's, as
  // is the last error an expert-parallel call reports.
  if (gpu || interface.getTraining() || interface.getExpertParallel())
    line.archives.push_back(runtimeArchive.str());
  if (interface.getExpertParallel())
    line.archives.push_back(archive("libmoe_transport.a"));
  for (const std::string &file : line.archives)
    if (!llvm::sys::fs::exists(file))
      return module.emitError()
             << "the runtime archive " << file << " does not exist";
  return line;
}

LogicalResult host::emitLibrary(ModuleOp module, InterfaceAttr interface,
                                StringRef output, StringRef runtimeArchive) {
  FailureOr<LinkLine> link = linkLine(module, interface, runtimeArchive);
  if (failed(link))
    return failure();
  // A GPU layer's host code goes in a module of its own: the kernels'
  // module stays as the pipeline left it.
  OwningOpRef<ModuleOp> gpuHost;
  ModuleOp host = module;
  if (interface.getTarget() == Target::SM90a) {
    gpuHost = ModuleOp::create(module.getLoc());
    host = *gpuHost;
  }
  if (failed(addEntries(host, module, interface)))
    return failure();

  StringRef stem = output;
  stem.consume_back(".so");
  std::string headerPath = (stem + ".h").str(), error;
  std::unique_ptr<llvm::ToolOutputFile> header =
      mlir::openOutputFile(headerPath, &error);
  if (!header)
    return module.emitError() << error;
  if (failed(emitSharedLibrary(host, output, link->archives, link->libraries)))
    return failure();
  header->os() << headerText(interface);
  header->keep();
  return success();
}
