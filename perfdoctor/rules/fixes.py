"""Fixes written against the user's own line.

`render_fix(kind, location, params)` reads the user's file, finds the statement that spans
`location.line` (libcst, with positions; a statement may span several lines), rewrites it and
returns `Fix(before, after, note)`: `before` is the statement exactly as written (with its
indentation), `after` the rewritten statement with the user's formatting kept where libcst
allows. When the code at that line does not match the pattern (the file changed, the line is
something else) it returns None: never a made-up fix.
"""

from __future__ import annotations

import ast
import io
import textwrap
import tokenize
from pathlib import Path
from typing import Callable

import libcst as cst
import libcst.matchers as m
from libcst.metadata import MetadataWrapper, ParentNodeProvider, PositionProvider

from perfdoctor.facts.static.cpu_to_device import FACTORIES
from perfdoctor.facts.static.dataparallel import DATAPARALLEL
from perfdoctor.facts.static.empty_cache import EMPTY_CACHE
from perfdoctor.facts.static.index import SourceIndex
from perfdoctor.model import Fix, Location

_COMPOUND = (cst.For, cst.While, cst.If, cst.With)
DDP_NOTE = ('launch with `torchrun --nproc_per_node=N`; call `torch.distributed.init_process_group("nccl")` '
            'first and use a DistributedSampler')


class _Ctx:
    """The parsed file and the statement at the location's line."""

    def __init__(self, path: Path, source: bytes, line: int):
        self.module_wrapper = MetadataWrapper(cst.parse_module(source))
        self.module = self.module_wrapper.module
        self.pos = self.module_wrapper.resolve(PositionProvider)
        self.parents = self.module_wrapper.resolve(ParentNodeProvider)
        text = self.module.code
        self.lines = text.splitlines()
        self.fa = SourceIndex(path.resolve(), self.lines, ast.parse(text))
        self.line = line
        self.stmt, self.scan = self._statement(line)

    def _statement(self, line: int) -> tuple[cst.CSTNode | None, cst.CSTNode | None]:
        """(statement, the part of it to search): a simple statement line, or a compound
        statement whose header (not its body) spans the line."""
        header = None
        for node, r in self.pos.items():
            if isinstance(node, cst.SimpleStatementLine) and r.start.line <= line <= r.end.line:
                return node, node
            if isinstance(node, _COMPOUND) and isinstance(node.body, cst.IndentedBlock):
                key = {cst.For: "iter", cst.While: "test", cst.If: "test"}.get(type(node))
                end = self.pos[getattr(node, key)].end.line if key else self.pos[node.items[-1]].end.line
                if r.start.line <= line <= end:
                    header = (node, getattr(node, key) if key else node)
        return header or (None, None)

    def code(self, node: cst.CSTNode) -> str:
        return self.module.code_for_node(node)

    def indent(self) -> str:
        r = self.pos[self.stmt]
        return self.lines[r.start.line - 1][:r.start.column]

    def render(self, stmt: cst.CSTNode) -> str:
        """The source of `stmt` put in the place of the located statement, with its real
        indentation (libcst keeps continuation lines relative to the block); a compound
        statement renders its header only."""
        if isinstance(stmt, _COMPOUND):
            stub = stmt.body.with_changes(body=[cst.SimpleStatementLine([cst.Pass()])])
            stmt = stmt.with_changes(body=stub, **({"orelse": None} if hasattr(stmt, "orelse") else {}))
        n = self.code(stmt.with_changes(leading_lines=())).rstrip("\n").count("\n") + 1
        if isinstance(stmt, _COMPOUND):
            n -= 1  # the stub body line
        start = self.pos[self.stmt].start.line
        lines = self.module.deep_replace(self.stmt, stmt).code.split("\n")
        return "\n".join(lines[start - 1:start - 1 + n])

    def to_ast(self, expr: cst.BaseExpression) -> ast.expr:
        return ast.parse("(" + self.code(expr) + ")", mode="eval").body

    def qual(self, expr: cst.BaseExpression) -> str | None:
        try:
            return self.fa.qual(self.to_ast(expr))
        except SyntaxError:
            return None

    def calls(self) -> list[cst.Call]:
        return list(m.findall(self.scan, m.Call())) if self.scan is not None else []

    def block(self) -> tuple[list[cst.CSTNode], int]:
        """The statement list that holds the statement, and its index there."""
        parent = self.parents.get(self.stmt)
        body = list(getattr(parent, "body", []) or [])
        for i, s in enumerate(body):
            if s is self.stmt:
                return body, i
        return body, -1


