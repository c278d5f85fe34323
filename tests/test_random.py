"""Random numbers on the npu: seeding, generators, distributions."""
import pytest
import torch

from conftest import requires_two_devices

N = 100_000


def draw_randn(n=1000, **kwargs):
    return torch.randn(n, device="npu", **kwargs).cpu()


# ---- reproducibility -------------------------------------------------------------

def test_manual_seed_makes_randn_and_rand_reproducible():
    torch.manual_seed(1234)
    a = torch.randn(1000, device="npu").cpu()
    b = torch.rand(7, 9, device="npu").cpu()
    torch.manual_seed(1234)
    a2 = torch.randn(1000, device="npu").cpu()
    b2 = torch.rand(7, 9, device="npu").cpu()
    assert torch.equal(a, a2)
    assert torch.equal(b, b2)


def test_consecutive_draws_differ():
    torch.manual_seed(0)
    a = draw_randn()
    b = draw_randn()
    assert not torch.equal(a, b)


def test_different_seeds_differ():
    torch.manual_seed(1)
    a = draw_randn()
    torch.manual_seed(2)
    b = draw_randn()
    assert not torch.equal(a, b)
    assert (a != b).float().mean() > 0.99


def test_npu_manual_seed():
    torch.npu.manual_seed(42)
    a = draw_randn()
    torch.npu.manual_seed(42)
    b = draw_randn()
    assert torch.equal(a, b)
    assert torch.npu.initial_seed() == 42


def test_manual_seed_does_not_depend_on_cpu_draws():
    torch.manual_seed(5)
    a = draw_randn()
    torch.manual_seed(5)
    torch.randn(100)  # cpu generator only
    b = draw_randn()
    assert torch.equal(a, b)


@requires_two_devices
def test_manual_seed_seeds_every_device():
    torch.manual_seed(9)
    a0 = torch.randn(500, device="npu:0").cpu()
    a1 = torch.randn(500, device="npu:1").cpu()
    torch.manual_seed(9)
    b1 = torch.randn(500, device="npu:1").cpu()
    b0 = torch.randn(500, device="npu:0").cpu()
    assert torch.equal(a0, b0) and torch.equal(a1, b1)
    torch.npu.manual_seed_all(11)
    c1 = torch.randn(500, device="npu:1").cpu()
    torch.npu.manual_seed_all(11)
    assert torch.equal(torch.randn(500, device="npu:1").cpu(), c1)


def test_rng_state_round_trip():
    torch.manual_seed(3)
    state = torch.npu.get_rng_state()
    assert state.dtype == torch.uint8 and state.device.type == "cpu"
    a = draw_randn()
    torch.npu.set_rng_state(state)
    b = draw_randn()
    assert torch.equal(a, b)
    states = torch.npu.get_rng_state_all()
    assert len(states) == torch.npu.device_count()
    c = draw_randn()
    torch.npu.set_rng_state_all(states)
    assert torch.equal(draw_randn(), c)


def test_fork_rng_restores_npu_state():
    torch.manual_seed(8)
    with torch.random.fork_rng(devices=[0], device_type="npu"):
        inside = draw_randn()
    outside = draw_randn()
    assert torch.equal(inside, outside)


# ---- explicit generators ---------------------------------------------------------

def test_generator_on_npu_is_reproducible():
    g = torch.Generator(device="npu")
    assert g.device.type == "npu"
    g.manual_seed(77)
    a = torch.empty(1000, device="npu").normal_(generator=g).cpu()
    g.manual_seed(77)
    b = torch.empty(1000, device="npu").normal_(generator=g).cpu()
    assert torch.equal(a, b)
    assert g.initial_seed() == 77


def test_generator_is_independent_of_the_default_one():
    g = torch.Generator(device="npu").manual_seed(5)
    torch.manual_seed(5)
    ref = torch.empty(100, device="npu").normal_(generator=g).cpu()
    g.manual_seed(5)
    torch.randn(1000, device="npu")  # advances the default generator only
    again = torch.empty(100, device="npu").normal_(generator=g).cpu()
    assert torch.equal(ref, again)


