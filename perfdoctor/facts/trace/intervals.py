"""Interval algebra on microsecond spans: merge, subtract, length per step window, count per window.

Hand-tuned loops (a big trace has millions of spans); tests/facts/test_trace_facts.py checks them against
a brute-force reading on a unit grid.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right


def merge(iv: list[tuple[float, float]]) -> list[list[float]]:
    """The union of the spans `iv` (sorted in place) as disjoint sorted intervals, empty ones dropped."""
    iv.sort()
    out: list[list[float]] = []
    append, last = out.append, None
    for s, e in iv:
        if last is not None and s <= last[1]:
            if e > last[1]:
                last[1] = e
        elif e > s:
            last = [s, e]
            append(last)
    return out


def subtract(a: list[list[float]], b: list[list[float]]) -> list[list[float]]:
    """Parts of disjoint sorted `a` not covered by disjoint sorted `b` (whose intervals may touch)."""
    out: list[list[float]] = []
    append, j, nb = out.append, 0, len(b)
    for s, e in a:
        while j < nb and b[j][1] <= s:
            j += 1
        k, cur = j, s
        while k < nb:
            bs, be = b[k]
            if bs >= e:
                break
            if bs > cur:
                append([cur, bs])
            if be > cur:
                cur = be
            k += 1
        if cur < e:
            append([cur, e])
    return out


def per_window(iv: list[list[float]], windows: list[tuple[float, float]]) -> list[float]:
    """Length of disjoint sorted intervals inside each (sorted, disjoint) window."""
    starts = [s for s, _ in iv]
    n = len(iv)
    out = []
    for ws, we in windows:
        j, tot = max(bisect_right(starts, ws) - 1, 0), 0.0
        while j < n:
            s, e = iv[j]
            if s >= we:
                break
            d = (e if e < we else we) - (s if s > ws else ws)
            if d > 0:
                tot += d
            j += 1
        out.append(tot)
    return out


def outermost(events: list[int], ts, dur) -> list[int]:
    """The events of one thread that no other event of the list encloses, in time order (`ts`, `dur`:
    the trace's columns)."""
    out: list[int] = []
    end = float("-inf")
    for i in sorted(events, key=lambda i: (ts[i], -dur[i])):
        if ts[i] >= end:
            end = ts[i] + dur[i]
            out.append(i)
    return out


def share_per_window(iv: list[list[float]], windows: list[tuple[float, float]]) -> list[float]:
    """The share of each window that the disjoint sorted intervals `iv` cover (an empty window: 0)."""
    return [c / (e - s) if e > s else 0.0 for c, (s, e) in zip(per_window(iv, windows), windows)]


def count_in(times: list[float], windows: list[tuple[float, float]]) -> list[int]:
    """How many of `times` fall inside each window [start, end)."""
    times = sorted(times)
    return [bisect_left(times, we) - bisect_left(times, ws) for ws, we in windows]
