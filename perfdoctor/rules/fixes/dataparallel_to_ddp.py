"""Fix kind "dataparallel-to-ddp": `nn.DataParallel(model)` -> `DistributedDataParallel(model.to(rank), device_ids=[rank])`."""

from __future__ import annotations

import libcst as cst

from perfdoctor.facts.static.dataparallel import DATAPARALLEL
from perfdoctor.rules.fixes.context import Context, dotted, kw, names

DDP_NOTE = ('launch with `torchrun --nproc_per_node=N`; call `torch.distributed.init_process_group("nccl")` '
            'first and use a DistributedSampler')


def fix(ctx: Context, params: dict):
    rank = str(params.get("local_rank", "local_rank"))
    for call in ctx.calls():
        if ctx.qual(call.func) not in DATAPARALLEL:
            continue
        module = kw(call, "module") or next((a for a in call.args if a.keyword is None and not a.star), None)
        if module is None:
            return None
        note = DDP_NOTE
        if isinstance(call.func, cst.Attribute):
            prefix = dotted(call.func.value)
            pq = ctx.qual(call.func.value)
            ddp = f"{prefix}.parallel.DistributedDataParallel" if pq == "torch.nn" else \
                f"{prefix}.DistributedDataParallel"
        else:
            local = [k for k, v in ctx.index.aliases.items()
                     if v in ("torch.nn.parallel.DistributedDataParallel", "torch.nn.DistributedDataParallel")]
            ddp = local[0] if local else "DistributedDataParallel"
            if not local:
                note = "add `from torch.nn.parallel import DistributedDataParallel`; " + note
        mod = ctx.code(module.value)
        if not isinstance(module.value, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)):
            mod = f"({mod})"
        new = cst.parse_expression(f"{ddp}({mod}.to({rank}), device_ids=[{rank}])")
        note += f"; set `{rank} = int(os.environ[\"LOCAL_RANK\"])`" if rank not in names(ctx, ctx.module) else ""
        return ctx.stmt.deep_replace(call, new), note
    return None
