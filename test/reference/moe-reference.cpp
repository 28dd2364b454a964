//===- moe-reference.cpp - the float64 reference of a compiled layer ------===//
//
// moe-reference LIBRARY.so IN.safetensors OUT.safetensors: reads the layer's
// configuration from the library's description (nothing else of it is used)
// and writes the float64 reference output, as F32 "out", for the inputs a
// run of moe-exec takes. FP8 weights are decoded with their scales; the
// layer's own quantization of activations is not modelled, so compare with
// a bound that allows for it. FP8 weights are decoded with their scales; the
// layer's own quantization of activations is not modelled, so compare with
// a bound that allows for it.
//
//===----------------------------------------------------------------------===//

#include "runtime/Json.h"
#include "runtime/Safetensors.h"
#include "test/reference/Layer.h"
#include "test/reference/Quantize.h"

#include <cstdio>
#include <cstring>
#include <dlfcn.h>
#include <map>

using namespace moe;

static int fail(const std::string &message) {
  std::fprintf(stderr, "moe-reference: %s\n", message.c_str());
  return 1;
}

/// A tensor's values as doubles (BF16 or F32 data).
static std::vector<double> values(const rt::SafetensorsFile &file,
                                  const rt::TensorInfo &tensor) {
  std::vector<double> out(tensor.numElements());
  const uint8_t *data = file.data(tensor);
  for (size_t i = 0; i < out.size(); ++i) {
    uint32_t bits = 0;
    if (tensor.dtype == rt::DType::BF16) {
      uint16_t half;
      std::memcpy(&half, data + 2 * i, 2);
      bits = uint32_t(half) << 16;
    } else {
      std::memcpy(&bits, data + 4 * i, 4);
    }
    float value;
    std::memcpy(&value, &bits, 4);
    out[i] = value;
  }
  return out;
}

int main(int argc, char **argv) {
  if (argc != 4)
    return fail("usage: moe-reference LIBRARY.so IN.safetensors "
                "OUT.safetensors");
  std::string library = argv[1];
  if (library.find('/') == std::string::npos)
    library = "./" + library;
  void *handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle)
    return fail(dlerror());
  auto info =
      reinterpret_cast<const char *(*)()>(dlsym(handle, "moe_layer_info"));
  if (!info)
    return fail(library + " has no moe_layer_info");
  std::string error;
  rt::Json description;
  const char *text = info();
  if (!rt::parseJson(text, text + std::strlen(text), description, error))
    return fail(error);
  const rt::Json *c = description.get("config");
  if (!c)
    return fail("the description has no config");
  auto number = [&](const char *key) {
    const rt::Json *v = c->get(key);
    return v ? v->number : 0.0;
  };
  auto flag = [&](const char *key) {
    const rt::Json *v = c->get(key);
    return v && v->boolean;
  };
  ref::LayerConfig config;
  config.experts = int64_t(number("experts"));
  config.topK = int64_t(number("top_k"));
  config.hidden = int64_t(number("hidden"));
  config.intermediate = int64_t(number("intermediate"));
  std::string router = c->get("router") ? c->get("router")->text : "";
  std::map<std::string, ref::Router> routers = {
      {"softmax_topk", ref::Router::SoftmaxTopK},
      {"topk_softmax", ref::Router::TopKSoftmax},
      {"sigmoid_grouped_topk", ref::Router::SigmoidGroupedTopK},
      {"sigmoid_scale_input", ref::Router::SigmoidScaleInput}};
  if (!routers.count(router))
    return fail("unknown router '" + router + "'");
  config.router = routers[router];
  config.renormalize = flag("renormalize");
  config.nGroup = int64_t(number("n_group"));
  config.topkGroup = int64_t(number("topk_group"));
  config.scaling = number("scaling");
  config.clampedSwiGLU =
      c->get("activation") && c->get("activation")->text == "clamped_swiglu";
  config.alpha = number("alpha");
  config.limit = number("limit");
  config.sharedIntermediate = int64_t(number("shared_intermediate"));
  config.sharedGate = flag("shared_gate");

  auto inputs = rt::SafetensorsFile::read(argv[2], error);
  if (!inputs)
    return fail(error);
  ref::LayerTensors t;
  std::map<std::string, std::vector<double> *> slots = {
      {"hidden_states", &t.hiddenStates},
      {"router_weight", &t.routerWeight},
      {"router_bias", &t.routerBias},
      {"w13", &t.w13},
      {"w2", &t.w2},
      {"w13_bias", &t.w13Bias},
      {"w2_bias", &t.w2Bias},
      {"shared_w13", &t.sharedW13},
      {"shared_w2", &t.sharedW2},
      {"shared_gate", &t.sharedGate}};
  int64_t tokens = 0;
  for (const rt::TensorInfo &tensor : inputs->tensors()) {
    if (tensor.name.size() > 6 &&
        tensor.name.compare(tensor.name.size() - 6, 6, "_scale") == 0)
      continue; // Read with its weight.
    if (!slots.count(tensor.name))
      return fail("cannot use input '" + tensor.name + "'");
    if (tensor.dtype == rt::DType::F8_E4M3) {
      // FP8 weights ([E,] N, K) with f32 scales per 128 x 128 or 1 x 128
      // block (FP8 block-128), or E8M0 scales per 1 x 32 block (MXFP8).
      const rt::TensorInfo *scale = inputs->find(tensor.name + "_scale");
      size_t rank = tensor.shape.size();
      if (!scale ||
          (scale->dtype != rt::DType::F32 &&
           scale->dtype != rt::DType::F8_E8M0) ||
          (rank != 2 && rank != 3) || scale->shape.size() != rank)
        return fail("FP8 input '" + tensor.name +
                    "' needs F32 or F8_E8M0 "
                    "scales '" +
                    tensor.name + "_scale' of its rank");
      bool mx = scale->dtype == rt::DType::F8_E8M0;
      std::vector<double> scales;
      if (mx) {
        const uint8_t *codes = inputs->data(*scale);
        for (int64_t i = 0; i < scale->numElements(); ++i)
          scales.push_back(ref::decodeE8M0(codes[i]));
      } else {
        scales = values(*inputs, *scale);
      }
      int64_t n = tensor.shape[rank - 2], k = tensor.shape[rank - 1];
      int64_t nb = scale->shape[rank - 2], kb = scale->shape[rank - 1];
      int64_t rowBlock = nb == n ? 1 : 128, colBlock = mx ? 32 : 128;
      std::vector<double> &out = *slots[tensor.name];
      out.resize(tensor.numElements());
      const uint8_t *codes = inputs->data(tensor);
      for (int64_t i = 0; i < int64_t(out.size()); ++i) {
        int64_t x = i / (n * k), r = (i / k) % n, c = i % k;
        out[i] = ref::decodeE4M3(codes[i]) *
                 scales[(x * nb + r / rowBlock) * kb + c / colBlock];
      }
      continue;
    }
    if (tensor.dtype != rt::DType::BF16 && tensor.dtype != rt::DType::F32)
      return fail("cannot use input '" + tensor.name + "'");
    *slots[tensor.name] = values(*inputs, tensor);
    if (tensor.name == "hidden_states")
      tokens = tensor.shape[0];
  }
  std::vector<double> out = ref::referenceLayer(config, t, tokens);
  std::vector<float> out32(out.begin(), out.end());
  if (!rt::writeSafetensors(
          argv[3],
          {{"out", rt::DType::F32, {tokens, config.hidden}, out32.data()}},
          error))
    return fail(error);
  return 0;
}