def test_generator_state_round_trip():
    g = torch.Generator(device="npu").manual_seed(123)
    torch.empty(10, device="npu").normal_(generator=g)  # move away from the seed's start
    state = g.get_state()
    a = torch.empty(500, device="npu").normal_(generator=g).cpu()
    b = torch.empty(500, device="npu").normal_(generator=g).cpu()
    assert not torch.equal(a, b)
    g.set_state(state)
    a2 = torch.empty(500, device="npu").normal_(generator=g).cpu()
    assert torch.equal(a, a2)
    clone = torch.Generator(device="npu")
    clone.set_state(g.get_state())
    assert torch.equal(torch.empty(50, device="npu").normal_(generator=g).cpu(),
                       torch.empty(50, device="npu").normal_(generator=clone).cpu())


def test_factories_with_generator():
    g = torch.Generator(device="npu").manual_seed(2)
    a = torch.randn(100, device="npu", generator=g).cpu()
    r = torch.rand(100, device="npu", generator=g).cpu()
    g.manual_seed(2)
    assert torch.equal(torch.randn(100, device="npu", generator=g).cpu(), a)
    assert torch.equal(torch.rand(100, device="npu", generator=g).cpu(), r)


def test_cpu_generator_rejected_for_npu_tensor():
    g = torch.Generator().manual_seed(0)
    with pytest.raises(RuntimeError):
        torch.empty(10, device="npu").normal_(generator=g)


def test_seeded_draws_on_side_stream_match_default_stream():
    torch.manual_seed(21)
    a = draw_randn()
    s = torch.npu.Stream()
    torch.manual_seed(21)
    with torch.npu.stream(s):
        b = torch.randn(1000, device="npu")
    s.synchronize()
    assert torch.equal(a, b.cpu())


# ---- distributions ------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_randn_moments(dtype):
    torch.manual_seed(0)
    x = torch.randn(N, device="npu", dtype=dtype).cpu().double()
    assert abs(x.mean().item()) < 0.02  # standard error 0.003
    assert abs(x.std().item() - 1.0) < 0.02
    assert x.abs().max().item() < 6.5


def test_normal_mean_and_std():
    torch.manual_seed(0)
    x = torch.empty(N, device="npu").normal_(mean=3.0, std=0.5).cpu().double()
    assert abs(x.mean().item() - 3.0) < 0.01
    assert abs(x.std().item() - 0.5) < 0.01


def test_rand_in_unit_interval():
    torch.manual_seed(0)
    x = torch.rand(N, device="npu").cpu()
    assert x.min().item() >= 0.0 and x.max().item() < 1.0
    assert abs(x.double().mean().item() - 0.5) < 0.01


def test_uniform_in_range():
    torch.manual_seed(0)
    x = torch.empty(N, device="npu").uniform_(-2.0, 3.0).cpu()
    assert x.min().item() >= -2.0 and x.max().item() < 3.0
    assert x.min().item() < -1.99 and x.max().item() > 2.99  # fills the range
    assert abs(x.double().mean().item() - 0.5) < 0.03
    counts = torch.histc(x, bins=5, min=-2.0, max=3.0)
    assert ((counts - N / 5).abs() < 0.05 * N / 5).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.int32, torch.uint8], ids=str)
def test_random_from_to(dtype):
    torch.manual_seed(0)
    x = torch.empty(10_000, device="npu", dtype=dtype).random_(0, 10).cpu()
    assert x.dtype == dtype
    assert x.min().item() >= 0 and x.max().item() <= 9
    assert torch.equal(x, x.to(torch.int64).to(dtype))  # integral values
    values = torch.bincount(x.to(torch.int64), minlength=10)
    assert (values > 800).all()  # every value appears (1000 expected each)


def test_random_to_and_randint():
    torch.manual_seed(0)
    x = torch.empty(5000, device="npu", dtype=torch.int64).random_(7).cpu()
    assert x.min().item() == 0 and x.max().item() == 6
    r = torch.randint(-3, 3, (5000,), device="npu").cpu()
    assert r.dtype == torch.int64 and r.min().item() == -3 and r.max().item() == 2


def test_bernoulli():
    torch.manual_seed(0)
    x = torch.empty(N, device="npu").bernoulli_(0.3).cpu()
    assert set(x.unique().tolist()) == {0.0, 1.0}
    assert abs(x.mean().item() - 0.3) < 0.01


def test_exponential():
    torch.manual_seed(0)
    x = torch.empty(N, device="npu").exponential_(2.0).cpu().double()
    assert x.min().item() >= 0.0
    assert abs(x.mean().item() - 0.5) < 0.01
