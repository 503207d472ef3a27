"""What every fixer shares: the user's file parsed with libcst, the statement at the flagged line,
and the helpers that rewrite calls with the user's formatting kept (`render` turns a fixer's result
into a `Fix`)."""

from __future__ import annotations

import ast
from collections.abc import Callable, Sequence
from pathlib import Path

import libcst as cst
import libcst.matchers as m
from libcst.metadata import MetadataWrapper, ParentNodeProvider, PositionProvider

from perfdoctor.contracts.source import read_source
from perfdoctor.facts.static.index import SourceIndex
from perfdoctor.model import Fix, Location

_COMPOUND = (cst.For, cst.While, cst.If, cst.With)
# a fixer: (context, params) -> (the statement rewritten, or its text, or None for a fix in words
# alone; a note) or None where the code does not match
Fixer = Callable[["Context", dict], "tuple[cst.CSTNode | str | None, str] | None"]


class NoStatement(Exception):
    """No statement (simple, or a compound statement's header) spans the location's line."""


class Context:
    """The parsed file and the statement at the location's line (NoStatement where there is none)."""

    def __init__(self, path: Path, source: bytes, line: int):
        self.module_wrapper = MetadataWrapper(cst.parse_module(source))
        self.module = self.module_wrapper.module
        self.pos = self.module_wrapper.resolve(PositionProvider)
        self.parents = self.module_wrapper.resolve(ParentNodeProvider)
        text = self.module.code
        self.lines = text.splitlines()
        self.index = SourceIndex(path.resolve(), self.lines, ast.parse(text))
        self.line = line
        found = self._statement(line)
        if found is None:
            raise NoStatement(f"no statement at line {line}")
        self.stmt, self.scan = found
        self.whole = False  # `widen`: the statement is a whole compound statement, not its header
        # a fixer that rewrites around one line of a long statement (a line inserted before a class)
        # sets the `before` text itself: that line, not the whole statement
        self.before_text: str | None = None

    def widen(self, stmt: cst.BaseStatement) -> None:
        """Make the fix replace `stmt`, a statement that encloses the located one, whole (an `if`
        whose body is only the removed call goes with it)."""
        self.stmt, self.scan, self.whole = stmt, stmt, True

    def _statement(self, line: int) -> tuple[cst.BaseStatement, cst.CSTNode] | None:
        """(statement, the part of it to search): a simple statement line, or a compound
        statement whose header (not its body) spans the line."""
        header = None
        for node, r in self.pos.items():
            if isinstance(node, cst.SimpleStatementLine) and r.start.line <= line <= r.end.line:
                return node, node
            if isinstance(node, _COMPOUND) and isinstance(node.body, cst.IndentedBlock):
                scan: cst.CSTNode
                last: cst.CSTNode
                if isinstance(node, cst.With):  # the header ends with the last item; search it whole
                    scan, last = node, node.items[-1]
                else:  # the header ends with the iterable or the condition; search that only
                    scan = last = node.iter if isinstance(node, cst.For) else node.test
                end = self.pos[last].end.line
                if r.start.line <= line <= end:
                    header = (node, scan)
        return header

    def code(self, node: cst.CSTNode) -> str:
        return self.module.code_for_node(node)

    def indent(self) -> str:
        r = self.pos[self.stmt]
        return self.lines[r.start.line - 1][:r.start.column]

    def render(self, stmt: cst.CSTNode) -> str:
        """The source of `stmt` put in the place of the located statement, with its real
        indentation (libcst keeps continuation lines relative to the block); a compound
        statement renders its header only."""
        header = isinstance(stmt, _COMPOUND) and not self.whole
        if isinstance(stmt, _COMPOUND) and header:
            stub = stmt.body.with_changes(body=[cst.SimpleStatementLine([cst.Pass()])])
            stmt = stmt.with_changes(body=stub, **({"orelse": None} if hasattr(stmt, "orelse") else {}))
        n = self.code(stmt.with_changes(leading_lines=())).rstrip("\n").count("\n") + 1
        if header:
            n -= 1  # the stub body line
        start = self.pos[self.stmt].start.line
        lines = self.code(self.module.deep_replace(self.stmt, stmt)).split("\n")
        return "\n".join(lines[start - 1:start - 1 + n])

    def to_ast(self, expr: cst.BaseExpression) -> ast.expr:
        return ast.parse("(" + self.code(expr) + ")", mode="eval").body

    def qual(self, expr: cst.BaseExpression) -> str | None:
        try:
            return self.index.qual(self.to_ast(expr))
        except SyntaxError:
            return None

    def calls(self) -> list[cst.Call]:
        return [c for c in m.findall(self.scan, m.Call()) if isinstance(c, cst.Call)]

    def block(self) -> tuple[list[cst.CSTNode], int]:
        """The statement list that holds the statement, and its index there."""
        parent = self.parents.get(self.stmt)
        body = list(getattr(parent, "body", []) or [])
        for i, s in enumerate(body):
            if s is self.stmt:
                return body, i
        return body, -1


