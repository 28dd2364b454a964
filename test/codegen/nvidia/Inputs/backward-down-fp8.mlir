// The down matmul's FP8 dgrad as moe-differentiate gives it for an FP8
// block-128 layer (the rows' gradient quantized along N, the weights
// transposed and quantized), and the activation's backward, its one
// reader: moe-legalize makes the product and that backward one grouped
// matmul, and the weights' transpose and quantize one kernel.
func.func @backward(%g: tensor<?x128xbf16>, %rows: tensor<?x2xi32>,
                    %w: tensor<?x2xf32>, %off: tensor<5xi32>,
                    %cnt: tensor<4xi32>, %w2: tensor<4x128x192xbf16>,
                    %h: tensor<?x384xbf16>, %x: tensor<?x64xbf16>)
    -> tensor<4x384x64xf32> {
  %dy = moe.scatter %g, %rows offsets %off
      : (tensor<?x128xbf16>, tensor<?x2xi32>, tensor<5xi32>) -> tensor<?x128xbf16>
  %t = moe.transpose %w2 : tensor<4x128x192xbf16> -> tensor<4x192x128xbf16>
  %wq, %ws = moe.quantize %t {scheme = #moe.quant<kind = fp8_block128>}
      : (tensor<4x192x128xbf16>) -> (tensor<4x192x128xf8E4M3FN>, tensor<4x2x1xf32>)
  %gq, %gs = moe.quantize %dy {scheme = #moe.quant<kind = fp8_block128>}
      : (tensor<?x128xbf16>) -> (tensor<?x128xf8E4M3FN>, tensor<?x1xf32>)
  %d = moe.grouped_matmul %gq, %wq groups(%cnt, %off) scales(%gs, %ws)
      : (tensor<?x128xf8E4M3FN>, tensor<4x192x128xf8E4M3FN>, tensor<4xi32>,
         tensor<5xi32>, tensor<?x1xf32>, tensor<4x2x1xf32>) -> tensor<?x192xbf16>
  %dh, %aw, %dw = moe.activation_grad %d, %h rows(%rows, %w)
      {activation = #moe.activation<kind = swiglu>}
      : (tensor<?x192xbf16>, tensor<?x384xbf16>, tensor<?x2xi32>,
         tensor<?x2xf32>) -> (tensor<?x384xbf16>, tensor<?x192xbf16>, tensor<?x2xf32>)
  %dw2 = moe.grouped_matmul_wgrad %dy lhs %aw groups(%cnt, %off)
      : (tensor<?x128xbf16>, tensor<?x192xbf16>, tensor<4xi32>, tensor<5xi32>)
      -> tensor<4x128x192xf32>
  %dw13 = moe.grouped_matmul_wgrad %dh lhs %x groups(%cnt, %off)
      : (tensor<?x384xbf16>, tensor<?x64xbf16>, tensor<4xi32>, tensor<5xi32>)
      -> tensor<4x384x64xf32>
  return %dw13 : tensor<4x384x64xf32>
}
