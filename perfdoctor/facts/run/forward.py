"""The forward probe's records (capture/probes/forward.py) -> one `model` subject per top-level
module's calling line (autocast, parameter dtype and device), `autocast.enabled` and
`model.param_dtype` of the largest model, and one `eval_grad` subject per line calling a module in
eval mode with grad mode on (PD019)."""

from __future__ import annotations

import statistics

from perfdoctor.contracts.run import ForwardRecord
from perfdoctor.facts.model import site_subject
from perfdoctor.facts.run.context import RunContext


def add(ctx: RunContext) -> None:
    facts = ctx.facts
    models = [f for f in ctx.probes.forward if f.params]
    for f in models:
        s = site_subject(facts, "model", f.site)
        if s is not None:
            s.add("autocast", f.autocast)
            s.add("param_dtype", f.param_dtype)
            s.add("device", f.device)
            s.add("params", f.params, "count")
            if f.lookup_params is not None and f.params is not None:
                s.add("math_params", f.params - f.lookup_params, "count",
                      detail=f"{f.params} parameters less {f.lookup_params} in embedding tables (looked up, not multiplied)")
    if models:
        main = max(models, key=lambda f: (f.params or 0, f.calls))
        facts.add("autocast.enabled", main.autocast, detail=f"at the forward of {main.module}")
        facts.add("model.param_dtype", main.param_dtype, detail=f"parameters of {main.module}")
    eval_grad(ctx)


def eval_grad(ctx: RunContext) -> None:
    """PD019: each line calling a module in eval mode with grad mode on: its calls and forward time
    per steady step, the bytes autograd saved per call for a backward, and how many of the measured
    calls a backward then used (a model kept in eval mode while it trains, to freeze BatchNorm, is
    not an evaluation)."""
    idx = [x["i"] for x in ctx.steady]
    for r in ctx.probes.eval_grad:
        s = site_subject(ctx.facts, "eval_grad", r.site)
        if s is None or not r.calls:
            continue
        s.add("module", r.module)
        per = {int(row[0]): (row[1], row[2] if len(row) > 2 else 1) for row in r.ms_by_step if len(row) >= 2}
        if idx:
            series = tuple(per.get(i, (0.0, 0))[0] for i in idx)
            s.add("calls_per_step", sum(per.get(i, (0.0, 0))[1] for i in idx) / len(idx), "count",
                  detail=f"mean over {len(idx)} steady steps; {r.calls} calls in the run")
            s.add("ms", statistics.fmean(series), "ms", detail=f"time in these forwards, mean over {len(idx)} steady steps",
                  per_step=series)
            on = sum(1 for i in idx if per.get(i, (0.0, 0))[1] > 0)
            s.add("step_share", on / len(idx), "ratio", detail=f"{on} of {len(idx)} steady steps called this line")
        if r.saved_bytes:
            n = len(r.saved_bytes)
            s.add("measured", n, "count")
            s.add("saved_bytes", statistics.median(r.saved_bytes), "bytes",
                  detail=f"median over the first {n} calls of the tensors autograd saved for a backward "
                         "(activations and inputs; parameters not counted)")
            s.add("backward_share", r.backward / n, "ratio", detail=f"{r.backward} of {n} measured calls")
            batches = [b for b in r.batch if b > 0]
            if batches:
                s.add("batch", int(statistics.median(batches)), "count",
                      detail=f"the first dimension of the input, median over {len(batches)} measured calls")
        s.add("trained", r.trained, detail="the module also ran training-mode forwards with grad on in this run"
              if r.trained else "no training-mode forward of the module in this run")


def model_classes(forward: list[ForwardRecord]) -> set[str] | None:
    """The user-defined classes of the models the run called; None where it called none, or where
    its run folder predates the record."""
    if not forward or any(fw.classes is None for fw in forward):
        return None
    return {c for fw in forward for c in fw.classes or ()}
