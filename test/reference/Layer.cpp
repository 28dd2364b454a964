//===- Layer.cpp - float64 reference of one MoE layer ---------------------===//

#include "test/reference/Layer.h"

#include <algorithm>
#include <cmath>
#include <numeric>

using namespace moe::ref;

static double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

/// Indices of the k largest values, largest first; ties to the lower index
/// (torch.topk leaves ties unspecified).
static std::vector<int64_t> topK(const std::vector<double> &values, int64_t k) {
  std::vector<int64_t> order(values.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return values[a] > values[b]; });
  order.resize(k);
  return order;
}

/// Divides the weights by their sum plus `epsilon`.
static void normalize(std::vector<double> &weights, double epsilon) {
  double total = std::accumulate(weights.begin(), weights.end(), 0.0) + epsilon;
  for (double &w : weights)
    w /= total;
}

/// Gated activation of one (gate, up) pair.
static double activate(const LayerConfig &c, double gate, double up) {
  if (!c.clampedSwiGLU)
    return gate * sigmoid(gate) * up; // silu(gate) * up
  // GptOssExperts: gate clamped above, up both sides, (up + 1) * glu.
  gate = std::min(gate, c.limit);
  up = std::clamp(up, -c.limit, c.limit);
  return (up + 1.0) * (gate * sigmoid(gate * c.alpha));
}

/// A gated MLP on one token: x [H] -> [H], weights w13 [2I, H], w2 [H, I].
static void mlp(const LayerConfig &c, const double *x, const double *w13,
                const double *w2, const double *b13, const double *b2,
                int64_t inter, double scale, double *out) {
  int64_t h = c.hidden;
  std::vector<double> act(inter);
  for (int64_t j = 0; j < inter; ++j) {
    double gate = 0.0, up = 0.0;
    for (int64_t k = 0; k < h; ++k) {
      gate += x[k] * w13[j * h + k];
      up += x[k] * w13[(inter + j) * h + k];
    }
    if (b13) {
      gate += b13[j];
      up += b13[inter + j];
    }
    act[j] = activate(c, gate, up);
  }
  for (int64_t o = 0; o < h; ++o) {
    double y = b2 ? b2[o] : 0.0;
    for (int64_t j = 0; j < inter; ++j)
      y += act[j] * w2[o * inter + j];
    out[o] += scale * y;
  }
}

std::vector<double> moe::ref::referenceLayer(const LayerConfig &c,
                                             const LayerTensors &t,
                                             int64_t tokens) {
  int64_t e = c.experts, h = c.hidden, inter = c.intermediate;
  std::vector<double> out(tokens * h, 0.0);
  for (int64_t tok = 0; tok < tokens; ++tok) {
    const double *x = &t.hiddenStates[tok * h];
    std::vector<double> logits(e);
    for (int64_t i = 0; i < e; ++i)
      for (int64_t k = 0; k < h; ++k)
        logits[i] += x[k] * t.routerWeight[i * h + k];
    bool hasBias = !t.routerBias.empty();

    std::vector<int64_t> chosen;
    std::vector<double> weights;
    switch (c.router) {
    case Router::SoftmaxTopK: { // Mixtral, Qwen2/3-MoE
      if (hasBias)
        for (int64_t i = 0; i < e; ++i)
          logits[i] += t.routerBias[i];
      double max = *std::max_element(logits.begin(), logits.end()), sum = 0;
      std::vector<double> p(e);
      for (int64_t i = 0; i < e; ++i)
        sum += p[i] = std::exp(logits[i] - max);
      for (double &v : p)
        v /= sum;
      chosen = topK(p, c.topK);
      for (int64_t i : chosen)
        weights.push_back(p[i]);
      if (c.renormalize)
        normalize(weights, 0.0);
      break;
    }
    case Router::TopKSoftmax: { // GptOssTopKRouter
      if (hasBias)
        for (int64_t i = 0; i < e; ++i)
          logits[i] += t.routerBias[i];
      chosen = topK(logits, c.topK);
      double max = logits[chosen[0]], sum = 0;
      for (int64_t i : chosen)
        sum += std::exp(logits[i] - max);
      for (int64_t i : chosen)
        weights.push_back(std::exp(logits[i] - max) / sum);
      break;
    }
    case Router::SigmoidGroupedTopK: { // DeepseekV3TopkRouter
      std::vector<double> scores(e), choice(e);
      for (int64_t i = 0; i < e; ++i) {
        scores[i] = sigmoid(logits[i]);
        choice[i] = scores[i] + (hasBias ? t.routerBias[i] : 0.0);
      }
      if (c.nGroup > 1) {
        int64_t per = e / c.nGroup;
        std::vector<double> groupScores(c.nGroup);
        for (int64_t g = 0; g < c.nGroup; ++g) {
          std::vector<double> members(choice.begin() + g * per,
                                      choice.begin() + (g + 1) * per);
          std::vector<int64_t> best = topK(members, 2);
          groupScores[g] = members[best[0]] + members[best[1]];
        }
        std::vector<int64_t> groups = topK(groupScores, c.topkGroup);
        for (int64_t i = 0; i < e; ++i)
          if (std::find(groups.begin(), groups.end(), i / per) == groups.end())
            choice[i] = 0.0;
      }
      chosen = topK(choice, c.topK);
      for (int64_t i : chosen)
        weights.push_back(scores[i]);
      if (c.renormalize)
        normalize(weights, 1e-20); // DeepSeek guards the sum against zero
      break;
    }
    case Router::SigmoidScaleInput: { // Llama4TextMoe
      if (hasBias)
        for (int64_t i = 0; i < e; ++i)
          logits[i] += t.routerBias[i];
      chosen = topK(logits, c.topK);
      for (int64_t i : chosen)
        weights.push_back(sigmoid(logits[i]));
      break;
    }
    }
    for (double &w : weights)
      w *= c.scaling;

    double *y = &out[tok * h];
    bool scaleInput = c.router == Router::SigmoidScaleInput;
    std::vector<double> scaled(h);
    for (size_t j = 0; j < chosen.size(); ++j) {
      int64_t x_e = chosen[j];
      const double *input = x;
      if (scaleInput) {
        for (int64_t k = 0; k < h; ++k)
          scaled[k] = x[k] * weights[j];
        input = scaled.data();
      }
      mlp(c, input, &t.w13[x_e * 2 * inter * h], &t.w2[x_e * h * inter],
          t.w13Bias.empty() ? nullptr : &t.w13Bias[x_e * 2 * inter],
          t.w2Bias.empty() ? nullptr : &t.w2Bias[x_e * h], inter,
          scaleInput ? 1.0 : weights[j], y);
    }
    if (c.sharedIntermediate > 0) {
      double gate = 1.0;
      if (c.sharedGate) {
        double g = 0.0;
        for (int64_t k = 0; k < h; ++k)
          g += x[k] * t.sharedGate[k];
        gate = sigmoid(g);
      }
      mlp(c, x, t.sharedW13.data(), t.sharedW2.data(), nullptr, nullptr,
          c.sharedIntermediate, gate, y);
    }
  }
  return out;
}
