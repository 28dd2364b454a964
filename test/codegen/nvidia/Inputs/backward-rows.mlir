// The routed experts' backward from the output's gradient to the gate/up
// weights' gradient: scatter, activation backward, wgrad.
func.func @backward(%g: tensor<?x64xbf16>, %rows: tensor<?x1xi32>,
                    %off: tensor<5xi32>, %cnt: tensor<4xi32>,
                    %w: tensor<?x1xf32>, %h: tensor<?x128xbf16>,
                    %x: tensor<?x64xbf16>) -> tensor<4x128x64xf32> {
  %dy = moe.scatter %g, %rows offsets %off
      : (tensor<?x64xbf16>, tensor<?x1xi32>, tensor<5xi32>) -> tensor<?x64xbf16>
  %dh, %aw, %dw = moe.activation_grad %dy, %h rows(%rows, %w)
      {activation = #moe.activation<kind = swiglu>}
      : (tensor<?x64xbf16>, tensor<?x128xbf16>, tensor<?x1xi32>,
         tensor<?x1xf32>)
      -> (tensor<?x128xbf16>, tensor<?x64xbf16>, tensor<?x1xf32>)
  %dw13 = moe.grouped_matmul_wgrad %dh lhs %x groups(%cnt, %off)
      : (tensor<?x128xbf16>, tensor<?x64xbf16>, tensor<4xi32>, tensor<5xi32>)
      -> tensor<4x128x64xf32>
  return %dw13 : tensor<4x128x64xf32>
}
