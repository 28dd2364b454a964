//===- moe-compile.cpp - build a layer from MLIR or a HF config -----------===//
//
// Reads one MoE layer, from the moe dialect or from a HuggingFace
// config.json, verifies it and writes it out.
//
//===----------------------------------------------------------------------===//

#include "codegen/host/Host.h"
#include "codegen/nvidia/passes/Passes.h"
#include "codegen/nvidia/passes/Registration.h"
#include "dialects/moe/MoeOps.h"
#include "passes/Pipelines.h"
#include "tools/Version.h"
#include "tools/moe-compile/HFConfig.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Support/FileUtilities.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/ToolOutputFile.h"

using namespace mlir;
namespace cl = llvm::cl;

namespace {
enum class Emit { SharedLibrary, MLIR, L1, Kernels, PTX };
using moe::PipelineOptions;
using moe::Target;
enum class Quant { Auto, None, MXFP8, MXFP8Ceil, FP8Block128 };

cl::OptionCategory category("moe-compile options");
cl::opt<std::string> inputFile(cl::Positional, cl::desc("[LAYER.mlir]"),
                               cl::cat(category));
cl::opt<std::string>
    hfConfig("from-hf-config",
             cl::desc("Build the layer from a HuggingFace config.json "
                      "(model types: mixtral, qwen2_moe, qwen3_moe, "
                      "deepseek_v2, deepseek_v3, kimi_k2, gpt_oss, llama4, "
                      "llama4_text)"),
             cl::value_desc("config.json"), cl::cat(category));
cl::opt<std::string>
    layerName("name",
              cl::desc("Name of the layer's function when built from a "
                       "config (default: <model_type>_moe)"),
              cl::value_desc("name"), cl::cat(category));
cl::opt<Emit> emit(
    "emit", cl::desc("What to write"),
    cl::values(
        clEnumValN(Emit::SharedLibrary, "so",
                   "a shared library exporting moe_<name>_forward and "
                   "moe_layer_info, with a C header beside it "
                   "(default)"),
        clEnumValN(Emit::MLIR, "mlir", "the verified layer in the moe dialect"),
        clEnumValN(Emit::L1, "l1",
                   "the layer decomposed into its steps (L1), legalized for "
                   "the target"),
        clEnumValN(Emit::Kernels, "kernels",
                   "the GPU kernels in the gpu/nvgpu/nvvm dialects and the "
                   "launch plan (--target=sm_90a)"),
        clEnumValN(Emit::PTX, "ptx", "the GPU kernels' PTX (--target=sm_90a)")),
    cl::init(Emit::SharedLibrary), cl::cat(category));
cl::opt<Quant> quant(
    "quant",
    cl::desc("Quantization of a layer built from a config; with "
             "--train the layer takes bf16 weights and quantizes "
             "them each call"),
    cl::values(
        clEnumValN(Quant::Auto, "auto",
                   "as the config's quantization_config says: FP8 128x128 "
                   "blocks are taken as stored, others are reported and the "
                   "layer stays bf16 (default)"),
        clEnumValN(Quant::None, "none", "bf16 throughout"),
        clEnumValN(Quant::MXFP8, "mxfp8",
                   "MXFP8, scales rounded down (OCP MX v1.0): the layer "
                   "takes E4M3 weights with E8M0 scales per 32 of K "
                   "(moe-quantize converts bf16 ones)"),
        clEnumValN(Quant::MXFP8Ceil, "mxfp8-ceil",
                   "MXFP8, scales rounded up (never saturates)"),
        clEnumValN(Quant::FP8Block128, "fp8-block128",
                   "FP8 with f32 scales per 1x128 activation and 128x128 "
                   "weight block (DeepSeek-V3): the layer takes E4M3 weights "
                   "with their scales (moe-quantize converts bf16 ones)")),
    cl::init(Quant::Auto), cl::cat(category));
cl::opt<int64_t> epSize(
    "ep-size",
    cl::desc("Expert-parallel ranks of a layer built from a config (it must "
             "divide the experts); each rank holds experts / N of them. A "
             ".mlir layer says it in its config attribute"),
    cl::value_desc("N"), cl::init(0), cl::cat(category));
cl::opt<bool> routerLogits(
    "router-logits",
    cl::desc("A layer built from a config also outputs its router logits "
             "(`router_logits` [T, E] f32, after `out`), for models that "
             "return them. A .mlir layer gives them as its second result"),
    cl::init(false), cl::cat(category));
cl::opt<Target> target(
    "target", cl::desc("What the library runs on"),
    cl::values(clEnumValN(Target::CPU, "cpu",
                          "the host CPU, through the reference backend "
                          "(default)"),
               clEnumValN(Target::SM90a, "sm_90a",
                          "NVIDIA Hopper: kernels compiled to a cubin (needs "
                          "ptxas) and launched on the caller's stream")),
    cl::init(Target::CPU), cl::cat(category));
cl::opt<std::string>
    runtimeLib("runtime-lib",
               cl::desc("The runtime archive linked into GPU layers "
                        "(default: ../lib/libmoert.a beside moe-compile); "
                        "expert-parallel layers link libmoe_ep.a and "
                        "libmoe_transport.a from its folder"),
               cl::value_desc("libmoert.a"), cl::cat(category));
cl::opt<std::string>
    outputFile("o",
               cl::desc("Output file: libNAME.so for --emit=so (required), "
                        "else default stdout"),
               cl::value_desc("file"), cl::init("-"), cl::cat(category));
} // namespace