def render_fix(kind: str, location: Location, params: dict) -> Fix | None:
    """The fix of `kind` rendered at `location`, or None when the code there does not match."""
    renderer = _RENDERERS.get(kind)
    if renderer is None or location.line < 1:
        return None
    path = Path(location.file)
    try:
        ctx = _Ctx(path, path.read_bytes(), location.line)
    except (OSError, cst.ParserSyntaxError, SyntaxError, ValueError, RecursionError):
        return None
    if ctx.stmt is None or location.line > len(ctx.lines):
        return None
    if location.code and ctx.lines[location.line - 1].strip() != location.code.strip():
        return None  # the file changed since the run
    try:
        result = renderer(ctx, params or {})
    except (cst.ParserSyntaxError, SyntaxError, KeyError, TypeError, ValueError):
        return None
    if result is None:
        return None
    after, note = result
    before = ctx.render(ctx.stmt)
    if isinstance(after, cst.CSTNode):
        after = ctx.render(after)
    if after == before:
        return None
    return Fix(before=before, after=after, note=note)


# -- helpers ---------------------------------------------------------------------------------
def _dotted(expr: cst.BaseExpression) -> str | None:
    if isinstance(expr, cst.Name):
        return expr.value
    if isinstance(expr, cst.Attribute):
        head = _dotted(expr.value)
        return f"{head}.{expr.attr.value}" if head else None
    return None


def _kw(call: cst.Call, name: str) -> cst.Arg | None:
    for a in call.args:
        if a.keyword is not None and a.keyword.value == name:
            return a
    return None


def _kwarg(name: str, value: str | cst.BaseExpression) -> cst.Arg:
    v = cst.parse_expression(value) if isinstance(value, str) else value
    tight = cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))
    return cst.Arg(value=v, keyword=cst.Name(name), equal=tight)


def _set_kwargs(args: list[cst.Arg], new: dict[str, cst.BaseExpression]) -> list[cst.Arg]:
    """Replace the keyword arguments named in `new` in place; append the others, copying the
    separator style of the existing arguments (one per line stays one per line)."""
    args = list(args)
    rest = dict(new)
    for i, a in enumerate(args):
        if a.keyword is not None and a.keyword.value in rest:
            args[i] = a.with_changes(value=rest.pop(a.keyword.value))
    if not rest:
        return args
    added = [_kwarg(k, v) for k, v in rest.items()]
    space = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    if not args:
        return [a.with_changes(comma=space) for a in added[:-1]] + added[-1:]
    trailing = args[-1].comma
    sep = args[-2].comma if len(args) >= 2 and isinstance(args[-2].comma, cst.Comma) else space
    out = args[:-1] + [args[-1].with_changes(comma=sep)]
    out += [a.with_changes(comma=sep) for a in added[:-1]] + [added[-1].with_changes(comma=trailing)]
    return out


def _is_factory(ctx: _Ctx, expr: cst.BaseExpression) -> bool:
    if not isinstance(expr, cst.Call):
        return False
    q = ctx.qual(expr.func)
    return (bool(q) and q.startswith("torch.") and q[6:] in FACTORIES and _kw(expr, "device") is None
            and not any(a.star == "**" for a in expr.args))


