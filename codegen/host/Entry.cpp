//===- Entry.cpp - the C entry point of a CPU layer -----------------------===//
//
// moe_<name>_forward(void *const *args, int64_t tokens) calls the lowered
// layer with one row-major buffer per argument (outputs last) whose token
// dimension is `tokens`. An expert-parallel layer's forward runs between
// moe_ep_begin and moe_ep_end (runtime/moe_ep.h). A library built for
// training also calls its training forward, with the saved tensors in the
// caller's buffer, and its backward, each gradient moved into the caller's
// buffer by the runtime where the caller asks for another dtype or a sum.
//
//===----------------------------------------------------------------------===//

#include "codegen/host/Host.h"
#include "codegen/host/HostBuilder.h"

#include "runtime/moert.h"

#include "llvm/Support/xxhash.h"

using namespace mlir;
using namespace mlir::moe;
using host::HostBuilder;

/// Appends the memref descriptor of row-major `data` of `shape` (pointer
/// twice, offset 0, sizes, strides), its dynamic leading size `rows`.
static void appendDescriptor(HostBuilder &h, SmallVectorImpl<Value> &operands,
                             Value data, ArrayRef<int64_t> shape, Value rows) {
  operands.append({data, data, h.c64(0)});
  for (int64_t size : shape)
    operands.push_back(ShapedType::isDynamic(size) ? rows : h.c64(size));
  SmallVector<int64_t> strides(shape.size(), 1);
  for (int64_t d = int64_t(shape.size()) - 2; d >= 0; --d)
    strides[d] = strides[d + 1] * shape[d + 1];
  for (int64_t stride : strides)
    operands.push_back(h.c64(stride));
}

