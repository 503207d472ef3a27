"""Losses kept with their autograd graph across steps (PD006 evidence), found in the child.

At a step tick (the first ~30 steps only) the scanner looks at the locals of the user frames on
the stack (the globals, for a module-level loop) and measures, per holder:

- a list / deque / tuple (or a dict's value) whose last element is a tensor with a `grad_fn`:
  its length;
- a tensor with a `grad_fn` (a running total such as `running += loss`): the length of the chain
  of same-typed autograd nodes reachable from its `grad_fn` (following `next_functions`, looking
  two levels down per hop). A running total adds one link per step; the current step's `loss`
  keeps a constant depth, and a tensor built by a loop over a batch's sequence (a decoder's outputs
  concatenated one time step at a time) has the depth of that batch's length: it rises and falls
  with the lengths, so only rises of the same links per step count (`total = total + a + b`: two), and
  they must outnumber the depth's other changes. Autograd nodes cannot be weakly referenced, so nothing of the previous
  graph is held between scans (no id() either: addresses are reused);
- objects (an AverageMeter, `self` of a trainer) whose attributes hold either, two levels deep.

A holder whose measure grows at two or more scans is reported, with the line that feeds it
(found with `ast` in the frame's function: `history.append(loss)`, `running += loss`,
`meter.update(loss)`).
"""

from __future__ import annotations

import ast
import collections
import types
from typing import Any

from perfdoctor.capture.sites import code_ast, site_of
from perfdoctor.contracts.run import LossHolderRecord, Site
from perfdoctor.usercode import is_user_file

_CHAIN_CAP = 64
_SEQ = (list, tuple, collections.deque)


def chain_depth(node: Any, cap: int = _CHAIN_CAP) -> int:
    """Links in the chain of autograd nodes of `node`'s type reachable from it (2 levels per hop)."""
    t = type(node)
    d = 0
    cur = node
    while d < cap:
        nxt = None
        for fn, _ in cur.next_functions:
            if fn is None:
                continue
            if type(fn) is t:
                nxt = fn
                break
            for fn2, _ in fn.next_functions:
                if fn2 is not None and type(fn2) is t:
                    nxt = fn2
                    break
            if nxt is not None:
                break
        if nxt is None:
            break
        cur = nxt
        d += 1
    return d


class _Cand:
    __slots__ = ("expr", "kind", "chain", "obs", "numel", "increases", "other", "rate", "site", "tensor_name",
                 "first_step")

    def __init__(self, expr: str, kind: str, chain: bool):
        self.expr = expr
        self.kind = kind
        self.chain = chain  # the measure is a chain depth (running total), not a length
        self.obs: list[tuple[int, int]] = []  # (step, measure)
        self.numel = 0
        self.increases = 0
        self.other = 0  # a chain's changes of depth other than its links per step (its batch's length changed)
        self.rate: float | None = None  # a chain's links per step at its first rise: a running total's stay the same
        self.site: Site | None = None
        self.tensor_name: str | None = None
        self.first_step: int | None = None


