"""Fix kind "call-kwargs": set keyword arguments of a call (`DataLoader(..., num_workers=8)`); where
`**config` feeds the call, merge the new keys into one dict and say where they belong."""

from __future__ import annotations

import libcst as cst

from perfdoctor.rules.fixes.context import Context, dotted, set_kwargs


def fix(ctx: Context, params: dict):
    callee = params["callee"]
    want = {k: cst.parse_expression(str(v)) for k, v in params["set"].items()}
    calls = [c for c in ctx.calls() if dotted(c.func) == callee or (dotted(c.func) or "").endswith("." + callee)
             or (ctx.qual(c.func) or "").endswith("." + callee)]
    if not calls or not want:
        return None
    here = [c for c in calls if ctx.pos[c].start.line <= ctx.line <= ctx.pos[c].end.line]
    call = (here or calls)[0]
    stars = [a for a in call.args if a.star == "**"]
    explicit = {a.keyword.value for a in call.args if a.keyword is not None}
    missing = [k for k in want if k not in explicit]
    note = ""
    if stars and missing:
        # `f(x, **cfg, num_workers=4)` raises when cfg has the key: merge into one dict instead
        parts = [f"**{ctx.code(a.value)}" for a in stars] + [f'"{k}": {ctx.code(want[k])}' for k in missing]
        merged = cst.parse_expression("{" + ", ".join(parts) + "}")
        args, seen = [], False
        for a in call.args:
            if a.star == "**":
                if not seen:
                    args.append(a.with_changes(value=merged))
                seen = True
            else:
                args.append(a)
        args[-1] = args[-1].with_changes(comma=call.args[-1].comma)
        args = set_kwargs(args, {k: v for k, v in want.items() if k in explicit})
        cfg = ", ".join(f"`{ctx.code(a.value)}`" for a in stars)
        note = f"{cfg} feeds this call: setting {', '.join(missing)} in the config that builds it is the better place"
    else:
        args = set_kwargs(call.args, want)
    return ctx.stmt.deep_replace(call, call.with_changes(args=args)), note
