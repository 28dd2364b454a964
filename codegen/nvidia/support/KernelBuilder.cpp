//===- KernelBuilder.cpp - building a layer's sm_90a kernels --------------===//

#include "codegen/nvidia/support/KernelBuilder.h"
#include "codegen/common/Numerics.h"
#include "runtime/EpLayout.h"

#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::nvidia;

gpu::GPUFuncOp nvidia::createKernelFunc(OpBuilder &b, gpu::GPUModuleOp module,
                                        StringRef name,
                                        ArrayRef<KernelArg> args,
                                        Location loc) {
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToEnd(module.getBody());
  Type ptr = LLVM::LLVMPointerType::get(module.getContext());
  // The last parameter is the address of the call's token count (i32, in
  // device memory), so a graph replays for any count its grids cover.
  SmallVector<Type> types(args.size() + 1, ptr);
  auto func =
      gpu::GPUFuncOp::create(b, loc, name, b.getFunctionType(types, {}));
  func->setAttr(gpu::GPUDialect::getKernelFuncAttrName(), b.getUnitAttr());
  // TMA descriptors are passed by value (__grid_constant__): the launch
  // copies them, so the host needs no copy to device memory and the kernel
  // reads them through the parameter's generic address.
  SmallVector<int64_t> maps;
  for (auto [i, arg] : llvm::enumerate(args))
    if (arg.kind == KernelArgKind::TensorMap)
      maps.push_back(i);
  if (!maps.empty())
    func->setAttr(kTensorMapArgs, b.getDenseI64ArrayAttr(maps));
  return func;
}

std::string nvidia::uniqueKernelName(llvm::StringSet<> &names, StringRef name) {
  std::string candidate = name.str();
  for (int i = 1; !names.insert(candidate).second; ++i)
    candidate = (name + "_" + std::to_string(i)).str();
  return candidate;
}

Kernel::Kernel(gpu::GPUModuleOp module, StringRef name, Launch &launch,
               ArrayRef<KernelArg> args, Location loc, int64_t skipWord)
    : b(module.getContext()), e(b, loc), launch(launch) {
  func = createKernelFunc(b, module, name, args, loc);
  b.setInsertionPointToStart(&func.getBody().front());
  // sm_89+ converts f32 to E4M3 in one instruction: round to nearest even,
  // saturating finite values to 448, the reference's rounding (checked on
  // every f32 by bench/e4m3_check.py).
  e.nativeE4M3 = [](Emitter &e, Value x) -> Value {
    Value pair = NVVM::ConvertF32x2ToF8x2Op::create(
        e.b, e.loc, e.b.getI16Type(), e.f32(0.0), x, NVVM::FPRoundingMode::RN,
        NVVM::SaturationMode::SATFINITE, false,
        e.b.getType<Float8E4M3FNType>());
    // `x`'s code is the low byte.
    return arith::TruncIOp::create(e.b, e.loc, e.b.getI8Type(), pair);
  };
  // The quotient from the correctly rounded reciprocal r: q = x r, then
  // q + r (x - q y) with one rounding (two FMAs) is the correctly rounded
  // x / y (Markstein) while nothing overflows, which a block's scale
  // guarantees (|x| <= 448 y). Zero and an infinite scale are exact in
  // x r already (the correction would lose -0's sign, or make NaN). The
  // division it replaces is a subroutine of some twenty instructions, and
  // quantize kernels are bound by issue (ncu: 84% of issue slots).
  e.scaleQuotient = [](Emitter &e, Value x, Value y) -> Value {
    OpBuilder &b = e.b;
    Location loc = e.loc;
    Value r = e.div(e.f32(1.0), y);
    Value q = e.mul(x, r);
    Value residual =
        math::FmaOp::create(b, loc, arith::NegFOp::create(b, loc, q), y, x);
    Value corrected = math::FmaOp::create(b, loc, residual, r, q);
    Value exact = arith::OrIOp::create(
        b, loc,
        arith::CmpFOp::create(b, loc, arith::CmpFPredicate::OEQ, x, e.f32(0.0)),
        arith::CmpFOp::create(b, loc, arith::CmpFPredicate::OEQ, y,
                              e.f32(INFINITY)));
    return e.select(exact, q, corrected);
  };
  // Launched as a programmatic dependent of the stream's previous kernel
  // (runtime/Launch.cpp): wait for it to finish before any memory access.
  // No kernel signals its dependents early: they launch as its blocks
  // exit (an early signal let a Mixtral decode's next matmul take
  // multiprocessors while the last blocks ran: 4% slower; bench/RESULTS.md).
  NVVM::GriddepcontrolOp::create(b, loc, NVVM::GridDepActionKind::wait);
  launch.kernel = name.str();
  launch.args.assign(args.begin(), args.end());
  launch.args.push_back({KernelArgKind::Tokens, 0});
  Value t32 = LLVM::LoadOp::create(b, loc, b.getI32Type(),
                                   func.getArgument(args.size()), 4);
  tokens = arith::IndexCastUIOp::create(b, loc, b.getIndexType(), t32);
  if (skipWord < 0)
    return;
  Type ptr = LLVM::LLVMPointerType::get(b.getContext());
  Value at = LLVM::GEPOp::create(b, loc, ptr, b.getI8Type(),
                                 func.getArgument(args.size() - 1),
                                 ArrayRef<LLVM::GEPArg>{int32_t(skipWord)});
  Value word = LLVM::LoadOp::create(b, loc, b.getI32Type(), at, 4);
  onlyIf(arith::CmpIOp::create(
      b, loc, arith::CmpIPredicate::eq, word,
      arith::ConstantOp::create(b, loc, b.getI32IntegerAttr(0))));
}

