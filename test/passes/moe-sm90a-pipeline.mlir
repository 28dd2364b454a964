// RUN: moe-opt %s --moe-sm90a-pipeline=stop-after=l1 | FileCheck %s --check-prefix=L1
// RUN: moe-opt %s --moe-sm90a-pipeline=stop-after=kernels | FileCheck %s --check-prefix=KERNELS
// RUN: moe-opt %s --moe-sm90a-pipeline=stop-after=ptx | FileCheck %s --check-prefix=PTX
// RUN: %if ptxas %{ moe-opt %s --moe-sm90a-pipeline | FileCheck %s --check-prefix=CUBIN %}

// The sm_90a target's stages (passes/Pipelines.cpp), stop by stop. An FP8
// layer: decomposed, its activations quantized by the dispatch and the
// gate/up matmul's epilogue; its matmuls take FP8 operands and scales.
// L1: moe.route
// L1-NOT: moe.quantize
// L1-NOT: moe.dequantize
// L1: moe.dispatch {{.*}}quant = #moe.quant<kind = mxfp8>
// L1: moe.grouped_matmul %{{[^ ,]+}}, %{{[^ ,]+}} groups({{.*}}) scales({{.*}}out_quant = #moe.quant<kind = mxfp8>
// L1: moe.grouped_matmul %{{[^ ,]+}}, %{{[^ ,]+}} groups({{.*}}) scales(
// L1: moe.combine

// Kernels and the launch plan beside the L1 ops, named after their steps.
// KERNELS: func.func @layer({{.*}}moe.launch_plan = #moe.launch_plan<
// KERNELS-SAME: @moe_route
// KERNELS-SAME: @moe_grouped_matmul_gate_up
// KERNELS-SAME: @moe_combine
// KERNELS: gpu.module @layer_kernels

// PTX for sm_90a (ptx85), descriptors passed by value; the MXFP8 codes
// converted to bf16 and multiplied as bf16.
// PTX: gpu.binary @layer_kernels  [#gpu.object<#nvvm.target<O = 3, chip = "sm_90a", features = "+ptx85">, properties = {{.*}}, assembly = "
// PTX-SAME: .target sm_90a
// PTX-SAME: .visible .entry moe_grouped_matmul_gate_up(
// PTX-SAME: .param .align 64 .b8 moe_grouped_matmul_gate_up_param_6[128]
// PTX-SAME: mul.rn.bf16x2
// PTX-SAME: wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16

// CUBIN: gpu.binary @layer_kernels  [#gpu.object<#nvvm.target<O = 3, chip = "sm_90a", features = "+ptx85">, properties = {{.*}}, bin = "\7FELF
func.func @layer(%x: tensor<?x64xbf16>, %rw: tensor<8x64xbf16>,
                 %w13: tensor<8x64x64xf8E4M3FN>, %w2: tensor<8x64x32xf8E4M3FN>,
                 %s13: tensor<8x64x2xf8E8M0FNU>, %s2: tensor<8x64x1xf8E8M0FNU>)
    -> tensor<?x64xbf16> {
  %0 = moe.layer %x router(%rw) experts(%w13, %w2) scales(%s13, %s2)
      {config = #moe.config<experts = 8, top_k = 2, hidden = 64, intermediate = 32,
                            router = <kind = softmax_topk>, activation = <kind = swiglu>,
                            quant = <kind = mxfp8>>}
      : (tensor<?x64xbf16>, tensor<8x64xbf16>, tensor<8x64x64xf8E4M3FN>,
         tensor<8x64x32xf8E4M3FN>, tensor<8x64x2xf8E8M0FNU>, tensor<8x64x1xf8E8M0FNU>)
      -> tensor<?x64xbf16>
  return %0 : tensor<?x64xbf16>
}
