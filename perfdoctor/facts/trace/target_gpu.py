"""The GPU step a CPU run of a CUDA-targeting script would take on a reference GPU (`target_gpu.*`):
what PD007 judges such a run by (is the fp32 matmul and convolution math a material share of the
step on the GPU the script targets, or is that step bound by its kernel launches?), what PD002 projects
a loader's loading onto and what PD004's copies are priced against.

From what the run observed:
- the FLOPs of one real step, forward and backward, and their 16-bit share (`compute.flops_per_step`: FlopCounterMode's count
  of matmuls, convolutions and attention, facts/run/compute.py; else the trace's matmul and
  convolution shapes, facts/trace/flops.py, which leave out a convolution that ran without a backward,
  a momentum encoder's or an evaluation's: the math is then a lower bound), of them the convolutions'
  (`compute.conv_flops_per_step`);
- the aten ops per step no other aten op encloses, each of which launches one kernel or more on a
  GPU (not a DataLoader's own, nor those of a batch source of the user's that the training thread
  draws from, `dataloader.source_def`, or of a function the run saw writing the host's values into a
  tensor element by element, `host_fill.frame`, outside the modules they call, a backward and an
  optimizer step: a batch built by hand stays on the host on a GPU too), with an optimizer step's ops counted once per operator
  (torch.optim's foreach form on CUDA) unless the step is a hand-written loop over the parameters, whose ops
  launch one by one on a GPU too (facts/trace/optimizer_loop.py `hand_written_loops`), and the backward
  of a recurrent layer once per forward call (`target_gpu.ops_per_step`): on a CPU an LSTM or GRU
  runs as its gates' ops and autograd differentiates each, on CUDA cuDNN runs the layer's forward
  and its backward as one call each;
- how the source sets TF32 (`script.tf32_matmul`, `script.tf32_conv`, facts/static/tf32.py).

The estimate, for the reference GPU (facts/trace/flops.py `REFERENCE_GPU`, its datasheet rates in
`PEAKS`):
    math_ms   = the fp32 part of the FLOPs (1 - compute.sixteen_bit_share):
                conv FLOPs / conv rate + other FLOPs / matmul rate
                (conv rate: TF32 unless the source turns cuDNN's TF32 off, torch's default being on;
                 matmul rate: fp32 unless the source lets matmuls use TF32, torch's default being off)
    launch_ms = target_gpu.ops_per_step x HOST_US_PER_OP (the host's floor of an eager step)
    step_ms   = launch_ms + math_ms + the 16-bit FLOPs / the 16-bit rate
    share     = math_ms / step_ms
    amp_saving_ms = math_ms - the same FLOPs / the 16-bit rate
    conv_share = the conv FLOPs at their rate / step_ms (where every convolution was counted): the share
                of the step that faster convolution kernels (PD016's autotuner, PD023's NHWC) can shorten;
                in a step bound by its launches they shorten nothing the step shows
    slowest_math_ms = all the FLOPs / the fp32 rate: the step's math on the GPU's CUDA cores, no tensor
                core used, the slowest of its datasheet rates (what PD025 asks to be still under the launch
                floor before it calls a step launch-bound: whatever precision the GPU runs it in; the
                operands' memory traffic is not counted)
    sync_ms   = 2 x HOST_US_PER_OP: the least one blocking copy from pageable host memory (or one sync)
                costs such a step: the call's own host time, then the drained queue waits for the next
                launch; a copy's bytes add at H2D_PAGEABLE_BYTES_PER_S (h2d_bytes_per_ms). PD004 prices
                the step's copies of host-made tensors with them: its severity follows their share
The rates are datasheet peaks, which small matmuls do not reach: the math time is a lower bound, so
the share is too. The batch is the run's: where a CPU run shrank it, the GPU's FLOPs per step are
larger than counted (perfdoctor cannot know the batch the script would use on the GPU).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Callable

from perfdoctor.facts import registry
from perfdoctor.facts.model import Facts
from perfdoctor.facts.trace.context import TraceContext
from perfdoctor.facts.trace.flops import H2D_PAGEABLE_BYTES_PER_S, HOST_US_PER_OP, REFERENCE_GPU, device_peak
from perfdoctor.facts.trace.intervals import count_in, outermost
from perfdoctor.facts.trace.optimizer_loop import loops
from perfdoctor.stats import median
from perfdoctor.trace.model import CPU_OP, PYFUNC, USER_ANN, Trace

# the facts naming the user's functions whose ops stay on the host on a GPU too (the profiler's names of
# their frames): a batch source the training thread draws from, a function writing a batch by hand
HOST_FRAMES = (("dataloader", "dataloader.source_def"), ("host_fill", "host_fill.frame"))
# torch's recurrent layers: a forward call each, whose backward cuDNN runs as one call on CUDA (the
# whole sequence's, or one step's for a cell); on a CPU autograd differentiates their gates' ops one by one
RECURRENT = frozenset({"aten::lstm", "aten::gru", "aten::rnn_tanh", "aten::rnn_relu",
                       "aten::lstm_cell", "aten::gru_cell", "aten::rnn_tanh_cell", "aten::rnn_relu_cell"})


def _rate(dtype: str) -> float:
    peak = device_peak(REFERENCE_GPU, dtype)
    assert peak is not None, f"PEAKS has no {dtype} rate for the reference GPU {REFERENCE_GPU}"
    return peak[0]


def host_work(ctx: TraceContext, sources: tuple[str, ...] = ()) -> Callable[[float], bool]:
    """Whether a CPU event starting at a time is the data path's host work, which stays on the host on a
    GPU too: a DataLoader's `__next__` (its transforms), or a batch source of the user's (`sources`: the
    profiler's names of their frames; nested where a generator resumes inside another's: their union)
    outside the step's own work they hold: the modules they call (an RL rollout's policy forward
    launches on the GPU, its bookkeeping does not), a backward or an optimizer step (a step function that
    also fills a host tensor element by element keeps its backward's and its optimizer's launches)."""
    t = ctx.trace
    ts, dur, name = t.ts, t.dur, t.name
    loading = t.names_where(lambda s: s.startswith("enumerate(DataLoader)"))
    batches = sorted((ts[i], ts[i] + dur[i]) for i in t.indices(CPU_OP, USER_ANN) if name[i] in loading)
    starts = [a for a, _ in batches]
    own = t.names_where(lambda s: any(s == w or s.endswith("/" + w) for w in sources)) if sources else set()
    made = _union([(ts[i], ts[i] + dur[i]) for i in t.indices(PYFUNC) if name[i] in own]) if own else []
    made_starts = [a for a, _ in made]
    modules: list[tuple[float, float]] = []
    if made:
        called = t.names_where(lambda s: s.startswith("nn.Module:"))
        backward = t.names_where(lambda s: s.startswith("autograd::engine::evaluate_function:"))
        steps = t.names_where(lambda s: s.startswith("Optimizer.step#"))
        modules = _union([(ts[i], ts[i] + dur[i]) for i in t.indices(PYFUNC) if name[i] in called]
                         + [(ts[i], ts[i] + dur[i]) for i in t.indices(CPU_OP, USER_ANN) if name[i] in steps]
                         + [(ts[i], ts[i] + dur[i]) for i in t.indices(CPU_OP) if name[i] in backward])
    module_starts = [a for a, _ in modules]

    def on_host(at: float) -> bool:
        j = bisect_right(starts, at) - 1
        if j >= 0 and at < batches[j][1]:
            return True  # the DataLoader's own work (a transform's ops)
        return bool(made) and _inside(made, made_starts, at) and not _inside(modules, module_starts, at)
    return on_host


def data_path_frames(facts: Facts) -> tuple[str, ...]:
    """The profiler's names of the frames of the user's batch sources (`HOST_FRAMES`)."""
    return tuple(str(f.value) for kind, name in HOST_FRAMES for s in facts.of_kind(kind)
                 if (f := s.facts.get(name)) is not None)


def gpu_ops_per_step(ctx: TraceContext, sources: tuple[str, ...] = ()) -> float | None:
    """The aten ops per step that no other aten op encloses (forward, backward, optimizer: the ops that
    launch a CUDA step's kernels; an autograd node's wrapper is not one), not the data path's host work
    (`host_work`: a DataLoader's `__next__`, a batch source of the user's, `sources`), those inside an
    optimizer step (`Optimizer.step#...`) once per operator and optimizer step: torch's optimizers loop over
    the parameters on a CPU and run each operator once over all of them in their foreach form, CUDA's
    default (a hand-written optimizer that loops over its parameters, `hand_written_loops`, launches each
    of its ops on a GPU too: counted one by one); a recurrent layer's backward once per forward call
    (`_recurrent_backward`). None without steps."""
    t, windows = ctx.trace, ctx.cpu_windows
    if not windows:
        return None
    ts, dur, name = t.ts, t.dur, t.name
    aten = t.names_where(lambda s: s.startswith("aten::"))
    steps = t.names_where(lambda s: s.startswith("Optimizer.step#"))
    looping = {(a, k) for loop in loops(ctx).values() for a, _, k in loop.spans}
    spans = sorted((ts[i], ts[i] + dur[i]) for i in t.indices(CPU_OP, USER_ANN) if name[i] in steps
                   and (ts[i], t.track[i]) not in looping)
    on_host = host_work(ctx, sources)
    by_track: dict[int, list[int]] = defaultdict(list)
    for i in t.indices(CPU_OP):
        if name[i] in aten:
            by_track[t.track[i]].append(i)
    outer = [i for lst in by_track.values() for i in outermost(lst, ts, dur)]
    layer_of = _recurrent_backward(t)
    times: list[float] = []
    seen: set[tuple[int, int]] = set()  # (optimizer step, operator)
    layers_seen: set[int] = set()
    k = 0
    for i in sorted(outer, key=ts.__getitem__):
        if on_host(ts[i]):
            continue  # the data path's host work: the host's, on a GPU too
        layer = layer_of(i)
        if layer is not None:
            if layer in layers_seen:
                continue  # the rest of a recurrent layer's backward: one cuDNN call on CUDA
            layers_seen.add(layer)
        while k < len(spans) and spans[k][1] <= ts[i]:
            k += 1
        if k < len(spans) and spans[k][0] <= ts[i]:
            if (k, name[i]) in seen:
                continue  # the same operator over the next parameter: one foreach op on CUDA
            seen.add((k, name[i]))
        times.append(ts[i])
    return median(count_in(times, windows))


def _inside(spans: list[tuple[float, float]], starts: list[float], at: float) -> bool:
    """`at` falls in one of the disjoint sorted spans (`starts`: their starts)."""
    j = bisect_right(starts, at) - 1
    return j >= 0 and at < spans[j][1]


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Overlapping (start, end) spans merged, in order."""
    out: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if out and a < out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _recurrent_backward(t: Trace) -> Callable[[int], int | None]:
    """For an op of the trace, the recurrent layer (the index of its forward call, `RECURRENT`) whose
    backward it is part of, else None: the backward nodes (`autograd::engine::evaluate_function: ...`)
    that carry the sequence number of an op the layer's forward call enclosed, on the same thread."""
    ts, dur, name, track = t.ts, t.dur, t.name, t.track
    layers = t.names_where(lambda s: s in RECURRENT)
    nodes = t.names_where(lambda s: s.startswith("autograd::engine::evaluate_function:"))
    if not layers or not t.seq:
        return lambda i: None
    ops: dict[int, list[int]] = defaultdict(list)  # track -> the ops with a sequence number, by start
    for i in t.seq:
        ops[track[i]].append(i)
    for lst in ops.values():
        lst.sort(key=ts.__getitem__)
    starts = {k: [ts[i] for i in lst] for k, lst in ops.items()}
    seq_of: dict[tuple[int, int], int] = {}  # (track, sequence number) -> the layer's forward call
    for r in t.indices(CPU_OP):
        if name[r] not in layers:
            continue
        lst, st = ops.get(track[r], []), starts.get(track[r], [])
        for j in range(bisect_left(st, ts[r]), bisect_left(st, ts[r] + dur[r])):
            seq_of[(track[r], t.seq[lst[j]])] = r
    spans: dict[int, list[tuple[float, float, int]]] = defaultdict(list)  # track -> (start, end, layer)
    for i in t.indices(CPU_OP):
        if name[i] in nodes and i in t.seq:
            layer = seq_of.get((track[i], t.seq[i]))
            if layer is not None:
                spans[track[i]].append((ts[i], ts[i] + dur[i], layer))
    for lst2 in spans.values():
        lst2.sort()
    begins = {k: [a for a, _, _ in lst2] for k, lst2 in spans.items()}

    def layer_of(i: int) -> int | None:
        lst3 = spans.get(track[i])
        if not lst3:
            return None
        j = bisect_right(begins[track[i]], ts[i]) - 1
        return lst3[j][2] if j >= 0 and ts[i] < lst3[j][1] else None
    return layer_of


