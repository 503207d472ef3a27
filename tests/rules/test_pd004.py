"""PD004 (rules/PD004-cpu-tensor-to-device.toml), judged on hand-built facts: only for a CUDA-targeting script and tensors made every step.

Its sample: sample_scripts/pd004_cpu_tensor_to_device.py (end to end: tests/analysis/test_e2e_samples.py; the fixed twin: tests/rules/test_fixes_applied.py);
its goldens: tests/golden/expected/pd004_cpu_tensor_to_device.* (tests/report/test_golden.py);
the run's host-tensor probe: tests/capture/test_host_tensors.py."""

from __future__ import annotations

from perfdoctor.model import Location
from perfdoctor.rules.engine import judge
from tests.rules.builders import RULES, cpu_run


def test_pd004_silent_when_script_never_targets_cuda():
    f = cpu_run()
    f.add("script.targets_cuda", False, "", "static")
    f.subject("cpu_to_device", "t.py:3").add("factory", "zeros", "", "static")
    assert judge(f, RULES) == []


def _judged(at: Location, source: str, **facts):
    """PD004 on a CPU run of a CUDA-targeting script with one `cpu_to_device` subject at `at`."""
    f = cpu_run()
    f.add("script.targets_cuda", True, "", "static")
    s = f.subject("cpu_to_device", f"{at.file}:{at.line}")
    for name, value in facts.items():
        s.add(name, value, "", source)
    s.locations.append(at)
    return judge(f, RULES)


def test_pd004_only_for_tensors_made_every_step():
    def run(in_loop, factory="zeros"):
        return _judged(Location("t.py", 3, "h0 = torch.zeros(2, 16, 8).to(device)"), "static",
                       factory=factory, in_loop=in_loop)
    assert run(in_loop=False) == []  # once per epoch or per run: nothing per step
    (finding,) = run(in_loop=True)
    assert "on every step" in finding.message and "Pass device=" in finding.message
    (finding,) = run(in_loop=True, factory="cuda.FloatTensor")
    assert finding.title.startswith("torch.cuda.FloatTensor(...)") and "torch.randn(..., device=" in finding.message


def test_pd004_host_batch_says_where_the_store_should_live():
    (finding,) = _judged(Location("buffers.py", 30, "obs1=torch.Tensor(self.obs1_buf[idxs]).to(self.device),"),
                         "static", factory="Tensor", in_loop=True, host_data=True)
    assert finding.title.startswith("A batch drawn from a store in host memory") and "torch.Tensor(...)" in finding.title
    assert "Keep the store on the device" in finding.message and "Pass device=" not in finding.message


def test_pd004_a_tensor_filled_from_python_values_is_not_called_a_store():
    (finding,) = _judged(Location("utils.py", 5, "batch_text = torch.LongTensor(len(text), n).fill_(0)"), "static",
                         factory="LongTensor", in_loop=True, host_data=True, filled=True)
    assert finding.title.startswith("A tensor filled on the host from Python values") and "store" not in finding.title
    assert "collate_fn" in finding.message and "Keep the store" not in finding.message


def test_pd004_a_kept_host_tensor_moved_every_step():
    (finding,) = _judged(Location("sched.py", 30, "a = self.alphas.to(x.device)[t]"), "run", kept=True, in_loop=True)
    assert finding.title == "The same host tensor is copied to the device on every step"
    assert "Move it to the device once" in finding.message and "Pass device=" not in finding.message


def test_pd004_numpy_index_arrays_into_the_models_computation():
    (finding,) = _judged(Location("main.py", 110, "loss = bce(pos_logits[indices], pos_labels[indices])"), "run",
                         factory="numpy", in_loop=True)
    assert finding.title.startswith("Numpy arrays index a tensor on the device")
    assert "Build the index on the device" in finding.message and "Pass device=" not in finding.message


def test_pd004_python_list_indices_into_the_models_computation():
    (finding,) = _judged(Location("models/base_models.py", 75, "return F.log_softmax(output[idx], dim=1)"), "run",
                         factory="list", in_loop=True)
    assert finding.title.startswith("Python lists of indices index a tensor on the device")
    assert "Make the index a tensor once" in finding.message and "Pass device=" not in finding.message


def test_pd004_a_dataset_that_moves_each_sample_to_the_device():
    """UrbanSound's `signal = signal.to(self.device)` in `__getitem__`: a copy per sample inside the
    DataLoader's fetch; the advice moves the batch once in the step (no factory to give device=)."""
    (finding,) = _judged(Location("urbansounddataset.py", 32, "signal = signal.to(self.device)"), "run",
                         per_sample=True, in_loop=True, moves_per_step=128)
    assert finding.title.startswith("The Dataset copies each sample to the device")
    assert "128 samples a step" in finding.message and "move the whole batch once" in finding.message
    assert finding.fix is None or "device=" not in (finding.fix.after or "")


def test_pd003_stands_down_where_the_batches_are_on_the_device_already():
    """A CUDA batch cannot be pinned: PD003's advice would fail where the Dataset moves its samples."""
    from tests.rules.builders import cpu_run as run

    def judged(on_device):
        f = run()
        f.add("script.targets_cuda", True, "", "static")
        s = f.subject("dataloader", "train.py:21")
        s.add("pin_memory", False, "", "run")
        s.add("pin_memory_on_cuda", False, "", "static")
        s.add("moved", True, "", "run")
        s.add("trains", True, "", "run")
        if on_device:
            s.add("samples_on_device", True, "", "run")
        s.locations.append(Location("train.py", 21, "train_dataloader = DataLoader(train_data, batch_size=batch_size)"))
        return [x.rule for x in judge(f, RULES)]
    assert "PD003" in judged(False)
    assert "PD003" not in judged(True)


def test_pd002_says_to_move_the_datasets_copies_out_before_adding_workers():
    """Workers cannot use CUDA: adding them to a loader whose Dataset moves samples to the GPU would fail."""
    from tests.rules.builders import cpu_run as run

    def message(on_device):
        f = run()
        f.add("step.time_ms", 100.0, "ms", "run")
        s = f.subject("dataloader", "train.py:21")
        for name, value in (("num_workers", 0), ("wait_ms", 50.0), ("wait_fraction", 0.5), ("trains", True)):
            s.add(name, value, "", "run")
        if on_device:
            s.add("samples_on_device", True, "", "run")
        s.locations.append(Location("train.py", 21, "train_dataloader = DataLoader(train_data, batch_size=batch_size)"))
        (finding,) = [x for x in judge(f, RULES) if x.rule == "PD002"]
        return finding.message
    assert "move the .to(device) out of the Dataset first" in message(True)
    assert "out of the Dataset" not in message(False)
