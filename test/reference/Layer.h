//===- Layer.h - float64 reference of one MoE layer -------------*- C++ -*-===//
//
// A whole layer computed in double precision, written from the models'
// reference code in HF transformers rather than from the compiler's ops, so
// that it checks the decomposition as well as the kernels.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_TEST_REFERENCE_LAYER_H
#define MOE_TEST_REFERENCE_LAYER_H

#include <cstdint>
#include <vector>

namespace moe::ref {

enum class Router {
  SoftmaxTopK,
  TopKSoftmax,
  SigmoidGroupedTopK,
  SigmoidScaleInput
};

struct LayerConfig {
  int64_t experts = 0, topK = 0, hidden = 0, intermediate = 0;
  Router router = Router::SoftmaxTopK;
  bool renormalize = false;
  int64_t nGroup = 1, topkGroup = 1;
  double scaling = 1.0;
  bool clampedSwiGLU = false;
  double alpha = 1.702, limit = 7.0;
  int64_t sharedIntermediate = 0;
  bool sharedGate = false;
};

/// Row-major tensors in the layer's ABI layout; empty when absent.
struct LayerTensors {
  std::vector<double> hiddenStates; // [T, H]
  std::vector<double> routerWeight; // [E, H]
  std::vector<double> routerBias;   // [E]
  std::vector<double> w13;          // [E, 2I, H]: gate rows, then up rows
  std::vector<double> w2;           // [E, H, I]
  std::vector<double> w13Bias;      // [E, 2I]
  std::vector<double> w2Bias;       // [E, H]
  std::vector<double> sharedW13;    // [2Is, H]
  std::vector<double> sharedW2;     // [H, Is]
  std::vector<double> sharedGate;   // [1, H]
};

/// The layer's output [tokens, H].
std::vector<double> referenceLayer(const LayerConfig &config,
                                   const LayerTensors &tensors, int64_t tokens);

} // namespace moe::ref

#endif // MOE_TEST_REFERENCE_LAYER_H
