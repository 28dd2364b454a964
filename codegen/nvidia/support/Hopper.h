//===- Hopper.h - sm_90a instructions the kernel families share -*- C++ -*-===//
//
// Inline PTX where NVVM has no op (or one whose unused token is dropped),
// wgmma shared-memory descriptors and the register fence that keeps LLVM
// from moving arithmetic on a wgmma fragment across its wait.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_CODEGEN_NVIDIA_SUPPORT_HOPPER_H
#define MOE_CODEGEN_NVIDIA_SUPPORT_HOPPER_H

#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/IR/Builders.h"

namespace mlir::moe::nvidia {

/// Inline PTX `text` with side effects; its one result, if any.
Value inlinePtx(OpBuilder &b, Location loc, TypeRange results,
                ValueRange operands, StringRef text, StringRef constraints);

/// The wgmma descriptor of a tile at shared address `address` (i64) with
/// 128-byte swizzling: `leadingBytes` between 64-element chunks of an
/// MN-major operand (ignored for K-major), `strideBytes` between 8-row
/// groups.
Value swizzledDescriptor(OpBuilder &b, Location loc, Value address,
                         int64_t leadingBytes = 16, int64_t strideBytes = 1024);

/// An m64nN f32 fragment (an LLVM struct of f32) of zeros.
Value zeroFragment(OpBuilder &b, Location loc, Type fragment);

/// acc + A x B (A x B alone when `accumulate` is false) into an m64nN f32
/// fragment of type `fragment`, both operands in shared memory and K-major
/// (descriptors `a` and `b`), one m64 x `n` x `k` wgmma of `type`.
Value wgmmaKMajor(OpBuilder &b, Location loc, Type fragment, Value acc, Value a,
                  Value bDesc, int64_t n, int64_t k, NVVM::WGMMATypes type,
                  bool accumulate);

/// The same with either operand MN-major (transposed): bf16 only, both
/// from shared memory.
Value wgmma(OpBuilder &b, Location loc, Type fragment, Value acc, Value a,
            Value bDesc, int64_t n, int64_t k, NVVM::WGMMATypes type,
            bool accumulate, bool aMNMajor, bool bMNMajor);

/// `fragment` (an LLVM struct of f32) itself, through an empty volatile asm
/// that reads and writes each register: LLVM may not move arithmetic on it
/// across, so reads stay after the wgmma wait that precedes it.
Value fenceFragment(OpBuilder &b, Location loc, Value fragment);

/// One arrival on mbarrier `slot` of `group`.
void mbarrierArrive(OpBuilder &b, Location loc, Value group, Value slot);
/// Arrives on the same mbarrier of cluster block `block` (i32), ordering
/// nothing beyond this block.
void mbarrierArriveRemote(OpBuilder &b, Location loc, Value group, Value slot,
                          Value block);

/// Named barrier `id` (a value, i32) for `threads`: wait, or arrive only.
void namedBarrierSync(OpBuilder &b, Location loc, Value id, int64_t threads);
void namedBarrierArrive(OpBuilder &b, Location loc, Value id, int64_t threads);

} // namespace mlir::moe::nvidia

#endif // MOE_CODEGEN_NVIDIA_SUPPORT_HOPPER_H