Value Kernel::view(unsigned i, const TensorInfo &info) {
  MemRefType type = info.type;
  MLIRContext *ctx = b.getContext();
  Location loc = e.loc;
  Type i64 = b.getI64Type(), ptr = LLVM::LLVMPointerType::get(ctx);
  int64_t rank = type.getRank();
  auto array = LLVM::LLVMArrayType::get(i64, rank);
  auto descriptor =
      LLVM::LLVMStructType::getLiteral(ctx, {ptr, ptr, i64, array, array});
  Value d = LLVM::PoisonOp::create(b, loc, descriptor);
  Value address = func.getArgument(i);
  d = LLVM::InsertValueOp::create(b, loc, d, address, ArrayRef<int64_t>{0});
  d = LLVM::InsertValueOp::create(b, loc, d, address, ArrayRef<int64_t>{1});
  d = LLVM::InsertValueOp::create(b, loc, d, constI64(0), ArrayRef<int64_t>{2});
  SmallVector<Value> sizes;
  for (int64_t s : type.getShape())
    sizes.push_back(
        ShapedType::isDynamic(s)
            ? arith::IndexCastOp::create(b, loc, i64, linear(info.rows))
                  .getResult()
            : constI64(s));
  Value stride = constI64(1);
  for (int64_t d0 = rank - 1; d0 >= 0; --d0) {
    d = LLVM::InsertValueOp::create(b, loc, d, sizes[d0],
                                    ArrayRef<int64_t>{3, d0});
    d = LLVM::InsertValueOp::create(b, loc, d, stride,
                                    ArrayRef<int64_t>{4, d0});
    stride = LLVM::MulOp::create(b, loc, stride, sizes[d0]);
  }
  return UnrealizedConversionCastOp::create(b, loc, type, d).getResult(0);
}

Value Kernel::tensorMap(unsigned i, Type type) {
  return UnrealizedConversionCastOp::create(b, e.loc, type, func.getArgument(i))
      .getResult(0);
}

Value Kernel::linear(TokenLinear l) {
  return e.iadd(e.index(l.fixed), e.imul(e.index(l.perToken), tokens));
}

Value Kernel::constI64(int64_t v) {
  return LLVM::ConstantOp::create(b, e.loc, b.getI64Type(), v);
}

Value Kernel::threadId() {
  return gpu::ThreadIdOp::create(b, e.loc, gpu::Dimension::x);
}

Value Kernel::blockId(gpu::Dimension d) {
  return gpu::BlockIdOp::create(b, e.loc, d);
}

Value Kernel::workgroupBuffer(ArrayRef<int64_t> shape, Type element) {
  auto space =
      gpu::AddressSpaceAttr::get(b.getContext(), gpu::AddressSpace::Workgroup);
  auto type =
      MemRefType::get(shape, element, MemRefLayoutAttrInterface(), space);
  int64_t bytes = llvm::alignTo(
      type.getNumElements() * element.getIntOrFloatBitWidth() / 8, 16);
  staticSharedBytes += bytes;
  Value buffer = func.addWorkgroupAttribution(type, e.loc);
  // Without an explicit alignment the buffer is placed at its element's
  // alignment, while LLVM may combine accesses into 16-byte vectors.
  func.setWorkgroupAttributionAttr(func.getNumWorkgroupAttributions() - 1,
                                   LLVM::LLVMDialect::getAlignAttrName(),
                                   b.getI64IntegerAttr(16));
  return buffer;
}