class HolderScanner:
    def __init__(self, torch: Any, max_frames: int = 3):
        self.Tensor = torch.Tensor
        self.skip = (torch.nn.Module, torch.optim.Optimizer, torch.utils.data.DataLoader,
                     types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType,
                     types.MethodType, str, bytes, int, float, bool)
        self.max_frames = max_frames
        self.cands: dict[tuple, _Cand] = {}

    # -- scanning --------------------------------------------------------------------------
    def scan(self, step: int, frame: Any) -> None:
        seen = 0
        while frame is not None and seen < self.max_frames:
            if is_user_file(frame.f_code.co_filename):
                self._scan_frame(step, frame)
                seen += 1
            frame = frame.f_back

    def _grad(self, v: Any) -> bool:
        return isinstance(v, self.Tensor) and v.grad_fn is not None

    def _scan_frame(self, step: int, frame: Any) -> None:
        code = frame.f_code
        ns = frame.f_globals if code.co_name == "<module>" else frame.f_locals
        ckey = (code.co_filename, code.co_firstlineno, code.co_name)
        for name, v in list(ns.items()):
            if name.startswith("__"):
                continue
            self._check(step, frame, ckey, name, v, 0)

    def _check(self, step: int, frame: Any, ckey: tuple, expr: str, v: Any, depth: int) -> None:
        if isinstance(v, self.skip) or v is None:
            return
        via_attr = depth > 0
        if isinstance(v, _SEQ):
            if len(v) and self._grad(v[-1]):
                self._observe(step, frame, ckey, expr, "attribute" if via_attr else "list", len(v),
                              v[-1].numel(), False)
            return
        if isinstance(v, dict):
            for k, dv in list(v.items())[:64]:
                if isinstance(dv, _SEQ) and len(dv) and self._grad(dv[-1]):
                    self._observe(step, frame, ckey, f"{expr}[{k!r}]", "attribute" if via_attr else "list",
                                  len(dv), dv[-1].numel(), False)
            return
        if isinstance(v, self.Tensor):
            if v.grad_fn is not None:
                self._observe(step, frame, ckey, expr, "attribute" if via_attr else "running-sum",
                              chain_depth(v.grad_fn), v.numel(), True)
            return
        if depth < 2:
            d = getattr(v, "__dict__", None)
            mod = getattr(type(v), "__module__", "") or ""
            if isinstance(d, dict) and not mod.startswith("torch"):
                for a, av in list(d.items())[:64]:
                    self._check(step, frame, ckey, f"{expr}.{a}", av, depth + 1)

    def _observe(self, step: int, frame: Any, ckey: tuple, expr: str, kind: str, measure: int, numel: int,
                 chain: bool) -> None:
        key = ckey + (expr,)
        c = self.cands.get(key)
        if c is None:
            c = self.cands[key] = _Cand(expr, kind, chain)
        if c.obs:
            (s0, m0) = c.obs[-1]
            rate = (measure - m0) / (step - s0) if step > s0 else None
            if measure > m0 and (not chain or rate == (c.rate if c.rate is not None else rate)):
                c.increases += 1
                c.rate = rate
                if c.first_step is None:
                    c.first_step = s0
            elif chain and measure != m0 and measure > 1:  # not the chain's links per step, nor a reset
                c.other += 1
        c.obs.append((step, measure))
        c.numel = int(numel)
        if c.increases >= 2 and c.site is None:
            c.site, c.tensor_name = feed_site(frame, expr, self.Tensor)

    # -- results ---------------------------------------------------------------------------
    def clear(self) -> None:
        """Forget every candidate (a stronger step clock took over: step numbers start again)."""
        self.cands.clear()

    def records(self) -> list[LossHolderRecord]:
        out = []
        for c in self.cands.values():
            if c.increases < 2 or c.site is None or c.increases <= c.other:
                continue
            (s0, m0), (s1, m1) = c.obs[0], c.obs[-1]
            retained = m1 + 1 if c.chain else m1  # a chain of m1 links holds m1 + 1 graphs
            out.append(LossHolderRecord(site=c.site, holder=c.expr, kind=c.kind, tensor_name=c.tensor_name,
                                        graphs_retained=int(retained), first_step=c.first_step or s0, last_step=s1,
                                        graphs_per_step=round((m1 - m0) / (s1 - s0), 3) if s1 > s0 else None,
                                        numel=c.numel))
        return out


# -- the line that feeds a holder -----------------------------------------------------------------

def _text(node: ast.AST) -> str:
    try:
        return ast.unparse(node)
    except Exception:  # noqa: BLE001 - best effort
        return ""


def feed_site(frame: Any, expr: str, tensor_type: Any) -> tuple[Site | None, str | None]:
    """The statement in the frame's function that puts a grad tensor into holder `expr`."""
    code = frame.f_code
    ns = frame.f_globals if code.co_name == "<module>" else frame.f_locals
    base = expr.split(".")[0].split("[")[0]
    grad_names = [n for n, v in ns.items() if n != base and isinstance(v, tensor_type) and v.grad_fn is not None]
    tree = code_ast(code)
    best: tuple | None = None
    if tree is not None:
        for n in ast.walk(tree):
            if not isinstance(n, (ast.Call, ast.AugAssign, ast.Assign)):
                continue
            payload: list[ast.expr] = []
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute):
                owner = _text(n.func.value)
                if owner == expr or (owner == base and expr != base) or (owner and expr.startswith(owner + "[")):
                    payload = list(n.args) + [k.value for k in n.keywords]
            elif isinstance(n, ast.AugAssign) and _text(n.target) in (expr, base):
                payload = [n.value]
            elif isinstance(n, ast.Assign):
                for t in n.targets:
                    if _text(t) == expr or (isinstance(t, ast.Subscript) and _text(t.value) == expr):
                        payload = [n.value]
            if not payload:
                continue
            names = [x.id for p in payload for x in ast.walk(p) if isinstance(x, ast.Name)]
            hit = next((g for g in grad_names if g in names), None)
            score = (0 if hit else 1, n.lineno)
            if best is None or score < best[0]:
                best = (score, n, hit or _text(payload[0])[:60])
    if best is None:
        return site_of(frame), None
    return site_of(frame, best[1].lineno), best[2]
