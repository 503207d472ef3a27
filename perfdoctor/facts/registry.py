"""Every fact perfdoctor produces, declared once: name, unit, scope, producers and a one-line doc.

This is the contract between the layers that measure (`facts/run`, `facts/trace`, `facts/static`, the
machine facts of a run) and the rules that judge. `Facts.add` and `Subject.add` refuse a name that
is not declared here (a producer's typo fails at once, not as a rule that silently never fires), and
the rule catalog refuses a rule file that reads an undeclared name (`perfdoctor.rules.catalog`).
The fact tables of docs/ARCHITECTURE.md are checked against this module by a test.

Scopes: a global fact (`Facts.add`) has scope "global"; a subject fact (`Subject.add`) has the
subject's kind as its scope and its name starts with the kind (`dataloader.wait_ms`). A name may be
declared in both scopes (the trace's `sync.ms` is global; a `sync` subject has its own `sync.ms`).
`threshold.*` names are not facts: they are local to a rule, read from its own `[thresholds]`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# Where a fact comes from, strongest evidence first (the order `facts.model` and the doc follow).
SOURCES = ("run", "trace", "static", "machine")
UNITS = ("ms", "bytes", "count", "ratio", "bool", "str", "number")
GLOBAL = "global"
THRESHOLD_PREFIX = "threshold."


@dataclass(frozen=True)
class FactSpec:
    name: str  # the full dotted name rules read
    unit: str  # one of UNITS: ms per step unless the doc says otherwise; ratio in 0..1 unless said
    scope: str  # GLOBAL or a subject kind
    producers: tuple[str, ...]  # the sources (SOURCES) that set it
    doc: str  # one line


def _declare(scope: str, rows: list[tuple[str, str, str, str]]) -> dict[str, FactSpec]:
    out: dict[str, FactSpec] = {}
    for name, unit, producers, doc in rows:
        full = name if scope == GLOBAL else f"{scope}.{name}"
        srcs = tuple(producers.split("/"))
        if unit not in UNITS or not set(srcs) <= set(SOURCES) or full in out:
            raise ValueError(f"bad declaration of {full}: unit {unit!r}, producers {producers!r}, or twice")
        out[full] = FactSpec(full, unit, scope, srcs, doc)
    return out


GLOBAL_FACTS: dict[str, FactSpec] = _declare(GLOBAL, [
    # the run and its steps
    ("run.steps_observed", "count", "run", "steps seen in the whole run"),
    ("run.steps_profiled", "count", "run/trace", "steps in the profiled window (or in the trace)"),
    ("run.world_size", "count", "run", "ranks in the distributed job this run is a rank of (absent outside one)"),
    ("run.step_clock", "str", "run/trace",
     "what counts a step: optimizer, backward, dataloader, profiler-step, annotation, whole-run"),
    ("run.loss_scan_steps", "count", "run",
     "steps on which the probes looked for retained losses (PD006 then trusts the run over the source)"),
    ("step.time_ms", "ms", "run/trace", "median step over the steady-state steps"),
    ("step.time_p90_ms", "ms", "run/trace", "90th percentile step over the steady-state steps"),
    ("step.profiled_time_ms", "ms", "trace", "median step of the profiled steps (the trace's): what host time "
     "measured there (sync.ms) is a share of"),
    ("step.data_ms", "ms", "run/trace", "data loading per step (the parts add up to step.time_ms; a run: mean share x median step, a trace: median)"),
    ("step.forward_ms", "ms", "run/trace", "forward per step (a run: mean share x median step; a trace: median, CPU traces only)"),
    ("step.backward_ms", "ms", "run/trace", "backward per step (a run: mean share x median step; a trace: median, CPU traces only)"),
    ("step.optimizer_ms", "ms", "run/trace", "optimizer step, without the closure's forward and backward (a run: mean share x median step; a trace: median, CPU traces only)"),
    ("step.gpu_compute_ms", "ms", "run", "a CPU run of a CUDA script: the step's measured compute (step less data "
                                          "loading) / step.gpu_speedup, what a GPU would need"),
    ("step.gpu_speedup", "number", "run", "a CPU run of a CUDA script: how many times faster a GPU is taken to run the step's "
                                    "compute than this machine's CPU cores (GPU_SPEEDUP, facts/run/dataloader.py)"),
    ("step.other_ms", "ms", "run/trace", "step time in none of the other parts"),
    ("step.gpu_kernel_ms", "ms", "trace", "GPU compute kernels per step (communication left out)"),
    ("step.memcpy_ms", "ms", "trace", "GPU copies per step"),
    ("step.memset_ms", "ms", "trace", "GPU memsets per step"),
    ("step.comm_ms", "ms", "trace", "communication kernels per step, not hidden behind compute"),
    ("step.runtime_ms", "ms", "trace", "CUDA/HIP runtime and driver calls per step"),
    ("step.cpu_ops_ms", "ms", "trace", "CPU operators per step outside the other parts"),
    ("step.idle_ms", "ms", "trace", "GPU idle per step (a run folder: the run's step less gpu.busy_ms)"),
    # the GPU
    ("gpu.busy_ms", "ms", "trace", "GPU busy per step (kernels, copies, memsets; the busiest device of several)"),
    ("gpu.utilization", "ratio", "trace", "GPU busy (kernels, copies, memsets) / step"),
    ("gpu.idle_host_wait_ms", "ms", "trace", "GPU idle per step while its next work was not launched yet"),
    ("gpu.idle_gap_ms", "ms", "trace", "GPU idle per step although its next work was already launched"),
    # the machine
    ("cpu.count", "count", "machine", "usable CPUs (sched_getaffinity); a rank of a distributed job: its share, the node's usable CPUs / its local ranks (unless the launcher pinned it)"),
    ("cpu.local_ranks", "count", "machine", "ranks of the job sharing this node's CPUs (set where cpu.count is a rank's share)"),
    ("cpu.amx", "bool", "machine", "the CPU has AMX tiles (bf16 autocast is fast)"),
    ("device.type", "str", "machine/trace", "cpu, cuda or rocm"),
    ("device.name", "str", "machine/trace", "the device's name"),
    ("device.count", "count", "machine/trace", "devices in the run, or deviceProperties entries of the trace"),
    ("device.capability", "number", "machine/trace", "CUDA compute capability, e.g. 8.0"),
    ("device.memory_bytes", "bytes", "machine/trace", "the device's memory"),
    ("device.amp_available", "bool", "machine/trace",
     "autocast pays on this hardware: CUDA capability >= 7.0, ROCm, or a CPU with AMX"),
    ("device.amp_basis", "str", "machine", "why device.amp_available is what it is, in words"),
    # the model
    ("autocast.enabled", "bool", "run", "autocast state at the forward of the largest top-level module"),
    ("model.param_dtype", "str", "run", "parameter dtype of the largest top-level module"),
    ("autograd.anomaly_enabled", "bool", "run", "set_detect_anomaly(True) / detect_anomaly() seen"),
    ("autograd.nan_check_fraction", "ratio", "trace", "share of the profiled step in anomaly mode's NaN checks of "
                                                      "the backward's gradients (facts/trace/anomaly.py)"),
    ("optimizer_loop.saving_share", "ratio", "trace", "share of the profiled step a per-tensor optimizer update spends "
                                                      "repeating its operators tensor by tensor (facts/trace/optimizer_loop.py)"),
    ("matmul.ms", "ms", "trace", "GEMM and convolution time per step"),
    ("matmul.fp32_share", "ratio", "trace", "share of the GEMM/convolution time in fp32 (no tensor cores)"),
    # syncs, copies, counters
    ("sync.count_per_step", "count", "trace", "host-device syncs per step"),
    ("sync.ms", "ms", "trace", "time the CPU spent blocked in sync calls, per step"),
    ("copies.h2d_per_step", "count", "trace", "host-to-device copies per step"),
    ("copies.h2d_pageable_per_step", "count", "trace", "host-to-device copies from pageable memory per step"),
    ("copies.h2d_ms", "ms", "trace", "host-to-device copy time per step"),
    ("copies.h2d_pageable_ms", "ms", "trace", "host-to-device copy time from pageable memory per step"),
    ("copies.h2d_pageable_host_ms", "ms", "trace",
     "time the CPU waited in the calls that copied from pageable memory to the device, per step"),
    ("copies.h2d_pinned_sync_ms", "ms", "trace",
     "time the CPU waited in the stream syncs right after copies from pinned memory (no non_blocking), per step"),
    ("ops.calls_per_step", "count", "trace", "top-level aten ops per step (noise-free: the CI gate compares it)"),
    ("kernels.launches_per_step", "count", "trace", "kernel launches per step (noise-free)"),
    ("empty_cache.free_calls_per_step", "count", "trace", "cudaFree/hipFree calls per step"),
    ("empty_cache.cost_share", "ratio", "trace", "share of the profiled step in torch's empty_cache calls and the "
                                                 "step's cudaMalloc/cudaFree calls (facts/trace/empty_cache.py)"),
    ("dataloader.num_workers", "count", "trace",
     "0 where the trace shows a single-process DataLoader iterator (read where no subject has it)"),
    # memory
    ("memory.peak_bytes", "bytes", "run", "CUDA: the highest memory allocated within a step, on the device that "
     "peaks most; else the max process RSS at step ends outside the profiled window"),
    ("memory.total_bytes", "bytes", "machine", "the memory of the device the memory facts are about on CUDA, else "
     "the host's"),
    ("memory.free_bytes", "bytes", "machine", "free memory at the end of the run (on CUDA: on that device)"),
    ("memory.growth_bytes_per_step", "bytes", "run", "clear linear memory growth over the steady steps (CUDA: "
     "allocated at step ends, the device that grows most)"),
    ("memory.steps_to_oom", "count", "run", "free memory at the end / growth per step"),
    ("memory.params_bytes", "bytes", "run", "the parameters the optimizers update, each storage once (on the device "
     "type the memory facts are about)"),
    ("memory.grads_bytes", "bytes", "run", "their gradients"),
    ("memory.optimizer_state_bytes", "bytes", "run", "the optimizers' state (moments, momentum buffers)"),
    ("memory.activations_bytes", "bytes", "run/trace", "the activations kept for backward and the temporaries: on "
     "CUDA the peak within a step less parameters, gradients and optimizer state; on a CPU run the allocator's "
     "within-step peak above the step's start (the trace's profile_memory)"),
    ("memory.headroom_bytes", "bytes", "run", "the device's (CPU: the machine's) memory less the peak"),
    ("compute.flops_per_step", "number", "run/trace", "FLOPs per step, forward and backward: a run's counted by "
     "FlopCounterMode on one step (matmuls, convolutions, attention), else a trace's recorded matmuls (mm, addmm, "
     "bmm, baddbmm: 2*M*K*N) and convolutions (from their backward's shapes)"),
    ("memory.loss_holders", "count", "run", "containers keeping losses with their graphs (PD006's): a known holder of growth"),
    ("memory.lost_frees", "count", "trace", "allocator blocks whose free the trace did not record (their address "
     "allocated again with no free between): the kept blocks of their lines are not counted"),
    ("memory.kept_bytes_per_step", "bytes", "trace", "allocator blocks a recorded step allocated and the trace's end "
     "still holds, per step (profile_memory)"),
    ("memory.step_transient_bytes", "bytes", "trace", "the allocator's highest total within a step less its total at "
     "the step's start (median over the recorded steps): activations kept for backward and temporaries"),
    ("compute.conv_flops_per_step", "number", "run/trace", "of compute.flops_per_step, the convolutions' (forward "
     "and backward), as FlopCounterMode counted them, else from their backward's shapes in the trace"),
    ("target_gpu.reference", "str", "trace", "a CPU run of a CUDA-targeting script: the reference GPU its step is "
     "estimated for, with the rates used (facts/trace/flops.py REFERENCE_GPU, PEAKS, HOST_US_PER_OP)"),
    ("target_gpu.math_ms", "ms", "trace", "the fp32 part of the step's counted FLOPs at the reference GPU's datasheet "
     "rate (TF32 where the script or cuDNN's default allows it)"),
    ("target_gpu.ops_per_step", "count", "trace", "the ops a CUDA step of the script would launch: aten ops per step "
     "no other aten op encloses (forward, backward, optimizer), an optimizer step's once per operator (CUDA's foreach form), "
     "a recurrent layer's backward once per forward call (cuDNN's), not a DataLoader's or a batch source's own"),
    ("target_gpu.launch_ms", "ms", "trace", "the host's floor of an eager step on the GPU: target_gpu.ops_per_step "
     "x the host time per op (HOST_US_PER_OP)"),
    ("target_gpu.step_ms", "ms", "trace", "the estimated GPU step: target_gpu.launch_ms + target_gpu.math_ms + the "
     "16-bit FLOPs at the 16-bit rate"),
    ("target_gpu.math_share", "ratio", "trace", "target_gpu.math_ms / target_gpu.step_ms"),
    ("target_gpu.sync_ms", "ms", "trace", "what one host-device sync or one blocking copy from pageable host memory "
     "costs a GPU step at least: the call's own host time and the drained queue's wait for the next launch, "
     "2 x HOST_US_PER_OP (what PD004 prices a copy at)"),
    ("target_gpu.h2d_bytes_per_ms", "number", "trace", "bytes per ms a copy from pageable host memory to the "
     "reference GPU moves (facts/trace/flops.py H2D_PAGEABLE_BYTES_PER_S)"),
    ("target_gpu.batch_scale", "ratio", "trace", "the training loader's batch by default (dataloader.default_batch_size) "
     "over this run's, where larger: the FLOPs per step of the estimate are scaled by it"),
    ("target_gpu.amp_saving_ms", "ms", "trace", "the math time bf16 autocast would save on the reference GPU: "
     "target_gpu.math_ms less the same FLOPs at its bf16 rate"),
    ("target_gpu.conv_share", "ratio", "trace", "the convolutions' FLOPs at their rate on the reference GPU over "
     "target_gpu.step_ms (absent where some convolutions went uncounted): the share of the estimated GPU step that "
     "faster convolution kernels can shorten"),
    ("target_gpu.slowest_math_ms", "ms", "trace", "all of the step's counted FLOPs at the reference GPU's fp32 rate "
     "(its CUDA cores, no tensor core): the step's math at the slowest of its datasheet rates"),
    ("compute.sixteen_bit_share", "ratio", "run", "the share of the counted FLOPs run on float16 or bfloat16 operands"),
    ("compute.achieved_flops", "number", "trace", "FLOPs per step / step time: FLOP/s achieved"),
    ("compute.peak_flops", "number", "machine/trace", "the peak the MFU is judged against: a CPU run's measured fp32 "
     "matmul rate, else a known accelerator's datasheet peak for the dtype in use"),
    ("compute.uncounted_convs_per_step", "count", "trace", "convolutions per step whose FLOPs are not counted: "
     "no FLOP/s or MFU is given where there are any"),
    ("compute.mfu", "ratio", "trace", "model FLOPs utilisation: achieved FLOP/s / peak FLOP/s"),
    ("memory.batch_that_fits", "count", "run/trace", "an estimate of the largest batch that fits, from the "
     "activations per sample (CUDA: the device's memory; CPU: the RAM or cgroup limit less the peak RSS)"),
    # the source
    ("script.targets_cuda", "bool", "static", "the user's files name a CUDA device"),
    ("script.tf32_matmul", "bool", "static", "the source lets fp32 matmuls run in TF32 "
     "(`torch.backends.cuda.matmul.allow_tf32 = True`, `set_float32_matmul_precision('high'/'medium')`), or keeps "
     "them fp32 (False, or 'highest'); absent: torch's default, fp32"),
    ("script.tf32_conv", "bool", "static", "the source sets `torch.backends.cudnn.allow_tf32`: False keeps "
     "convolutions fp32; absent: torch's default, TF32"),
    ("script.uses_amp", "bool", "static",
     "the user's files use low precision on some path not switched off by a user's setting: autocast (not enabled=False), .half()/.bfloat16(), a 16-bit precision setting (none in a branch only a user's "
     "setting takes: `if args.fp16: model.half()`)"),
    # communication and ranks
    ("comm.share", "ratio", "trace", "communication / GPU busy time"),
    ("comm.overlap", "ratio", "trace", "share of communication time overlapped by compute on other streams"),
    ("comm.allreduce_per_step", "count", "trace", "all-reduce calls per step"),
    ("comm.allreduce_bytes_median", "bytes", "trace", "median all-reduce size"),
    ("comm.host_share", "ratio", "trace", "share of the step in collectives run on the host (gloo): communication, mostly waiting for the slowest rank"),
    ("ranks.count", "count", "run/trace", "ranks in a job folder or a folder of per-rank traces"),
    ("ranks.imbalance_ratio", "ratio", "run/trace", "step / (step - (straggler's - other ranks' median) per-rank work (step less host collectives)), else the straggler's / median GPU compute or step time, >= 1"),
    ("ranks.imbalance_p", "ratio", "run/trace", "the chance that the steps' noise alone makes a rank's work exceed the others' as much as the straggler's: a permutation test over the ranks' aligned steps"),
    ("ranks.straggler", "number", "run/trace", "the rank whose work (step less host collectives), GPU compute or step time exceeds the others' step by step beyond the steps' noise (imbalance_p <= 0.1), or where too few steps to test the most, at 1.1 times the median rank's or more"),
    ("ranks.straggler_cause", "str", "run/trace", "what makes the straggler slow, from its own evidence: data loading, compute, a slower CPU or GPU (the same work as the other ranks, done slower), host syncs, garbage collection, waiting for a CPU, CPU throttling or GPU throttling"),
    ("ranks.straggler_excess_ms", "ms", "run/trace", "how much longer the straggler's cause takes on it than on the other ranks (median)"),
    ("ranks.idle_spread", "ratio", "run/trace", "max - min GPU idle fraction across ranks"),
])

SUBJECT_FACTS: dict[str, dict[str, FactSpec]] = {
    "dataloader": _declare("dataloader", [
        ("num_workers", "count", "run/trace/static", "worker processes"),
        ("pin_memory", "bool", "run/static", "pin_memory as given"),
        ("persistent_workers", "bool", "run/static", "persistent_workers as given"),
        ("batch_size", "count", "run/static", "batch_size as given"),
        ("workers_follow_cpus", "bool", "static", "num_workers is computed from the machine's CPUs (os.cpu_count(), "
                                                  "len(os.sched_getaffinity(0)) ...): as many on any machine as its CPUs make it"),
        ("default_batch_size", "count", "static", "the batch size the script gives it unless the user changes it, "
                                                  "where it reads an option: the literal default of that argparse option (given directly, "
                                                  "through a name, or through a parameter of the helper that builds the "
                                                  "loader, which every caller fills from that option)"),
        ("prefetch_factor", "count", "run", "prefetch_factor as given"),
        ("multiprocessing_context", "str", "run", "multiprocessing_context as given"),
        ("kwargs_style", "str", "run/static", "how the call passes its arguments: literal, dict or mixed"),
        ("batches", "count", "run", "batches it delivered"),
        ("wait_ms", "ms", "run/trace", "median time per step the loop waits in its __next__"),
        ("wait_mean_ms", "ms", "run", "mean time per step the loop waits in its __next__"),
        ("wait_fraction", "ratio", "run/trace", "wait_ms / step time"),
        ("load_ms", "ms", "run", "num_workers=0: loading one step's batches in the training process (mean wait)"),
        ("batch_tensors", "count", "run", "tensors in one batch (the largest of the first batches the run saw)"),
        ("batch_bytes", "bytes", "run", "the bytes of those tensors"),
        ("receipt_ms", "ms", "run", "what receiving its batches from worker processes would cost the training "
                                    "process per step (queue, unpickling, storages rebuilt from shared memory): "
                                    "per batch as timed for a batch of this shape on the run's host after the run "
                                    "(receipts.json, capture/receipt.py), else from batch_tensors and batch_bytes "
                                    "with costs benchmarks/loader_receipt.py measured; times the batches per step"),
        ("feeds_cuda", "bool", "run/static", "its batches are moved to a CUDA device (absent, never False, "
                                               "in a static read without a move)"),
        ("non_blocking", "bool", "run/static", "the batch moves pass non_blocking=True"),
        ("samples_on_device", "bool", "run", "its Dataset moves each sample to the device as it is read (in "
                                             "__getitem__): its batches are on the device already, nothing to pin"),
        ("source", "str", "static", "no DataLoader: the batch source of the user's the training loop draws from on the "
                                    "training thread (a generator, an iterator's __next__; facts/static/batch_source.py)"),
        ("source_def", "str", "static", "that source's function: its file's name, the first line of its definition "
                                        "(decorators included) and its name, as the profiler names its frames: "
                                        "train.py(36): random_training_set"),
        ("trains", "bool", "run/static", "its batches reach the training step (a run: moved to a device on at least "
                                         "half the watched steps); a static read: a loop over its batches takes a "
                                         "training step, False where none does while another loop of the file does, "
                                         "or all sit in an evaluation function (an evaluation loader)"),
        ("moved", "bool", "run", "the step moved its batches to a device (.to(device), .cuda(), any function or file; "
                                 "the move's line is a further location)"),
        ("pin_memory_on_cuda", "bool", "static",
         "pin_memory as it would be on a CUDA device: `use_cuda`, `torch.cuda.is_available()`, a kwargs dict "
         "filled on the accelerator path (absent where the source does not say)"),
        ("num_workers_on_cuda", "count", "static",
         "num_workers as it would be on a CUDA device: a literal, or a kwargs dict filled on the accelerator path "
         "(absent where the source does not say)"),
        ("multiprocess", "bool", "trace", "the trace shows a multi-process iterator"),
        ("sampler", "str", "run", "the sampler's class name (the batch sampler's where one was given)"),
        ("sharded", "bool", "run", "its sampler gives each rank its own shard (DistributedSampler, or one named so); absent for an IterableDataset"),
        # worker start-up per epoch (PD015)
        ("constructed", "count", "run", "times the DataLoader was built at this line"),
        ("epochs", "count", "run", "iterators started (epochs begun)"),
        ("batches_per_epoch", "count", "run", "len(loader)"),
        ("startup_ms", "ms", "run", "an epoch start's extra time over a steady step (workers started again, "
                                    "their first batch), median over the epochs after the first (ms per epoch)"),
        ("refill_ms", "ms", "run", "what a pass's first batch waits for with persistent workers too: one worker's "
                                   "time on a CPU for one batch, on the steady steps of the loader the steps draw "
                                   "from, x workers / CPUs where more workers than CPUs load at once"),
        ("startup_ms_per_step", "ms", "run", "startup_ms x the restarts (epochs after the first) / the training steps "
                                             "observed: the start-up's cost per training step, whichever loader"),
        ("steps_per_pass", "count", "run", "training steps per pass over this loader (steps observed / epochs begun): "
                                           "how often its workers start"),
    ]),
    "dataparallel": _declare("dataparallel", [
        ("constructed", "bool", "run", "the run saw nn.DataParallel constructed"),
        ("device_count", "count", "run/trace", "devices it spreads over"),
        ("callee", "str", "static", "the callee as written"),
        ("opt_in", "bool", "static", "built only in a branch a user's setting turns on (`if args.dp:`, a store_true flag): not the script's default"),
    ]),
    "empty_cache": _declare("empty_cache", [
        ("calls_per_step", "count", "run/trace", "torch.cuda.empty_cache() calls per step"),
        ("cost_share", "ratio", "trace", "its calls' part of empty_cache.cost_share (by calls per step)"),
        ("in_loop", "bool", "run/trace/static", "called on every training step (static: in the step loop, not behind a periodic guard)"),
        ("calls", "count", "run", "calls in the whole run"),
        ("free_calls_per_step", "count", "trace", "cudaFree/hipFree calls per step"),
    ]),
    "host_fill": _declare("host_fill", [
        ("frame", "str", "run", "a user function that wrote the host's values into a tensor of the step element by "
                                "element (a batch built by hand), as the profiler names its frame: its ops stay on "
                                "the host on a GPU too (facts/trace/target_gpu.py)"),
    ]),
    "cpu_to_device": _declare("cpu_to_device", [
        ("per_sample", "bool", "run", "a Dataset moves each sample at this line as it is read (inside the "
                                      "DataLoader's fetch): one copy per sample"),
        ("factory", "str", "run/trace/static", "the torch factory that builds the tensor on the CPU"),
        ("target", "str", "trace/static", "the device it is copied to, as written (a trace: cuda)"),
        ("in_loop", "bool", "run/trace/static", "made on every training step (a run: moved on at least half the "
                                                "watched steps; a static read: in the step loop's body, not once per "
                                                "epoch; in a forward or a function the step calls)"),
        ("moves_per_step", "count", "run", "its tensors moved to a device per watched step (the move's line is the "
                                           "second location)"),
        ("bytes_per_move", "bytes", "run", "bytes of the first tensor moved (what one copy carries to the device)"),
        ("ms", "ms", "trace", "its host-to-device copy time per step"),
        ("kept", "bool", "run", "the same host tensor, made before the steps (a schedule or a table kept in an "
                                "attribute), moved to the device again on every step"),
        ("host_data", "bool", "static", "the tensor copies host data (a batch drawn from a store kept in host "
                                        "memory: a replay buffer, a numpy rollout) inside the training step"),
        ("filled", "bool", "static", "the host data was written into the made tensor by index, row by row, "
                                     "from Python values (a label batch padded in a loop), not drawn from a store"),
    ]),
    "loss_holder": _declare("loss_holder", [
        ("kind", "str", "run/static", "list, running-sum or attribute"),
        ("holder", "str", "run/static", "the holder as written, e.g. history or meter.vals"),
        ("tensor_name", "str", "run/static", "the name of the tensor kept, e.g. loss"),
        ("numel", "count", "run", "elements of the tensor kept"),
        ("graphs_retained", "count", "run", "autograd graphs it kept alive"),
        ("graphs_per_step", "count", "run", "graphs kept per step"),
        ("growth_bytes_per_step", "bytes", "run", "the process's memory growth per step"),
    ]),
    "model": _declare("model", [
        ("autocast", "bool", "run", "autocast on at the top-level forward (the call site is the location)"),
        ("param_dtype", "str", "run", "the parameters' dtype"),
        ("device", "str", "run", "the parameters' device"),
        ("params", "count", "run", "parameters"),
        ("math_params", "count", "run", "parameters of the layers that multiply: all but those of embedding tables"),
    ]),
    "sync": _declare("sync", [
        ("count_per_step", "count", "trace", "syncs per step at this line (python stacks name it)"),
        ("ms", "ms", "trace", "time blocked in syncs at this line, per step"),
    ]),
    "host_read": _declare("host_read", [
        ("kind", "str", "run/static", "how the value is read to the host: item, cpu, numpy, tolist, float, int, print"),
        ("count_per_step", "count", "run", "reads at this line per training step"),
        ("step_share", "ratio", "run", "the share of the steady steps that read at this line at all"),
        ("in_loop", "bool", "static", "in the training loop (a loop that runs backward), not behind a periodic guard; "
                                      "False in a loop no training step runs (an evaluation loop)"),
    ]),
    "selection": _declare("selection", [
        ("ops", "str", "trace", "the ops at this line whose output size the device decides (a boolean-mask index's "
                                "aten::nonzero, masked_select, unique), in a CPU run of a CUDA-targeting script: a "
                                "host-device sync each on the GPU (facts/trace/mask_sync.py)"),
        ("count_per_step", "count", "trace", "such ops at this line per profiled step (mean)"),
        ("step_share", "ratio", "trace", "the share of the profiled steps that ran one at this line"),
    ]),
    "anomaly": _declare("anomaly", [
        ("enabled", "bool", "run", "set_detect_anomaly(True) / detect_anomaly() seen here"),
        ("stack_ms", "ms", "run", "anomaly mode's Python stack captures per step (torch.fx.traceback.format_stack "
                                  "for every autograd node of the forward)"),
    ]),
    "worker_hotspot": _declare("worker_hotspot", [
        ("function", "str", "run", "the hottest user function in the DataLoader workers (py-spy)"),
        ("ms_per_step", "ms", "run", "worker CPU time per step in it, summed over the workers"),
        ("share", "ratio", "run", "its share of the workers' sampled time"),
        ("workers", "count", "run", "DataLoader worker processes sampled"),
        ("busy", "ratio", "run", "sampled running time per worker over the window's wall time"),
    ]),
    "gc_collect": _declare("gc_collect", [
        ("calls_per_step", "count", "run", "gc.collect() calls at this line per steady step"),
        ("ms", "ms", "run", "time in those calls per steady step (mean)"),
        ("ms_per_call", "ms", "run", "median time of one call"),
    ]),
    "periodic_stall": _declare("periodic_stall", [
        ("rank", "count", "run", "the sampler's order of the pattern's candidate lines, the outermost first (the "
                                 "static read keeps the first that does not run on every step)"),
        ("period", "count", "run", "every how many steps a step is slower (outside data loading)"),
        ("stalls", "count", "run", "slow steps of the pattern among the steady steps"),
        ("extra_ms", "ms", "run", "mean extra time of such a step over the other steps' median (ms per stall)"),
        ("ms_per_step", "ms", "run", "the stalls' extra time spread over every steady step"),
        ("share", "ratio", "run", "share of the pattern's slow steps watched while they ran long that this line was seen running on"),
        ("rollout", "bool", "static", "the line steps an environment (a loop with a gym-style env.step, or a call "
                                      "of a function with one): reinforcement learning's rollout, the algorithm's work"),
        ("every_step", "bool", "static", "the line runs on every training step (in the step's loop, nothing that can "
                                         "pass it by): no work done every N steps"),
    ]),
}
# The GPU-side settings whose cost a CPU run cannot show (PD016, PD017, PD021-PD026, PD028): read from
# the source (static), and from a GPU trace where its kernels show them.
GLOBAL_FACTS.update(_declare(GLOBAL, [
    ("cudnn.benchmark", "bool", "run/static",
     "the files set torch.backends.cudnn.benchmark (True where any sets it True; absent where none sets it); "
     "a run: it was on when the run ended (set by the script or a library it ran)"),
    ("cudnn.deterministic", "bool", "run/static", "the files set torch.backends.cudnn.deterministic = True; a run: "
     "deterministic algorithms were on when it ended"),
    ("autocast.in_source", "bool", "static", "the files enter torch.autocast (or torch.cuda.amp.autocast)"),
    ("layout.channels_last", "bool", "run/static", "a run: the conv nets it called hold 2-D convolution weights or "
     "get inputs in torch.channels_last; the source: the files use torch.channels_last (or channels_last_3d)"),
    ("layout.transposes_per_step", "count", "trace", "NCHW<->NHWC layout transpose kernels per step"),
    ("layout.transpose_ms", "ms", "trace", "NCHW<->NHWC layout transpose kernel time per step"),
    ("data.custom_collate", "bool", "static",
     "a DataLoader is given a collate_fn (its batches may change shape from step to step)"),
    ("conv.shape_reuse", "ratio", "trace",
     "share of the profiled steps after the first whose convolutions got input shapes an earlier step gave them"),
]))
SUBJECT_FACTS.update({
    "conv_net": _declare("conv_net", [
        ("layer", "str", "run/static", "the first convolution layer: its class (a run) or as written (e.g. nn.Conv2d)"),
        ("dims", "count", "run/static", "its spatial dimensions: 1, 2 or 3 (the largest of the model's)"),
        ("convs", "count", "run/static", "convolution layers: in the module tree the run called, or constructed in the file"),
        ("spatial_convs", "count", "run/static", "of them, those with a kernel of more than one element over "
                                                 "overlapping windows: a 1x1 convolution or a patch embedding (kernel = "
                                                 "stride) is a matmul, with no algorithm for cuDNN's search to choose"),
        ("model", "str", "run", "the class of the top-level module holding them (e.g. ResNet)"),
        ("conv_params", "count", "run", "parameters of its convolutions"),
        ("min_in_channels", "count", "run", "the fewest input channels of its convolutions (3: an RGB stem)"),
    ]),
    "conv_bias": _declare("conv_bias", [
        ("layer", "str", "run/static", "the convolution class, as called (e.g. Conv2d)"),
        ("norm", "str", "run/static", "the BatchNorm that directly follows it (e.g. BatchNorm2d)"),
        ("pattern", "str", "run/static", "where they meet: run (the run saw the conv's output go into the norm), "
                                         "sequential (nn.Sequential) or forward (bn(conv(x)))"),
        ("count", "count", "run", "convolutions built at this line whose output the run saw go into the norm"),
    ]),
    "kept_alloc": _declare("kept_alloc", [
        ("bytes_per_step", "bytes", "trace", "bytes allocated at this line per recorded step and never freed by the trace's end"),
        ("count_per_step", "count", "trace", "such blocks per step"),
        ("block_bytes", "bytes", "trace", "the median block's size"),
        ("steps", "count", "trace", "recorded steps that left such a block (1: one step's tensor outlived the window)"),
        ("recorded_steps", "count", "trace", "the recorded steps judged: those whose allocations had a whole step "
                                             "to be freed in (all but the last)"),
    ]),
    "misaligned": _declare("misaligned", [
        ("layer", "str", "run", "the layer class (Linear, Conv2d...) built at this line"),
        ("dims", "str", "run", "its matmul dimensions that are not multiples of 8, e.g. 'out_features 50257'"),
        ("count", "count", "run", "such layers built at this line in the tree the run called"),
        ("direct", "bool", "run", "the line itself constructs the layer (not a library's model builder)"),
        ("flops_share", "ratio", "run", "their share of the step's FLOPs (FlopCounterMode on one step)"),
        ("weight_share", "ratio", "run", "Linear layers where no step was counted: their share of the model's parameters"),
        ("param_dtype", "str", "run", "the parameters' dtype of the model holding them"),
        ("autocast", "bool", "run", "autocast was on in at least half of that model's forward calls"),
    ]),
    "tf32": _declare("tf32", [
        ("setting", "str", "static", "the statement that turns TF32 off, as written"),
    ]),
    "optimizer": _declare("optimizer", [
        ("name", "str", "static", "the class called (torch.optim's, e.g. AdamW, or another: BertAdam)"),
        ("foreach", "bool", "static", "foreach as given (absent: torch's default)"),
        ("fused", "bool", "static", "fused as given (absent: torch's default)"),
        ("loop_saving_share", "ratio", "trace",
         "its class's optimizer_loop.saving_share, split over the optimizers of that class built per tensor"),
        ("custom", "bool", "static", "a class not of torch.optim (a hand-written optimizer) built with parameters"),
        ("through_variable", "bool", "static", "built through a variable holding the class (a factory picked it)"),
        ("loop_class", "str", "trace", "the hand-written class whose step the trace shows looping over its parameters"),
        ("loop_ops_per_step", "count", "trace", "that class's step's outermost aten ops per step"),
        ("loop_repeats_per_step", "count", "trace",
         "those less one per operator and optimizer step: what one foreach op per operator would not launch"),
        ("loop_tensors", "count", "trace", "the count most of its step's repeated operators share: about its tensors"),
    ]),
    "zero_grad": _declare("zero_grad", [
        ("set_to_none", "bool", "static", "set_to_none as given"),
        ("grads_read", "bool", "static", "the file reads a tensor's .grad (zeroed gradients may be relied on)"),
    ]),
    "batch_copy": _declare("batch_copy", [
        ("pinned", "bool", "run/static", "the DataLoader whose batch this line moves pins its memory"),
        ("non_blocking", "bool", "run/static", "the move passes non_blocking=True (a run: every move it saw)"),
    ]),
})
SUBJECT_FACTS["dataloader"].update(_declare("dataloader", [
    ("model_params", "count", "run",
     "parameters of the largest model the run saw, beside the loader that feeds it (batch size x model size)"),
]))
SUBJECT_FACTS["worker_hotspot"].update(_declare("worker_hotspot", [
    ("io_call", "str", "static", "the file open / read / decode call at the hot line, as written"),
]))
# The checklist rules measured on the steps: CPU contention from DataLoader workers (PD018),
# eval-mode forwards that record autograd (PD019), torch.compile's graph breaks (PD029).
SUBJECT_FACTS["dataloader"].update(_declare("dataloader", [
    ("workers_runnable", "count", "run",
     "its workers on a CPU or waiting for one at once, on average over the steady steps (schedstat)"),
    ("contention_ms", "ms", "run",
     "the training thread's CPU wait per step caused by more runnable workers than the CPUs beside it"),
]))
SUBJECT_FACTS.update({
    "eval_grad": _declare("eval_grad", [
        ("module", "str", "run", "the class of the module called in eval mode with grad mode on"),
        ("calls_per_step", "count", "run", "such calls at this line per steady step"),
        ("ms", "ms", "run", "time in those forwards per steady step (mean)"),
        ("saved_bytes", "bytes", "run", "tensors autograd saved for a backward per call (median; parameters not counted)"),
        ("measured", "count", "run", "calls whose saved tensors were counted"),
        ("backward_share", "ratio", "run", "share of the measured calls whose graph a backward then used"),
        ("step_share", "ratio", "run", "share of the steady steps that called this line: an evaluation runs at some "
         "steps, work on every training step is part of training"),
        ("trained", "bool", "run", "the module also ran training-mode forwards with grad on: the script trains it "
         "elsewhere, so its eval-mode forwards are an evaluation even where a backward runs through them"),
        ("batch", "count", "run", "the batch of the measured calls (their input's first dimension, median)"),
        ("default_batch", "count", "static", "the batch the script evaluates with unless the user changes it: the default "
         "batch (dataloader.default_batch_size) of the one evaluation loader whose batch in this run was eval_grad.batch"),
        ("in_source", "bool", "static",
         "the call runs a model in eval mode (the last .eval()/.train(False)/.train() of it before the call, in its function "
         "or at top level, or a caller's that passed it), with no no_grad/inference_mode around it or its function's calls, "
         "and no backward that can run through it (one in its loop, or after it), recurring beside the training (a loop around "
         "it or its function's call trains); "
         "or, without eval(), calls a trained model in an evaluation loop over a loader's batches, or in a loop of a function "
         "with no backward, outside the training step, that reads a forward's output out at once (`.cpu().data.numpy()`)"),
    ]),
    "graph_break": _declare("graph_break", [
        ("kind", "str", "run", "graph break (dynamo ended a graph at this line) or recompile (this compiled function)"),
        ("reason", "str", "run", "dynamo's reason: what broke the graph, or the guard that failed"),
        ("count", "count", "run", "steps whose compilations broke the graph at this line, or recompilations in the run"),
        ("steady", "count", "run", "recompilations on the steady steps"),
        ("ms", "ms", "run", "compile time on the steady steps spread over every steady step"),
    ]),
})
# A rank's own evidence for the straggler's cause beyond data, compute and host syncs
# (capture/probes/gc_time.py, cpu_wait.py and gpu_clock.py, read by facts/run/ modules of the same names; facts/ranks.py).
GLOBAL_FACTS.update(_declare(GLOBAL, [
    ("gc.ms", "ms", "run", "time per steady step in Python's garbage collections, automatic and explicit (mean)"),
    ("gc.compute_ms", "ms", "run", "the part of gc.ms inside forward, backward and the optimizer step (in their time)"),
    ("cpu.wait_ms", "ms", "run", "time per steady step the training thread was runnable but waited for a CPU (run queue), plus its CPU cgroup's throttled time where readable (mean)"),
    ("cpu.run_ms", "ms", "run", "time per steady step the training thread ran on a CPU (mean): how much of cpu.wait_ms its own work explains"),
    ("cpu.throttled_ms", "ms", "run", "of cpu.wait_ms, the time per steady step its CPU cgroup's quota held the process back (cpu.stat throttled time, mean; where readable)"),
    ("cpu.throttled_periods", "number", "run", "the CPU cgroup's quota periods per steady step in which it was throttled (cpu.stat nr_throttled, mean)"),
    ("cpu.wait_share", "ratio", "run", "the training thread's wait for a CPU over the steady steps' wall time (sum over sum): how far other processes inflated the step times"),
    ("cpu.contended", "bool", "run", "the training thread waited for a CPU for at least CONTENTION_SHARE of the steady steps (facts/run/cpu_wait.py): step times are inflated"),
    ("step.work_ms", "ms", "run", "median over the steady steps of the step's wall time less the training thread's wait for a CPU: the step as a host without other processes would time it (where the wait was measured)"),
    ("cpu.tree_ms", "ms", "run", "CPU time per steady step of the process tree: every thread of the training process but perfdoctor's own, plus the DataLoader workers (mean)"),
    ("host.cpu_pressure", "ratio", "run", "share of the steady steps' wall time in which some runnable task on the host waited for a CPU (/proc/pressure/cpu, where the kernel has it)"),
    ("host.others_cpus", "number", "run", "the CPUs the machine's other processes kept busy during the steady steps: all CPUs' time (/proc/stat) less this process tree's, over the steps' wall time (1.0: one CPU's worth)"),
    ("host.steal_ms", "ms", "run", "time per steady step a hypervisor gave this VM's CPUs to other guests, all CPUs (/proc/stat steal, mean)"),
    ("host.load_avg", "number", "run", "the host's 1-minute load average when the run started"),
    ("gpu.sm_clock_mhz", "number", "run", "the GPU's SM clock in MHz (NVML, read at step ends a few times a second; median over the steady steps)"),
    ("gpu.sm_clock_max_mhz", "number", "run", "the GPU's maximum SM clock in MHz (NVML)"),
    ("gpu.throttled_share", "ratio", "run", "share of the SM clock readings with a power or thermal clock throttle reason set (NVML)"),
    ("gpu.throttle_reasons", "str", "run", "the power and thermal clock throttle reasons set on those readings (power cap, thermal, ...)"),
]))
# DistributedDataParallel (PD031-PD033): how each DDP was built and what it did on the steps
# (capture/probes/ddp.py, facts/run/ddp.py).
SUBJECT_FACTS.update({
    "ddp": _declare("ddp", [
        ("module", "str", "run", "the wrapped module's class name"),
        ("built_by", "str", "run", "the package whose code built the DDP (lightning, accelerate); absent where the user's code did"),
        ("find_unused_parameters", "bool", "run", "find_unused_parameters as the DDP holds it"),
        ("gradient_as_bucket_view", "bool", "run", "gradient_as_bucket_view as the DDP holds it"),
        ("static_graph", "bool", "run", "static_graph as the DDP holds it"),
        ("params", "count", "run", "trainable parameters it synchronises"),
        ("grad_bytes", "bytes", "run", "their gradients' bytes: what DDP's buckets hold a second copy of without gradient_as_bucket_view"),
        ("synced_steps", "count", "run", "steady steps with a backward that all-reduced"),
        ("steps_checked", "count", "run", "steps on which the probe read DDP's used map (find_unused_parameters without static_graph)"),
        ("unused_steps", "count", "run", "of those, steps on which some parameter got no gradient on some rank"),
        ("traversal_ms", "ms", "run", "time per steady step in DDP's search for unused parameters (its walk of the autograd graph after forward), mean"),
    ]),
    "ddp_sync": _declare("ddp_sync", [
        ("syncs_per_step", "count", "run/trace", "backward passes that all-reduced per optimizer step (median over the steady steps)"),
        ("backwards_per_step", "count", "run/trace", "backward passes per optimizer step (median over the steady steps)"),
        ("comm_ms", "ms", "run/trace", "DDP's own mean time of one backward's all-reduces (ms per backward, its sampled iterations); a trace: the collectives that backward started, merged"),
        ("model", "str", "run/trace", "the DDP as named where it is built (the assignment's target), else model"),
        ("statement", "str", "run/trace", "the backward line as written (a trace: loss.backward(), its code is not in the trace)"),
    ]),
})
SUBJECT_KINDS = tuple(SUBJECT_FACTS)


# -- derived facts -------------------------------------------------------------------------------
# What several rules (and perfdoctor's own Python) would otherwise each spell out from the measured
# facts, said once: a derived fact is computed here from the global facts it names as inputs, where a
# rule reads it (`rules.engine.make_lookup`) or Python asks (`derive`). It is never stored: a finding's
# evidence is its inputs (`rules.catalog.Rule.reads`), so the sources behind a finding are the same as
# if the rule had spelt the expression out.


@dataclass(frozen=True)
class DerivedSpec:
    name: str
    unit: str  # one of UNITS
    inputs: tuple[str, ...]  # the global facts it is computed from
    doc: str  # one line
    compute: Callable[[Callable[[str], Any]], Any]  # value(name) -> the input's value or None; None: absent


def _cuda_on_cpu(value: Callable[[str], Any]) -> bool:
    return value("device.type") == "cpu" and value("script.targets_cuda") is True


def _gpu_target(value: Callable[[str], Any]) -> bool:
    return value("script.targets_cuda") is True or value("device.type") not in (None, "cpu")


def _cpu_workers(value: Callable[[str], Any]) -> int | None:
    cpus = value("cpu.count")
    return None if cpus is None else max(1, cpus)


def _conv_share(value: Callable[[str], Any]) -> float | None:
    convs, total = value("compute.conv_flops_per_step"), value("compute.flops_per_step")
    if convs is None or not total or value("compute.uncounted_convs_per_step"):
        return None  # convolutions went uncounted: their share is not known
    return convs / total


DERIVED_FACTS: dict[str, DerivedSpec] = {d.name: d for d in [
    DerivedSpec("run.cuda_on_cpu", "bool", ("device.type", "script.targets_cuda"),
                "a CPU run (or trace) of a script that targets CUDA: device.type is cpu and script.targets_cuda; what "
                "only a GPU shows is judged for the GPU the script targets, unmeasured (False where either is unknown)",
                _cuda_on_cpu),
    DerivedSpec("run.gpu_target", "bool", ("script.targets_cuda", "device.type"),
                "the script runs on a GPU or targets one: script.targets_cuda, or a device.type other than cpu "
                "(False where neither says so)", _gpu_target),
    DerivedSpec("compute.conv_share", "ratio",
                ("compute.conv_flops_per_step", "compute.flops_per_step", "compute.uncounted_convs_per_step"),
                "the convolutions' share of the step's counted FLOPs (forward and backward; absent where some "
                "convolutions went uncounted): the work PD016's and PD023's fixes affect, where the estimated GPU step's "
                "target_gpu.conv_share is not made", _conv_share),
    DerivedSpec("cpu.workers", "count", ("cpu.count",),
                "DataLoader workers this process can keep busy: its usable CPUs (cpu.count, a rank's share), at "
                "least 1; absent where the CPUs are not known (a trace)", _cpu_workers),
]}
for _d in DERIVED_FACTS.values():
    if _d.unit not in UNITS or _d.name in GLOBAL_FACTS or not all(i in GLOBAL_FACTS for i in _d.inputs):
        raise ValueError(f"bad derived fact {_d.name}: unit {_d.unit!r}, a measured fact's name, or an undeclared input")


def derive(name: str, value: Callable[[str], Any]) -> Any:
    """The derived fact `name` (DERIVED_FACTS) from `value(input)`, the inputs' values (None where absent);
    None where it is absent itself."""
    return DERIVED_FACTS[name].compute(value)


class UndeclaredFact(ValueError):
    """A producer added a fact (or a subject kind) this registry does not declare: a bug in perfdoctor."""


def spec(name: str, scope: str = GLOBAL) -> FactSpec | None:
    """The declaration of `name` in `scope` (GLOBAL or a subject kind), or None."""
    table = GLOBAL_FACTS if scope == GLOBAL else SUBJECT_FACTS.get(scope, {})
    return table.get(name)


def check_kind(kind: str) -> None:
    """Raise UndeclaredFact unless `kind` is a declared subject kind."""
    if kind not in SUBJECT_FACTS:
        raise UndeclaredFact(f"subject kind {kind!r} is not declared in perfdoctor/facts/registry.py "
                             f"(declared: {', '.join(SUBJECT_KINDS)})")


def check_declared(name: str, scope: str = GLOBAL) -> None:
    """Raise UndeclaredFact unless `name` is declared in `scope`."""
    if scope != GLOBAL:
        check_kind(scope)
    if spec(name, scope) is None:
        where = "global fact" if scope == GLOBAL else f"fact of {scope} subjects"
        raise UndeclaredFact(f"{name!r} is not a declared {where}: declare it in perfdoctor/facts/registry.py")


def readable(name: str, subject: str | None) -> bool:
    """Whether a rule judged on subjects of kind `subject` (None: on the global facts) may read the
    fact `name`: the global facts (measured and derived), and the facts of its own subject kind."""
    return name in GLOBAL_FACTS or name in DERIVED_FACTS or (
        subject is not None and name in SUBJECT_FACTS.get(subject, {}))


def all_specs() -> list[FactSpec]:
    """Every declaration, global facts first, then subject kinds in declaration order."""
    return [*GLOBAL_FACTS.values(), *(s for table in SUBJECT_FACTS.values() for s in table.values())]
