//===- Numerics.cpp - the arithmetic every backend shares -----------------===//

#include "codegen/common/Numerics.h"

#include "codegen/common/FP8.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::common;

Value common::roundedToBF16(Emitter &e, Value x) {
  Value rounded = arith::TruncFOp::create(e.b, e.loc, e.b.getBF16Type(), x);
  return arith::ExtFOp::create(e.b, e.loc, e.b.getF32Type(), rounded);
}

Value common::routerLogit(Emitter &e, RouterKind kind, Value logit,
                          Value bias) {
  return bias && kind != RouterKind::SigmoidGroupedTopK ? e.add(logit, bias)
                                                        : logit;
}

std::pair<Value, Value> common::expertScore(Emitter &e, RouterKind kind,
                                            Value logit, Value bias) {
  logit = routerLogit(e, kind, logit, bias);
  Value s = kind == RouterKind::SigmoidGroupedTopK ? e.sigmoid(logit) : logit;
  // DeepSeek selects by score plus the correction bias.
  Value choice =
      bias && kind == RouterKind::SigmoidGroupedTopK ? e.add(s, bias) : s;
  return {s, choice};
}

void common::routeGrad(Emitter &e, RouterAttr router, int64_t experts,
                       int64_t topK, Value score, Value scoreGrad, Value ids,
                       Value dw, Value dl, Value t, ExpertThreads threads) {
  auto inOrder = [&](function_ref<void(Value)> body) {
    e.forEach(e.index(0), e.index(experts), body);
  };
  auto fold = [&](Value init, function_ref<Value(Value)> term, bool isMax) {
    return e.reduce(e.index(0), e.index(experts), {init},
                    [&](Value x, ValueRange acc) -> SmallVector<Value> {
                      Value v = term(x);
                      return {isMax ? e.maxf(acc[0], v) : e.add(acc[0], v)};
                    })[0];
  };
  auto alone = [](function_ref<void()> step) { step(); };
  using ForExperts = function_ref<void(function_ref<void(Value)>)>;
  using Reduce = function_ref<Value(Value, function_ref<Value(Value)>, bool)>;
  ForExperts forExperts =
      threads.forExperts ? threads.forExperts : ForExperts(inOrder);
  Reduce reduce = threads.reduce ? threads.reduce : Reduce(fold);
  auto single = threads.single
                    ? threads.single
                    : function_ref<void(function_ref<void()>)>(alone);
  RouterKind kind = router.getKind();
  bool normalize = router.getRenormalize() || kind == RouterKind::TopKSoftmax;
  double scaling = router.getScaling().convertToDouble();
  auto overChoices = [&](Value init, auto term) {
    return e.reduce(e.index(0), e.index(topK), {init},
                    [&](Value j, ValueRange acc) -> SmallVector<Value> {
                      return {term(j, acc[0])};
                    })[0];
  };
  // An id outside [0, E) (never a route's) reads and adds nothing: it is
  // taken as expert 0 with no gradient.
  auto validId = [&](Value j) {
    Value id = e.loadRaw(ids, {t, j});
    return e.andi(e.icmp(arith::CmpIPredicate::sge, id, e.i32(0)),
                  e.icmp(arith::CmpIPredicate::slt, id, e.i32(experts)));
  };
  auto chosen = [&](Value j) {
    return e.toIndex(e.select(validId(j), e.loadRaw(ids, {t, j}), e.i32(0)));
  };
  // The scores: sigmoid, softmax over every expert, or exp less the chosen
  // maximum.
  if (kind == RouterKind::SigmoidGroupedTopK ||
      kind == RouterKind::SigmoidScaleInput) {
    forExperts([&](Value x) {
      e.storeRaw(e.sigmoid(e.loadRaw(score, {x})), score, {x});
    });
  } else {
    Value max =
        kind == RouterKind::TopKSoftmax
            ? overChoices(e.f32(-INFINITY),
                          [&](Value j, Value m) {
                            return e.maxf(m, e.loadRaw(score, {chosen(j)}));
                          })
            : reduce(
                  e.f32(-INFINITY),
                  [&](Value x) { return e.loadRaw(score, {x}); },
                  /*isMax=*/true);
    Value sum = reduce(
        e.f32(0.0),
        [&](Value x) {
          Value p = e.exp(e.sub(e.loadRaw(score, {x}), max));
          e.storeRaw(p, score, {x});
          return p;
        },
        /*isMax=*/false);
    forExperts([&](Value x) {
      Value p = e.loadRaw(score, {x});
      e.storeRaw(kind == RouterKind::SoftmaxTopK ? e.div(p, sum) : p, score,
                 {x});
      e.storeRaw(e.f32(0.0), scoreGrad, {x});
    });
  }
  if (kind == RouterKind::SigmoidGroupedTopK ||
      kind == RouterKind::SigmoidScaleInput)
    forExperts([&](Value x) { e.storeRaw(e.f32(0.0), scoreGrad, {x}); });
  // The chosen scores u_j, normalized v_j = u_j / S and scaled: the
  // gradient of u_j is (dv_j - sum_m dv_m v_m) / S, dv = scaling dw.
  Value total = overChoices(e.f32(0.0), [&](Value j, Value acc) {
    return e.add(
        acc, e.select(validId(j), e.loadRaw(score, {chosen(j)}), e.f32(0.0)));
  });
  if (kind == RouterKind::SigmoidGroupedTopK)
    total = e.add(total, e.f32(1e-20));
  auto dv = [&](Value j) {
    return e.select(validId(j), e.mul(e.loadRaw(dw, {t, j}), e.f32(scaling)),
                    e.f32(0.0));
  };
  Value dot = overChoices(e.f32(0.0), [&](Value j, Value acc) {
    return e.add(acc,
                 e.mul(dv(j), e.div(e.loadRaw(score, {chosen(j)}), total)));
  });
  single([&] {
    e.forEach(e.index(0), e.index(topK), [&](Value j) {
      Value du = normalize ? e.div(e.sub(dv(j), dot), total) : dv(j);
      e.ifThen(validId(j), [&] { e.storeRaw(du, scoreGrad, {chosen(j)}); });
    });
  });
  // Through the score: softmax over every expert, exp, or sigmoid.
  Value pDot = kind == RouterKind::SoftmaxTopK
                   ? reduce(
                         e.f32(0.0),
                         [&](Value x) {
                           return e.mul(e.loadRaw(score, {x}),
                                        e.loadRaw(scoreGrad, {x}));
                         },
                         /*isMax=*/false)
                   : Value();
  forExperts([&](Value x) {
    Value u = e.loadRaw(score, {x}), du = e.loadRaw(scoreGrad, {x});
    Value grad;
    if (kind == RouterKind::SoftmaxTopK)
      grad = e.mul(u, e.sub(du, pDot));
    else if (kind == RouterKind::TopKSoftmax)
      grad = e.mul(du, u);
    else
      grad = e.mul(du, e.mul(u, e.sub(e.f32(1.0), u)));
    e.storeRaw(grad, dl, {t, x});
  });
}