def _device_dtype(ctx: _Ctx, move: cst.Call) -> tuple[cst.BaseExpression, cst.BaseExpression | None] | None:
    """(device, dtype or None) of a `.cuda(...)` / `.to(...)` call; None when it is not a device move
    or carries arguments a factory cannot take (memory_format, a tensor)."""
    attr = move.func.attr.value
    if attr == "cuda":
        dev = (_kw(move, "device") or (move.args[0] if move.args and not move.args[0].keyword else None))
        if dev is None:
            return cst.SimpleString('"cuda"'), None
        d = ctx.to_ast(dev.value)
        if isinstance(d, ast.Constant) and type(d.value) is int:
            return cst.SimpleString(f'"cuda:{d.value}"'), None
        return dev.value, None
    if any(a.keyword is not None and a.keyword.value not in ("device", "dtype", "non_blocking", "copy")
           for a in move.args) or any(a.star for a in move.args):
        return None
    positional = [a.value for a in move.args if a.keyword is None]
    dev = _kw(move, "device").value if _kw(move, "device") else None
    dtype = _kw(move, "dtype").value if _kw(move, "dtype") else None
    for p in positional[:2]:
        node = ctx.to_ast(p)
        if ctx.fa.is_dtype(node) and dtype is None:
            dtype = p
        elif dev is None and ctx.fa.device_expr(node) is True:
            dev = p
        else:
            return None
    if dev is None or ctx.fa.device_expr(ctx.to_ast(dev)) is not True:
        return None
    return dev, dtype


def _on_device(ctx: _Ctx, factory: cst.Call, move: cst.Call) -> cst.Call | None:
    dd = _device_dtype(ctx, move)
    if dd is None:
        return None
    dev, dtype = dd
    new = {"device": dev}
    if dtype is not None:
        new["dtype"] = dtype
    return factory.with_changes(args=_set_kwargs(factory.args, new))


def _names(ctx: _Ctx, node: cst.CSTNode) -> set[str]:
    return {n.value for n in m.findall(node, m.Name())}


# -- the kinds -------------------------------------------------------------------------------
def _call_kwargs(ctx: _Ctx, params: dict):
    callee = params["callee"]
    want = {k: cst.parse_expression(str(v)) for k, v in params["set"].items()}
    calls = [c for c in ctx.calls() if _dotted(c.func) == callee or (_dotted(c.func) or "").endswith("." + callee)
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
        args = _set_kwargs(args, {k: v for k, v in want.items() if k in explicit})
        cfg = ", ".join(f"`{ctx.code(a.value)}`" for a in stars)
        note = f"{cfg} feeds this call: setting {', '.join(missing)} in the config that builds it is the better place"
    else:
        args = _set_kwargs(call.args, want)
    return ctx.stmt.deep_replace(call, call.with_changes(args=args)), note


def _dataparallel_to_ddp(ctx: _Ctx, params: dict):
    rank = str(params.get("local_rank", "local_rank"))
    for call in ctx.calls():
        if ctx.qual(call.func) not in DATAPARALLEL:
            continue
        module = _kw(call, "module") or next((a for a in call.args if a.keyword is None and not a.star), None)
        if module is None:
            return None
        note = DDP_NOTE
        if isinstance(call.func, cst.Attribute):
            prefix = _dotted(call.func.value)
            pq = ctx.qual(call.func.value)
            ddp = f"{prefix}.parallel.DistributedDataParallel" if pq == "torch.nn" else \
                f"{prefix}.DistributedDataParallel"
        else:
            local = [k for k, v in ctx.fa.aliases.items()
                     if v in ("torch.nn.parallel.DistributedDataParallel", "torch.nn.DistributedDataParallel")]
            ddp = local[0] if local else "DistributedDataParallel"
            if not local:
                note = "add `from torch.nn.parallel import DistributedDataParallel`; " + note
        mod = ctx.code(module.value)
        if not isinstance(module.value, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)):
            mod = f"({mod})"
        new = cst.parse_expression(f"{ddp}({mod}.to({rank}), device_ids=[{rank}])")
        note += f"; set `{rank} = int(os.environ[\"LOCAL_RANK\"])`" if rank not in _names(ctx, ctx.module) else ""
        return ctx.stmt.deep_replace(call, new), note
    return None


