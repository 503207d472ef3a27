"""The FLOP probe's count (capture/probes/flops.py, probes.json `flops`) -> `compute.flops_per_step`
(FlopCounterMode on one real step: matmuls, convolutions, attention; forward and backward), the
convolutions' part of them (`compute.conv_flops_per_step`: TF32 speeds cuDNN's by default, not matmuls),
the 16-bit share of those FLOPs, and the summary's `compute`: where the count comes from and the modules
with the most FLOPs. The trace's module times later add each listed module's achieved rate
(facts/trace/flops.py `module_rates`); the FLOP/s and MFU are the trace's family's too."""

from __future__ import annotations

from perfdoctor.contracts.report import ComputeDoc, ComputeModuleDoc
from perfdoctor.facts.run.context import RunContext

TOP_MODULES = 8  # modules listed in the summary, by FLOPs


def add(ctx: RunContext) -> None:
    rec = ctx.probes.flops
    if rec is None or rec.flops <= 0:
        return
    ops = ", ".join(f"{k.removeprefix('aten.')} {v / rec.flops:.0%}" for k, v in
                    sorted(rec.ops.items(), key=lambda kv: -kv[1])[:6])
    source = f"torch.utils.flop_counter.FlopCounterMode on step {rec.step}"
    ctx.facts.add("compute.flops_per_step", rec.flops, "number",
                  detail=f"counted by {source} of the run, forward and backward ({ops})")
    convs = sum(v for k, v in rec.ops.items() if "convolution" in k)  # forward and backward
    ctx.facts.add("compute.conv_flops_per_step", convs, "number",
                  detail=f"of the FLOPs {source} counted, those of convolutions (forward and backward)")
    ctx.facts.add("compute.sixteen_bit_share", round(rec.sixteen_bit_flops / rec.flops, 4), "ratio",
                  detail=f"of the FLOPs {source} counted, those of operators on float16 or bfloat16 operands")
    names = list(rec.modules)
    leaves = [n for n in names if not any(o.startswith(n + ".") for o in names)]  # a parent holds its children's
    rows = [ComputeModuleDoc(module=n, layer=rec.order.get(n), flops=rec.modules[n], share=round(rec.modules[n] / rec.flops, 4),
                             forward_flops=rec.forward.get(n, 0))
            for n in sorted(leaves, key=lambda n: -rec.modules[n])[:TOP_MODULES]]
    ctx.summary.compute = ComputeDoc(source=source, flops_per_step=rec.flops, modules=rows)