static std::string defaultRuntimeLib(const char *argv0) {
  std::string exe = llvm::sys::fs::getMainExecutable(
      argv0, reinterpret_cast<void *>(&defaultRuntimeLib));
  SmallString<256> path(
      llvm::sys::path::parent_path(llvm::sys::path::parent_path(exe)));
  llvm::sys::path::append(path, "lib", "libmoert.a");
  return path.str().str();
}

/// Writes `text` to the output file.
static bool writeOutput(StringRef text) {
  std::string error;
  std::unique_ptr<llvm::ToolOutputFile> output =
      openOutputFile(outputFile, &error);
  if (!output) {
    llvm::errs() << "moe-compile: " << error << "\n";
    return false;
  }
  output->os() << text;
  output->keep();
  return true;
}

/// Compiles the module's one layer function and writes the library and its
/// header, or the module at an earlier stop.
static bool compileSharedLibrary(ModuleOp module, PipelineOptions &options,
                                 const char *argv0) {
  bool library = emit == Emit::SharedLibrary;
  if (library && outputFile == "-") {
    llvm::errs() << "moe-compile: --emit=so needs -o libNAME.so\n";
    return false;
  }
  // A library holds one layer function, or one function of L1 ops (a
  // kernel family on its own, for checks and benchmarks).
  SmallVector<func::FuncOp> layers, functions(module.getOps<func::FuncOp>());
  for (auto func : functions)
    if (!func.getOps<moe::LayerOp>().empty())
      layers.push_back(func);
  if (layers.empty() && functions.size() == 1)
    layers = functions;
  if (layers.size() != 1) {
    emitError(module.getLoc()) << "a library holds one layer function (or "
                                  "one function of moe ops), but the input "
                                  "has "
                               << layers.size() << " layer functions and "
                               << functions.size() << " functions";
    return false;
  }
  std::string name = layers.front().getName().str();
  // --emit values are stops along the target's pipeline (passes/Pipelines.h).
  options.stopAfter = emit == Emit::L1        ? moe::Stop::L1
                      : emit == Emit::Kernels ? moe::Stop::Kernels
                      : emit == Emit::PTX     ? moe::Stop::PTX
                                              : moe::Stop::Library;
  std::string archive =
      runtimeLib.empty() ? defaultRuntimeLib(argv0) : runtimeLib;
  if (failed(moe::compileLayer(module, name, target, options, outputFile,
                               archive)))
    return false;
  if (emit == Emit::PTX) {
    FailureOr<StringRef> ptx = moe::host::kernelImage(module);
    return succeeded(ptx) && writeOutput(*ptx);
  }
  if (library)
    return true;
  std::string text;
  llvm::raw_string_ostream os(text);
  module.print(os);
  os << "\n";
  return writeOutput(text);
}