void common::selectExperts(Emitter &e, RouterAttr router, int64_t experts,
                           int64_t topK, const RouteScratch &scratch, Value ids,
                           Value weights, Value t, SelectThreads threads) {
  auto sequential = [&](Value lb, Value ub, function_ref<Value(Value)> key,
                        function_ref<Value(Value)> eligible) {
    return e.argmax(lb, ub, key, eligible);
  };
  ArgmaxFn argmax = threads.argmax ? threads.argmax : ArgmaxFn(sequential);
  auto alone = [](function_ref<void()> step) { step(); };
  auto single = threads.single
                    ? threads.single
                    : function_ref<void(function_ref<void()>)>(alone);
  RouterKind kind = router.getKind();
  int64_t nGroup = router.getNGroup();
  Value zero8 = arith::ConstantOp::create(e.b, e.loc, e.b.getI8IntegerAttr(0));
  Value one8 = arith::ConstantOp::create(e.b, e.loc, e.b.getI8IntegerAttr(1));
  auto isFree = [&](Value flags) {
    return [&, flags](Value iv) {
      return e.icmp(arith::CmpIPredicate::eq, e.loadRaw(flags, {iv}), zero8);
    };
  };
  auto clear = [&](Value x) { e.storeRaw(zero8, scratch.taken, {x}); };
  if (threads.forExperts)
    threads.forExperts(clear);
  else
    single([&] { e.forEach(e.index(0), e.index(experts), clear); });

  if (kind == RouterKind::SoftmaxTopK && threads.softmax)
    threads.softmax();
  else if (kind == RouterKind::SoftmaxTopK)
    single([&] {
      // Softmax over all experts, max-subtracted; it ranks as the logits do.
      Value max =
          e.reduce(e.index(0), e.index(experts), {e.f32(-INFINITY)},
                   [&](Value x, ValueRange acc) -> SmallVector<Value> {
                     return {e.maxf(acc[0], e.loadRaw(scratch.score, {x}))};
                   })[0];
      Value sum =
          e.reduce(e.index(0), e.index(experts), {e.f32(0.0)},
                   [&](Value x, ValueRange acc) -> SmallVector<Value> {
                     Value p = e.exp(e.sub(e.loadRaw(scratch.score, {x}), max));
                     e.storeRaw(p, scratch.score, {x});
                     return {e.add(acc[0], p)};
                   })[0];
      e.forEach(e.index(0), e.index(experts), [&](Value x) {
        Value p = e.div(e.loadRaw(scratch.score, {x}), sum);
        e.storeRaw(p, scratch.score, {x});
        e.storeRaw(p, scratch.choice, {x});
      });
    });

  if (nGroup > 1)
    single([&] {
      // Each group scores by the sum of its two best choices; experts outside
      // the best topk_group groups compete with a choice score of 0, as in
      // HF transformers' DeepseekV3TopkRouter.
      int64_t perGroup = experts / nGroup;
      e.forEach(e.index(0), e.index(nGroup), [&](Value g) {
        Value first = arith::MulIOp::create(e.b, e.loc, g, e.index(perGroup));
        Value last = e.iadd(first, e.index(perGroup));
        auto top2 =
            e.reduce(first, last, {e.f32(-INFINITY), e.f32(-INFINITY)},
                     [&](Value x, ValueRange acc) -> SmallVector<Value> {
                       Value v = e.loadRaw(scratch.choice, {x});
                       Value beatsFirst = e.fgt(v, acc[0]);
                       Value second =
                           e.select(beatsFirst, acc[0],
                                    e.select(e.fgt(v, acc[1]), v, acc[1]));
                       return {e.select(beatsFirst, v, acc[0]), second};
                     });
        e.storeRaw(e.add(top2[0], top2[1]), scratch.groupScore, {g});
        e.storeRaw(zero8, scratch.groupTaken, {g});
      });
      e.forEach(e.index(0), e.index(router.getTopkGroup()), [&](Value) {
        Value best = e.argmax(
            e.index(0), e.index(nGroup),
            [&](Value g) { return e.loadRaw(scratch.groupScore, {g}); },
            isFree(scratch.groupTaken));
        e.storeRaw(one8, scratch.groupTaken, {e.toIndex(best)});
      });
      e.forEach(e.index(0), e.index(experts), [&](Value x) {
        Value g = arith::DivUIOp::create(e.b, e.loc, x, e.index(perGroup));
        Value masked = e.icmp(arith::CmpIPredicate::eq,
                              e.loadRaw(scratch.groupTaken, {g}), zero8);
        e.storeRaw(e.select(masked, e.f32(0.0), e.loadRaw(scratch.choice, {x})),
                   scratch.choice, {x});
      });
    });

  // Top-k by choice score, in descending order.
  e.forEach(e.index(0), e.index(topK), [&](Value j) {
    Value best = e.toIndex(argmax(
        e.index(0), e.index(experts),
        [&](Value x) { return e.loadRaw(scratch.choice, {x}); },
        isFree(scratch.taken)));
    single([&] {
      e.storeRaw(one8, scratch.taken, {best});
      e.storeRaw(e.toI32(best), ids, {t, j});
      Value w = e.loadRaw(scratch.score, {best});
      if (kind == RouterKind::SigmoidScaleInput)
        w = e.sigmoid(w);
      e.storeRaw(w, weights, {t, j});
      if (scratch.chosen)
        e.storeRaw(w, scratch.chosen, {j});
    });
  });

  // The chosen weights, read back from the scratch where there is one.
  auto chosen = [&](Value j) {
    return scratch.chosen ? e.loadRaw(scratch.chosen, {j})
                          : e.loadRaw(weights, {t, j});
  };
  auto setChosen = [&](Value w, Value j) {
    e.storeRaw(w, scratch.chosen ? scratch.chosen : weights,
               scratch.chosen ? ValueRange{j} : ValueRange{t, j});
  };
  single([&] {
    // GPT-OSS: softmax over the k chosen logits.
    if (kind == RouterKind::TopKSoftmax) {
      Value max = e.reduce(e.index(0), e.index(topK), {e.f32(-INFINITY)},
                           [&](Value j, ValueRange acc) -> SmallVector<Value> {
                             return {e.maxf(acc[0], chosen(j))};
                           })[0];
      e.forEach(e.index(0), e.index(topK),
                [&](Value j) { setChosen(e.exp(e.sub(chosen(j), max)), j); });
    }
    bool normalize = router.getRenormalize() || kind == RouterKind::TopKSoftmax;
    double scaling = router.getScaling().convertToDouble();
    if (normalize || scaling != 1.0) {
      Value sum = e.reduce(e.index(0), e.index(topK), {e.f32(0.0)},
                           [&](Value j, ValueRange acc) -> SmallVector<Value> {
                             return {e.add(acc[0], chosen(j))};
                           })[0];
      // DeepSeek guards the sum against zero.
      if (kind == RouterKind::SigmoidGroupedTopK)
        sum = e.add(sum, e.f32(1e-20));
      e.forEach(e.index(0), e.index(topK), [&](Value j) {
        Value w = chosen(j);
        if (normalize)
          w = e.div(w, sum);
        if (scaling != 1.0)
          w = e.mul(w, e.f32(scaling));
        e.storeRaw(w, weights, {t, j});
      });
    }
  });
}

