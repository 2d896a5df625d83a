#!/usr/bin/env python3
"""FLA's Triton KDA kernels (fla-core 0.6.0) on the shapes of bench/cuda/ops_bench.cc, printing rows of
the same table, so scripts/gpu-check.sh can put each klinear figure beside FLA's from one run.

chunk_kda gets the gate in the kernel (use_gate_in_kernel, as vLLM/SGLang call it) with the
in-kernel L2 norm, fp32 initial state and final state out; fused_recurrent_kda the same for decode,
updating the state in place. Median of timed repeats with CUDA events after warm-up; random inputs.
"""
import math
import sys

import torch
from fla.ops.kda import chunk_kda, fused_recurrent_kda

BW, FLOPS = 4.2e12, 770e12


def time_ms(fn, warm=3, reps=10):
    for _ in range(warm):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def row(op, shape, ms, flop, nbytes):
    floor = max(flop / FLOPS, nbytes / BW) * 1e3
    print(f"| {op:<22} | {shape:<34} | {ms:9.4f} | {flop:10.3g} | {nbytes:10.3g} | {floor:9.4f} | {100 * floor / ms:5.1f}% |",
          flush=True)


def inputs(b, t, h, d, dev):
    q = torch.rand(b, t, h, d, device=dev, dtype=torch.bfloat16) * 2 - 1
    k = torch.rand(b, t, h, d, device=dev, dtype=torch.bfloat16) * 2 - 1
    v = torch.rand(b, t, h, d, device=dev, dtype=torch.bfloat16) * 2 - 1
    f = (torch.rand(b, t, h, d, device=dev, dtype=torch.bfloat16) * 6 - 3)
    beta = torch.rand(b, t, h, device=dev, dtype=torch.float32)
    a_log = torch.rand(h, device=dev, dtype=torch.float32) * math.log(16.0)
    dt_bias = torch.rand(h * d, device=dev, dtype=torch.float32) * 2 - 1
    return q, k, v, f, beta, a_log, dt_bias


def main():
    what = sys.argv[1] if len(sys.argv) > 1 else "all"
    dev = "cuda"
    h, d = 32, 128
    print("| op | shape | ms (median) | FLOP | bytes | floor ms | of floor |\n|---|---|---|---|---|---|---|")
    if what in ("all", "kda"):
        for lens in ([4096], [16384], [65536], [2048] * 8):
            for lb in (None, -5.0):
                n, b = sum(lens), len(lens)
                q, k, v, f, beta, a_log, dt_bias = inputs(1, n, h, d, dev)
                s0 = torch.rand(b, h, d, d, device=dev, dtype=torch.float32) * 0.2 - 0.1
                cu = torch.tensor([0] + list(__import__("itertools").accumulate(lens)), device=dev, dtype=torch.long)

                def run():
                    return chunk_kda(q, k, v, f, beta, initial_state=s0, output_final_state=True,
                                     use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, A_log=a_log,
                                     dt_bias=dt_bias, lower_bound=lb, safe_gate=lb is not None,
                                     cu_seqlens=cu if b > 1 else None)

                with torch.inference_mode():
                    ms = time_ms(run)
                nbytes = n * h * d * (2.0 * 4 + 4) + n * h * 4.0 + 2.0 * b * h * d * d * 4
                flop = n * h * 2.0 * (4.0 * 64 * d + 3.0 * d * d)
                row("FLA chunk_kda", f"B={b} T={n // b} H=32 D=128 {'softplus' if lb is None else 'lower-bound'}",
                    ms, flop, nbytes)
    if what in ("all", "kda_decode"):
        for b in (1, 64, 256):
            q, k, v, f, beta, a_log, dt_bias = inputs(b, 1, h, d, dev)
            state = torch.rand(b, h, d, d, device=dev, dtype=torch.float32) * 0.2 - 0.1

            def run():
                return fused_recurrent_kda(q, k, v, f, beta, A_log=a_log, dt_bias=dt_bias, initial_state=state,
                                           output_final_state=True, use_qk_l2norm_in_kernel=True,
                                           use_gate_in_kernel=True)

            with torch.inference_mode():
                ms = time_ms(run)
            nbytes = b * h * d * (2.0 * 4 + 4) + b * h * 4.0 + 2.0 * b * h * d * d * 4
            row("FLA fused_recurrent", f"B={b} T=1 H=32 D=128 softplus", ms, b * h * 4.0 * d * d, nbytes)


if __name__ == "__main__":
    main()