def _factory_device(ctx: _Ctx, params: dict):
    for call in ctx.calls():  # torch.randn(a, b).cuda() / torch.zeros(n).to(device)
        f = call.func
        if isinstance(f, cst.Attribute) and f.attr.value in ("cuda", "to") and _is_factory(ctx, f.value):
            new = _on_device(ctx, f.value, call)
            if new is not None:
                return ctx.stmt.deep_replace(call, new), ""
    # x = torch.randn(...)  ...  x = x.to(device)
    if not isinstance(ctx.stmt, cst.SimpleStatementLine) or len(ctx.stmt.body) != 1:
        return None
    assign = ctx.stmt.body[0]
    if not (m.matches(assign, m.Assign(targets=[m.AssignTarget(target=m.Name())])) and _is_factory(ctx, assign.value)):
        return None
    name = assign.targets[0].target.value
    block, i = ctx.block()
    assigned_between: set[str] = set()
    for later in block[i + 1:i + 6] if i >= 0 else []:
        move = None
        if isinstance(later, cst.SimpleStatementLine) and len(later.body) == 1 and m.matches(later.body[0], m.Assign(
                targets=[m.AssignTarget(target=m.Name(name))],
                value=m.Call(func=m.Attribute(value=m.Name(name), attr=m.Name("to") | m.Name("cuda"))))):
            move = later.body[0].value
        if move is not None:
            new = _on_device(ctx, assign.value, move)
            if new is None or (_names(ctx, move) - {name}) & assigned_between:
                return None
            line = ctx.pos[later].start.line
            code = ctx.code(later.with_changes(leading_lines=())).strip()
            return (ctx.stmt.deep_replace(assign.value, new),
                    f"then delete line {line} (`{code}`): the tensor is already on the device")
        if not isinstance(later, cst.SimpleStatementLine) or name in _names(ctx, later):
            return None
        assigned_between |= {n.value for t in m.findall(later, m.AssignTarget()) for n in m.findall(t, m.Name())}
    return None


def _remove_call(ctx: _Ctx, params: dict):
    if not isinstance(ctx.stmt, cst.SimpleStatementLine):
        return None
    callee = params.get("callee")

    def target(s: cst.BaseSmallStatement) -> bool:
        if not (isinstance(s, cst.Expr) and isinstance(s.value, cst.Call)):
            return False
        d = _dotted(s.value.func) or ""
        return (d == callee or d.endswith("." + str(callee))) if callee else ctx.qual(s.value.func) in EMPTY_CACHE

    keep = [s for s in ctx.stmt.body if not target(s)]
    if len(keep) == len(ctx.stmt.body):
        return None
    note = ("`torch.cuda.empty_cache()` frees no memory your tensors hold: it hands the allocator's cached blocks "
            "back to the driver, and the next steps pay for cudaMalloc and a device sync to get them again. "
            "Call it once outside the training loop if another process needs the memory.")
    if keep:
        keep = [s.with_changes(semicolon=cst.MaybeSentinel.DEFAULT) for s in keep]
        return ctx.stmt.with_changes(body=keep), note
    block, _ = ctx.block()
    return (ctx.indent() + "pass" if len(block) == 1 else ""), note


def _detach_loss(ctx: _Ctx, params: dict):
    name, method = str(params["name"]), str(params.get("method", "item"))
    if method not in ("item", "detach") or not isinstance(ctx.stmt, cst.SimpleStatementLine):
        return None
    replaced = []

    def bare(e: cst.BaseExpression) -> cst.BaseExpression:
        if isinstance(e, cst.Name) and e.value == name:
            replaced.append(e)
            return cst.parse_expression(f"{name}.{method}()").with_changes(lpar=e.lpar, rpar=e.rpar)
        if isinstance(e, cst.BinaryOperation):
            return e.with_changes(left=bare(e.left), right=bare(e.right))
        if isinstance(e, cst.UnaryOperation):
            return e.with_changes(expression=bare(e.expression))
        if isinstance(e, (cst.Tuple, cst.List)):
            return e.with_changes(elements=[el.with_changes(value=bare(el.value)) for el in e.elements])
        return e

    body = []
    for s in ctx.stmt.body:
        if isinstance(s, cst.Expr) and isinstance(s.value, cst.Call) and isinstance(s.value.func, cst.Attribute):
            s = s.with_changes(value=s.value.with_changes(
                args=[a.with_changes(value=bare(a.value)) for a in s.value.args]))
        elif isinstance(s, (cst.AugAssign, cst.Assign)):
            s = s.with_changes(value=bare(s.value))
        body.append(s)
    if not replaced:
        return None
    note = (f"`{name}.item()` copies one number to the host (a sync each time); to avoid the sync keep "
            f"`{name}.detach()` and convert when you log" if method == "item" else
            f"`{name}.detach()` keeps the value on the device without its autograd graph")
    return ctx.stmt.with_changes(body=body), note


