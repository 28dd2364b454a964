//===- AssembleCubin.cpp - PTX to cubin with ptxas, reproducibly ----------===//
//
// Upstream's gpu-module-to-binary can call ptxas itself, but then a failure
// leaves nothing to rerun: here the PTX goes to a file that is kept when
// ptxas fails, and the error gives the exact command.
//
//===----------------------------------------------------------------------===//

#include "codegen/nvidia/passes/Passes.h"

#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FileUtilities.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Process.h"
#include "llvm/Support/Program.h"
#include "llvm/Support/raw_ostream.h"

namespace mlir::moe::nvidia {
#define GEN_PASS_DEF_ASSEMBLECUBIN
#include "codegen/nvidia/passes/Passes.h.inc"
} // namespace mlir::moe::nvidia

using namespace mlir;
using namespace mlir::moe;

std::string nvidia::defaultCudaPath() {
  if (std::optional<std::string> home = llvm::sys::Process::GetEnv("CUDA_HOME"))
    return *home;
  return "/usr/local/cuda";
}

/// Runs ptxas on `ptx` for `chip`; the cubin, or a diagnostic on `op`.
static FailureOr<std::string> assemble(Operation *op, StringRef ptxas,
                                       StringRef chip, StringRef ptx) {
  SmallString<128> ptxPath, cubinPath, logPath;
  if (llvm::sys::fs::createTemporaryFile("moe-kernels", "ptx", ptxPath) ||
      llvm::sys::fs::createTemporaryFile("moe-kernels", "cubin", cubinPath) ||
      llvm::sys::fs::createTemporaryFile("moe-ptxas", "log", logPath))
    return op->emitError() << "cannot create temporary files for ptxas";
  llvm::FileRemover removeCubin(cubinPath), removeLog(logPath);
  {
    std::error_code ec;
    llvm::raw_fd_ostream os(ptxPath, ec);
    if (ec)
      return op->emitError()
             << "cannot write " << ptxPath << ": " << ec.message();
    os << ptx;
  }
  std::string arch = ("-arch=" + chip).str();
  SmallVector<StringRef> args = {ptxas, arch, "-O3", ptxPath, "-o", cubinPath};
  std::optional<StringRef> redirects[] = {std::nullopt, logPath, logPath};
  std::string error;
  int rc = llvm::sys::ExecuteAndWait(ptxas, args, std::nullopt, redirects, 0, 0,
                                     &error);
  if (rc != 0) {
    auto log = llvm::MemoryBuffer::getFile(logPath);
    InFlightDiagnostic diag = op->emitError() << "ptxas failed";
    if (!error.empty())
      diag << " (" << error << ")";
    if (log)
      diag << ":\n" << (*log)->getBuffer().rtrim();
    diag << "\nreproduce with: " << llvm::join(args, " ");
    return failure();
  }
  llvm::sys::fs::remove(ptxPath);
  auto cubin = llvm::MemoryBuffer::getFile(cubinPath);
  if (!cubin)
    return op->emitError() << "ptxas wrote no cubin to " << cubinPath;
  return (*cubin)->getBuffer().str();
}

namespace {
struct AssembleCubinPass
    : public nvidia::impl::AssembleCubinBase<AssembleCubinPass> {
  using AssembleCubinBase::AssembleCubinBase;

  void runOnOperation() override {
    std::string toolkit =
        cudaPath.empty() ? nvidia::defaultCudaPath() : std::string(cudaPath);
    SmallString<128> ptxas(toolkit);
    llvm::sys::path::append(ptxas, "bin", "ptxas");
    WalkResult result = getOperation().walk([&](gpu::BinaryOp binary) {
      SmallVector<Attribute> objects;
      for (Attribute attr : binary.getObjects()) {
        auto object = cast<gpu::ObjectAttr>(attr);
        auto target = dyn_cast<NVVM::NVVMTargetAttr>(object.getTarget());
        if (!target || object.getFormat() != gpu::CompilationTarget::Assembly) {
          objects.push_back(object);
          continue;
        }
        if (!llvm::sys::fs::can_execute(ptxas)) {
          binary.emitError()
              << "no ptxas at " << ptxas << " (set --cuda-path or CUDA_HOME)";
          return WalkResult::interrupt();
        }
        FailureOr<std::string> cubin = assemble(binary, ptxas, target.getChip(),
                                                object.getObject().getValue());
        if (failed(cubin))
          return WalkResult::interrupt();
        objects.push_back(gpu::ObjectAttr::get(
            &getContext(), target, gpu::CompilationTarget::Binary,
            StringAttr::get(&getContext(), *cubin), object.getProperties(),
            object.getKernels()));
      }
      binary.setObjectsAttr(ArrayAttr::get(&getContext(), objects));
      return WalkResult::advance();
    });
    if (result.wasInterrupted())
      signalPassFailure();
  }
};
} // namespace