Value common::activate(Emitter &e, ActivationAttr activation, Value gate,
                       Value up) {
  if (activation.getKind() == ActivationKind::SwiGLU)
    return e.mul(e.mul(gate, e.sigmoid(gate)), up);
  // GPT-OSS: gate clamped above, up on both sides, (up + 1) * glu.
  double limit = activation.getLimit().convertToDouble();
  double alpha = activation.getAlpha().convertToDouble();
  gate = e.minf(gate, e.f32(limit));
  up = e.maxf(e.minf(up, e.f32(limit)), e.f32(-limit));
  Value glu = e.mul(gate, e.sigmoid(e.mul(gate, e.f32(alpha))));
  return e.mul(e.add(up, e.f32(1.0)), glu);
}

std::pair<Value, Value> common::activationGrad(Emitter &e,
                                               ActivationAttr activation,
                                               Value gate, Value up) {
  // silu'(x) = s + x s (1 - s), s = sigmoid(x).
  auto siluGrad = [&](Value x, Value s) {
    return e.add(s, e.mul(x, e.mul(s, e.sub(e.f32(1.0), s))));
  };
  if (activation.getKind() == ActivationKind::SwiGLU) {
    Value s = e.sigmoid(gate);
    return {e.mul(siluGrad(gate, s), up), e.mul(gate, s)};
  }
  // (clamp(up) + 1) * g sigmoid(alpha g), g = min(gate, limit).
  double limit = activation.getLimit().convertToDouble();
  double alpha = activation.getAlpha().convertToDouble();
  auto ole = [&](Value x, Value y) {
    return arith::CmpFOp::create(e.b, e.loc, arith::CmpFPredicate::OLE, x, y)
        .getResult();
  };
  Value g = e.minf(gate, e.f32(limit));
  Value u = e.maxf(e.minf(up, e.f32(limit)), e.f32(-limit));
  Value s = e.sigmoid(e.mul(g, e.f32(alpha)));
  Value glu = e.mul(g, s);
  // d(g s(alpha g))/dg = s + alpha g s (1 - s).
  Value dGlu =
      e.add(s, e.mul(e.f32(alpha), e.mul(g, e.mul(s, e.sub(e.f32(1.0), s)))));
  Value gateGrad = e.select(ole(gate, e.f32(limit)),
                            e.mul(e.add(u, e.f32(1.0)), dGlu), e.f32(0.0));
  Value upInside = arith::AndIOp::create(e.b, e.loc, ole(e.f32(-limit), up),
                                         ole(up, e.f32(limit)));
  Value upGrad = e.select(upInside, glu, e.f32(0.0));
  return {gateGrad, upGrad};
}

