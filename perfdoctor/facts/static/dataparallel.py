"""`nn.DataParallel(model)` constructions (PD001): one `dataparallel` subject per call, with the
callee as written (`dataparallel.callee`, which the fix rewrites), and `opt_in` where it is built only
in a branch the user turns on (`if args.dp:` on a store_true flag: `index.settings.in_user_branch`):
the script's default runs one device without it. A test of the device (`if torch.cuda.device_count()
> 1:`) is no such branch: on the machine the script targets it runs."""

from __future__ import annotations

from perfdoctor.facts.model import Facts
from perfdoctor.facts.static.index import SourceIndex, put
from perfdoctor.facts.static.index.settings import in_user_branch

DATAPARALLEL = frozenset({"torch.nn.DataParallel", "torch.nn.parallel.DataParallel",
                          "torch.nn.parallel.data_parallel.DataParallel"})


def detect(index: SourceIndex, facts: Facts) -> None:
    for call in index.calls:
        if index.qual(call.func) in DATAPARALLEL:
            s = index.subject(facts, "dataparallel", call)
            put(s, "callee", index.text(call.func))
            if in_user_branch(index, call):
                put(s, "opt_in", True)
