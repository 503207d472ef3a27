"""The explanation of a comparison (gate.explain) as plain sentences, one per line, the same in every
format: the environment or the host first where they come first, then the phases, the modules and the
operators that changed most."""

from __future__ import annotations

from pathlib import Path

from perfdoctor.gate.explain import Explanation, Part

SHOWN = 3  # contributors per level
MIN_MS = 0.005  # a change below this per step is not worth a line


def _part(p: Part, total: float | None) -> str:
    share = f", {p.delta_ms / total:.0%} of the change" if total else ""
    where = f" ({Path(p.where.rsplit(':', 1)[0]).name}:{p.where.rsplit(':', 1)[1]})" if p.where and ":" in p.where else ""
    return f"{p.name}{where} {p.base_ms:.2f} -> {p.cur_ms:.2f} ms ({p.delta_ms:+.2f} ms{share})"


def explanation_lines(e: Explanation | None) -> list[str]:
    if e is None:
        return []
    out = list(e.first)
    d = e.step_delta_ms
    if d is not None and e.step_base_ms is not None and e.step_cur_ms is not None:
        out.append(f"mean steady step {e.step_base_ms:.2f} -> {e.step_cur_ms:.2f} ms ({d:+.2f} ms); by phase: "
                   + "; ".join(_part(p, d) for p in e.phases[:SHOWN] if abs(p.delta_ms) >= MIN_MS))
    if e.cpu_wait is not None and abs(e.cpu_wait.delta_ms) >= MIN_MS:
        out.append(_part(e.cpu_wait, d))
    pd = e.profiled_delta_ms
    for label, parts in ((f"by module (profiled steps, {pd:+.2f} ms)" if pd is not None else "", e.modules),
                         (f"by {e.unit}", e.operators)):
        shown = [p for p in parts[:SHOWN] if abs(p.delta_ms) >= MIN_MS]
        if shown:
            out.append(f"{label}: " + "; ".join(_part(p, pd) for p in shown))
    return out + list(e.notes)