int64_t common::scaleRowsPerBlock(ArrayRef<int64_t> dataShape,
                                  ArrayRef<int64_t> scaleShape,
                                  QuantAttr scheme) {
  size_t rows = dataShape.size() - 2;
  bool square = scheme.getKind() == QuantKind::FP8Block128 &&
                scaleShape[rows] != dataShape[rows];
  return square ? 128 : 1;
}

void common::layOutExperts(Emitter &e, int64_t experts, int64_t align,
                           Value offsets, function_ref<Value(Value)> countOf,
                           function_ref<void(Value, Value, Value)> each) {
  Value total =
      e.reduce(e.index(0), e.index(experts), {e.i32(0)},
               [&](Value x, ValueRange acc) -> SmallVector<Value> {
                 Value count = countOf(x);
                 e.storeRaw(acc[0], offsets, {x});
                 if (each)
                   each(x, acc[0], count);
                 return {e.iadd(acc[0], e.roundUp(count, e.i32(align)))};
               })[0];
  e.storeRaw(total, offsets, {e.index(experts)});
}

Value common::loadScale(Emitter &e, Value scales, ValueRange indices) {
  Value raw = e.loadRaw(scales, indices);
  return raw.getType().isInteger(8) ? decodeE8M0(e, raw) : raw;
}

