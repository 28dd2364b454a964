// The down matmul's dgrad and the activation's backward, its one reader,
// with a bias's dot: moe-legalize makes them one grouped matmul whose
// epilogue is the activation's backward.
func.func @backward(%g: tensor<?x64xbf16>, %rows: tensor<?x2xi32>,
                    %w: tensor<?x2xf32>, %off: tensor<5xi32>,
                    %cnt: tensor<4xi32>, %w2: tensor<4x64x96xbf16>,
                    %h: tensor<?x192xbf16>, %b2: tensor<4x64xbf16>,
                    %x: tensor<?x32xbf16>) -> tensor<4x192x32xf32> {
  %dy = moe.scatter %g, %rows offsets %off
      : (tensor<?x64xbf16>, tensor<?x2xi32>, tensor<5xi32>) -> tensor<?x64xbf16>
  %d, %dot = moe.grouped_matmul_dgrad %dy, %w2 groups(%cnt, %off) bias %b2
      : (tensor<?x64xbf16>, tensor<4x64x96xbf16>, tensor<4xi32>, tensor<5xi32>,
         tensor<4x64xbf16>) -> (tensor<?x96xbf16>, tensor<?x1xf32>)
  %dh, %aw, %dw = moe.activation_grad %d, %h rows(%rows, %w) bias_term %dot
      {activation = #moe.activation<kind = clamped_swiglu>}
      : (tensor<?x96xbf16>, tensor<?x192xbf16>, tensor<?x2xi32>,
         tensor<?x2xf32>, tensor<?x1xf32>)
      -> (tensor<?x192xbf16>, tensor<?x96xbf16>, tensor<?x2xf32>)
  %dw2 = moe.grouped_matmul_wgrad %dy lhs %aw groups(%cnt, %off)
      : (tensor<?x64xbf16>, tensor<?x96xbf16>, tensor<4xi32>, tensor<5xi32>)
      -> tensor<4x64x96xf32>
  %dw13 = moe.grouped_matmul_wgrad %dh lhs %x groups(%cnt, %off)
      : (tensor<?x192xbf16>, tensor<?x32xbf16>, tensor<4xi32>, tensor<5xi32>)
      -> tensor<4x192x32xf32>
  return %dw13 : tensor<4x192x32xf32>
}