/// Moves the flags that are pipeline options (passes/Pipelines.h) out of
/// `argv` into `options`, and a request for help into `help`, leaving the
/// others for cl; false, with cl's message, on a bad value.
static bool takePipelineOptions(SmallVectorImpl<const char *> &argv,
                                PipelineOptions &options, bool &help) {
  SmallVector<const char *> rest = {argv[0]};
  for (size_t i = 1; i < argv.size(); ++i) {
    StringRef arg = argv[i];
    StringRef flag = arg.ltrim('-');
    auto [name, value] = flag.split('=');
    bool takesValue = false;
    if (arg.starts_with("-") &&
        (name == "help" || name == "h" || name == "help-hidden")) {
      help = true;
      continue;
    }
    if (!arg.starts_with("-") || !options.isOption(name, takesValue)) {
      rest.push_back(argv[i]);
      continue;
    }
    // `--name value` as well as `--name=value`, as cl takes them.
    if (!flag.contains('=') && takesValue) {
      if (i + 1 == argv.size()) {
        llvm::errs() << "moe-compile: --" << name << " needs a value\n";
        return false;
      }
      value = argv[++i];
    }
    if (!options.setFromFlag(name, value))
      return false;
  }
  argv.assign(rest.begin(), rest.end());
  return true;
}

