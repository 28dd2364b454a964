func.func @value_size_32(%q: tensor<1x17x2x64xbf16>, %k: tensor<1x50x1x64xbf16>, %v: tensor<1x50x1x32xbf16>) -> tensor<1x17x2x32xbf16> {
  %o = moe.attention %q, %k, %v {scale = 0.3 : f32} : (tensor<1x17x2x64xbf16>, tensor<1x50x1x64xbf16>, tensor<1x50x1x32xbf16>) -> tensor<1x17x2x32xbf16>
  return %o : tensor<1x17x2x32xbf16>
}
