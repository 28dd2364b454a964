// The gate/up weights' gradient in E4M3 from the rows' saved codes (1 x 128
// scales along K) and the rows' gradient in bf16; intermediate 40 and
// hidden 200: neither a multiple of the 128-column tiles.
func.func @wgrad(%dh: tensor<?x80xbf16>, %x: tensor<?x200xf8E4M3FN>,
                 %s: tensor<?x2xf32>, %cnt: tensor<4xi32>,
                 %off: tensor<5xi32>) -> tensor<4x80x200xf32> {
  %dw13 = moe.grouped_matmul_wgrad %dh lhs %x groups(%cnt, %off) scale %s
      {quant = #moe.quant<kind = fp8_block128>}
      : (tensor<?x80xbf16>, tensor<?x200xf8E4M3FN>, tensor<4xi32>,
         tensor<5xi32>, tensor<?x2xf32>) -> tensor<4x80x200xf32>
  return %dw13 : tensor<4x80x200xf32>
}
