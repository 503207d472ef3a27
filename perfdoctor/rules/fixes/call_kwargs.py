"""Fix kind "call-kwargs": set keyword arguments of a call (`DataLoader(..., num_workers=8)`); where
`**config` feeds the call, merge the new keys into one dict and say where they belong.

A keyword the call already passes from a variable (`num_workers=args.workers`, `num_workers=WORKERS`)
is never overwritten with a constant: that would disable the script's own flag or setting. The fix
goes where the value comes from instead, the `default=` of its argparse option (`--workers`) or the
module-level constant (`WORKERS = 0`) in this file, with the call's other keys said in words; where
neither is found, the call keeps that keyword and the note says which value to give it."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

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
    fed = {a.keyword.value: a.value for a in call.args
           if a.keyword is not None and a.keyword.value in want and not _constant(a.value)}
    if fed:
        return _at_the_source(ctx, call, callee, want, fed)
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


def _constant(expr: cst.BaseExpression) -> bool:
    """A literal the user wrote in the call (`0`, `True`, `"x"`, `-1`), which a fix may replace."""
    if isinstance(expr, cst.UnaryOperation):
        expr = expr.expression
    return isinstance(expr, (cst.Integer, cst.Float, cst.SimpleString, cst.ConcatenatedString)) or (
        isinstance(expr, cst.Name) and expr.value in ("True", "False", "None"))


def _at_the_source(ctx: Context, call: cst.Call, callee: str, want: dict[str, cst.BaseExpression],
                   fed: dict[str, cst.BaseExpression]):
    """The fix where a variable keyword's value comes from (see the module's doc), or the call's
    other keys with the variable ones left as they are and said in words."""
    line = ctx.pos[call].start.line
    rest = {k: v for k, v in want.items() if k not in fed}
    rest_words = (f"; in the {callee} call at line {line}, also " + ", ".join(f"{k}={ctx.code(v)}" for k, v in rest.items())
                  if rest else "")
    if len(fed) == 1:
        (key, value), = fed.items()
        source = _source_of(ctx, value)
        if source is not None:
            stmt, node, what = source
            ctx.widen(stmt)
            new = ctx.stmt.deep_replace(node, _with_value(node, want[key]))
            return new, (f"`{key}={ctx.code(value)}` in the {callee} call at line {line} reads {what}: "
                         f"{'its default' if isinstance(node, cst.Call) else 'it'} becomes {ctx.code(want[key])}"
                         f"{' (the option still overrides it)' if isinstance(node, cst.Call) else ''}{rest_words}")
    words = "; ".join(f"{k} comes from `{ctx.code(v)}`: give it {ctx.code(want[k])} (where that value is set)"
                      for k, v in fed.items())
    if rest:
        return ctx.stmt.deep_replace(call, call.with_changes(args=set_kwargs(call.args, rest))), words
    return None, words  # words only: nothing in the call to change


def _source_of(ctx: Context, value: cst.BaseExpression) -> tuple[cst.BaseStatement, cst.CSTNode, str] | None:
    """Where `value` is set in this file: (its statement, the node to change, in words): the
    argparse option `--x` (or `--x-y`, or dest="x") of `args.x`, else the module-level `X = <literal>`
    of a name `X`. None where it is not found once."""
    if isinstance(value, cst.Attribute) and isinstance(value.value, cst.Name) and _parsed_args(ctx, value.value.value):
        dest = value.attr.value
        found = []
        for c in m.findall(ctx.module, m.Call(func=m.Attribute(attr=m.Name("add_argument")))):
            assert isinstance(c, cst.Call)
            flags = [a.value.evaluated_value for a in c.args if a.keyword is None
                     and isinstance(a.value, cst.SimpleString) and isinstance(a.value.evaluated_value, str)]
            names = {f.lstrip("-").replace("-", "_") for f in flags if f.startswith("--")}
            dest_kw = next((a.value.evaluated_value for a in c.args if a.keyword is not None
                            and a.keyword.value == "dest" and isinstance(a.value, cst.SimpleString)), None)
            if dest in names or dest_kw == dest:
                found.append((c, next((f for f in flags if f.startswith("--")), dest)))
        if len(found) == 1:
            c, flag = found[0]
            stmt = _statement_of(ctx, c)
            return (stmt, c, f"the option {flag}") if stmt is not None else None
    if isinstance(value, cst.Name):
        assigns = [s for s in ctx.module.body if isinstance(s, cst.SimpleStatementLine) and len(s.body) == 1
                   and isinstance(s.body[0], cst.Assign) and len(s.body[0].targets) == 1
                   and isinstance(s.body[0].targets[0].target, cst.Name)
                   and s.body[0].targets[0].target.value == value.value]
        if len(assigns) == 1 and _constant(assigns[0].body[0].value):  # type: ignore[attr-defined]
            return assigns[0], assigns[0].body[0], f"the module constant {value.value}"
    return None


def _parsed_args(ctx: Context, name: str) -> bool:
    """`name` is assigned an argparse result in this file (`args = parser.parse_args()`)."""
    for a in m.findall(ctx.module, m.Assign(value=m.Call(func=m.Attribute(attr=m.Name("parse_args"))))):
        assert isinstance(a, cst.Assign)
        if any(isinstance(t.target, cst.Name) and t.target.value == name for t in a.targets):
            return True
    return False


def _statement_of(ctx: Context, node: cst.CSTNode) -> cst.BaseStatement | None:
    cur: cst.CSTNode | None = node
    while cur is not None and not isinstance(cur, cst.SimpleStatementLine):
        cur = ctx.parents.get(cur)
    return cur


def _with_value(node: cst.CSTNode, value: cst.BaseExpression) -> cst.CSTNode:
    """An add_argument call with `default=value`, or a constant's assignment of `value`."""
    if isinstance(node, cst.Call):
        return node.with_changes(args=set_kwargs(node.args, {"default": value}))
    assert isinstance(node, cst.Assign)
    return node.with_changes(value=value)
