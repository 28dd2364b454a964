//===- Passes.td - NVIDIA (sm_90a) codegen passes ----------*- tablegen -*-===//

#ifndef MOE_CODEGEN_NVIDIA_PASSES_TD
#define MOE_CODEGEN_NVIDIA_PASSES_TD

include "mlir/Pass/PassBase.td"

def BuildKernels : Pass<"moe-build-kernels", "::mlir::ModuleOp"> {
  let summary = "Build sm_90a kernels and a launch plan from L1 moe ops";
  let description = [{
    For every function of L1 ops (on tensors whose only dynamic size is the
    leading token dimension), builds a `gpu.module @<function>_kernels` of
    kernels in the gpu, nvgpu and nvvm dialects, one family per op
    (codegen/nvidia: Route, Dispatch, GroupedMatmul, Combine, Quantize), and
    attaches `moe.launch_plan`: the device buffers (the caller's arguments,
    then workspace slices), the TMA descriptors and the launches in stream
    order, which the host code carries out. Kernels are named
    `moe_<family>[_<step>]` after the step moe-decompose names. Every
    assumption a kernel makes about a shape is checked here, with a
    diagnostic naming the dimension, its value and the rule.
  }];
  let options = [
    Option<"epMaxTokens", "ep-max-tokens", "int64_t", "4096",
           "The most tokens a rank of an expert-parallel layer passes to one "
           "forward: it sizes the receive buffers and grids">
  ];
  let dependentDialects = [
    "::mlir::gpu::GPUDialect", "::mlir::nvgpu::NVGPUDialect",
    "::mlir::NVVM::NVVMDialect", "::mlir::LLVM::LLVMDialect",
    "::mlir::vector::VectorDialect", "::mlir::arith::ArithDialect",
    "::mlir::math::MathDialect", "::mlir::memref::MemRefDialect",
    "::mlir::scf::SCFDialect"
  ];
}

def MarkTensorMapParams : Pass<"moe-mark-tensor-map-params",
                               "::mlir::ModuleOp"> {
  let summary = "Pass TMA descriptors to kernels by value (__grid_constant__)";
  let description = [{
    Runs once the kernels are LLVM functions: each parameter the kernel
    builder listed in `moe.tensor_map_args` becomes a 128-byte, 64-byte
    aligned `byval` parameter marked `nvvm.grid_constant`, so a launch copies
    the descriptor and the kernel reads it in place.
  }];
}

def ExternDynamicShared : Pass<"moe-extern-dynamic-shared",
                                "::mlir::ModuleOp"> {
  let summary = "Declare kernels' dynamic shared memory as PTX's extern array";
  let description = [{
    Runs once the kernels are LLVM functions: each zero-sized global in
    shared memory (what gpu.dynamic_shared_memory becomes) gets external
    linkage, so the NVPTX backend declares it `.extern .shared` and the
    dynamic shared memory starts after every static shared variable
    (mbarriers, workgroup buffers) instead of possibly below them.
  }];
}

def AssembleCubin : Pass<"moe-assemble-cubin", "::mlir::ModuleOp"> {
  let summary = "Assemble the PTX of every gpu.binary into a cubin with ptxas";
  let description = [{
    Replaces each PTX object (`gpu-module-to-binary format=isa`) with the
    cubin ptxas makes of it for its chip. When ptxas fails, the PTX is kept
    in a file and the diagnostic gives the command that reproduces the
    failure.
  }];
  let options = [
    Option<"cudaPath", "cuda-path", "std::string", "",
           "CUDA toolkit whose bin/ptxas assembles (default: $CUDA_HOME, "
           "else /usr/local/cuda)">
  ];
}

#endif // MOE_CODEGEN_NVIDIA_PASSES_TD
