#!/usr/bin/env python3
"""FLA's Triton KDA kernels (fla-core 0.6.0) on the shapes of bench/cuda/ops_bench.cc, printing rows of
the same table, so scripts/gpu-check.sh can put each klinear figure beside FLA's from one run.

chunk_kda gets the gate in the kernel (use_gate_in_kernel, as vLLM/SGLang call it) with the
in-kernel L2 norm, fp32 initial state and final state out. The decode calls the recurrent kernel as
vLLM does: fused_recurrent_kda_fwd updating an fp32 state pool in place through slot indices (the
public fused_recurrent_kda writes its final state to a fresh tensor instead), the same work as
klinear's kda_recurrent row; then the whole decode layer after the projections as FLA's modules
compose it (a conv update for each of q, k and v with SiLU, the recurrent kernel, the sigmoid-gated
RMSNorm), the same work as klinear's fused kda_decode row. Median of timed repeats with CUDA events
after warm-up; random inputs.

usage: fla_bench.py [all | kda | kda_decode] [SHAPE]: the rows of a group whose shape contains SHAPE
(as bench/cuda/ops_bench's second argument), e.g. fla_bench.py kda "T=16384 H=32".
"""
import math
import sys

import torch
from fla.modules.causal_conv1d import causal_conv1d_update
from fla.modules.norm.fused_norm_gate import rms_norm_gated
from fla.ops.kda import chunk_kda
from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd

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
    if what in ("-h", "--help"):
        print(__doc__)
        return
    if what not in ("all", "kda", "kda_decode"):
        sys.exit(f"fla_bench.py: unknown group {what!r}\n{__doc__}")
    wanted = sys.argv[2] if len(sys.argv) > 2 else ""
    dev = "cuda"
    h, d = 32, 128
    print("| op | shape | ms (median) | FLOP | bytes | floor ms | of floor |\n|---|---|---|---|---|---|---|")
    if what in ("all", "kda"):
        # H = 32, and 16 or 8 heads: a two- or four-way tensor-parallel shard of the same layer.
        for lens, heads in (([4096], 32), ([16384], 32), ([65536], 32), ([2048] * 8, 32), ([16384], 16), ([16384], 8)):
            for lb in (None, -5.0) if heads == 32 else (None,):
                n, b = sum(lens), len(lens)
                shape = f"B={b} T={n // b} H={heads} D=128 {'softplus' if lb is None else 'lower-bound'}"
                if wanted not in shape:
                    continue
                q, k, v, f, beta, a_log, dt_bias = inputs(1, n, heads, d, dev)
                s0 = torch.rand(b, heads, d, d, device=dev, dtype=torch.float32) * 0.2 - 0.1
                cu = torch.tensor([0] + list(__import__("itertools").accumulate(lens)), device=dev, dtype=torch.long)

                def run():
                    return chunk_kda(q, k, v, f, beta, initial_state=s0, output_final_state=True,
                                     use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, A_log=a_log,
                                     dt_bias=dt_bias, lower_bound=lb, safe_gate=lb is not None,
                                     cu_seqlens=cu if b > 1 else None)

                with torch.inference_mode():
                    ms = time_ms(run)
                nbytes = n * heads * d * (2.0 * 4 + 4) + n * heads * 4.0 + 2.0 * b * heads * d * d * 4
                flop = n * heads * 2.0 * (4.0 * 64 * d + 3.0 * d * d)
                row("FLA chunk_kda", shape, ms, flop, nbytes)
    if what in ("all", "kda_decode"):
        taps = 4
        for b in (1, 64, 256):
            recurrent_shape, layer_shape = f"B={b} T=1 H=32 D=128 softplus", f"B={b} H=32 D=128 softplus"
            if wanted not in recurrent_shape and wanted not in layer_shape:
                continue
            q, k, v, f, beta, a_log, dt_bias = inputs(b, 1, h, d, dev)
            pool = torch.rand(b, h, d, d, device=dev, dtype=torch.float32) * 0.2 - 0.1
            slots = torch.arange(b, device=dev, dtype=torch.int32)

            def recurrent(q, k, v):
                return fused_recurrent_kda_fwd(q, k, v, f, beta, A_log=a_log, dt_bias=dt_bias, initial_state=pool,
                                               inplace_final_state=True, ssm_state_indices=slots,
                                               use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True)[0]

            with torch.inference_mode():
                ms = time_ms(lambda: recurrent(q, k, v))
            nbytes = b * h * d * (2.0 * 4 + 4) + b * h * 4.0 + 2.0 * b * h * d * d * 4
            row("FLA fused_recurrent", recurrent_shape, ms, b * h * 4.0 * d * d, nbytes)

            # The layer: x rows of q, k, v before their convs, FLA's conv caches [B, channels, taps] (bf16).
            p = h * d
            xs = [torch.rand(b, p, device=dev, dtype=torch.bfloat16) * 2 - 1 for _ in range(3)]
            conv_w = [torch.rand(p, taps, device=dev, dtype=torch.bfloat16) - 0.5 for _ in range(3)]
            caches = [torch.rand(b, p, taps, device=dev, dtype=torch.bfloat16) * 2 - 1 for _ in range(3)]
            og = torch.rand(b * h, d, device=dev, dtype=torch.bfloat16) * 6 - 3
            o_norm = torch.rand(d, device=dev, dtype=torch.bfloat16) + 0.5

            def layer():
                qc, kc, vc = (causal_conv1d_update(x, c, weight=w, activation="silu")[0].view(b, 1, h, d)
                               for x, c, w in zip(xs, caches, conv_w))
                o = recurrent(qc, kc, vc)
                return rms_norm_gated(o.view(b * h, d), og, o_norm, None, activation="sigmoid", eps=1e-5)

            with torch.inference_mode():
                ms = time_ms(layer)
            # As ops_bench's kda_decode row counts them: the state read and written, qkv, og and y,
            # the conv window read and written, f and β, the weights; ~7·D·D FLOP per head.
            ch = 3 * p
            nbytes = (2.0 * b * h * d * d * 4 + b * (ch + 2.0 * p) * 2 + 2.0 * b * (taps - 1) * ch * 2 + b * (p + h) * 4.0 +
                      ch * taps * 2.0 + p * 4.0 + d * 2.0)
            row("FLA decode layer", layer_shape, ms, 7.0 * b * h * d * d, nbytes)


if __name__ == "__main__":
    main()
