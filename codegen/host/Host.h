//===- Host.h - a compiled layer's host side and artifact -------*- C++ -*-===//
//
// What moe-compile adds around a lowered layer: a C entry point and a
// metadata query (Entry.cpp), then the object and the shared library
// (Artifact.cpp). The ABI is in runtime/moe_layer.h.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_CODEGEN_HOST_HOST_H
#define MOE_CODEGEN_HOST_HOST_H

#include "dialects/moe/MoeDialect.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"

#include <string>

namespace mlir::moe::host {

/// One argument of a compiled layer, in call order; outputs come last.
struct ArgInfo {
  std::string name;           // The moe.layer operand it feeds, or "out".
  std::string dtype;          // Safetensors dtype name: BF16, F32, ...
  SmallVector<int64_t> shape; // -1 for the token dimension.
  bool isOutput = false;
};

/// Describes the arguments and results of `func`, which must hold one
/// moe.layer fed directly by its arguments and return its result.
FailureOr<SmallVector<ArgInfo>> describeLayer(func::FuncOp func);

/// Adds `moe_<name>_forward` and `moe_layer_info` (the arguments and
/// `config` as JSON) to `module`, already in the LLVM dialect, around the
/// lowered function `name`.
LogicalResult addEntryPoints(ModuleOp module, StringRef name,
                             ArrayRef<ArgInfo> args, ConfigAttr config);

/// The C header declaring what addEntryPoints (or, with `gpu`,
/// addLaunchEntryPoints) adds; an expert-parallel layer (`epSize` > 1) adds
/// its init and finalize.
std::string headerText(StringRef name, ArrayRef<ArgInfo> args, bool gpu = false,
                       int64_t epSize = 1, bool buckets = false);

/// The layer's description as JSON (what moe_layer_info returns); a GPU
/// target adds its workspace bytes.
/// An expert-parallel GPU layer adds its capacity (`epCapacity` tokens per
/// rank) and the bytes of its state.
/// A GPU layer with token buckets lists them.
std::string infoJson(StringRef name, ArrayRef<ArgInfo> args, ConfigAttr config,
                     StringRef target, const TokenLinear *workspace = nullptr,
                     int64_t epCapacity = 0, int64_t epStateBytes = 0,
                     ArrayRef<int64_t> buckets = {});

/// Adds `const char *moe_layer_info(void)` returning `json` to `module`.
void addLayerInfo(ModuleOp module, StringRef json);

/// Adds the GPU entry points to `module`: moe_<name>_forward carrying out
/// `plan` with the kernels of the embedded `cubin`,
/// moe_<name>_workspace_size and moe_layer_info. With token `buckets` (one
/// plan each, ascending), a call of at most a bucket's tokens replays that
/// bucket's CUDA graph, and moe_<name>_set_graphs and moe_<name>_warmup are
/// added. An expert-parallel layer (compiled for `epMaxTokens` tokens per
/// rank) adds moe_<name>_ep_init, _ep_finalize and _ep_status.
LogicalResult addLaunchEntryPoints(ModuleOp module, StringRef name,
                                   ArrayRef<ArgInfo> args, ConfigAttr config,
                                   LaunchPlanAttr plan,
                                   ArrayRef<LaunchPlanAttr> buckets,
                                   StringRef cubin, int64_t epMaxTokens = 0);

/// Translates `module` to LLVM IR, optimizes it for the host CPU, and links
/// it into the shared library `path` with the system's C++ compiler driver,
/// together with `archives` (the runtime) and system `libraries` (-lNAME).
LogicalResult emitSharedLibrary(ModuleOp module, StringRef path,
                                ArrayRef<std::string> archives = {},
                                ArrayRef<std::string> libraries = {});

} // namespace mlir::moe::host

#endif // MOE_CODEGEN_HOST_HOST_H
