//===- moe-compile.cpp - build a layer from MLIR or a HF config -----------===//
//
// Reads one MoE layer, from the moe dialect or from a HuggingFace
// config.json, verifies it and writes it out.
//
//===----------------------------------------------------------------------===//

#include "dialects/moe/MoeOps.h"
#include "tools/moe-compile/HFConfig.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Support/FileUtilities.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/ToolOutputFile.h"

using namespace mlir;
namespace cl = llvm::cl;

namespace {
enum class Emit { MLIR };

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
cl::opt<Emit> emit("emit", cl::desc("What to write"),
                   cl::values(clEnumValN(Emit::MLIR, "mlir",
                                         "the verified layer in the moe "
                                         "dialect")),
                   cl::init(Emit::MLIR), cl::cat(category));
cl::opt<std::string> outputFile("o", cl::desc("Output file (default: stdout)"),
                                cl::value_desc("file"), cl::init("-"),
                                cl::cat(category));
} // namespace

int main(int argc, char **argv) {
  llvm::InitLLVM init(argc, argv);
  cl::HideUnrelatedOptions(category);
  cl::ParseCommandLineOptions(
      argc, argv,
      "moe-compile: build one MoE layer from the moe dialect or a "
      "HuggingFace config.json\n\n"
      "  moe-compile LAYER.mlir [-o OUT.mlir]\n"
      "  moe-compile --from-hf-config config.json [--name NAME] "
      "[-o OUT.mlir]\n");

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
    module = moe::importHFConfig(context, path, input->getBuffer(), layerName);
  } else {
    sourceMgr.AddNewSourceBuffer(std::move(input), llvm::SMLoc());
    module = parseSourceFile<ModuleOp>(sourceMgr, &context);
  }
  if (!module)
    return 1;

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