void Kernel::onlyIf(Value condition) {
  auto op = scf::IfOp::create(b, e.loc, condition, /*withElseRegion=*/false);
  if (!guard)
    guard = op;
  b.setInsertionPoint(op.thenBlock()->getTerminator());
}

LogicalResult Kernel::finish(Operation *op) {
  if (guard)
    b.setInsertionPointAfter(guard);
  gpu::ReturnOp::create(b, e.loc);
  // The block size fixed (.reqntid): ptxas keeps registers within what a
  // block of it may hold, so a launch never fails for want of them.
  if (!func.getKnownBlockSizeAttr() && launch.block > 0)
    func.setKnownBlockSizeAttr(
        b.getDenseI32ArrayAttr({int32_t(launch.block), 1, 1}));
  if (staticSharedBytes > sm90a::kSharedWithoutOptIn)
    return op->emitOpError()
           << "needs " << staticSharedBytes << " bytes of shared memory in "
           << launch.kernel << "; a sm_90a kernel has at most "
           << sm90a::kSharedWithoutOptIn << " without opting in";
  return success();
}

void LayerKernels::bind(Value tensor, unsigned buffer, TokenLinear rows) {
  tensors[tensor] =
      TensorInfo{buffer, common::bufferType(tensor.getType()), rows};
}

const TensorInfo &LayerKernels::define(Value result, TokenLinear rows) {
  MemRefType type = common::bufferType(result.getType());
  int64_t rowBytes = type.getElementTypeBitWidth() / 8;
  bool dynamic = type.getRank() > 0 && type.isDynamicDim(0);
  if (!dynamic && type.getRank() > 0)
    rows = TokenLinear{type.getDimSize(0), 0};
  for (int64_t d = dynamic ? 1 : 0; d < type.getRank(); ++d)
    rowBytes *= type.getDimSize(d);
  unsigned index;
  auto it = outputArgs.find(result);
  if (it != outputArgs.end())
    index = it->second;
  else
    index =
        plan.addWorkspace(dynamic ? rows * rowBytes : TokenLinear{rowBytes, 0});
  return tensors[result] = TensorInfo{index, type, rows};
}

FailureOr<TensorInfo> LayerKernels::tmaSource(Operation *op, Value tensor) {
  TensorInfo source = info(tensor);
  if (maxTokens == 0 || source.rows.perToken == 0 ||
      !plan.isArgument(source.buffer))
    return source;
  auto it = staged.find(tensor);
  if (it != staged.end())
    return it->second;
  MemRefType type = source.type;
  int64_t rowBytes = type.getElementTypeBitWidth() / 8;
  for (int64_t d = 1; d < type.getRank(); ++d)
    rowBytes *= type.getDimSize(d);
  if (type.getRank() != 2 || rowBytes % 16 != 0)
    return op->emitOpError() << "reads a caller's rows with TMA that are not "
                                "rank 2 or not a multiple of 16 bytes";
  TensorInfo copy = source;
  copy.buffer = plan.addWorkspace(source.rows * rowBytes);
  Kernel k = kernelOn(op, "copy_rows", {source.buffer, copy.buffer});
  k.launch.work = source.rows;
  k.launch.block = 128;
  Emitter &e = k.e;
  Value from = k.view(0, source), to = k.view(1, copy);
  Value r = k.blockId(gpu::Dimension::x);
  k.onlyIf(e.ult(r, k.linear(source.rows)));
  Type element = type.getElementType();
  int64_t width = 16 / (element.getIntOrFloatBitWidth() / 8);
  auto vecType = VectorType::get({width}, element);
  e.forEach(
      e.imul(k.threadId(), width), e.index(type.getDimSize(1)),
      [&](Value c) {
        Value v = vector::LoadOp::create(e.b, e.loc, vecType, from, {r, c},
                                         false, vectorAlign(width, element));
        vector::StoreOp::create(e.b, e.loc, v, to, {r, c}, false,
                                vectorAlign(width, element));
      },
      e.index(128 * width));
  if (failed(k.finish(op)))
    return failure();
  return staged[tensor] = copy;
}

std::string LayerKernels::uniqueName(std::string name) {
  return uniqueKernelName(names, name);
}

Kernel LayerKernels::kernel(Operation *op, StringRef family,
                            ArrayRef<Value> buffers, ArrayRef<unsigned> maps) {
  SmallVector<unsigned> indices;
  for (Value v : buffers)
    indices.push_back(info(v).buffer);
  return kernelOn(op, family, indices, maps);
}

