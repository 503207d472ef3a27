"""`nn.DataParallel(model)` constructions (PD001): one `dataparallel` subject per call, with the
callee as written (`dataparallel.callee`, which the fix rewrites), and `opt_in` where it is built only
in a branch the user turns on (`if args.dp:` on a store_true flag: `index.settings.in_user_branch`):
the script's default runs one device without it. A test of the device (`if torch.cuda.device_count()
> 1:`) is no such branch: on the machine the script targets it runs. Where the run built nn.DataParallel
in other functions only, a construction here is `constructed` false: a path its training does not take."""

from __future__ import annotations

from pathlib import Path

from perfdoctor.facts.model import Facts
from perfdoctor.facts.static.index import SourceIndex, put
from perfdoctor.facts.static.index.settings import in_user_branch

DATAPARALLEL = frozenset({"torch.nn.DataParallel", "torch.nn.parallel.DataParallel",
                          "torch.nn.parallel.data_parallel.DataParallel"})


def detect(index: SourceIndex, facts: Facts) -> None:
    # the lines where the run built nn.DataParallel: a construction in a function where the run built none
    # while it built one elsewhere is on a path its training does not take (ddim's EMAHelper.ema_copy,
    # for sampling only), not the model it trains
    built = [s for s in facts.of_kind("dataparallel")
             if (f := s.facts.get("dataparallel.constructed")) is not None and f.value]
    for call in index.calls:
        if index.qual(call.func) in DATAPARALLEL:
            s = index.subject(facts, "dataparallel", call)
            put(s, "callee", index.text(call.func))
            if in_user_branch(index, call):
                put(s, "opt_in", True)
            # in a function where the run built none (an if/else on the device in one function is one
            # decision: on the GPU the other branch runs)
            func = (index.file, index.function_name(call))
            if built and all(s is not b and (loc.file, loc.function) != func for b in built for loc in b.locations):
                where = ", ".join(f"{Path(loc.file).name}:{loc.line}" for b in built for loc in b.locations[:1])
                s.add("constructed", False, "", "run",
                      detail=f"the run built nn.DataParallel at {where}, never in this function")
