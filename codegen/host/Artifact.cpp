//===- Artifact.cpp - LLVM dialect to a shared library --------------------===//

#include "codegen/host/Host.h"

#include "mlir/ExecutionEngine/OptUtils.h"
#include "mlir/Target/LLVMIR/Dialect/Builtin/BuiltinToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Dialect/LLVMIR/LLVMToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Export.h"
#include "llvm/IR/LegacyPassManager.h"
#include "llvm/IR/Module.h"
#include "llvm/MC/TargetRegistry.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FileUtilities.h"
#include "llvm/Support/Program.h"
#include "llvm/Support/TargetSelect.h"
#include "llvm/Target/TargetMachine.h"
#include "llvm/TargetParser/Host.h"

using namespace mlir;

LogicalResult moe::host::emitSharedLibrary(ModuleOp module, StringRef path,
                                           ArrayRef<std::string> archives,
                                           ArrayRef<std::string> libraries) {
  Location loc = module.getLoc();
  DialectRegistry registry;
  registerBuiltinDialectTranslation(registry);
  registerLLVMDialectTranslation(registry);
  module.getContext()->appendDialectRegistry(registry);

  llvm::InitializeNativeTarget();
  llvm::InitializeNativeTargetAsmPrinter();
  llvm::Triple triple(llvm::sys::getDefaultTargetTriple());
  std::string error;
  const llvm::Target *target =
      llvm::TargetRegistry::lookupTarget(triple, error);
  if (!target)
    return emitError(loc) << "no LLVM target for " << triple.str() << ": "
                          << error;
  // A baseline CPU: the library runs on any machine of the architecture.
  std::unique_ptr<llvm::TargetMachine> machine(target->createTargetMachine(
      triple, "x86-64", "", llvm::TargetOptions(), llvm::Reloc::PIC_));

  llvm::LLVMContext llvmContext;
  std::unique_ptr<llvm::Module> llvmModule =
      translateModuleToLLVMIR(module, llvmContext);
  if (!llvmModule)
    return emitError(loc) << "translation to LLVM IR failed";
  llvmModule->setTargetTriple(triple);
  llvmModule->setDataLayout(machine->createDataLayout());
  if (llvm::Error e =
          makeOptimizingTransformer(2, 0, machine.get())(llvmModule.get()))
    return emitError(loc) << "LLVM optimization failed: "
                          << llvm::toString(std::move(e));

  SmallString<128> object;
  if (std::error_code ec =
          llvm::sys::fs::createTemporaryFile("moe-layer", "o", object))
    return emitError(loc) << "cannot create a temporary object file: "
                          << ec.message();
  llvm::FileRemover removeObject(object);
  {
    std::error_code ec;
    llvm::raw_fd_ostream out(object, ec);
    if (ec)
      return emitError(loc)
             << "cannot write " << object << ": " << ec.message();
    llvm::legacy::PassManager codegen;
    if (machine->addPassesToEmitFile(codegen, out, nullptr,
                                     llvm::CodeGenFileType::ObjectFile))
      return emitError(loc)
             << "LLVM cannot emit an object for " << triple.str();
    codegen.run(*llvmModule);
  }

  // The compiler driver knows the platform's linker and runtimes; the GPU
  // runtime is C++, and its symbols stay inside the library.
  llvm::ErrorOr<std::string> cc =
      llvm::sys::findProgramByName(archives.empty() ? "cc" : "c++");
  if (!cc)
    return emitError(loc) << "linking needs a compiler driver '"
                          << (archives.empty() ? "cc" : "c++") << "' on PATH";
  std::string output = path.str();
  SmallVector<StringRef> argv = {*cc, "-shared", "-o", output, object};
  for (const std::string &archive : archives)
    argv.push_back(archive);
  if (!archives.empty())
    argv.append({"-Wl,--exclude-libs,ALL", "-ldl"});
  SmallVector<std::string> flags;
  for (const std::string &library : libraries)
    flags.push_back("-l" + library);
  for (const std::string &flag : flags)
    argv.push_back(flag);
  argv.push_back("-lm");
  std::string message;
  int status =
      llvm::sys::ExecuteAndWait(*cc, argv, std::nullopt, {}, 0, 0, &message);
  if (status != 0)
    return emitError(loc) << "linking " << output << " failed"
                          << (message.empty() ? "" : ": ") << message
                          << " (command: " << llvm::join(argv, " ") << ")";
  return success();
}