Kernel LayerKernels::kernelOn(Operation *op, StringRef family,
                              ArrayRef<unsigned> bufferIndices,
                              ArrayRef<unsigned> maps) {
  SmallVector<KernelArg> args;
  for (unsigned index : bufferIndices)
    args.push_back({KernelArgKind::Buffer, index});
  for (unsigned m : maps)
    args.push_back({KernelArgKind::TensorMap, m});
  // moe_<family>_<step>, without the step where the family says it.
  std::string name = ("moe_" + family).str();
  if (auto step = dyn_cast<NameLoc>(op->getLoc()))
    if (!family.starts_with(step.getName().strref()))
      name += "_" + step.getName().str();
  // The exchanges themselves run on: their peers wait for them.
  bool skips = skipAfterEpFailure && !isa<EpDispatchSendOp, EpDispatchRecvOp,
                                          EpCombineSendOp, EpCombineRecvOp>(op);
  if (skips)
    args.push_back({KernelArgKind::Buffer, epState()});
  return Kernel(module, uniqueName(name), plan.addLaunch(), args, op->getLoc(),
                skips ? int64_t(::moe::rt::EpDeviceLayout::kError) : -1);
}

llvm::MaybeAlign nvidia::vectorAlign(int64_t width, Type element) {
  return llvm::Align(width * element.getIntOrFloatBitWidth() / 8);
}

Value nvidia::loadF32Vector(Emitter &e, Value buffer, ValueRange index,
                            int64_t width) {
  Type element = cast<MemRefType>(buffer.getType()).getElementType();
  Value v = vector::LoadOp::create(
      e.b, e.loc, VectorType::get({width}, element), buffer, index,
      /*nontemporal=*/false, vectorAlign(width, element));
  if (element.isF32())
    return v;
  return arith::ExtFOp::create(e.b, e.loc,
                               VectorType::get({width}, e.b.getF32Type()), v);
}

Value nvidia::warpButterfly(Emitter &e, Value v,
                            function_ref<Value(Value, Value)> combine) {
  for (int64_t offset = 16; offset > 0; offset /= 2)
    v = combine(v, gpu::ShuffleOp::create(e.b, e.loc, v, offset, 32,
                                          gpu::ShuffleMode::XOR)
                       .getShuffleResult());
  return v;
}

void nvidia::reduceBlockStats(Emitter &e, Value &amax, Value &special,
                              int64_t lanes) {
  for (int64_t offset = 1; offset < lanes; offset *= 2) {
    auto shuffle = [&](Value v) {
      return gpu::ShuffleOp::create(e.b, e.loc, v, offset, 32,
                                    gpu::ShuffleMode::XOR)
          .getShuffleResult();
    };
    amax = arith::MaxNumFOp::create(e.b, e.loc, amax, shuffle(amax));
    special = arith::MaximumFOp::create(e.b, e.loc, special, shuffle(special));
  }
}

std::pair<Value, Value> nvidia::quantizeVector(Emitter &e, QuantAttr scheme,
                                               Value values, int64_t lanes) {
  auto type = cast<VectorType>(values.getType());
  int64_t width = type.getNumElements();
  auto f32Vec = VectorType::get({width}, e.b.getF32Type());
  Value wide = arith::ExtFOp::create(e.b, e.loc, f32Vec, values);
  Value amax = e.f32(0.0), special = e.f32(0.0);
  SmallVector<Value> elements;
  for (int64_t i = 0; i < width; ++i) {
    Value x = vector::ExtractOp::create(e.b, e.loc, wide, i);
    Value isSpecial;
    amax = arith::MaxNumFOp::create(e.b, e.loc, amax,
                                    common::blockStats(e, x, isSpecial));
    special = arith::MaximumFOp::create(e.b, e.loc, special, isSpecial);
    elements.push_back(x);
  }
  reduceBlockStats(e, amax, special, lanes);
  common::BlockScale scale = common::blockScale(e, scheme, amax, special);
  auto codesType = VectorType::get({width}, e.b.getI8Type());
  Value codes = arith::ConstantOp::create(
      e.b, e.loc, DenseElementsAttr::get(codesType, e.b.getI8IntegerAttr(0)));
  for (int64_t i = 0; i < width; ++i)
    codes = vector::InsertOp::create(e.b, e.loc, scale.encode(e, elements[i]),
                                     codes, i);
  return {codes, scale.stored};
}
