"""A user's settings and what they are by default, from the source: `setting` says whether a flag, a
variable or a comparison on one is on (True) or off (False) unless the user changes it, or is no
setting at all (None: a test of the device, which is on for the GPU the script targets);
`in_user_branch` whether a node sits in the branch of an `if` or a conditional expression on a setting
that runs only where the user changes it (`if args.dp:` with a store_true flag, the `else:` of
`if not args.noamp:`). Low precision there is not the script's default (`uses_amp`), nor is an
`nn.DataParallel` built there (`dataparallel.opt_in`)."""

from __future__ import annotations

import ast
import re

from perfdoctor.facts.static.index.syntax import Syntax, kwarg

DEVICE_WORDS = re.compile(r"cuda|device|gpu|is_available", re.I)
# a flag on several devices at once (`--use_multi_gpu`, `--data_parallel`, `--n_gpus`) is a choice of
# parallelism the user makes, not the test of the device the script targets
MULTI_DEVICE_WORDS = re.compile(r"multi|parallel|gpus|devices|n_?gpu|num_?gpu", re.I)


def setting(index: Syntax, node: ast.expr | None, depth: int = 0) -> bool | None:
    """What a user's setting is by default: False where it is off unless the user turns it on
    (`args.amp` with `action="store_true"`, `amp`, `use_amp == "native"` with `use_amp = None` first),
    True where it is on unless turned off (`not args.noamp`, an argparse `default=True`, `amp = True`),
    None where `node` is no setting: a test of the device (`device.type == "cuda"`,
    `torch.cuda.is_available()`), which is on for the GPU the script targets. An `and` of a setting and
    a device test is the setting's (`args.use_multi_gpu and args.use_gpu`). `len(x)` is x's: a list of
    GPUs the caller passes (`gpus=None` then `gpus = []`: torch-rechub's trainers) is off unless passed,
    a list of the machine's devices (`range(torch.cuda.device_count())`) is a device test. The module's
    own `__name__` is no setting: the main guard's body runs in the script the user runs."""
    if node is None or depth > 3:
        return None
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        v = setting(index, node.operand, depth)
        return None if v is None else not v
    if isinstance(node, ast.BoolOp):  # `args.use_multi_gpu and args.use_gpu`: a device test is on
        known = [v for v in (setting(index, x, depth) for x in node.values) if v is not None]
        if not known:
            return None
        return all(known) if isinstance(node.op, ast.And) else any(known)
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "len"
            and len(node.args) == 1 and not node.keywords):  # `len(gpus) > 1`: the list's own setting
        return setting(index, node.args[0], depth + 1)
    if isinstance(node, ast.Compare) and all(isinstance(c, ast.Constant) for c in node.comparators):
        left = node.left
        first = first_value(index, left) if isinstance(left, ast.Name) else None
        if isinstance(first, ast.Constant) and len(node.ops) == 1 and isinstance(node.ops[0], (ast.Eq, ast.NotEq)):
            same = first.value == node.comparators[0].value  # type: ignore[attr-defined]
            return same if isinstance(node.ops[0], ast.Eq) else not same
        return None if setting(index, left, depth) is None else False
    if isinstance(node, ast.Attribute):
        return None if _device_test(ast.unparse(node)) else on_by_default(index, node.attr)
    if isinstance(node, ast.Name) and node.id.startswith("__") and node.id.endswith("__"):
        return None  # the interpreter's (`if __name__ == "__main__":` runs in the script the user runs): no setting
    if isinstance(node, ast.Name) and not _device_test(node.id):
        values = index.assigned.get(node.id, [])
        if any(_device_test(ast.unparse(v)) for v in values):
            return None
        first = first_value(index, node)  # the default: later bindings override it where a setting says
        if isinstance(first, ast.Constant):
            return bool(first.value)
        if isinstance(first, (ast.Name, ast.Attribute, ast.UnaryOp, ast.Compare)):
            return setting(index, first, depth + 1)
        return False  # a parameter (`amp: bool = False`) or a value read from a config
    return None


def first_value(index: Syntax, name: ast.Name) -> ast.expr | None:
    """The value `name` is bound to first in the file's source order (`assigned` is in walk order)."""
    values = index.assigned.get(name.id, [])
    return min(values, key=lambda v: (v.lineno, v.col_offset)) if values else None


def _device_test(text: str) -> bool:
    return bool(DEVICE_WORDS.search(text)) and not MULTI_DEVICE_WORDS.search(text)


def on_by_default(index: Syntax, dest: str) -> bool:
    """An argparse option stored in `dest` whose default turns it on (`default=True`,
    `action="store_false"`): then `args.<dest>` is on unless the user turns it off. The option is
    looked for in this file, then in the project's other files (`Loops.peers`: run.py parses the
    arguments, the experiment class reads `self.args.use_multi_gpu`)."""
    call = option(index, dest)
    if call is None:
        return False
    action, default = kwarg(call, "action"), kwarg(call, "default")
    if isinstance(action, ast.Constant) and action.value == "store_false":
        return True
    return isinstance(default, ast.Constant) and bool(default.value)


def option_default(index: Syntax, dest: str) -> object:
    """The literal default of the argparse option stored in `dest` (`default=128`), in this file or
    the project's other files; None where there is no such option or its default is no literal."""
    call = option(index, dest)
    default = kwarg(call, "default") if call is not None else None
    try:
        return ast.literal_eval(default) if default is not None else None
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None


def project_files(index: Syntax) -> list[Syntax]:
    """This file, then the project's other files (`Loops.peers`, where the index has its loops)."""
    loops = getattr(index, "loops", None)
    return [index, *(peer.syntax for peer in getattr(loops, "peers", ()))]


def option(index: Syntax, dest: str) -> ast.Call | None:
    """The `add_argument` call of the option stored in `dest`: in this file, else in the project's
    other files."""
    for f in project_files(index):
        for call in f.calls:
            fn = call.func
            if not (isinstance(fn, ast.Attribute) and fn.attr == "add_argument") or not call.args:
                continue
            flags = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            d = kwarg(call, "dest")
            name = d.value if isinstance(d, ast.Constant) else next(
                (x.lstrip("-").replace("-", "_") for x in flags if x.startswith("--")), None)
            if name == dest:
                return call
    return None


def in_user_branch(index: Syntax, node: ast.AST) -> bool:
    """Whether `node` is in the branch of an `if` / conditional expression on a user's setting (within
    its function) that runs only where the user changes the setting: the body of one off by default,
    the `else` of one on by default."""
    child: ast.AST = node
    for p in index.ancestors(node):
        if isinstance(p, (ast.If, ast.IfExp)) and child is not p.test:
            on = setting(index, p.test)
            in_body = any(child is b for b in p.body) if isinstance(p, ast.If) else child is p.body
            if on is not None and on != in_body:
                return True
        if isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return False
        child = p
    return False
