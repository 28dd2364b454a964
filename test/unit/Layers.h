//===- Layers.h - the model layers the CPU tests build -------*- C++ -*-===//
//
// The router, activation and shared-expert variant of each model type as a
// moe.layer with random bf16 weights, for the tests that run it through the
// CPU backend beside the float64 reference layer (test/reference).
//
//===----------------------------------------------------------------------===//

#ifndef MOE_TEST_UNIT_LAYERS_H
#define MOE_TEST_UNIT_LAYERS_H

#include "test/reference/Layer.h"
#include "test/unit/CpuJit.h"

#include <cmath>

namespace moe::test {

/// One layer: its config, which optional weights it takes, and its quant
/// scheme as the config writes it (e.g. "<kind = mxfp8>"; empty for bf16).
struct LayerCase {
  const char *name;
  ref::LayerConfig config;
  bool routerBias = false, expertBiases = false;
  std::string quant = "";
};

/// Each model type's layer at hidden size 64 and intermediate size 32.
inline std::vector<LayerCase> modelLayers() {
  using ref::Router;
  auto config = [](Router router, int64_t experts, int64_t topK) {
    ref::LayerConfig c;
    c.router = router;
    c.experts = experts;
    c.topK = topK;
    c.hidden = 64;
    c.intermediate = 32;
    return c;
  };
  std::vector<LayerCase> all;
  ref::LayerConfig mixtral = config(Router::SoftmaxTopK, 8, 2);
  mixtral.renormalize = true;
  all.push_back({"mixtral", mixtral});
  ref::LayerConfig qwen2 = config(Router::SoftmaxTopK, 16, 4);
  qwen2.sharedIntermediate = 48;
  qwen2.sharedGate = true;
  all.push_back({"qwen2_moe", qwen2});
  ref::LayerConfig deepseek = config(Router::SigmoidGroupedTopK, 16, 4);
  deepseek.renormalize = true;
  deepseek.nGroup = 4;
  deepseek.topkGroup = 2;
  deepseek.scaling = 2.5;
  deepseek.sharedIntermediate = 32;
  all.push_back({"deepseek_v3", deepseek, /*routerBias=*/true});
  ref::LayerConfig gptOss = config(Router::TopKSoftmax, 8, 4);
  gptOss.clampedSwiGLU = true;
  gptOss.limit = 0.75; // small enough that clamping happens
  all.push_back({"gpt_oss", gptOss, true, /*expertBiases=*/true});
  ref::LayerConfig llama4 = config(Router::SigmoidScaleInput, 8, 1);
  llama4.sharedIntermediate = 32;
  all.push_back({"llama4", llama4});
  return all;
}

inline std::string routerText(const ref::LayerConfig &c) {
  static const char *kinds[] = {"softmax_topk", "topk_softmax",
                                "sigmoid_grouped_topk", "sigmoid_scale_input"};
  std::string text = std::string("<kind = ") + kinds[int(c.router)];
  if (c.renormalize)
    text += ", renormalize = true";
  if (c.nGroup > 1)
    text += ", n_group = " + std::to_string(c.nGroup) +
            ", topk_group = " + std::to_string(c.topkGroup);
  if (c.scaling != 1.0)
    text += ", scaling = " + std::to_string(c.scaling);
  return text + ">";
}

/// The layer's arguments after the tokens, in ABI order, random.
inline std::vector<std::pair<std::string, Input>>
layerWeights(const LayerCase &lc, std::mt19937 &rng) {
  const ref::LayerConfig &c = lc.config;
  int64_t e = c.experts, h = c.hidden, inter = c.intermediate;
  int64_t is = c.sharedIntermediate;
  double wScale = 1.0 / std::sqrt(double(h));
  std::vector<std::pair<std::string, Input>> weights;
  weights.push_back({"router_weight", randomInput(rng, {e, h}, wScale)});
  if (lc.routerBias)
    weights.push_back({"router_bias", randomInput(rng, {e}, 0.3, true)});
  weights.push_back({"w13", randomInput(rng, {e, 2 * inter, h}, wScale)});
  weights.push_back(
      {"w2", randomInput(rng, {e, h, inter}, 1.0 / std::sqrt(double(inter)))});
  if (lc.expertBiases) {
    weights.push_back({"w13_bias", randomInput(rng, {e, 2 * inter}, 0.3)});
    weights.push_back({"w2_bias", randomInput(rng, {e, h}, 0.3)});
  }
  if (is > 0) {
    weights.push_back({"shared_w13", randomInput(rng, {2 * is, h}, wScale)});
    weights.push_back(
        {"shared_w2", randomInput(rng, {h, is}, 1.0 / std::sqrt(double(is)))});
    if (c.sharedGate)
      weights.push_back({"shared_gate", randomInput(rng, {1, h}, wScale)});
  }
  return weights;
}

/// `func.func @layer` of one moe.layer on the tokens and `weights`.
inline std::string
layerSource(const LayerCase &lc,
            const std::vector<std::pair<std::string, Input>> &weights) {
  const ref::LayerConfig &c = lc.config;
  std::string h = std::to_string(c.hidden);
  std::string out = "tensor<?x" + h + "xbf16>";
  std::string args = "%hidden_states: " + out, types = out;
  for (auto &[name, in] : weights) {
    args += ", %" + name + ": " + tensorType(in.shape, in.isF32, false);
    types += ", " + tensorType(in.shape, in.isF32, false);
  }
  int64_t is = c.sharedIntermediate;
  std::string layer =
      "%out = moe.layer %hidden_states router(%router_weight" +
      std::string(lc.routerBias ? ", %router_bias" : "") +
      ") experts(%w13, %w2)" +
      (lc.expertBiases ? " biases(%w13_bias, %w2_bias)" : "") +
      (is > 0 ? std::string(" shared(%shared_w13, %shared_w2") +
                    (c.sharedGate ? ", %shared_gate)" : ")")
              : "") +
      " {config = #moe.config<experts = " + std::to_string(c.experts) +
      ", top_k = " + std::to_string(c.topK) + ", hidden = " + h +
      ", intermediate = " + std::to_string(c.intermediate) +
      ", router = " + routerText(c) + ", activation = " +
      (c.clampedSwiGLU
           ? "<kind = clamped_swiglu, alpha = " + std::to_string(c.alpha) +
                 ", limit = " + std::to_string(c.limit) + ">"
           : std::string("<kind = swiglu>")) +
      (is > 0 ? ", shared_intermediate = " + std::to_string(is) : "") +
      (c.sharedGate ? ", shared_gate = true" : "") +
      (lc.quant.empty() ? "" : ", quant = " + lc.quant) + ">} : (" + types +
      ") -> " + out;
  return "func.func @layer(" + args + ") -> " + out +
         " attributes {llvm.emit_c_interface} {\n  " + layer +
         "\n  return %out : " + out + "\n}\n";
}

/// The reference's tensor of the argument `name`.
inline std::vector<double> *referenceSlot(ref::LayerTensors &t,
                                          const std::string &name) {
  return name == "hidden_states"   ? &t.hiddenStates
         : name == "router_weight" ? &t.routerWeight
         : name == "router_bias"   ? &t.routerBias
         : name == "w13"           ? &t.w13
         : name == "w2"            ? &t.w2
         : name == "w13_bias"      ? &t.w13Bias
         : name == "w2_bias"       ? &t.w2Bias
         : name == "shared_w13"    ? &t.sharedW13
         : name == "shared_w2"     ? &t.sharedW2
                                   : &t.sharedGate;
}

} // namespace moe::test

#endif // MOE_TEST_UNIT_LAYERS_H