void common::quantizeBlock(Emitter &e, QuantAttr scheme, Value input,
                           Value data, Value scales, ArrayRef<Value> prefix,
                           Value rb, Value kb, Value firstRow, Value lastRow,
                           Value firstCol, Value lastCol) {
  auto at = [&](Value r, Value c) {
    SmallVector<Value> index(prefix);
    index.append({r, c});
    return index;
  };
  // amax ignores NaN; MXFP8 marks a block holding NaN or inf instead.
  auto stats = e.reduce(
      firstRow, lastRow, {e.f32(0.0), e.f32(0.0)},
      [&](Value r, ValueRange acc) -> SmallVector<Value> {
        return e.reduce(
            firstCol, lastCol, acc,
            [&](Value c, ValueRange inner) -> SmallVector<Value> {
              Value special;
              Value x = blockStats(e, e.load(input, at(r, c)), special);
              return {arith::MaxNumFOp::create(e.b, e.loc, inner[0], x),
                      arith::MaximumFOp::create(e.b, e.loc, inner[1], special)};
            });
      });
  SmallVector<Value> scaleIndex(prefix);
  scaleIndex.append({rb, kb});
  BlockScale scale = blockScale(e, scheme, stats[0], stats[1]);
  e.storeRaw(scale.stored, scales, scaleIndex);
  e.forEach(firstRow, lastRow, [&](Value r) {
    e.forEach(firstCol, lastCol, [&](Value c) {
      e.storeRaw(scale.encode(e, e.load(input, at(r, c))), data, at(r, c));
    });
  });
}

common::BlockScale common::blockScale(Emitter &e, QuantAttr scheme, Value amax,
                                      Value special) {
  BlockScale out;
  out.mx = scheme.getKind() == QuantKind::MXFP8;
  if (out.mx) {
    Value isSpecial = e.fgt(special, e.f32(0.0));
    Value exponent = e.select(isSpecial, e.i32(0),
                              mxScaleExponent(e, amax, scheme.getRounding()));
    Value code = e.select(isSpecial, e.i32(0xFF), e.iadd(exponent, e.i32(127)));
    out.stored = arith::TruncIOp::create(e.b, e.loc, e.b.getI8Type(), code);
    out.factor = exp2(e, arith::SubIOp::create(e.b, e.loc, e.i32(0), exponent));
  } else {
    out.stored = e.div(arith::MaxNumFOp::create(e.b, e.loc, amax, e.f32(1e-4)),
                       e.f32(448.0));
    out.factor = out.stored;
  }
  return out;
}

Value common::BlockScale::encode(Emitter &e, Value x) const {
  // MXFP8 multiplies by 2^-e (exact); FP8 block-128 divides in f32.
  if (mx)
    return encodeE4M3(e, e.mul(x, factor));
  return encodeE4M3(e, e.scaleQuotient ? e.scaleQuotient(e, x, factor)
                                       : e.div(x, factor));
}

Value common::blockStats(Emitter &e, Value x, Value &special) {
  Value magnitude = math::AbsFOp::create(e.b, e.loc, x);
  Value isSpecial = arith::CmpFOp::create(e.b, e.loc, arith::CmpFPredicate::UGE,
                                          magnitude, e.f32(INFINITY));
  special = e.select(isSpecial, e.f32(1.0), e.f32(0.0));
  return magnitude;
}

void common::dequantizeBlock(Emitter &e, Value data, Value scales, Value out,
                             ArrayRef<Value> prefix, Value rb, Value kb,
                             Value firstRow, Value lastRow, Value firstCol,
                             Value lastCol) {
  SmallVector<Value> scaleIndex(prefix);
  scaleIndex.append({rb, kb});
  Value scale = loadScale(e, scales, scaleIndex);
  e.forEach(firstRow, lastRow, [&](Value r) {
    e.forEach(firstCol, lastCol, [&](Value c) {
      SmallVector<Value> index(prefix);
      index.append({r, c});
      e.store(e.mul(decodeE4M3(e, e.loadRaw(data, index)), scale), out, index);
    });
  });
}
