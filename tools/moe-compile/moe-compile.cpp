//===- moe-compile.cpp - build a layer from MLIR or a HF config -----------===//
//
// Reads one MoE layer, from the moe dialect or from a HuggingFace
// config.json, verifies it and writes it out.
//
//===----------------------------------------------------------------------===//

#include "codegen/cpu/Passes.h"
#include "codegen/host/Host.h"
#include "dialects/moe/MoeOps.h"
#include "passes/Passes.h"
#include "tools/moe-compile/HFConfig.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Support/FileUtilities.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/ToolOutputFile.h"

using namespace mlir;
namespace cl = llvm::cl;

namespace {
enum class Emit { SharedLibrary, MLIR };
enum class Target { CPU };
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
    cl::values(clEnumValN(Emit::SharedLibrary, "so",
                          "a shared library exporting moe_<name>_forward and "
                          "moe_layer_info, with a C header beside it "
                          "(default)"),
               clEnumValN(Emit::MLIR, "mlir",
                          "the verified layer in the moe dialect")),
    cl::init(Emit::SharedLibrary), cl::cat(category));
cl::opt<Quant> quant(
    "quant", cl::desc("Quantization of a layer built from a config"),
    cl::values(
        clEnumValN(Quant::Auto, "auto",
                   "as the config's quantization_config says: FP8 128x128 "
                   "blocks are taken as stored, others are reported and the "
                   "layer stays bf16 (default)"),
        clEnumValN(Quant::None, "none", "bf16 throughout"),
        clEnumValN(Quant::MXFP8, "mxfp8",
                   "MXFP8, scales rounded down (OCP MX v1.0); bf16 weights "
                   "quantized by the layer"),
        clEnumValN(Quant::MXFP8Ceil, "mxfp8-ceil",
                   "MXFP8, scales rounded up (never saturates)"),
        clEnumValN(Quant::FP8Block128, "fp8-block128",
                   "FP8 with f32 scales per 128 elements (DeepSeek-V3); bf16 "
                   "weights quantized by the layer")),
    cl::init(Quant::Auto), cl::cat(category));
cl::opt<Target> target("target", cl::desc("What the library runs on"),
                       cl::values(clEnumValN(Target::CPU, "cpu",
                                             "the host CPU, through the "
                                             "reference backend (default)")),
                       cl::init(Target::CPU), cl::cat(category));
cl::opt<std::string>
    outputFile("o",
               cl::desc("Output file: libNAME.so for --emit=so (required), "
                        "else default stdout"),
               cl::value_desc("file"), cl::init("-"), cl::cat(category));
} // namespace

/// Lowers the module's one layer function and writes the library and its
/// header.
static bool compileSharedLibrary(ModuleOp module) {
  if (outputFile == "-") {
    llvm::errs() << "moe-compile: --emit=so needs -o libNAME.so\n";
    return false;
  }
  SmallVector<func::FuncOp> layers;
  for (auto func : module.getOps<func::FuncOp>())
    if (!func.getOps<moe::LayerOp>().empty())
      layers.push_back(func);
  if (layers.size() != 1) {
    emitError(module.getLoc()) << "a library holds one layer function, but "
                                  "the input has "
                               << layers.size();
    return false;
  }
  func::FuncOp func = layers.front();
  std::string name = func.getName().str();
  if (name.empty() || llvm::isDigit(name[0]) || !llvm::all_of(name, [](char c) {
        return llvm::isAlnum(c) || c == '_';
      })) {
    func.emitOpError() << "name '" << name
                       << "' is not a C identifier (use --name)";
    return false;
  }
  FailureOr<SmallVector<moe::host::ArgInfo>> args =
      moe::host::describeLayer(func);
  if (failed(args))
    return false;
  moe::ConfigAttr config = (*func.getOps<moe::LayerOp>().begin()).getConfig();

  PassManager pm(module.getContext());
  pm.addPass(moe::createDecompose());
  moe::cpu::buildLowerToLLVMPipeline(pm);
  if (failed(pm.run(module)) ||
      failed(moe::host::addEntryPoints(module, name, *args, config)) ||
      failed(moe::host::emitSharedLibrary(module, outputFile)))
    return false;

  StringRef stem = outputFile;
  stem.consume_back(".so");
  std::string headerPath = (stem + ".h").str();
  std::string error;
  std::unique_ptr<llvm::ToolOutputFile> header =
      openOutputFile(headerPath, &error);
  if (!header) {
    llvm::errs() << "moe-compile: " << error << "\n";
    return false;
  }
  header->os() << moe::host::headerText(name, *args);
  header->keep();
  return true;
}

int main(int argc, char **argv) {
  llvm::InitLLVM init(argc, argv);
  cl::HideUnrelatedOptions(category);
  cl::ParseCommandLineOptions(
      argc, argv,
      "moe-compile: build one MoE layer from the moe dialect or a "
      "HuggingFace config.json\n\n"
      "  moe-compile LAYER.mlir -o libNAME.so\n"
      "  moe-compile --from-hf-config config.json [--name NAME] -o libNAME.so\n"
      "  moe-compile ... --emit=mlir [-o OUT.mlir]\n");

  if (hfConfig.empty() && quant != Quant::Auto) {
    llvm::errs() << "moe-compile: --quant applies to --from-hf-config; a "
                    ".mlir layer carries its own quant config\n";
    return 1;
  }
  if (inputFile.empty() == hfConfig.empty()) {
    llvm::errs() << "moe-compile: give either a LAYER.mlir file or "
                    "--from-hf-config config.json (see --help)\n";
    return 1;
  }

  MLIRContext context;
  context.loadDialect<moe::MoeDialect, func::FuncDialect>();
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
                                 scheme);
  } else {
    sourceMgr.AddNewSourceBuffer(std::move(input), llvm::SMLoc());
    module = parseSourceFile<ModuleOp>(sourceMgr, &context);
  }
  if (!module)
    return 1;
  if (emit == Emit::SharedLibrary)
    return compileSharedLibrary(*module) ? 0 : 1;

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
