"""torch_npu.contrib.transfer_to_npu: a script written for CUDA runs on the npu
unchanged and computes what the cpu computes."""


CUDA_STYLE_SCRIPT = """
import torch
import torch_npu.contrib.transfer_to_npu
from torch.profiler import ProfilerActivity, profile

assert torch.cuda.is_available() and torch.cuda.device_count() >= 1
torch.manual_seed(0)
reference = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
model.load_state_dict(reference.state_dict())
model = model.cuda()
device = torch.device("cuda:0")
data = torch.randn(4, 8)
x = data.cuda()
y = torch.ones(4, 8, device="cuda") + torch.zeros(4, 8).to(device) + x.new_zeros(4, 8)
out = model(x + y)
out.sum().backward()
torch.cuda.synchronize()
assert out.device.type == "npu" and model[0].weight.grad.device.type == "npu", out.device
expected = reference(data + 1)
expected.sum().backward()
torch.testing.assert_close(out.cpu(), expected)
torch.testing.assert_close(model[0].weight.grad.cpu(), reference[0].weight.grad)
assert torch.cuda.memory_allocated() > 0 and torch.cuda.current_device() == 0
torch.cuda.manual_seed(1)
stream = torch.cuda.Stream()
with torch.cuda.stream(stream):
    z = x * 2
torch.cuda.current_stream().wait_stream(stream)
torch.testing.assert_close(z.cpu(), data * 2)
gen = torch.Generator(device="cuda").manual_seed(3)
assert gen.device.type == "npu" and isinstance(gen, torch.Generator) and isinstance(torch.default_generator, torch.Generator)
picks = torch.randint(0, 100, (5,), device="cuda", generator=gen)
assert torch.equal(picks, torch.randint(0, 100, (5,), device="npu", generator=torch.Generator("npu").manual_seed(3)))

@torch.jit.script
def scripted(t: torch.Tensor) -> torch.Tensor:
    return t + torch.ones(t.shape, device=t.device)
torch.testing.assert_close(scripted(x).cpu(), data + 1)

with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    model(x)
    torch.cuda.synchronize()
addmm = [e for e in prof.key_averages() if e.key == "aten::addmm"][0]
assert addmm.device_time_total > 0

scaler = torch.cuda.amp.GradScaler()
with torch.autocast("cuda", dtype=torch.float16):
    half = model(x)
with torch.cuda.amp.autocast():
    assert model(x).dtype == torch.float16
assert half.dtype == torch.float16 and torch.is_autocast_enabled("npu") is False
scaler.scale(half.float().sum()).backward()
assert torch.amp.GradScaler("cuda").get_scale() == 65536.0 and scaler.get_scale() == 65536.0
assert torch.amp.GradScaler()._device == "npu"      # its default device, "cuda", means the npu
print("CUDA script OK")
"""