def render(fixer: Fixer, location: Location, params: dict) -> Fix | None:
    """`fixer` applied at `location`, or None when the code there does not match."""
    if location.line < 1:
        return None
    path = Path(location.file)
    sf = read_source(path)  # the one size-guarded reader of the user's files: regular files only, capped
    if sf is None:
        return None
    try:
        ctx = Context(path, sf.data, location.line)
    except (OSError, cst.ParserSyntaxError, SyntaxError, ValueError, RecursionError, NoStatement):
        return None
    if location.line > len(ctx.lines):
        return None
    if location.code and ctx.lines[location.line - 1].strip() != location.code.strip():
        return None  # the file changed since the run
    try:
        result = fixer(ctx, params or {})
    except (cst.ParserSyntaxError, SyntaxError, KeyError, TypeError, ValueError):
        return None
    if result is None:
        return None
    after, note = result
    if after is None:  # words: what to change where the fixer cannot write it (the note says which value)
        return Fix(before="", after="", note=note) if note else None
    before = ctx.before_text if ctx.before_text is not None else ctx.render(ctx.stmt)
    if isinstance(after, cst.CSTNode):
        after = ctx.render(after)
    if after == before:
        return None
    return Fix(before=before, after=after, note=note)


# -- helpers the fixers share ----------------------------------------------------------------
def dotted(expr: cst.BaseExpression) -> str | None:
    if isinstance(expr, cst.Name):
        return expr.value
    if isinstance(expr, cst.Attribute):
        head = dotted(expr.value)
        return f"{head}.{expr.attr.value}" if head else None
    return None


def kw(call: cst.Call, name: str) -> cst.Arg | None:
    for a in call.args:
        if a.keyword is not None and a.keyword.value == name:
            return a
    return None


def kwarg(name: str, value: str | cst.BaseExpression) -> cst.Arg:
    v = cst.parse_expression(value) if isinstance(value, str) else value
    tight = cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))
    return cst.Arg(value=v, keyword=cst.Name(name), equal=tight)


def set_kwargs(args: Sequence[cst.Arg], new: dict[str, cst.BaseExpression]) -> list[cst.Arg]:
    """Replace the keyword arguments named in `new` in place; append the others, copying the
    separator style of the existing arguments (one per line stays one per line)."""
    args = list(args)
    rest = dict(new)
    for i, a in enumerate(args):
        if a.keyword is not None and a.keyword.value in rest:
            args[i] = a.with_changes(value=rest.pop(a.keyword.value))
    if not rest:
        return args
    added = [kwarg(k, v) for k, v in rest.items()]
    space = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    if not args:
        return [a.with_changes(comma=space) for a in added[:-1]] + added[-1:]
    trailing = args[-1].comma
    sep = args[-2].comma if len(args) >= 2 and isinstance(args[-2].comma, cst.Comma) else space
    out = args[:-1] + [args[-1].with_changes(comma=sep)]
    out += [a.with_changes(comma=sep) for a in added[:-1]] + [added[-1].with_changes(comma=trailing)]
    return out


def names(ctx: Context, node: cst.CSTNode) -> set[str]:
    return {n.value for n in m.findall(node, m.Name()) if isinstance(n, cst.Name)}
