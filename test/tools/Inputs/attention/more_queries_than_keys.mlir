func.func @more_queries_than_keys(%q: tensor<1x40x6x32xbf16>, %k: tensor<1x30x2x32xbf16>, %v: tensor<1x30x2x32xbf16>) -> tensor<1x40x6x32xbf16> {
  %o = moe.attention %q, %k, %v {causal} : (tensor<1x40x6x32xbf16>, tensor<1x30x2x32xbf16>, tensor<1x30x2x32xbf16>) -> tensor<1x40x6x32xbf16>
  return %o : tensor<1x40x6x32xbf16>
}
