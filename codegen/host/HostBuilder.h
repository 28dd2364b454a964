//===- HostBuilder.h - LLVM dialect code of host entry points --*- C++ -*-===//

#ifndef MOE_CODEGEN_HOST_HOSTBUILDER_H
#define MOE_CODEGEN_HOST_HOSTBUILDER_H

#include "codegen/common/RuntimeImports.h"
#include "dialects/moe/MoeDialect.h"

#include "mlir/Dialect/LLVMIR/LLVMDialect.h"

namespace mlir::moe::host {

/// Builds LLVM dialect code in one function, with an early return of any
/// nonzero status.
struct HostBuilder {
  OpBuilder &b;
  Location loc;
  Block *failure = nullptr;
  Type ptr, i64, i32;

  HostBuilder(OpBuilder &b, Location loc) : b(b), loc(loc) {
    ptr = LLVM::LLVMPointerType::get(b.getContext());
    i64 = b.getI64Type();
    i32 = b.getI32Type();
  }
  Value c64(int64_t v) { return LLVM::ConstantOp::create(b, loc, i64, v); }
  Value c32(int64_t v) { return LLVM::ConstantOp::create(b, loc, i32, v); }
  Value c1(bool v) {
    return LLVM::ConstantOp::create(b, loc, b.getI1Type(), v);
  }
  Value linear(TokenLinear l, Value tokens) {
    return LLVM::AddOp::create(
        b, loc, c64(l.fixed),
        LLVM::MulOp::create(b, loc, c64(l.perToken), tokens));
  }
  Value offset(Value base, Value bytes) {
    return LLVM::GEPOp::create(b, loc, ptr, b.getI8Type(), base,
                               ValueRange{bytes});
  }
  Value stackSlot(Type element, int64_t count, int64_t align = 8) {
    return LLVM::AllocaOp::create(b, loc, ptr, element, c64(count), align);
  }
  /// Calls the runtime's `fn` (RuntimeImports.def), declared in the module
  /// on first use; returns its result (null for void).
  Value call(RuntimeImport fn, ValueRange args) {
    auto module =
        b.getInsertionBlock()->getParentOp()->getParentOfType<ModuleOp>();
    RuntimeSignature signature = getRuntimeSignature(fn);
    auto callee = module.lookupSymbol<LLVM::LLVMFuncOp>(signature.name);
    if (!callee) {
      OpBuilder::InsertionGuard guard(b);
      b.setInsertionPointToStart(module.getBody());
      FunctionType type = getRuntimeFunctionType(b.getContext(), fn, ptr);
      Type result = type.getNumResults()
                        ? type.getResult(0)
                        : LLVM::LLVMVoidType::get(b.getContext());
      callee = LLVM::LLVMFuncOp::create(
          b, loc, signature.name,
          LLVM::LLVMFunctionType::get(result, type.getInputs()));
    }
    auto op = LLVM::CallOp::create(b, loc, callee, args);
    return op.getNumResults() ? op.getResult() : Value();
  }
  /// An exported function `symbol` of `params` at the end of `module`,
  /// returning an i32 status: the builder at its entry block, `failure`
  /// the block that returns a failing status.
  LLVM::LLVMFuncOp statusFunction(ModuleOp module, StringRef symbol,
                                  ArrayRef<Type> params) {
    b.setInsertionPointToEnd(module.getBody());
    auto fn = LLVM::LLVMFuncOp::create(
        b, loc, symbol, LLVM::LLVMFunctionType::get(i32, params));
    Block *entry = fn.addEntryBlock(b);
    failure = b.createBlock(&fn.getBody(), {}, {i32}, {loc});
    LLVM::ReturnOp::create(b, loc, failure->getArgument(0));
    b.setInsertionPointToEnd(entry);
    return fn;
  }
  /// Pointer `i` of the array of pointers `array`.
  Value pointerAt(Value array, int64_t i) {
    Value slot = LLVM::GEPOp::create(b, loc, ptr, ptr, array,
                                     ArrayRef<LLVM::GEPArg>{int32_t(i)});
    return LLVM::LoadOp::create(b, loc, ptr, slot);
  }
  /// Returns `status` from the function if it is nonzero, after
  /// `cleanup` has run.
  void check(Value status, llvm::function_ref<void()> cleanup) {
    Block *current = b.getInsertionBlock();
    Block *failed = b.createBlock(current->getParent());
    cleanup();
    LLVM::BrOp::create(b, loc, ValueRange{status}, failure);
    Block *next = b.createBlock(current->getParent());
    b.setInsertionPointToEnd(current);
    Value bad =
        LLVM::ICmpOp::create(b, loc, LLVM::ICmpPredicate::ne, status, c32(0));
    LLVM::CondBrOp::create(b, loc, bad, failed, next);
    b.setInsertionPointToStart(next);
  }
  /// Returns `status` from the function if it is nonzero.
  void check(Value status) {
    Block *current = b.getInsertionBlock();
    Block *next = b.createBlock(current->getParent());
    b.setInsertionPointToEnd(current);
    Value bad =
        LLVM::ICmpOp::create(b, loc, LLVM::ICmpPredicate::ne, status, c32(0));
    LLVM::CondBrOp::create(b, loc, bad, failure, ValueRange{status}, next,
                           ValueRange{});
    b.setInsertionPointToStart(next);
  }
};

} // namespace mlir::moe::host

#endif // MOE_CODEGEN_HOST_HOSTBUILDER_H
