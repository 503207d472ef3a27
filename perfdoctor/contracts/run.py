"""The run folder's JSON files: `perfdoctor run` writes them (capture/writer.py), `perfdoctor report
RUN_DIR` reads them back (facts/run/context.py). Versioned by meta.json's `schema`, "perfdoctor/run/v1".

Every field has a default, so that an older v1 folder, or one the parent finished after the child
died, still reads. A few keys are written only in some runs (the CUDA ones, what is known only at
the end of the run, py-spy's counts when it could not start): they default to `UNSET`, which is
left out when written (so the files keep the keys they always had) and is falsy when read.
Cheap to import: the capture child loads it next to torch.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TypeVar

import msgspec
from msgspec import UNSET, Struct, UnsetType

from perfdoctor.contracts import files
from perfdoctor.errors import InputError

SCHEMA = "perfdoctor/run/v1"
T = TypeVar("T")


# -- meta.json ---------------------------------------------------------------------------------

class Exit(Struct, kw_only=True):
    code: int | None = None
    reason: str | None = None  # completed | steps-reached | sys-exit | exception | interrupted | killed | not-started
    traceback: str | None = None
    at: float | None = None  # when the script ended (Unix time): which rank of a failed job failed first


def exception_line(traceback: str | None) -> str:
    """The line that names the exception in a traceback as Python prints it: the first line of the
    last traceback (a chained one's) that is not a frame (indented or not: a SyntaxError's stripped
    traceback starts with its `File "..."` line), its code or its carets. Not the last line,
    which a multi-line message fills (jit.trace's graph diff ends in `\t\t? ^^`)."""
    text = traceback or ""
    last = text.rsplit("Traceback (most recent call last):", 1)[-1]
    for line in last.splitlines():
        if line.strip() and not line[:1].isspace() and not line.startswith(("Traceback", 'File "')):
            return line.strip()
    lines = text.strip().splitlines()
    return lines[-1].strip() if lines else "an exception"


class Window(Struct, kw_only=True):
    """The profiled window: steps skip+1..skip+warmup warm up, first_step..last_step are recorded."""
    skip: int | None = None
    warmup: int | None = None
    active: int | None = None
    first_step: int | None = None
    last_step: int | None = None
    completed: bool | None = None
    steps_profiled: int | None = None
    trace: bool | None = None  # trace.json.gz was written
    error: str | None = None
    budget_s: float | None = None  # the window's wall-time budget (capture/window.py)
    budget_events: int | None = None  # its budget of estimated trace events in the recorded steps
    stopped_by: str | None = None  # "time" | "events": the budget ended the window before its last step;
    # "user-profiler": the script started a profiler of its own
    events_per_step: int | None = None  # the estimate of trace events per step, from the warm-up
    # the script had its own sys.setprofile hook when the window opened: kept, no Python calls recorded
    user_profile_hook: bool | None = None


class DeviceInfo(Struct, kw_only=True):
    """A CUDA device the run allocated memory on (meta.json `env.devices`)."""
    index: int
    name: str | None = None
    capability: list[int] | None = None  # [major, minor]
    total_memory_bytes: int | None = None
    free_memory_bytes: int | None = None  # at the end of the run (cudaMemGetInfo on this device)
    peak_allocated_bytes: int | None = None  # the highest of its steps' peaks


class Env(Struct, kw_only=True):
    """The machine (capture/env.py). `torch`, `rocm` and `free_memory_bytes` are known once the
    child has imported torch / at the end of the run; `devices` only where the script used CUDA,
    `cuda_error` only on error. `device` is "cuda" where the script initialised CUDA; the
    `device_*` keys then describe its first device in use (`devices[0]`), and `free_memory_bytes`
    is that device's free memory, else the host's."""
    python: str | None = None
    platform: str | None = None
    cpu_count: int | None = None  # usable CPUs (sched_getaffinity)
    cpu_amx: bool | None = None
    cpu_model: str | None = None
    total_memory_bytes: int | None = None  # the machine's RAM, or its cgroup's memory limit where lower
    cuda_available: bool | None = None
    device: str | None = None  # cpu | cuda
    device_name: str | None = None
    device_count: int | None = None
    device_capability: list[int] | None = None  # [major, minor]
    device_memory_bytes: int | None = None
    torch: str | UnsetType = UNSET
    rocm: bool | UnsetType = UNSET
    free_memory_bytes: int | None | UnsetType = UNSET
    devices: list[DeviceInfo] | UnsetType = UNSET
    cuda_error: str | UnsetType = UNSET
    cpu_matmul_flops: float | UnsetType = UNSET  # fp32 matmul FLOP/s this CPU reached at the end of a CPU run
    # torch's backend flags as the script left them (capture/env.py BACKEND_FLAGS): set by the user's
    # code or by a library it runs (Lightning's Trainer(benchmark=True), a framework's config)
    backends: dict[str, bool] | UnsetType = UNSET


class Rank(Struct, kw_only=True):
    """Where this run sits in a distributed job, from the launcher's environment (torchrun, SLURM
    through torchrun, `perfdoctor run --nproc-per-node`): RANK, LOCAL_RANK, WORLD_SIZE,
    LOCAL_WORLD_SIZE, GROUP_RANK (the node)."""
    rank: int
    local_rank: int | None = None
    world_size: int | None = None
    local_world_size: int | None = None
    node_rank: int | None = None
    cpu_share: int | None = None  # usable CPUs for this rank: its own where pinned, else the node's / local ranks


def rank_from_env(environ: Mapping[str, str] | None = None) -> Rank | None:
    """The rank of this process in a distributed job, or None outside one (no RANK, or a world of
    one process). SLURM's own SLURM_PROCID / SLURM_NTASKS stand in where a script reads those."""
    env = os.environ if environ is None else environ

    def num(*names: str) -> int | None:
        for n in names:
            v = env.get(n, "").strip()
            if v.isdigit():
                return int(v)
        return None

    rank = num("RANK", "SLURM_PROCID")
    world = num("WORLD_SIZE", "SLURM_NTASKS")
    if rank is None or (world is not None and world < 2):
        return None
    return Rank(rank=rank, local_rank=num("LOCAL_RANK", "SLURM_LOCALID"), world_size=world,
                local_world_size=num("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"),
                node_rank=num("GROUP_RANK", "SLURM_NODEID"))


def rank_dir_name(rank: int) -> str:
    """A rank's run folder inside a job folder: `rank-<R>`."""
    return f"rank-{rank}"


def rank_dirs(job_dir: Path) -> list[tuple[int, Path]]:
    """The rank run folders of a job folder (`rank-<R>` holding a meta.json), by rank."""
    out = []
    try:
        entries = list(job_dir.iterdir())
    except OSError:
        return []
    for d in entries:
        n = d.name[len("rank-"):]
        if d.name.startswith("rank-") and n.isdigit() and (d / "meta.json").is_file():
            out.append((int(n), d))
    return sorted(out)


class Meta(Struct, kw_only=True):
    """meta.json: written when the child starts (`complete` false, the exit `killed`), rewritten
    when the run ends; the parent completes it if the child died first (`finalised_by`)."""
    schema: str = ""
    script: str | None = None
    module: str | None = None
    argv: list[str] = []
    cwd: str | None = None
    started: str | None = None
    wall_s: float | None = None
    exit: Exit = msgspec.field(default_factory=Exit)
    step_clock: str | None = None  # optimizer | backward | dataloader | none
    window: Window | None = None
    env: Env = msgspec.field(default_factory=Env)
    complete: bool = False
    steps_limit: int | None | UnsetType = UNSET
    user_files: list[str] | UnsetType = UNSET  # the script and the user's modules it imported
    probe_errors: list[str] | UnsetType = UNSET
    finalised_by: str | UnsetType = UNSET  # "parent"
    rank: Rank | UnsetType = UNSET  # a rank of a distributed job
    # "timing": `perfdoctor verify`'s capture, the step clock and the first losses only (no probes, no
    # profiler: capture/recorder.py `TIMING`); absent: the full capture
    capture: str | UnsetType = UNSET


# -- steps.json (and steps.partial.jsonl, one Step per line) -------------------------------------

class CudaMem(Struct, kw_only=True):
    """A CUDA device's memory at a step (capture/clock.py `DeviceMemory`, the caching allocator's
    statistics)."""
    device: int
    allocated: int  # bytes allocated at the step end (torch.cuda.memory_allocated)
    peak: int  # the most bytes allocated at any moment of the step (max_memory_allocated, reset per step)


class Step(Struct, kw_only=True):
    """One step of the whole run; times in ms, `end_s` since the script started. `cuda_mem` from
    the first step end at which CUDA was initialised, for the devices the process allocated on."""
    i: files.Count
    end_s: float | None = None
    wall_ms: files.Ms
    data_ms: files.Ms | None = None
    forward_ms: files.Ms | None = None
    backward_ms: files.Ms | None = None
    optimizer_ms: files.Ms | None = None
    mem_bytes: files.Count | None = None  # the process RSS at the step end, on every device type
    cuda_mem: list[CudaMem] | UnsetType = UNSET


class Steps(Struct, kw_only=True):
    steps: list[Step] = []


class ClockLine(Struct, kw_only=True):
    """The first line of steps.partial.jsonl: which step clock the steps after it count."""
    clock: str


# -- probes.json -------------------------------------------------------------------------------

class Site(Struct, kw_only=True):
    """A line of the user's code: the first frame outside torch, perfdoctor, packages and stdlib."""
    file: str
    line: int
    code: str = ""
    function: str = ""


class DataLoaderKwargs(Struct, kw_only=True):
    batch_size: int | None = None
    num_workers: int | None = None
    pin_memory: bool | None = None
    persistent_workers: bool | None = None
    prefetch_factor: int | None = None
    multiprocessing_context: str | None = None
    drop_last: bool | None = None


class DataLoaderRecord(Struct, kw_only=True):
    id: int = 0
    site: Site | None = None
    kwargs: DataLoaderKwargs = msgspec.field(default_factory=DataLoaderKwargs)
    kwargs_style: str | None = None  # literal | dict | mixed (perfdoctor.usercode.kwargs_style)
    dataset: str | None = None  # the dataset's class name
    constructed: int = 0
    batches: int | None = None
    wait_ms_per_step: list[float] = []  # 0.0 where it delivered nothing
    to_cuda: bool = False  # a batch from it was moved to a CUDA device
    non_blocking: bool | None = None
    sampler: str | UnsetType = UNSET  # the sampler's class name (its batch sampler's, where one was given)
    sharded: bool | UnsetType = UNSET  # a DistributedSampler (or one named so); unset for an IterableDataset
    first_batch_ms: list[float] = []  # per epoch (iterator): from iter(loader) to its first batch
    first_batch_step: list[int] = []  # per epoch: the step its first batch arrived in
    # per epoch: the batches the loader had delivered before its first one (a pass's batches are the
    # differences: a pass that ended short of `length` was left, a peek with next(iter(loader)) or a break)
    first_batch_index: list[int] = []
    length: int | None = None  # len(loader), batches per epoch (None for an IterableDataset without len)
    # built by a library from a loader of the user's (same dataset, same workers; opacus, accelerate):
    # where that one was built, the line whose settings this loader has
    origin: Site | None = None
    # what one batch holds (the largest of the first BATCH_SHAPE_SAMPLES batches): its tensors and their bytes,
    # what a batch from a worker costs the training process to receive (PD002)
    batch_tensors: int | None = None
    batch_bytes: int | None = None
    # the user lines that drew an epoch's first batch from it: the loops over it, in any file
    draw_sites: list[Site] = []

    @property
    def judged_site(self) -> Site | None:
        """The line a finding about this loader names first: its settings' (the origin, else its own)."""
        return self.origin or self.site


class DataParallelRecord(Struct, kw_only=True):
    site: Site | None = None
    device_ids: list[int] | None = None
    device_count: int | None = None


class EmptyCacheRecord(Struct, kw_only=True):
    site: Site | None = None
    calls: int = 0
    calls_in_steps: int = 0


class ChildProcessRecord(Struct, kw_only=True):
    """Processes the script started itself at one user line (multiprocessing's Process.start:
    torch.multiprocessing.spawn, mp.Process, a Pool), DataLoader workers left out."""
    site: Site | None = None
    target: str = ""  # the function they run (torch.multiprocessing.spawn's: the user's function)
    method: str = ""  # the start method (spawn, fork, forkserver) where known
    started: int = 0


class AnomalyRecord(Struct, kw_only=True):
    site: Site | None = None
    enabled: bool = False


class ConvGroup(Struct, kw_only=True):
    """The convolutions of a module tree built at one user line (capture/probes/modules.py)."""
    site: Site | None = None  # the user's line that built them (None: no user frame, or copies that never ran __init__)
    direct: bool = False  # that line itself constructs the layer (not a library's model builder it called)
    layer: str = ""  # class name, e.g. Conv2d
    dims: int = 2  # spatial dimensions
    count: int = 0
    bias: int = 0  # of them, built with a bias
    # of them, with a kernel of one element (1x1) or over non-overlapping patches (kernel = stride, no
    # padding: a ViT's patch embedding): a matmul, whatever cuDNN algorithm runs it
    pointwise: int = 0
    params: int = 0
    in_channels: int = 0  # the smallest input channel count among them
    weights_channels_last: int = 0  # 4-D weights in torch.channels_last (strictly: not also NCHW-contiguous)
    inputs_seen: int = 0  # of them, called in the watched forward
    inputs_channels_last: int = 0  # of those, given a 4-D input in torch.channels_last
    norm: str | None = None  # the BatchNorm class (affine) that a biased one's output went straight into
    bias_into_norm: int = 0  # convolutions with a bias whose output was an affine BatchNorm's input


class LayerGroup(Struct, kw_only=True):
    """The Linear or convolution layers of a module tree built at one user line whose matmul dimensions
    are not all multiples of 8 (capture/probes/modules.py)."""
    site: Site | None = None
    direct: bool = False  # that line itself constructs the layer
    layer: str = ""  # class name, e.g. Linear
    count: int = 0
    params: int = 0
    dims: list[str] = []  # the dimensions that are not, e.g. "out_features 50257"
    names: list[str] = []  # their names in the tree as FlopCounterMode gives them ("GPT.lm_head")


class ModuleTree(Struct, kw_only=True):
    """A top-level module's tree at its first call and, from one forward, what its layers were fed."""
    modules: int = 0  # modules in the tree, itself included
    layers: dict[str, int] = {}  # class name -> modules of that class (the 64 most common classes)
    convs: list[ConvGroup] = []  # by construction line and class
    misaligned: list[LayerGroup] = []  # Linear and convolution layers with dimensions not multiples of 8
    watched: bool = False  # a forward's submodule calls were seen (input layouts and conv -> norm are known)
    submodule_calls: int = 0  # submodule calls in that forward


class ForwardRecord(Struct, kw_only=True):
    """A top-level module's forward calls (the call site is where the script calls the model)."""
    site: Site | None = None
    module: str | None = None  # class name
    calls: int = 0
    autocast_calls: int = 0
    param_dtype: str | None = None
    device: str | None = None
    params: int | None = None
    # of those, the parameters of its embedding tables (nn.Embedding, nn.EmbeddingBag): rows looked up,
    # never multiplied; None in a run folder written before perfdoctor counted them
    lookup_params: int | None = None
    autocast: bool = False  # autocast was on in at least half the calls
    # the classes (and their bases) of its module tree when first called that the user's files
    # define, as "<real path>:<qualname>": static detectors of model code judge only the models that
    # ran; None in a run folder written before perfdoctor recorded them
    classes: list[str] | None = None
    # its module tree (layer counts, convolutions and their layouts, conv -> BatchNorm); None in older folders
    tree: ModuleTree | None = None


class HostTensorRecord(Struct, kw_only=True):
    """Tensors a torch factory made on the host inside the step (or a DataLoader's batch), then moved to
    a device (capture/probes/host_tensors.py)."""
    site: Site | None = None  # the factory call (None for a batch)
    loader: int | None = None  # the DataLoader record (its id) whose batch was moved; None for a factory's tensor
    non_blocking: bool | None = None  # every move passed non_blocking=True
    moved: Site | None = None  # the .to(device) / .cuda() / .type_as(t) that moved them
    factory: str = ""  # randn, randint, arange, ... ("" for a batch)
    how: str = ""  # to | cuda | type_as | index (an index into the model's computation) | new_tensor (t.new_tensor(host data))
    moves: int = 0  # moves seen over the watched steps
    steps: int = 0  # watched steps with such a move
    watched: int = 0  # steps watched
    nbytes: int = 0  # bytes of the first tensor moved
    # the same host tensor, made before the steps that move it (a schedule kept in an attribute), moved
    # at `moved` on `steps` watched steps (`site` and `factory` unset)
    kept: bool = False
    # each sample moved at `moved` inside the DataLoader's fetch, by this Dataset class (`site`, `factory` unset)
    dataset: str | None = None


class HostFactoryWatch(Struct, kw_only=True):
    """The host-tensor probe's watch (capture/probes/host_tensors.py): the training steps it watched,
    the user's lines where a watched torch factory made a tensor on the host in them, moved or not, and
    the user's lines that moved a tensor in them. A factory (or move) line of the user's that is not
    among them did not run in the watched steps."""
    watched: int = 0  # steps watched to their end
    made: list[Site] = []  # at most MAX_MADE_LINES lines
    complete: bool = True  # False: more lines than were kept
    # the user's lines of `.to(device)` / `.cuda()` / `.type_as()` calls in the watched steps, whatever the
    # tensor: a move line of the user's not among them did not run in those steps
    moved: list[Site] = []  # at most MAX_MADE_LINES lines
    moves_complete: bool = True  # False: more move lines than were kept
    # the user's functions that wrote the host's values into a tensor a factory of the step made, element
    # by element (a batch built by hand: `t[i][j] = vocab[w]`), as the profiler names their frames,
    # "utils.py(41): tensorized": their ops are the host's on a GPU too (facts/trace/target_gpu.py)
    filled: list[str] = []


class LossHolderRecord(Struct, kw_only=True):
    """A holder of losses with their graphs (capture/probes/holders.py); `site` feeds it."""
    site: Site | None = None
    holder: str | None = None  # expr text: "history", "meter.vals"
    kind: str | None = None  # list | running-sum | attribute
    tensor_name: str | None = None
    graphs_retained: int | None = None
    first_step: int | None = None
    last_step: int | None = None
    graphs_per_step: float | None = None
    numel: int | None = None


class HostReadRecord(Struct, kw_only=True):
    """A line of the user's code that reads tensors on the host (.item(), .cpu(), print, ...)."""
    site: Site | None = None
    kind: str | None = None  # item | cpu | numpy | tolist | float | int | bool | print
    device: str | None = None  # the device of the first tensor read there
    counts_per_step: list[int] = []  # reads per step, step i at index i - 1
    # where the training loop called into the function that reads (a metrics helper in another
    # file): the line in the function that calls the optimizer step, None where it is that function
    caller: Site | None = None


class GcCallRecord(Struct, kw_only=True):
    """A line of the user's code that calls gc.collect() (capture/probes/gc_calls.py)."""
    site: Site | None = None
    calls: int = 0
    calls_in_steps: int = 0
    ms_by_step: list[list[float]] = []  # [step, ms in the calls on that step, calls], steps with a call only


class DdpRecord(Struct, kw_only=True):
    """A DistributedDataParallel built by the user's code, and what it did per step (capture/probes/ddp.py)."""
    site: Site | None = None  # the DDP(...) call
    module: str | None = None  # the wrapped module's class name
    find_unused_parameters: bool = False
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    params: int = 0  # trainable parameters (elements)
    grad_bytes: int = 0  # their gradients' bytes (what a copy of them in DDP's buckets holds)
    world_size: int = 0  # ranks of its process group
    built_by: str | None = None  # the package whose code built it (lightning, accelerate); None: the user's code
    # [step, synchronising forwards (grad on, not in no_sync()), ms in _post_forward with
    #  find_unused_parameters (the graph walk), backward passes on that step], steps with a synchronising forward
    by_step: list[list[float]] = []
    steps_checked: int = 0  # steps whose used map was read (find_unused_parameters without static_graph)
    unused_steps: int = 0  # of those, steps on which some parameter was unused on some rank
    comm_ms: float | None = None  # DDP's own mean time of a backward's all-reduces (its sampled iterations)
    comm_overlap_ms: float | None = None  # the part of it that backward compute overlapped
    backward_site: Site | None = None  # the user line of the first backward() while a DDP was alive


class GcTimeRecord(Struct, kw_only=True):
    """Python's garbage collections on the training steps, automatic and explicit (capture/probes/gc_time.py)."""
    # [step, ms in collections, collections, ms of it inside forward, backward or the optimizer step],
    # steps with a collection only
    ms_by_step: list[list[float]] = []


class StallLine(Struct, kw_only=True):
    """A line of the user's code on the main thread's stack, sampled through the whole run
    (capture/probes/stalls.py): on which steps it was seen and how often."""
    site: Site | None = None
    depth: int = 0  # the smallest depth it was seen at, 0 the outermost user frame
    by_step: list[list[int]] = []  # [step, samples] pairs, steps where it was seen only


class StallSamples(Struct, kw_only=True):
    interval_s: float | None = None
    samples_by_step: list[list[int]] = []  # [step, samples] pairs
    # [step, samples] pairs of the looks taken while the step ran past SLOW x the recent median:
    # the steps whose stall was seen while it ran (the others were looked at only before or after)
    late_by_step: list[list[int]] = []
    lines: list[StallLine] = []


class EvalGradRecord(Struct, kw_only=True):
    """A line of the user's code calling a module in eval mode with autograd recording
    (capture/probes/forward.py, PD019)."""
    site: Site | None = None
    module: str | None = None  # class name
    calls: int = 0
    ms_by_step: list[list[float]] = []  # [step, ms in those forwards, calls], steps with a call only
    saved_bytes: list[int] = []  # per measured call: bytes of the tensors autograd saved for a backward
    backward: int = 0  # measured calls whose graph a backward then ran through
    # per measured call: the first dimension of its first tensor argument (the batch), 0 where none
    batch: list[int] = []
    # the module also ran training-mode forwards with grad on in this run (the script trains it elsewhere)
    trained: bool = False


class GraphBreakRecord(Struct, kw_only=True):
    """A user line torch.compile's dynamo broke a graph at (capture/probes/compile.py, PD029)."""
    site: Site | None = None
    reason: str = ""  # dynamo's reason, its first line
    steps: list[int] = []  # the step of each break (dynamo breaks once per compile of the frame)


class CompiledFrame(Struct, kw_only=True):
    """A function dynamo compiled: each (re)compilation, with its step, time and reason."""
    site: Site | None = None  # the compiled function's first line
    name: str = ""
    compiles: list[list[float]] = []  # [step, ms] per compilation
    reasons: list[str] = []  # recompile reasons, the first few


class CompileRecord(Struct, kw_only=True):
    graph_breaks: list[GraphBreakRecord] = []
    frames: list[CompiledFrame] = []


class CpuWaitRecord(Struct, kw_only=True):
    """Time on a CPU and time runnable but waiting for one (run-queue delay, /proc schedstat), per
    step, of the training thread and of the DataLoader workers together (capture/probes/cpu_wait.py,
    PD018, a straggler rank's cause); step i at index i - 1."""
    wait_ms: list[float] = []  # the training thread's, within the step; the cgroup's throttled time included
    run_ms: list[float] = []
    throttled_ms: list[float] = []  # of wait_ms, the time the process's CPU cgroup was throttled
    throttled_periods: list[int] = []  # the cgroup's quota periods in which it was throttled (nr_throttled)
    cgroup: bool = False  # the CPU cgroup's throttled time was readable (and is in the wait)
    workers_wait_ms: list[float] = []  # summed over the worker processes alive at the step's end
    workers_run_ms: list[float] = []
    workers: list[int] = []  # worker processes read at each step's end
    machine_ms: list[float] = []  # CPU time every process on the machine used (/proc/stat, all CPUs)
    process_ms: list[float] = []  # CPU time this process used, all its threads (/proc/self/stat)
    # the process tree's CPU time within the step: this process's threads (CLOCK_PROCESS_CPUTIME_ID)
    # less perfdoctor's own threads (own_ms), plus the workers' time on a CPU since the previous step end
    tree_ms: list[float] = []
    # perfdoctor's own threads' time on a CPU within the step (the `perfdoctor-*` threads' schedstat: the
    # stall sampler, the profiled window's sampler): the script's tree does not have them
    own_ms: list[float] = []
    steal_ms: list[float] = []  # the VM's steal time, all CPUs (/proc/stat; 0 on bare metal)
    pressure_ms: list[float] = []  # the host's CPU pressure: ms some runnable task waited for a CPU (PSI)
    pressure: bool = False  # /proc/pressure/cpu was readable (pressure_ms is measured)
    loadavg: list[float] = []  # the host's 1, 5 and 15 min load averages at the run's start
    loadavg_end: list[float] = []  # ... and at its end

    def whole_tree_ms(self) -> list[float]:
        """tree_ms with perfdoctor's own threads added back: what this process tree took from the machine
        (the machine's other processes are the rest). tree_ms itself where own_ms was not recorded."""
        if len(self.own_ms) != len(self.tree_ms):
            return list(self.tree_ms)
        return [a + b for a, b in zip(self.tree_ms, self.own_ms)]


class GpuClockRecord(Struct, kw_only=True):
    """The SM clock of the rank's GPU and its clock throttle reasons (NVML), read at step ends a few
    times a second (capture/probes/gpu_clock.py): a straggler rank's "GPU throttling" cause."""
    max_mhz: float | None = None  # the device's maximum SM clock
    by_step: list[list[float]] = []  # [step, SM clock MHz, throttle reasons (NVML's bit mask)] per reading


class OptimizerMemory(Struct, kw_only=True):
    """The bytes an optimizer's parameters, their gradients and its state take, by "dtype@device type",
    each storage counted once across every optimizer (capture/probes/memory_objects.py)."""
    optimizer: str  # class name
    step: int  # the optimizer's own step at whose end they were read
    params: int = 0  # parameters it updates
    params_bytes: dict[str, files.Count] = {}
    grads_bytes: dict[str, files.Count] = {}
    state_bytes: dict[str, files.Count] = {}


class FlopRecord(Struct, kw_only=True):
    """The FLOPs of one training step as `torch.utils.flop_counter.FlopCounterMode` counted them
    (capture/probes/flops.py): in all, by operator and by module (ModuleTracker's names, e.g.
    "Net.fc1"; the MAX_MODULES with the most)."""
    step: int  # the step counted
    flops: int = 0
    sixteen_bit_flops: int = 0  # of them, by operators whose first operand was float16 or bfloat16
    ops: dict[str, int] = {}
    modules: dict[str, int] = {}  # forward and backward
    forward: dict[str, int] = {}  # the modules' forward FLOPs alone
    # module name -> "Class_k": its class's k-th module to run a forward in the step, as torch.profiler's
    # Python tracer names module calls ("nn.Module: Linear_1")
    order: dict[str, str] = {}


class Probes(Struct, kw_only=True):
    dataloaders: list[DataLoaderRecord] = []
    dataparallel: list[DataParallelRecord] = []
    empty_cache: list[EmptyCacheRecord] = []
    anomaly: list[AnomalyRecord] = []
    children: list[ChildProcessRecord] = []  # processes the script started itself (not DataLoader workers)
    forward: list[ForwardRecord] = []
    loss_holders: list[LossHolderRecord] = []
    host_tensors: list[HostTensorRecord] = []
    host_factories: HostFactoryWatch | None = None
    host_reads: list[HostReadRecord] = []
    gc_calls: list[GcCallRecord] = []
    ddp: list[DdpRecord] = []
    gc_time: GcTimeRecord | None = None
    stalls: StallSamples | None = None
    eval_grad: list[EvalGradRecord] = []
    compile: CompileRecord | None = None
    cpu_wait: CpuWaitRecord | None = None
    gpu_clock: GpuClockRecord | None = None
    memory_objects: list[OptimizerMemory] = []
    flops: FlopRecord | None = None
    # the value of the tensor passed to each of the first LOSS_STEPS outermost backward calls (the loss;
    # null where it is not a one-element tensor or not finite): `perfdoctor verify` compares the
    # trajectories of a script and its fixed copy
    losses: list[float | None] = []
    # [step, ms] in anomaly mode's Python stack captures (capture/probes/anomaly.py), steps with some only
    anomaly_stack_ms: list[list[float]] = []
    # the user's frames at the first optimizer step, innermost first (the line that steps the
    # optimizer, then the line that called its function, ... out to the script's module code)
    step_chain: list[Site] = []


# -- receipts.json -----------------------------------------------------------------------------

class Receipt(Struct, kw_only=True):
    """What a batch of one shape from a DataLoader worker cost a training process to receive on the run's
    host, timed right after the run (capture/receipt.py): ms per batch, and what it was taken from."""
    tensors: int
    bytes: int
    ms: float  # take_ms + read_ms - inproc_read_ms
    take_ms: float | None = None  # median __next__ with one worker that is always ahead
    read_ms: float | None = None  # median first read of its tensors (the shared pages mapped)
    inproc_read_ms: float | None = None  # the same read of a batch made in-process
    batches: int | None = None  # batches timed per way
    load_avg: float | None = None  # 1-minute load average when it was taken


class Receipts(Struct, kw_only=True):
    schema: str = SCHEMA
    receipts: list[Receipt] = []


# -- hotspots.json -----------------------------------------------------------------------------

class FunctionStat(Struct, kw_only=True):
    """cProfile's row of a user function over the window's warm-up steps."""
    function: str
    file: str
    line: int
    tottime_s: float
    cumtime_s: float
    ncalls: int


class LineSamples(Struct, kw_only=True):
    """The line sampler's count of a user line (innermost user frame of the main thread)."""
    file: str
    line: int
    samples: int


class WorkerLine(Struct, kw_only=True):
    file: str
    line: int
    function: str
    samples: int


class Workers(Struct, kw_only=True):
    """py-spy on the DataLoader workers through the window. Where it could not run, only `pids`,
    `error` and `steps` are written."""
    pids: list[int] = []
    rate_hz: int | UnsetType = UNSET
    samples: int | UnsetType = UNSET
    other_samples: int | UnsetType = UNSET  # samples with no user frame
    lines: list[WorkerLine] | UnsetType = UNSET
    error: str | None = None
    steps: int | None = None  # profiled steps py-spy ran through


class Hotspots(Struct, kw_only=True):
    functions: list[FunctionStat] = []
    lines: list[LineSamples] = []
    samples: int = 0
    sample_interval_s: float | None = None
    steps: int = 0  # steps cProfile and the line sampler ran through
    workers: Workers | None = None


# -- stuck.json: where a script was while no step ended (capture/runner.py StuckWatch) -----------

class StuckFrame(Struct, kw_only=True):
    function: str
    file: str
    line: int


class StuckProcess(Struct, kw_only=True):
    """One process's main thread, innermost frame first (py-spy dump)."""
    pid: int
    role: str  # "main" (the training process) or "child" (a process under it: a DataLoader worker)
    frames: list[StuckFrame] = []


class Stuck(Struct, kw_only=True):
    after_s: float  # how long the script had run without ending a step when this was taken
    processes: list[StuckProcess] = []


# -- encoding and decoding ----------------------------------------------------------------------

def encode(obj: object) -> bytes:
    """Indented JSON (anything that is not JSON data is written as its str()). Text that is not
    Unicode (a file name, argument or folder of non-UTF-8 bytes, which Python holds as lone
    surrogates: surrogateescape) is written with those bytes as `\\xNN`, as Python's repr shows them."""
    try:
        raw = msgspec.json.encode(obj, enc_hook=str)
    except UnicodeEncodeError:
        raw = msgspec.json.encode(files.printable_data(msgspec.to_builtins(obj, enc_hook=str)))
    return msgspec.json.format(raw, indent=1)


def decode(data: bytes, type: type[T], path: Path) -> T:
    """`data` (the contents of `path`) as a `type`; InputError with one line saying what is wrong."""
    return files.decode(path, data, type, "perfdoctor run file", hint="run `perfdoctor run` again")


def read(path: Path, type: type[T]) -> T | None:
    """A run file as its contract (regular files only, capped), None where there is no such file."""
    if not path.exists() and not path.is_symlink():
        return None
    return decode(files.read_bytes(path), type, path)


def read_meta(run_dir: Path) -> Meta:
    """meta.json of a run folder, validated; InputError when the folder is not a run folder, or one
    of a schema this perfdoctor does not read."""
    path = run_dir / "meta.json"
    if not path.exists():
        raise InputError(f"{run_dir} is not a perfdoctor run folder (no meta.json); "
                         "give a folder that `perfdoctor run` wrote, or a trace file")
    data = files.read_bytes(path)
    files.check_schema(path, files.schema_of(path, data), SCHEMA, "perfdoctor run folder's meta.json")
    return decode(data, Meta, path)
