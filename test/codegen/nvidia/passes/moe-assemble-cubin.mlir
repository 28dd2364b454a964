// RUN: %if ptxas %{ moe-opt %s --moe-assemble-cubin --split-input-file --verify-diagnostics | FileCheck %s %}
// RUN: not moe-opt %s --moe-assemble-cubin=cuda-path=%t.no-toolkit --split-input-file 2>&1 | FileCheck %s --check-prefix=NONE

// Without a toolkit the error says where ptxas was looked for.
// NONE: error: no ptxas at {{.*}}.no-toolkit/bin/ptxas (set --cuda-path or CUDA_HOME)

// PTX objects become cubins for their chip; others are left as they are.
// CHECK-LABEL: gpu.binary @kernels
// CHECK-SAME: #gpu.object<#nvvm.target<chip = "sm_90a">, bin = "\7FELF
// CHECK-SAME: #gpu.object<#nvvm.target<chip = "sm_90a">, bin = "not assembled">
gpu.binary @kernels [
  #gpu.object<#nvvm.target<chip = "sm_90a">, assembly = ".version 8.5\0A.target sm_90a\0A.address_size 64\0A.visible .entry empty()\0A{\0Aret;\0A}\0A">,
  #gpu.object<#nvvm.target<chip = "sm_90a">, bin = "not assembled">
]

// -----

// A ptxas failure keeps the PTX and says how to reproduce it.
// expected-error @+1 {{ptxas failed}}
gpu.binary @broken [
  #gpu.object<#nvvm.target<chip = "sm_90a">, assembly = ".version 8.5\0A.target sm_90a\0A.address_size 64\0A.visible .entry broken()\0A{\0Anot_an_instruction;\0A}\0A">
]