def batch_scale(facts: Facts) -> tuple[float, str]:
    """The script's own batch over this run's, for the training loader: a CPU run is often given a
    smaller batch (`--batch_size 8`) than the script uses on its GPU (`default=128`), and the estimate
    is for the GPU. 1 where the run's batch is the default, larger, or either is unknown."""
    best: tuple[float, str] = (1.0, "")
    for s in facts.of_kind("dataloader"):
        f = s.facts
        if f.get("dataloader.trains") is not None and f["dataloader.trains"].value is False:
            continue
        ran, default = f.get("dataloader.batch_size"), f.get("dataloader.default_batch_size")
        if ran is None or default is None or ran.source == "static":
            continue
        if isinstance(ran.value, int) and ran.value > 0 and isinstance(default.value, int) and default.value > ran.value:
            scale = default.value / ran.value
            if scale > best[0]:
                best = (scale, f"the script's batch of {default.value} (its default) over this run's {ran.value}: "
                               "the FLOPs per step scaled by it, the launches not")
    return best


def add(ctx: TraceContext) -> None:
    facts = ctx.facts
    if ctx.gpu or not registry.derive("run.cuda_on_cpu", facts.value):
        return  # a GPU run measures its step; a script that stays on the CPU is not judged for a GPU
    flops = facts.value("compute.flops_per_step")
    if not isinstance(flops, (int, float)) or flops <= 0:
        return
    ops = gpu_ops_per_step(ctx, data_path_frames(facts))
    if not ops:
        return
    convs = facts.value("compute.conv_flops_per_step")
    conv_flops = min(float(convs), float(flops)) if isinstance(convs, (int, float)) else 0.0
    scale, why = batch_scale(facts)
    if scale > 1:  # the GPU runs the script's own batch: its math scales with it, its launches do not
        flops, conv_flops = flops * scale, conv_flops * scale
        ctx.put("target_gpu.batch_scale", scale, "ratio", why)
    sixteen = facts.value("compute.sixteen_bit_share")
    fp32 = 1.0 - (min(1.0, max(0.0, float(sixteen))) if isinstance(sixteen, (int, float)) else 0.0)
    conv_dtype = "fp32" if facts.value("script.tf32_conv") is False else "tf32"
    mm_dtype = "tf32" if facts.value("script.tf32_matmul") is True else "fp32"
    half = _rate("16-bit")
    math_ms = fp32 * (conv_flops / _rate(conv_dtype) + (flops - conv_flops) / _rate(mm_dtype)) * 1000
    launch_ms = ops * HOST_US_PER_OP / 1000
    step_ms = launch_ms + math_ms + (1 - fp32) * flops / half * 1000
    ctx.put("target_gpu.reference", f"NVIDIA {REFERENCE_GPU} (datasheet, dense: 16-bit {half / 1e12:g}, "
            f"TF32 {_rate('tf32') / 1e12:g}, fp32 {_rate('fp32') / 1e12:g} TFLOP/s); {HOST_US_PER_OP:g} us of host "
            "time per op", "str", "the GPU a CPU run of a CUDA-targeting script is judged for")
    ctx.put("target_gpu.math_ms", math_ms, "ms",
            f"the fp32 part ({fp32:.0%}) of {flops:.4g} FLOPs per step ({conv_flops:.4g} in convolutions, at the "
            f"{conv_dtype} rate; the rest at the {mm_dtype} rate) on the reference GPU")
    ctx.put("target_gpu.ops_per_step", ops, "count", "aten ops per step no other aten op encloses, an optimizer "
            "step's once per operator, a recurrent layer's backward once per call, not the data path's")
    ctx.put("target_gpu.launch_ms", launch_ms, "ms", f"{ops:g} ops per step x {HOST_US_PER_OP:g} us")
    ctx.put("target_gpu.step_ms", step_ms, "ms", "launch floor + math (the 16-bit part at the 16-bit rate), on the "
            "reference GPU")
    ctx.put("target_gpu.math_share", math_ms / step_ms, "ratio", "fp32 math / the estimated GPU step")
    ctx.put("target_gpu.sync_ms", 2 * HOST_US_PER_OP / 1000, "ms",
            f"2 x {HOST_US_PER_OP:g} us: the call's host time, then the drained queue waits for the next launch")
    ctx.put("target_gpu.h2d_bytes_per_ms", H2D_PAGEABLE_BYTES_PER_S / 1000, "number",
            f"{H2D_PAGEABLE_BYTES_PER_S / 1e9:g} GB/s from pageable host memory")
    ctx.put("target_gpu.amp_saving_ms", max(0.0, math_ms - fp32 * flops / half * 1000), "ms",
            "the fp32 math less the same FLOPs at the reference GPU's 16-bit rate")
    ctx.put("target_gpu.slowest_math_ms", flops / _rate("fp32") * 1000, "ms",
            f"{flops:.4g} FLOPs per step at the reference GPU's fp32 rate, no tensor core used")
    if registry.derive("compute.conv_share", facts.value) is not None:  # every convolution counted
        conv_ms = conv_flops * (fp32 / _rate(conv_dtype) + (1 - fp32) / half) * 1000
        ctx.put("target_gpu.conv_share", conv_ms / step_ms, "ratio",
                f"the convolutions' {conv_flops:.4g} FLOPs per step at the {conv_dtype} rate ({conv_ms:.3g} ms) / the "
                "estimated GPU step")