def test_a_cuda_style_script_runs_unchanged_on_the_npu(run_python, tmp_path):
    script = tmp_path / "cuda_script.py"  # a file: torch.jit.script reads its source
    script.write_text(CUDA_STYLE_SCRIPT)
    proc = run_python(f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')")
    assert "CUDA script OK" in proc.stdout


def test_save_on_cuda_load_with_map_location_cuda(run_python, tmp_path):
    proc = run_python(f"""
        import torch
        import torch_npu.contrib.transfer_to_npu
        path = {str(tmp_path / "t.pt")!r}
        torch.save(torch.arange(6.0).cuda(), path)
        loaded = torch.load(path, map_location="cuda")
        assert loaded.device.type == "npu"
        torch.testing.assert_close(loaded.cpu(), torch.arange(6.0))
        print("OK")
    """)
    assert "OK" in proc.stdout


def test_device_contexts_make_their_device_and_cuda_means_the_npu(run_python):
    # torch.utils._device recognises factories by their function objects: the
    # originals and transfer_to_npu's wrappers must both count.
    proc = run_python("""
        import torch
        import torch_npu.contrib.transfer_to_npu
        with torch.device("meta"):   # transformers' / accelerate's init_empty_weights
            linear = torch.nn.Linear(1024, 1024)
            made = [torch.zeros(2), torch.ones(2), torch.empty(2), torch.randn(2), torch.arange(3),
                    torch.full((2,), 1.0), torch.tensor([1.0])]
        assert linear.weight.device.type == "meta" and linear.bias.device.type == "meta"
        assert {t.device.type for t in made} == {"meta"}, [t.device for t in made]
        for device in ("npu", "cuda", "cuda:0", torch.device("cuda")):
            with torch.device(device):
                made = [torch.zeros(2), torch.ones(2), torch.randn(2), torch.arange(3),
                        torch.nn.Linear(2, 2).weight, torch.zeros(2, device="cpu")]
            assert [t.device.type for t in made] == ["npu"] * 5 + ["cpu"], (device, [t.device for t in made])
        torch.set_default_device("cuda")
        try:
            assert torch.zeros(2).device.type == "npu" and torch.nn.Linear(2, 2).weight.device.type == "npu"
            assert torch.get_default_device() == torch.device("npu:0")
        finally:
            torch.set_default_device(None)
        assert torch.zeros(2).device.type == "cpu"
        print("OK")
    """)
    assert "OK" in proc.stdout


def test_cuda_devices_mean_the_npu_beyond_factories(run_python):
    proc = run_python("""
        import datetime
        import torch, torch.distributed as dist
        import torch_npu.contrib.transfer_to_npu
        cuda0, cuda = torch.device("cuda:0"), torch.device("cuda")
        # torch.cuda (= torch.npu) functions and classes that take a device
        torch.cuda.set_device(cuda0)
        torch.npu.set_device("cuda:0")
        assert torch.cuda.current_stream(cuda).device == torch.device("npu:0")
        assert torch.npu.default_stream("cuda:0").device == torch.device("npu:0")
        torch.cuda.synchronize(cuda0)
        assert torch.cuda.get_device_properties(cuda0).total_memory > 0
        assert torch.cuda.memory_allocated(cuda) >= 0 and torch.cuda.get_rng_state(cuda).numel() > 0
        assert torch.cuda.Stream(device=cuda0).device == torch.device("npu:0")
        with torch.cuda.device(cuda0):
            assert torch.cuda.current_device() == 0
        torch.accelerator.synchronize(cuda0)
        assert torch.accelerator.current_stream("cuda").device == torch.device("npu:0")
        # device-generic classes and lookups
        event, stream = torch.Event("cuda"), torch.Stream(torch.device("cuda"))
        assert event.device.type == "npu" and stream.device.type == "npu"
        assert isinstance(stream, torch.Stream) and isinstance(torch.npu.Stream(), torch.Stream)
        assert isinstance(event, torch.Event) and isinstance(torch.npu.Event(), torch.Event)
        assert torch.get_device_module("cuda") is torch.npu and torch.get_device_module(cuda0) is torch.npu
        # factories outside the list the tensor constructors had
        assert torch.fft.fftfreq(8, device="cuda").device.type == "npu"
        assert torch.fft.rfftfreq(8, device=cuda).device.type == "npu"
        coo = torch.sparse_coo_tensor([[0, 1]], [1.0, 2.0], (3,), device="cuda")
        csr = torch.sparse_csr_tensor([0, 1, 2], [0, 1], [1.0, 2.0], (2, 2), device="cuda")
        csc = torch.sparse_csc_tensor([0, 1, 2], [0, 1], [1.0, 2.0], (2, 2), device=cuda0)
        assert [t.device.type for t in (coo, csr, csc)] == ["npu"] * 3
        assert torch.hann_window(4, device="cuda").device.type == "npu"
        # a process group bound to a cuda device
        dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1, device_id=cuda0)
        try:
            assert dist.group.WORLD.bound_device_id == torch.device("npu:0")
            t = torch.ones(2, device="cuda")
            dist.all_reduce(t)
            assert t.device.type == "npu" and t.sum().item() == 2
        finally:
            dist.destroy_process_group()
        print("OK")
    """)
    assert "OK" in proc.stdout


def test_process_group_nccl_stands_for_the_npu_backend(run_python):
    proc = run_python("""
        import torch, torch.distributed as dist
        import torch_npu.contrib.transfer_to_npu
        from torch.distributed import ProcessGroupNCCL
        dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
        try:
            backend = dist.group.WORLD._get_backend(torch.device("cuda"))
            assert isinstance(backend, ProcessGroupNCCL), type(backend)
            options = ProcessGroupNCCL.Options()
            options.is_high_priority_stream = True
            group = dist.new_group([0], backend="nccl", pg_options=options)
            assert isinstance(group._get_backend(torch.device("cuda:0")), ProcessGroupNCCL)
            t = torch.ones(3, device="cuda")
            dist.all_reduce(t, group=group)
            assert t.tolist() == [1.0, 1.0, 1.0]
            made = ProcessGroupNCCL(dist.HashStore(), 0, 1, ProcessGroupNCCL.Options())
            assert isinstance(made, ProcessGroupNCCL) and made.size() == 1
            assert not isinstance(dist.ProcessGroupGloo(dist.HashStore(), 0, 1), ProcessGroupNCCL)
        finally:
            dist.destroy_process_group()
        print("OK")
    """)
    assert "OK" in proc.stdout


UNCHANGED_CUDA_SCRIPT = """
import torch
x = torch.ones(2, 3, device="cuda")
assert x.device.type == "npu", x.device
assert torch.cuda.is_available() and torch.cuda.device_count() >= 1
model = torch.nn.Linear(3, 1).cuda()
out = model(x)
torch.cuda.synchronize()
assert out.device.type == "npu" and torch.cuda.memory_allocated() > 0
print("OK", torch.cuda.get_device_name())
"""


def test_torch_transfer_to_npu_variable_runs_a_cuda_script_that_imports_only_torch(run_python):
    proc = run_python(UNCHANGED_CUDA_SCRIPT, env={"TORCH_TRANSFER_TO_NPU": "1"})
    assert "OK Emulated NPU" in proc.stdout
    # without it, "cuda" is CUDA (which this torch lacks)
    proc = run_python(UNCHANGED_CUDA_SCRIPT, env={"TORCH_TRANSFER_TO_NPU": None}, check=False)
    assert proc.returncode != 0 and "OK" not in proc.stdout


def test_compiled_model_in_a_cuda_script(run_python):
    # torch.cuda.* are the npu's for the script, CUDA's for inductor: its cache key
    # takes CUDA's device properties only when CUDA is there.
    proc = run_python("""
        import torch
        import torch_npu.contrib.transfer_to_npu
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)).cuda()
        x = torch.randn(4, 8, device="cuda")
        compiled = torch.compile(model)
        out = compiled(x)
        assert out.device.type == "npu"
        torch.testing.assert_close(out, model(x))

        @torch.compile
        def scaled(t):
            return t * torch.cuda.device_count() + torch.ones(t.shape, device="cuda")
        torch.testing.assert_close(scaled(x).cpu(), x.cpu() * torch.npu.device_count() + 1)
        # the script still sees the npu through torch.cuda
        assert torch.cuda.is_available() and torch.cuda.get_device_properties().name == "Emulated NPU"
        print("OK")
    """, timeout=300)
    assert "OK" in proc.stdout


def test_undo_gives_pytorch_back_its_own_objects(run_python):
    proc = run_python("""
        import torch, torch.distributed as dist, torch.profiler, torch.utils._device
        import torch_npu
        from torch_npu import _patches
        import torch.accelerator._utils
        from torch_npu.npu import _device, streams

        owners = [torch, torch.Tensor, torch.nn.Module, torch.cuda, torch.cuda.amp, torch.fft, torch.nested,
                  torch.sparse, torch.utils._device, torch.utils._device.DeviceContext, torch.profiler.profile,
                  torch.amp.autocast_mode.autocast, torch.amp.GradScaler, dist, dist.distributed_c10d,
                  dist.ProcessGroup, torch.npu, _device, streams, torch.accelerator, torch.accelerator._utils]
        before = [dict(vars(owner)) for owner in owners]
        builtins_before = dict(torch.jit._builtins._get_builtin_table())
        own = {"zeros": torch.zeros, "to": torch.Tensor.to, "Generator": torch.Generator,
               "synchronize": torch.cuda.synchronize, "device_constructors": torch.utils._device._device_constructors}

        import torch_npu.contrib.transfer_to_npu
        assert torch.zeros is not own["zeros"] and torch.cuda.synchronize is not own["synchronize"]
        assert len(_patches.applied("transfer_to_npu")) > 50
        assert _patches.undo("transfer_to_npu") > 50 and _patches.applied("transfer_to_npu") == []

        assert torch.zeros is own["zeros"] and torch.Tensor.to is own["to"] and torch.Generator is own["Generator"]
        assert torch.cuda.synchronize is own["synchronize"]
        assert torch.utils._device._device_constructors is own["device_constructors"]
        assert not hasattr(dist, "ProcessGroupNCCL")
        for owner, was in zip(owners, before):
            now = dict(vars(owner))
            changed = sorted(k for k in set(was) | set(now) if was.get(k, None) is not now.get(k, None))
            assert not changed, (owner, changed)
        assert torch.jit._builtins._get_builtin_table() == builtins_before
        # and PyTorch behaves as its own again
        with torch.device("meta"):
            assert torch.nn.Linear(2, 2).weight.device.type == "meta"
        try:
            torch.zeros(1, device="cuda")
        except (RuntimeError, AssertionError):
            pass
        else:
            raise AssertionError("'cuda' still means the npu")
        print("OK")
    """)
    assert "OK" in proc.stdout


def test_the_lists_of_changed_names_exist_in_torch_and_torch_npu(run_python):
    # transfer_to_npu changes the names it lists, and only those: each must exist in the
    # pinned torch (and torch.npu), once; what PyTorch adds later shows up here too.
    proc = run_python("""
        import sys
        import torch, torch.utils._device
        import torch_npu
        import torch_npu.contrib.transfer_to_npu as t
        from torch_npu import _patches

        def original(owner, name):
            value = _patches.original(owner, name)
            assert value is not None, f"{getattr(owner, '__name__', owner)}.{name} does not exist"
            return value

        # Device-taking functions and methods: each exists, and each is listed once per owner.
        for table in (t.DEVICE_CONSTRUCTORS, t.MORE_DEVICE_FUNCTIONS):
            for module, names in table.items():
                for name in names:
                    original(sys.modules[module], name)
        for module in set(t.DEVICE_CONSTRUCTORS) & set(t.MORE_DEVICE_FUNCTIONS):
            assert not set(t.DEVICE_CONSTRUCTORS[module]) & set(t.MORE_DEVICE_FUNCTIONS[module]), module
        for table in (t.DEVICE_METHODS, t.CUDA_METHODS):
            for owner, names in table.items():
                for name in names:
                    original(t._owner(owner), name)
        assert not set(t.DEVICE_METHODS["Tensor"]) & set(t.CUDA_METHODS["Tensor"])
        for name in t.DEVICE_CLASSES:
            original(torch, name)
        # The device constructors are exactly PyTorch's (what `with torch.device(...)` applies to).
        listed = {original(sys.modules[module], name)
                  for module, names in t.DEVICE_CONSTRUCTORS.items() for name in names}
        assert listed == set(t._pytorch_device_constructors()), set(t._pytorch_device_constructors()) ^ listed

        # torch.cuda's names: each in torch.cuda and torch.npu, once; and every torch.npu name that
        # torch.cuda has is listed (amp's are CUDA_AMP_NAMES).
        cuda_names = [name for names in t.CUDA_NAMES.values() for name in names]
        assert len(cuda_names) == len(set(cuda_names)), cuda_names
        for name in cuda_names:
            original(torch.cuda, name)
            assert hasattr(torch.npu, t.NPU_NAMES.get(name, name)), name
        shared = {n for n in torch.npu.__all__ if hasattr(torch.cuda, n) or _patches.original(torch.cuda, n)}
        shared |= {cuda for cuda, npu in t.NPU_NAMES.items() if npu in torch.npu.__all__}
        assert shared - {"amp"} == set(cuda_names), shared - {"amp"} ^ set(cuda_names)
        for name in t.CUDA_AMP_NAMES:
            original(torch.cuda.amp, name)
            assert hasattr(torch.npu.amp, name), name

        # The device-index helpers: each listed module imported the helper, and no other does.
        for (home, name, _), users in t.DEVICE_INDEX_HELPERS.items():
            helper = _patches.original(sys.modules[home], name)
            assert helper is not None and len(users) == len(set(users)), (home, users)
            for user in users:
                assert _patches.original(sys.modules[user], name) is helper, user
            package = home.split(".")[0] + "." + ("npu" if home.startswith("torch_npu") else "accelerator")
            holders = {m.__name__ for key, m in list(sys.modules.items())
                       if (key + ".").startswith(package + ".") and vars(m).get(name) is not None
                       and _patches.original(m, name) is helper}
            assert holders == set(users), (holders, users)

        # Each name is changed once: the ledger has one entry per (owner, name).
        targets = [(id(e.owner), e.attr) for e in _patches.ledger("transfer_to_npu")]
        assert len(targets) == len(set(targets))
        print("OK")
    """)
    assert "OK" in proc.stdout
