//===- Entry.cpp - the C entry point of a CPU layer -----------------------===//
//
// moe_<name>_forward(void *const *args, int64_t tokens) calls the lowered
// layer with one row-major buffer per argument (outputs last) whose token
// dimension is `tokens`. An expert-parallel layer's forward runs between
// moe_ep_begin and moe_ep_end (runtime/moe_ep.h).
//
//===----------------------------------------------------------------------===//

#include "codegen/host/Host.h"
#include "codegen/host/HostBuilder.h"

using namespace mlir;
using namespace mlir::moe;
using host::HostBuilder;

/// The lowered layer's operands: each buffer as a memref descriptor
/// (pointer twice, offset 0, sizes, row-major strides; only the leading
/// size is dynamic).
static SmallVector<Value> memrefOperands(HostBuilder &h,
                                         InterfaceAttr interface, Value argv,
                                         Value tokens) {
  SmallVector<Value> operands;
  for (auto [i, arg] : llvm::enumerate(interface.getArgList())) {
    Value slot = LLVM::GEPOp::create(h.b, h.loc, h.ptr, h.ptr, argv,
                                     ArrayRef<LLVM::GEPArg>{int32_t(i)});
    Value data = LLVM::LoadOp::create(h.b, h.loc, h.ptr, slot);
    operands.append({data, data, h.c64(0)});
    ArrayRef<int64_t> shape = arg.getType().getShape();
    for (int64_t size : shape)
      operands.push_back(ShapedType::isDynamic(size) ? tokens : h.c64(size));
    SmallVector<int64_t> strides(shape.size(), 1);
    for (int64_t d = int64_t(shape.size()) - 2; d >= 0; --d)
      strides[d] = strides[d + 1] * shape[d + 1];
    for (int64_t stride : strides)
      operands.push_back(h.c64(stride));
  }
  return operands;
}

LogicalResult host::addEntryPoints(ModuleOp module, InterfaceAttr interface) {
  auto layer = module.lookupSymbol<LLVM::LLVMFuncOp>(interface.getName());
  if (!layer)
    return module.emitError()
           << "no lowered function '" << interface.getName() << "'";
  OpBuilder b = OpBuilder::atBlockEnd(module.getBody());
  HostBuilder h(b, layer.getLoc());
  auto forward = LLVM::LLVMFuncOp::create(
      b, h.loc, interface.getSymbol("forward"),
      LLVM::LLVMFunctionType::get(h.i32, {h.ptr, h.i64}));
  Block *entry = forward.addEntryBlock(b);
  b.setInsertionPointToStart(entry);
  SmallVector<Value> operands = memrefOperands(
      h, interface, entry->getArgument(0), entry->getArgument(1));
  if (layer.getNumArguments() != operands.size())
    return layer.emitOpError()
           << "takes " << layer.getNumArguments()
           << " values, but the layer's buffers give " << operands.size();
  // Only the entry points are the library's interface.
  layer.setLinkage(LLVM::Linkage::Internal);
  if (!interface.getExpertParallel()) {
    LLVM::CallOp::create(b, h.loc, layer, operands);
    LLVM::ReturnOp::create(b, h.loc, h.c32(0));
    return success();
  }
  // begin; the layer; end's status.
  h.failure = b.createBlock(&forward.getBody(), {}, {h.i32}, {h.loc});
  LLVM::ReturnOp::create(b, h.loc, h.failure->getArgument(0));
  b.setInsertionPointToEnd(entry);
  h.check(h.call(RuntimeImport::moe_ep_begin, {entry->getArgument(1)}));
  LLVM::CallOp::create(b, h.loc, layer, operands);
  LLVM::ReturnOp::create(b, h.loc, h.call(RuntimeImport::moe_ep_end, {}));
  return success();
}
