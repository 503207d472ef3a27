"""meta.json's env -> the machine: `cpu.*` (this rank's share of the CPUs in a job), `device.*`
(type, name, count, memory, capability), whether autocast has hardware to use (`device.amp_*`), and the
cuDNN flags the run ended with on (`cudnn.benchmark`, `cudnn.deterministic`)."""

from __future__ import annotations

import msgspec

from perfdoctor.facts.run.context import RunContext


def add(ctx: RunContext) -> None:
    facts, env, rank, m = ctx.facts, ctx.env, ctx.rank, "machine"
    if rank is not None and rank.cpu_share is not None and rank.cpu_share != env.cpu_count:
        local = rank.local_world_size
        facts.add("cpu.count", rank.cpu_share, "count", m,
                  f"this rank's share: {env.cpu_count} usable CPUs / {local} ranks on this node")
        facts.add("cpu.local_ranks", local, "count", m)
    else:
        facts.add("cpu.count", env.cpu_count, "count", m)
    facts.add("cpu.amx", env.cpu_amx, "", m, "amx_tile in /proc/cpuinfo flags")
    if env.cpu_matmul_flops is not msgspec.UNSET and env.cpu_matmul_flops:
        facts.add("compute.peak_flops", env.cpu_matmul_flops, "number", m,
                  "this CPU's fp32 matmul rate, measured at the end of the run (512 x 512 matrices for 0.2 s with "
                  "torch's threads as the script left them): a rate reached here, not a datasheet peak")
    backends = env.backends if env.backends is not msgspec.UNSET else {}
    # a flag the run saw on was set by the script or a library it ran; off is torch's default, which a
    # GPU path this CPU run did not take may still change (the source says where: facts/static)
    if backends.get("cudnn.benchmark"):
        facts.add("cudnn.benchmark", True, "", "run", "torch.backends.cudnn.benchmark was on when the run ended")
    if backends.get("cudnn.deterministic") or backends.get("deterministic_algorithms"):
        facts.add("cudnn.deterministic", True, "", "run",
                  "deterministic algorithms were on when the run ended (cudnn.deterministic or "
                  "torch.use_deterministic_algorithms)")
    dev = "rocm" if env.rocm and env.device == "cuda" else env.device
    facts.add("device.type", dev, "", m)
    facts.add("device.name", env.device_name, "", m)
    if env.device == "cuda":
        facts.add("device.count", env.device_count, "count", m)
        cap = env.device_capability
        facts.add("device.memory_bytes", env.device_memory_bytes, "bytes", m)
        if cap:
            c = f"{cap[0]}.{cap[1]}"
            facts.add("device.capability", float(c), "", m)
            ok = (cap[0], cap[1]) >= (7, 0) or dev == "rocm"
            basis = ("ROCm device (matrix cores)" if dev == "rocm" else
                     f"CUDA capability {c} >= 7.0: tensor cores" if ok else
                     f"CUDA capability {c} < 7.0: no tensor cores, autocast brings little")
            facts.add("device.amp_available", ok, "", m, basis)
            facts.add("device.amp_basis", basis, "", m)
    elif env.device == "cpu" and env.cpu_amx is not None:
        amx = bool(env.cpu_amx)
        basis = "CPU with AMX (bf16 autocast)" if amx else "CPU without AMX: autocast brings little"
        facts.add("device.amp_available", amx, "", m, basis)
        facts.add("device.amp_basis", basis, "", m)
