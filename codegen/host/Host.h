//===- Host.h - a compiled layer's host side and library --------*- C++ -*-===//
//
// What a library of a lowered layer holds around its code, rendered from
// the layer's interface (#moe.interface) alone: the C entry points (a CPU
// call, Entry.cpp, or a GPU layer's launches, LaunchEntry.cpp), the
// expert-parallel proxy routine (ProxyTurn.cpp), the description JSON, the
// header and the link line (Library.cpp), then the object and the shared
// library (Artifact.cpp).
//
//===----------------------------------------------------------------------===//

#ifndef MOE_CODEGEN_HOST_HOST_H
#define MOE_CODEGEN_HOST_HOST_H

#include "dialects/moe/MoeDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/IR/BuiltinOps.h"

#include <string>

namespace mlir::moe::host {

/// The interface of the layer function `name` of `module`, at any stage of
/// its lowering, or an error.
FailureOr<InterfaceAttr> findInterface(ModuleOp module, StringRef name);

/// The one object (PTX or cubin) of the module's gpu.binary, or an error.
FailureOr<StringRef> kernelImage(ModuleOp module);

/// Writes the shared library `output` of the lowered layer of `interface`
/// in `module`, and its C header beside it (libNAME.so, libNAME.h): the
/// entry points, the description JSON and the runtime archives it needs,
/// `runtimeArchive` (libmoert.a) and, beside it, libmoe_ep.a and
/// libmoe_transport.a.
LogicalResult emitLibrary(ModuleOp module, InterfaceAttr interface,
                          StringRef output, StringRef runtimeArchive);

/// The C header declaring what the library of `interface` exports.
std::string headerText(InterfaceAttr interface);

/// The layer's description as JSON (what moe_layer_info returns).
std::string infoJson(InterfaceAttr interface);

/// Adds the CPU forward to `module`, already in the LLVM dialect, around
/// its lowered layer function.
LogicalResult addEntryPoints(ModuleOp module, InterfaceAttr interface);

/// Adds the CPU training forward, saved size and backward of a library
/// built for training to `module`, around its lowered functions.
LogicalResult addTrainingEntryPoints(ModuleOp module, InterfaceAttr interface);

/// Adds a training library's saved_size(tokens): the saved buffer's bytes,
/// its header and every saved tensor's slice.
void addSavedSize(ModuleOp module, InterfaceAttr interface);

/// Adds to `host` the GPU forward carrying out the launch plans of the
/// layer function in `module` with the kernels of its cubin, and its
/// workspace size, set_graphs and warmup; for a library built for
/// training, also its training forward, saved size and backward.
LogicalResult addLaunchEntryPoints(ModuleOp host, ModuleOp module,
                                   InterfaceAttr interface);

/// Adds the proxy routine of an expert-parallel GPU layer (an internal
/// function whose address init hands the runtime).
LLVM::LLVMFuncOp addProxyTurn(ModuleOp module, ExpertParallelAttr ep,
                              bool combineValues);

/// Translates `module` to LLVM IR, optimizes it for the host CPU, and links
/// it into the shared library `path` with the system's C++ compiler driver,
/// together with `archives` (the runtime) and system `libraries` (-lNAME).
LogicalResult emitSharedLibrary(ModuleOp module, StringRef path,
                                ArrayRef<std::string> archives = {},
                                ArrayRef<std::string> libraries = {});

} // namespace mlir::moe::host

#endif // MOE_CODEGEN_HOST_HOST_H