def _wrap_autocast(ctx: _Ctx, params: dict):
    if not isinstance(ctx.stmt, cst.SimpleStatementLine) or not all(
            isinstance(s, (cst.Assign, cst.AnnAssign, cst.AugAssign, cst.Expr, cst.Return)) for s in ctx.stmt.body) \
            or not m.findall(ctx.stmt, m.Call()):
        return None  # only statements that compute something (a forward, a loss)
    device_type = str(params.get("device_type", "cuda"))
    dtype = str(params.get("dtype", "torch.bfloat16"))
    torch_names = [k for k, v in ctx.fa.aliases.items() if v == "torch"]
    t = "torch" if "torch" in torch_names or not torch_names else torch_names[0]
    if dtype.startswith("torch."):
        dtype = t + dtype[5:]
    unit = ctx.module.default_indent
    inner = _shift(ctx.render(ctx.stmt), unit)
    if inner is None:
        return None
    after = f'{ctx.indent()}with {t}.autocast(device_type="{device_type}", dtype={dtype}):\n{inner}'
    if dtype.endswith(("float16", ".half")) and not dtype.endswith("bfloat16"):
        note = (f'float16 needs a GradScaler: `scaler = {t}.amp.GradScaler("{device_type}")`, then '
                "`scaler.scale(loss).backward()`, `scaler.step(optimizer)`, `scaler.update()`")
    else:
        note = "keep `loss.backward()` and the optimizer step outside the block; bfloat16 needs no GradScaler"
    if not torch_names:
        note = "add `import torch`; " + note
    return after, note


def _shift(code: str, unit: str) -> str | None:
    """Indent the lines of a statement by `unit`, except lines inside multi-line strings."""
    lines = code.split("\n")
    inside: set[int] = set()  # 1-based rows that continue a string token
    try:
        for tok in tokenize.generate_tokens(io.StringIO(textwrap.dedent(code) + "\n").readline):
            if tok.type == tokenize.STRING or getattr(tokenize, "FSTRING_MIDDLE", -1) == tok.type:
                inside |= set(range(tok.start[0] + 1, tok.end[0] + 1))
    except (tokenize.TokenError, SyntaxError):
        return None
    return "\n".join(l if (i + 1) in inside or not l.strip() else unit + l for i, l in enumerate(lines))


def _non_blocking(ctx: _Ctx, params: dict):
    targets = []
    for call in ctx.calls():
        f = call.func
        if not isinstance(f, cst.Attribute) or f.attr.value not in ("to", "cuda"):
            continue
        if f.attr.value == "to":
            dev = _kw(call, "device") or next((a for a in call.args if a.keyword is None), None)
            if dev is None:
                continue
            node = ctx.to_ast(dev.value)
            verdict = ctx.fa.device_expr(node)
            if not (verdict is True or (verdict is None and isinstance(node, (ast.Name, ast.Attribute))
                                        and not ctx.fa.is_dtype(node))):
                continue
        nb = _kw(call, "non_blocking")
        if nb is None or not m.matches(nb.value, m.Name("True")):
            targets.append(call)
    if not targets:
        return None

    class AddNonBlocking(cst.CSTTransformer):
        def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
            if any(original is t for t in targets):
                return updated.with_changes(args=_set_kwargs(updated.args, {"non_blocking": cst.Name("True")}))
            return updated

    return ctx.stmt.visit(AddNonBlocking()), ("non_blocking=True overlaps the copy with compute only from "
                                              "pinned memory: set `pin_memory=True` on the DataLoader too")


_RENDERERS: dict[str, Callable[[_Ctx, dict], tuple | None]] = {
    "call-kwargs": _call_kwargs,
    "dataparallel-to-ddp": _dataparallel_to_ddp,
    "factory-device": _factory_device,
    "remove-call": _remove_call,
    "detach-loss": _detach_loss,
    "wrap-autocast": _wrap_autocast,
    "non-blocking": _non_blocking,
}
