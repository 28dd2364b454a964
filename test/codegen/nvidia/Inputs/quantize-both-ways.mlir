// A training forward's weights quantized for its own matmul and, for the
// backward's FP8 dgrad, transposed: moe-legalize makes the two quantizes
// one kernel, which writes the codes both ways.
func.func @both_ways(%x: tensor<?x128xbf16>, %cnt: tensor<4xi32>,
                     %off: tensor<5xi32>, %w: tensor<4x256x128xbf16>)
    -> tensor<?x128xbf16> {
  %xq, %xs = moe.quantize %x {scheme = #moe.quant<kind = fp8_block128>}
      : (tensor<?x128xbf16>) -> (tensor<?x128xf8E4M3FN>, tensor<?x1xf32>)
  %wq, %ws = moe.quantize %w {scheme = #moe.quant<kind = fp8_block128>}
      : (tensor<4x256x128xbf16>) -> (tensor<4x256x128xf8E4M3FN>, tensor<4x2x1xf32>)
  %t = moe.transpose %w : tensor<4x256x128xbf16> -> tensor<4x128x256xbf16>
  %tq, %ts = moe.quantize %t {scheme = #moe.quant<kind = fp8_block128>}
      : (tensor<4x128x256xbf16>) -> (tensor<4x128x256xf8E4M3FN>, tensor<4x1x2xf32>)
  %y = moe.grouped_matmul %xq, %wq groups(%cnt, %off) scales(%xs, %ws)
      : (tensor<?x128xf8E4M3FN>, tensor<4x256x128xf8E4M3FN>, tensor<4xi32>,
         tensor<5xi32>, tensor<?x1xf32>, tensor<4x2x1xf32>) -> tensor<?x256xbf16>
  %yq, %ys = moe.quantize %y {scheme = #moe.quant<kind = fp8_block128>}
      : (tensor<?x256xbf16>) -> (tensor<?x256xf8E4M3FN>, tensor<?x2xf32>)
  %z = moe.grouped_matmul %yq, %tq groups(%cnt, %off) scales(%ys, %ts)
      : (tensor<?x256xf8E4M3FN>, tensor<4x128x256xf8E4M3FN>, tensor<4xi32>,
         tensor<5xi32>, tensor<?x2xf32>, tensor<4x1x2xf32>) -> tensor<?x128xbf16>
  return %z : tensor<?x128xbf16>
}