/// The lowered layer's operands: each buffer as a memref descriptor (only
/// the leading size is dynamic), outputs too unless `inputsOnly`.
static SmallVector<Value> memrefOperands(HostBuilder &h,
                                         InterfaceAttr interface, Value argv,
                                         Value tokens,
                                         bool inputsOnly = false) {
  SmallVector<Value> operands;
  for (auto [i, arg] : llvm::enumerate(interface.getArgList()))
    if (!inputsOnly || !arg.getOutput())
      appendDescriptor(h, operands, h.pointerAt(argv, i),
                       arg.getType().getShape(), tokens);
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

//===----------------------------------------------------------------------===//
// Training
//===----------------------------------------------------------------------===//

/// The lowered function `name` of `module`, called with `operands`.
static LogicalResult callLowered(HostBuilder &h, ModuleOp module,
                                 StringRef name, ValueRange operands) {
  auto fn = module.lookupSymbol<LLVM::LLVMFuncOp>(name);
  if (!fn)
    return module.emitError() << "no lowered function '" << name << "'";
  if (fn.getNumArguments() != operands.size())
    return fn.emitOpError()
           << "takes " << fn.getNumArguments()
           << " values, but its buffers give " << operands.size();
  fn.setLinkage(LLVM::Linkage::Internal);
  LLVM::CallOp::create(h.b, h.loc, fn, operands);
  return success();
}

/// The descriptors of the saved tensors inside `saved`.
static void appendSaved(HostBuilder &h, SmallVectorImpl<Value> &operands,
                        TrainingAttr training, Value saved, Value tokens) {
  for (auto [i, tensor] : llvm::enumerate(training.getSavedList()))
    appendDescriptor(
        h, operands,
        h.offset(saved, h.linear(training.getSavedOffset(i), tokens)),
        tensor.getType().getShape(), h.linear(tensor.getRows(), tokens));
}

void host::addSavedSize(ModuleOp module, InterfaceAttr interface) {
  OpBuilder b = OpBuilder::atBlockEnd(module.getBody());
  HostBuilder h(b, module.getLoc());
  auto size =
      LLVM::LLVMFuncOp::create(b, h.loc, interface.getSymbol("saved_size"),
                               LLVM::LLVMFunctionType::get(h.i64, {h.i64}));
  b.setInsertionPointToStart(size.addEntryBlock(b));
  LLVM::ReturnOp::create(
      b, h.loc,
      h.linear(interface.getTraining().getSavedBytes(), size.getArgument(0)));
}

LogicalResult host::addTrainingEntryPoints(ModuleOp module,
                                           InterfaceAttr interface) {
  TrainingAttr training = interface.getTraining();
  OpBuilder b(module.getContext());
  HostBuilder h(b, module.getLoc());
  // The saved buffer's header names the layer by a digest of its
  // description.
  int64_t layerId = int64_t(llvm::xxh3_64bits(host::infoJson(interface)));

  host::addSavedSize(module, interface);

  // forward_train(args, tokens, saved): the header, then the training
  // forward writing the outputs and the saved tensors.
  auto forward = h.statusFunction(module, interface.getSymbol("forward_train"),
                                  {h.ptr, h.i64, h.ptr});
  Value tokens = forward.getArgument(1), saved = forward.getArgument(2);
  bool ep = static_cast<bool>(interface.getExpertParallel());
  h.check(h.call(RuntimeImport::moert_saved_begin,
                 {saved, tokens, h.c64(layerId)}));
  if (ep)
    h.check(h.call(RuntimeImport::moe_ep_begin_training, {tokens}));
  SmallVector<Value> operands =
      memrefOperands(h, interface, forward.getArgument(0), tokens);
  appendSaved(h, operands, training, saved, tokens);
  if (failed(callLowered(h, module, (interface.getName() + "_train").str(),
                         operands)))
    return failure();
  // A step the group refused leaves no saved buffer a backward takes.
  if (ep)
    h.check(h.call(RuntimeImport::moe_ep_end, {}),
            [&] { h.call(RuntimeImport::moert_saved_clear, {saved}); });
  LLVM::ReturnOp::create(b, h.loc, h.c32(0));

  // backward(args, tokens, output_grad, saved, grads, flags).
  auto backward = h.statusFunction(module, interface.getSymbol("backward"),
                                   {h.ptr, h.i64, h.ptr, h.ptr, h.ptr, h.i32});
  tokens = backward.getArgument(1);
  saved = backward.getArgument(3);
  Value grads = backward.getArgument(4), flags = backward.getArgument(5);
  h.check(h.call(RuntimeImport::moert_backward_check,
                 {saved, tokens, h.c64(layerId), flags}));
  operands = memrefOperands(h, interface, backward.getArgument(0), tokens,
                            /*inputsOnly=*/true);
  // The output's gradient, shaped as the output.
  for (ArgumentAttr arg : interface.getArgList())
    if (arg.getOutput()) {
      appendDescriptor(h, operands, backward.getArgument(2),
                       arg.getType().getShape(), tokens);
      break;
    }
  appendSaved(h, operands, training, saved, tokens);
  // Each gradient into the caller's buffer, or scratch the runtime moves
  // it from (a dtype or an accumulation the caller asks for).
  SmallVector<std::tuple<Value, Value, Value, Value>> moves;
  for (auto [i, grad] : llvm::enumerate(training.getGradientList())) {
    RankedTensorType type = grad.getType();
    Value count = h.c64(1);
    for (int64_t d : type.getShape())
      count = LLVM::MulOp::create(b, h.loc, count,
                                  ShapedType::isDynamic(d) ? tokens : h.c64(d));
    int64_t width = type.getElementTypeBitWidth() / 8;
    // An expert-parallel backward learns whether the group ran it only at
    // its end: every gradient waits in scratch until then.
    int32_t extra =
        (type.getElementType().isBF16() ? MOERT_GRAD_SOURCE_BF16 : 0) |
        (ep ? MOERT_GRAD_STAGED : 0);
    Value mode =
        extra ? LLVM::OrOp::create(b, h.loc, flags, h.c32(extra)).getResult()
              : flags;
    Value dst = h.pointerAt(grads, i);
    Value target =
        h.call(RuntimeImport::moert_grad_target,
               {dst, LLVM::MulOp::create(b, h.loc, count, h.c64(width)), mode});
    Value null = LLVM::ZeroOp::create(b, h.loc, h.ptr);
    Value missing =
        LLVM::ICmpOp::create(b, h.loc, LLVM::ICmpPredicate::eq, target, null);
    h.check(LLVM::ZExtOp::create(b, h.loc, h.i32, missing));
    appendDescriptor(h, operands, target, type.getShape(), tokens);
    moves.emplace_back(dst, target, count, mode);
  }
  // Refused by the group: the scratch is freed, nothing is written.
  auto discard = [&] {
    Value null = LLVM::ZeroOp::create(b, h.loc, h.ptr);
    for (auto [dst, target, count, mode] : moves)
      h.call(RuntimeImport::moert_grad_finish, {null, target, count, mode});
  };
  // Every check passed: the rank joins the group's exchanges.
  if (ep)
    h.check(h.call(RuntimeImport::moe_ep_begin_training, {tokens}), discard);
  if (failed(callLowered(h, module, (interface.getName() + "_backward").str(),
                         operands)))
    return failure();
  if (ep)
    h.check(h.call(RuntimeImport::moe_ep_end, {}), discard);
  for (auto [dst, target, count, mode] : moves)
    h.call(RuntimeImport::moert_grad_finish, {dst, target, count, mode});
  LLVM::ReturnOp::create(b, h.loc, h.c32(0));
  return success();
}