int main(int argc, char **argv) {
  llvm::InitLLVM init(argc, argv);
  cl::SetVersionPrinter(moe::printVersion);
  cl::HideUnrelatedOptions(category);
  // Response files first, as cl would expand them.
  SmallVector<const char *> args(argv, argv + argc);
  llvm::BumpPtrAllocator allocator;
  cl::ExpansionContext expansion(allocator, cl::TokenizeGNUCommandLine);
  if (llvm::Error error = expansion.expandResponseFiles(args)) {
    llvm::errs() << "moe-compile: " << llvm::toString(std::move(error)) << "\n";
    return 1;
  }
  PipelineOptions options;
  bool help = false;
  // cl names the program in the messages of the pipeline's options too.
  cl::ParseCommandLineOptions(1, argv);
  if (!takePipelineOptions(args, options, help))
    return 1;
  cl::ParseCommandLineOptions(
      args.size(), args.data(),
      "moe-compile: build one MoE layer from the moe dialect or a "
      "HuggingFace config.json\n\n"
      "  moe-compile LAYER.mlir -o libNAME.so\n"
      "  moe-compile --from-hf-config config.json [--name NAME] -o libNAME.so\n"
      "  moe-compile ... --emit=mlir [-o OUT.mlir]\n");
  if (help) {
    // cl knows the tool's own flags; the pipeline's follow.
    cl::PrintHelpMessage(/*Hidden=*/false, /*Categorized=*/true);
    llvm::outs() << "Pipeline options (also those of moe-opt's "
                    "--moe-cpu-pipeline and --moe-sm90a-pipeline):\n\n";
    options.printHelp(2, options.getOptionWidth() + 4);
    return 0;
  }
  if (options.stopAfter.hasValue()) {
    llvm::errs() << "moe-compile: --emit says where moe-compile stops; "
                    "--stop-after is moe-opt's\n";
    return 1;
  }

  if (hfConfig.empty() && quant != Quant::Auto) {
    llvm::errs() << "moe-compile: --quant applies to --from-hf-config; a "
                    ".mlir layer carries its own quant config\n";
    return 1;
  }
  if (hfConfig.empty() && routerLogits) {
    llvm::errs() << "moe-compile: --router-logits applies to "
                    "--from-hf-config; a .mlir layer returns them as its "
                    "second result\n";
    return 1;
  }
  if (hfConfig.empty() && epSize != 0) {
    llvm::errs() << "moe-compile: --ep-size applies to --from-hf-config; a "
                    ".mlir layer carries its own ep_size\n";
    return 1;
  }
  if (epSize < 0 ||
      (!hfConfig.empty() && epSize == 0 && epSize.getNumOccurrences() > 0)) {
    llvm::errs() << "moe-compile: --ep-size must be at least 1, not " << epSize
                 << "\n";
    return 1;
  }
  if (options.train && target == Target::SM90a && emit == Emit::PTX) {
    llvm::errs() << "moe-compile: --emit=ptx writes one kernel image, and a "
                    "--train build has three (the forward's, the training "
                    "forward's and the backward's): use --emit=kernels, or "
                    "build the library\n";
    return 1;
  }
  if ((emit == Emit::Kernels || emit == Emit::PTX) && target != Target::SM90a) {
    llvm::errs() << "moe-compile: --emit=kernels and --emit=ptx need a GPU "
                    "target (--target=sm_90a)\n";
    return 1;
  }
  if (inputFile.empty() == hfConfig.empty()) {
    llvm::errs() << "moe-compile: give either a LAYER.mlir file or "
                    "--from-hf-config config.json (see --help)\n";
    return 1;
  }

  DialectRegistry registry;
  moe::nvidia::registerNvidiaCodegen(registry);
  MLIRContext context(registry);
  // Diagnostics name the layer's dimensions; a dump of the op adds nothing.
  context.printOpOnDiagnostic(false);
  context.loadDialect<moe::MoeDialect, func::FuncDialect>();
  context.loadAllAvailableDialects();
  std::string error;
  StringRef path =
      hfConfig.empty() ? StringRef(inputFile) : StringRef(hfConfig);
  std::unique_ptr<llvm::MemoryBuffer> input = openInputFile(path, &error);
  if (!input) {
    llvm::errs() << "moe-compile: " << error << "\n";
    return 1;
  }

  llvm::SourceMgr sourceMgr;
  SourceMgrDiagnosticHandler diagnostics(sourceMgr, &context);
  OwningOpRef<ModuleOp> module;
  if (!hfConfig.empty()) {
    std::optional<moe::QuantAttr> scheme;
    auto make = [&](moe::QuantKind kind, moe::ScaleRounding rounding) {
      return moe::QuantAttr::get(&context, kind, rounding);
    };
    switch (quant) {
    case Quant::Auto:
      break;
    case Quant::None:
      scheme = moe::QuantAttr();
      break;
    case Quant::MXFP8:
      scheme = make(moe::QuantKind::MXFP8, moe::ScaleRounding::Floor);
      break;
    case Quant::MXFP8Ceil:
      scheme = make(moe::QuantKind::MXFP8, moe::ScaleRounding::Ceil);
      break;
    case Quant::FP8Block128:
      scheme = make(moe::QuantKind::FP8Block128, moe::ScaleRounding::Floor);
      break;
    }
    module = moe::importHFConfig(context, path, input->getBuffer(), layerName,
                                 scheme, epSize ? int64_t(epSize) : 1,
                                 routerLogits, /*bf16Weights=*/options.train);
  } else {
    sourceMgr.AddNewSourceBuffer(std::move(input), llvm::SMLoc());
    module = parseSourceFile<ModuleOp>(sourceMgr, &context);
  }
  if (!module)
    return 1;
  if (emit != Emit::MLIR)
    return compileSharedLibrary(*module, options, argv[0]) ? 0 : 1;

  std::unique_ptr<llvm::ToolOutputFile> output =
      openOutputFile(outputFile, &error);
  if (!output) {
    llvm::errs() << "moe-compile: " << error << "\n";
    return 1;
  }
  module->print(output->os());
  output->os() << "\n";
  output->keep();
  return 0;
}
