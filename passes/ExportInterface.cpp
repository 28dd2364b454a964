//===- ExportInterface.cpp - what a layer function's library exports ------===//
//
// The one place that reads a layer as its caller sees it: argument names
// and shapes, the config, expert-parallel ranks. Everything after lowering
// (host code, header, description JSON, link line) renders from the
// attribute this pass attaches.
//
//===----------------------------------------------------------------------===//

#include "passes/Passes.h"

#include "runtime/EpLayout.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/StringSet.h"

namespace mlir::moe {
#define GEN_PASS_DEF_EXPORTINTERFACE
#include "passes/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;
using namespace mlir::moe;

/// An argument's description; ArgumentAttr's verifier says what the C
/// entry point cannot pass.
static FailureOr<ArgumentAttr> describe(Operation *where, StringRef name,
                                        Type type, bool isOutput) {
  auto tensor = dyn_cast<RankedTensorType>(type);
  if (!tensor)
    return where->emitOpError() << "cannot pass " << type << " as '" << name
                                << "' through the C entry point";
  auto arg =
      ArgumentAttr::getChecked([&] { return where->emitOpError(); },
                               type.getContext(), name, tensor, isOutput);
  if (!arg)
    return failure();
  return arg;
}

/// The arguments in call order, named `names[i]`, then the results: `out`
/// and, where a layer gives them, `router_logits`.
static FailureOr<SmallVector<Attribute>>
describeArguments(func::FuncOp func, ArrayRef<std::string> names,
                  TypeRange results) {
  SmallVector<Attribute> args;
  for (auto [i, name] : llvm::enumerate(names)) {
    FailureOr<ArgumentAttr> arg =
        describe(func, name, func.getArgument(i).getType(), false);
    if (failed(arg))
      return failure();
    args.push_back(*arg);
  }
  for (auto [i, result] : llvm::enumerate(results)) {
    FailureOr<ArgumentAttr> out =
        describe(func, i == 0 ? "out" : "router_logits", result, true);
    if (failed(out))
      return failure();
    args.push_back(*out);
  }
  return args;
}

/// A function of L1 ops (one kernel family, say): its arguments are named
/// by their `moe.name` attribute, else argN, and its one result is `out`.
static FailureOr<SmallVector<Attribute>>
describeKernelFunction(func::FuncOp func) {
  if (func.getNumResults() != 1)
    return func.emitOpError() << "must return one tensor to be compiled, but "
                                 "returns "
                              << func.getNumResults();
  SmallVector<std::string> names;
  llvm::StringSet<> seen;
  for (unsigned i = 0; i < func.getNumArguments(); ++i) {
    auto given = func.getArgAttrOfType<StringAttr>(i, "moe.name");
    std::string name = given ? given.str() : "arg" + std::to_string(i);
    if (name == "out" || !seen.insert(name).second)
      return func.emitOpError()
             << "argument " << i << " is named '" << name
             << "', which another argument or the result has";
    names.push_back(name);
  }
  return describeArguments(func, names, func.getResultTypes());
}

/// The operands the ABI names, in the op's order.
static SmallVector<std::pair<StringRef, Value>> namedOperands(Operation *op) {
  if (isa<AttentionOp, TiledAttentionOp>(op))
    return {{"query", op->getOperand(0)},
            {"key", op->getOperand(1)},
            {"value", op->getOperand(2)}};
  auto l = cast<LayerOp>(op);
  return {
      {"hidden_states", l.getHiddenStates()},
      {"router_weight", l.getRouterWeight()},
      {"router_bias", l.getRouterBias()},
      {"w13", l.getW13()},
      {"w2", l.getW2()},
      {"w13_scale", l.getW13Scale()},
      {"w2_scale", l.getW2Scale()},
      {"w13_bias", l.getW13Bias()},
      {"w2_bias", l.getW2Bias()},
      {"shared_w13", l.getSharedW13()},
      {"shared_w2", l.getSharedW2()},
      {"shared_gate", l.getSharedGate()},
      {"shared_w13_scale", l.getSharedW13Scale()},
      {"shared_w2_scale", l.getSharedW2Scale()},
  };
}

/// A function holding one layer (or attention) fed directly by its
/// arguments: each argument is named after the operand it feeds.
static FailureOr<SmallVector<Attribute>> describeLayer(func::FuncOp func,
                                                       Operation *layer) {
  SmallVector<std::string> names(func.getNumArguments());
  for (auto [name, value] : namedOperands(layer)) {
    if (!value)
      continue;
    auto arg = dyn_cast<BlockArgument>(value);
    if (!arg || arg.getOwner() != &func.getBody().front() ||
        !names[arg.getArgNumber()].empty())
      return layer->emitOpError() << "operand '" << name
                                  << "' must be its own function argument to "
                                     "be compiled";
    names[arg.getArgNumber()] = name.str();
  }
  auto ret = cast<func::ReturnOp>(func.getBody().front().getTerminator());
  if (!llvm::equal(ret.getOperands(), layer->getResults()))
    return func.emitOpError() << "must return the layer's results, in order";
  for (auto [i, name] : llvm::enumerate(names))
    if (name.empty())
      return func.emitOpError() << "argument " << i << " does not feed the "
                                << "layer";
  return describeArguments(func, names, layer->getResultTypes());
}

/// What an expert-parallel layer's ranks agree on; a CPU rank's buffers
/// are linear in the capacity its init takes.
static ExpertParallelAttr expertParallel(ConfigAttr config, Target target) {
  ExpertParallelAttr ep = ExpertParallelAttr::forLayer(config);
  if (!ep || target != Target::CPU)
    return ep;
  ::moe::rt::EpLayout none{ep.getHidden(), ep.getTopK(), ep.getExperts(),
                           ep.getRanks(), 0};
  ::moe::rt::EpLayout one = none;
  one.maxTokens = 1;
  auto linear = [](size_t base, size_t withOne) {
    return TokenLinear{int64_t(base), int64_t(withOne - base)};
  };
  return ExpertParallelAttr::get(ep.getContext(), ep.getRanks(),
                                 ep.getLocalExperts(), ep.getExperts(),
                                 ep.getTopK(), ep.getHidden(), 0, 0,
                                 linear(none.sendBytes(), one.sendBytes()),
                                 linear(none.recvBytes(), one.recvBytes()));
}

static LogicalResult exportInterface(func::FuncOp func, Target target) {
  StringRef name = func.getName();
  if (name.empty() || llvm::isDigit(name[0]) ||
      !llvm::all_of(name, [](char c) { return llvm::isAlnum(c) || c == '_'; }))
    return func.emitOpError()
           << "name '" << name
           << "' is not a C identifier, which the library's symbols need "
              "(moe-compile --name sets it)";
  SmallVector<Operation *> layers;
  for (Operation &op : func.getBody().front())
    if (isa<LayerOp, AttentionOp, TiledAttentionOp>(op))
      layers.push_back(&op);
  if (layers.size() > 1)
    return func.emitOpError() << "must hold exactly one moe.layer or "
                                 "moe.attention to be compiled, but holds "
                              << layers.size();
  FailureOr<SmallVector<Attribute>> args =
      layers.empty() ? describeKernelFunction(func)
                     : describeLayer(func, layers.front());
  if (failed(args))
    return failure();
  auto layer = layers.empty() ? LayerOp() : dyn_cast<LayerOp>(layers.front());
  ConfigAttr config = layer ? layer.getConfig() : ConfigAttr();
  MLIRContext *context = func.getContext();
  func->setAttr(InterfaceAttr::getAttrName(),
                InterfaceAttr::get(
                    context, name, target, ArrayAttr::get(context, *args),
                    config, TokenLinear(), {}, expertParallel(config, target)));
  return success();
}

namespace {
struct ExportInterfacePass
    : public mlir::moe::impl::ExportInterfaceBase<ExportInterfacePass> {
  using ExportInterfaceBase::ExportInterfaceBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (!layer.empty()) {
      auto func = module.lookupSymbol<func::FuncOp>(layer);
      if (func && !func.isExternal() && failed(exportInterface(func, target)))
        return signalPassFailure();
      return;
    }
    // Functions of kernels on their own, with several results say, are
    // lowered but have no library to describe.
    ScopedDiagnosticHandler quiet(&getContext(),
                                  [](Diagnostic &) { return success(); });
    for (auto func : module.getOps<func::FuncOp>()) {
      bool moeOps = false;
      func.walk(
          [&](Operation *op) { moeOps |= isa<MoeDialect>(op->getDialect()); });
      if (moeOps && !func.isExternal())
        (void)exportInterface(func, target);
    }
  }
};
} // namespace
