"""Random numbers on the npu: seeding, generators, distributions."""
import itertools
import os
import unittest.mock
import warnings

import pytest
import torch
import torch.distributions as D
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

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


# ---- every random op draws from the npu generator, at launch ----------------------
#
# check_npu_generator(fn) runs fn() (which launches random ops on npu tensors and
# returns their results) several times. The npu generator is seeded alone; every
# other generator (the cpu's, and npu:0's default one when fn uses an explicit
# generator) gets other seeds in runs that must agree, so no state they share can
# hide a difference. Right after each launch, before the results are read, every
# generator is reseeded again: a kernel that took its draw later, when it ran,
# would see those seeds. That check bites when kernels are queued: under
# NPU_EMU_ALWAYS_ENQUEUE=1 (make test runs this file again so), where a sleep
# kernel launched first holds them in the queue. By default a kernel launched on an
# idle stream runs at once, on the caller's thread.

CPU_GENERATOR = torch.random.default_generator
QUEUED = any(os.environ.get(v, "0") not in ("", "0") for v in ("NPU_EMU_ALWAYS_ENQUEUE", "NPU_EMU_DEFER"))
SEED = 1234
# Up to 64 other seeds, until one changes the result: a tiny or lopsided result (one
# draw of bernoulli(0.1)) often repeats by chance.
OTHER_NPU_SEEDS = range(SEED + 1, SEED + 65)


def _to_cpu(out):
    return tree_map(lambda x: x.cpu() if isinstance(x, torch.Tensor) else x, out)


def _same(a, b):
    try:
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
    except AssertionError:
        return False
    return True


def check_npu_generator(fn, generator=None, varies=True):
    """The problems found (an empty list if none) with how fn()'s random ops draw.

    ``generator``: the explicit npu generator fn uses; None means npu:0's default one,
    seeded with torch.npu.manual_seed. ``varies=False`` for a result that cannot
    vary (empty, or p=0): then only the checks that it ignores other generators
    apply.
    """
    if generator is None:
        seed, get_state, set_state = torch.npu.manual_seed, torch.npu.get_rng_state, torch.npu.set_rng_state
        others = [CPU_GENERATOR]
    else:
        seed, get_state, set_state = generator.manual_seed, generator.get_state, generator.set_state
        others = [CPU_GENERATOR, torch.npu.default_generators[0]]

    def run(npu_seed=SEED, other_seed=1, late_seed=101):
        if npu_seed is not None:  # None: the npu generator as it is
            seed(npu_seed)
        for g in others:
            g.manual_seed(other_seed)
        if QUEUED:
            torch.npu._sleep(1)  # fn's kernels wait behind it, until after the reseeding below
        out = fn()
        seed(late_seed)
        for g in others:
            g.manual_seed(late_seed)
        return _to_cpu(out)

    problems = []
    first = run()
    if not _same(first, run(other_seed=2)):
        problems.append("depends on the cpu generator" if generator is None
                        else "depends on the cpu or the default npu generator")
    if not _same(first, run(late_seed=102)):
        problems.append("draws after launch (reseeding after the launch changes the result)")
    if varies and all(_same(first, run(npu_seed=s)) for s in OTHER_NPU_SEEDS):
        problems.append("reseeding the npu generator does not change the result")

    # It consumes from the npu generator only; its state replays it.
    seed(SEED)
    for g in others:
        g.manual_seed(1)
    other_states = [g.get_state() for g in others]
    _to_cpu(fn())  # away from the seed's start
    state = get_state()
    expected = _to_cpu(fn())
    if varies and torch.equal(state, get_state()):
        problems.append("does not advance the npu generator")
    for g, before in zip(others, other_states):
        if not torch.equal(before, g.get_state()):
            problems.append("advances the cpu generator" if g is CPU_GENERATOR
                            else "advances the default npu generator")
    set_state(state)
    if not _same(expected, run(npu_seed=None, other_seed=2, late_seed=102)):
        problems.append("set_rng_state does not replay it" if generator is None
                        else "Generator.set_state does not replay it")

    if generator is None:
        seed(SEED)
        with torch.random.fork_rng(devices=[0], device_type="npu"):
            inside = run(npu_seed=None)
        if not _same(inside, run(npu_seed=None, other_seed=2, late_seed=102)):
            problems.append("fork_rng(device_type='npu') does not restore it")
    return problems


def _x(*shape, dtype=torch.float32):
    """An npu tensor of fixed values (no generator involved) in [-1, 1]."""
    return torch.linspace(-1, 1, torch.Size(shape).numel(), dtype=dtype).reshape(shape).to("npu")


def _p(*shape, dtype=torch.float32):
    """An npu tensor of fixed probabilities in [0.1, 0.9]."""
    return _x(*shape, dtype=dtype) * 0.4 + 0.5


def _values(*values):
    return torch.tensor(values, device="npu")


def _out(*shape, dtype=torch.float32):
    """An npu tensor for out=."""
    return torch.empty(shape, dtype=dtype, device="npu")


aten = torch.ops.aten


# -- OpInfo: every op_db entry whose samples call an aten op tagged nondeterministic_seeded.
# op_db is loaded when the tests run (as test_opinfo.py does), not at collection:
# importing torch.testing._internal changes global state (torch.backends flags).

RANDOM_OPINFOS = [  # what tracing op_db finds: test_these_are_the_random_opinfos checks it
    "bernoulli", "cauchy", "exponential", "geometric", "log_normal", "multinomial", "normal",
    "normal.in_place", "normal.number_mean", "rand_like", "randint", "randint_like", "randn",
    "randn_like", "uniform", "nn.functional.alpha_dropout", "nn.functional.dropout",
    "nn.functional.dropout2d", "nn.functional.dropout3d", "nn.functional.feature_alpha_dropout.with_train",
    "nn.functional.fractional_max_pool2d", "nn.functional.fractional_max_pool3d",
    "nn.functional.multi_head_attention_forward", "nn.functional.rrelu",
    "nn.functional.scaled_dot_product_attention", "pca_lowrank", "svd_lowrank",
]
FLOAT64_OPINFOS = [  # float64 falls back to the cpu, which must draw from the npu generator too
    "bernoulli", "exponential", "multinomial", "nn.functional.dropout", "nn.functional.rrelu", "normal",
    "normal.in_place", "normal.number_mean", "randn_like", "uniform",
]
UNTRACEABLE_OPINFOS = {  # no sample of theirs runs on the cpu, so whether they are random is unknown
    name: "CUDA only (jiterator): no sample runs on the cpu to trace" for name in (
        "jiterator_unary", "jiterator_binary", "jiterator_4inputs_with_extra_args",
        "jiterator_binary_return_by_ref", "jiterator_2inputs_2outputs")
}
# The first 10 samples of an OpInfo show whether it is random (the dropouts' first
# random one is their third: p=0 and training=False come first); tracing all of them
# takes 15 s. MAX_SAMPLES of the random ones are run.
TRACED_SAMPLES, MAX_SAMPLES = 10, 6


def _opinfo_module():
    pytest.importorskip("expecttest")  # torch.testing._internal needs it
    from torch.testing._internal import common_methods_invocations
    return common_methods_invocations


def _unseeded_opinfos():
    """OpInfo wraps random ops in wrapper_set_seed (torch.manual_seed(42) before each call),
    which seeds every generator: within this, they are called as they are."""
    return unittest.mock.patch.object(_opinfo_module(), "wrapper_set_seed",
                                      lambda op, *args, **kwargs: op(*args, **kwargs))


class _SeededOpRecorder(TorchDispatchMode):
    """Records the seeded aten ops called (with device_type: those whose result is on it)."""
    def __init__(self, device_type=None):
        super().__init__()
        self.device_type = device_type
        self.seeded = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if torch.Tag.nondeterministic_seeded in func.tags and (self.device_type is None or any(
                isinstance(x, torch.Tensor) and x.device.type == self.device_type for x in tree_flatten(out)[0])):
            self.seeded.add(str(func))
        return out


def _random_samples(op, dtype):
    """op's first cpu samples of dtype that call a seeded aten op; the error if none ran."""
    random, error = [], None
    # sample_inputs_func, not sample_inputs: that one walks the (deep, under pytest) stack
    # and reseeds every generator for each sample.
    with warnings.catch_warnings(), torch.random.fork_rng(devices=[]), _unseeded_opinfos():
        warnings.simplefilter("ignore")
        CPU_GENERATOR.manual_seed(0)
        samples = op.sample_inputs_func(op, "cpu", dtype, False)
        for sample in itertools.islice(samples, TRACED_SAMPLES):
            recorder = _SeededOpRecorder()
            try:
                with recorder:
                    op(sample.input, *sample.args, **sample.kwargs)
                error = False
            except Exception as e:  # a sample the cpu rejects
                error = e if error is None else error
            if recorder.seeded:
                random.append(sample)
    return random[:MAX_SAMPLES], error or None


@pytest.fixture(scope="module")
def random_opinfos():
    """{"name-dtype": (op, dtype, random samples)} of op_db's random OpInfos, and {name: error}
    of those that could not be traced."""
    random, untraceable = {}, {}
    for op in _opinfo_module().op_db:
        opid = op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")
        supported = op.supported_dtypes("cpu")
        if not supported:
            continue
        dtypes = [torch.float32 if torch.float32 in supported else min(supported, key=str)]
        if opid in FLOAT64_OPINFOS:
            dtypes.append(torch.float64)
        for dtype in dtypes:
            samples, error = _random_samples(op, dtype)
            if samples:
                random[f"{opid}-{str(dtype).removeprefix('torch.')}"] = (op, dtype, samples)
            elif error is not None:
                untraceable[opid] = error
    return random, untraceable


OPINFO_CASES = [f"{name}-float32" for name in RANDOM_OPINFOS] + [f"{name}-float64" for name in FLOAT64_OPINFOS]


def test_these_are_the_random_opinfos(random_opinfos):
    random, untraceable = random_opinfos
    assert sorted(random) == sorted(OPINFO_CASES), "update RANDOM_OPINFOS (or FLOAT64_OPINFOS)"
    assert sorted(untraceable) == sorted(UNTRACEABLE_OPINFOS), untraceable


def _sample_args(sample, to_npu):
    """sample's (input, args, kwargs): copies on the npu (device="cpu" becomes "npu"), or on the cpu."""
    def convert(x):
        if isinstance(x, torch.Tensor):
            return x.to("npu") if to_npu else x.clone()
        if to_npu and isinstance(x, (str, torch.device)) and str(x) == "cpu":
            return "npu"
        return x
    return tree_map(convert, (sample.input, sample.args, sample.kwargs))


def _call_sample(op, sample, to_npu):
    inp, args, kwargs = _sample_args(sample, to_npu)
    return op(inp, *args, **kwargs)


def _describe(sample):
    def short(x):
        return f"Tensor{list(x.shape)}" if isinstance(x, torch.Tensor) else x
    inp, args, kwargs = tree_map(short, (sample.input, sample.args, sample.kwargs))
    return f"{inp}, {args}, {kwargs}"[:160]


@pytest.mark.parametrize("case", OPINFO_CASES + [
    pytest.param(name, marks=pytest.mark.skip(reason=reason)) for name, reason in UNTRACEABLE_OPINFOS.items()])
def test_opinfo_random_op_draws_from_npu_generator(case, random_opinfos):
    assert case in random_opinfos[0], f"{case} is not random (or not in op_db) any more"
    op, dtype, samples = random_opinfos[0][case]
    problems = []
    for index, sample in enumerate(samples):
        # A result that does not vary on the cpu either (an empty tensor, p=0, windows that
        # the random offsets cannot move) cannot show the npu seed: those checks are skipped.
        cpu_results = []
        for cpu_seed in (1, 2, 3, 4):
            CPU_GENERATOR.manual_seed(cpu_seed)
            with _unseeded_opinfos():
                cpu_results.append(_call_sample(op, sample, to_npu=False))
        varies = not all(_same(cpu_results[0], r) for r in cpu_results[1:])
        with _unseeded_opinfos():
            problems += [f"sample {index} ({_describe(sample)}): {p}"
                         for p in check_npu_generator(lambda: _call_sample(op, sample, to_npu=True), varies=varies)]
    assert not problems, "\n".join(problems)


# -- torch.distributions: every Distribution class, with npu parameters

def _eye(n):
    return torch.eye(n, device="npu")


DISTRIBUTIONS = {
    "Bernoulli": lambda: D.Bernoulli(probs=_values(0.3, 0.6)),
    "Beta": lambda: D.Beta(_values(0.5, 2.0), _values(1.5, 0.7)),
    "Binomial": lambda: D.Binomial(total_count=_values(5.0, 10.0), probs=_values(0.3, 0.6)),
    "Categorical": lambda: D.Categorical(probs=_values(0.2, 0.3, 0.5)),
    "Cauchy": lambda: D.Cauchy(_values(0.0, 1.0), _values(1.0, 2.0)),
    "Chi2": lambda: D.Chi2(_values(2.0, 3.0)),
    "ContinuousBernoulli": lambda: D.ContinuousBernoulli(probs=_values(0.3, 0.6)),
    "Dirichlet": lambda: D.Dirichlet(_values(0.5, 1.0, 2.0)),
    "Exponential": lambda: D.Exponential(_values(1.0, 2.0)),
    "FisherSnedecor": lambda: D.FisherSnedecor(_values(2.0, 3.0), _values(4.0, 5.0)),
    "Gamma": lambda: D.Gamma(_values(0.5, 2.0), _values(1.0, 2.0)),
    "GeneralizedPareto": lambda: D.GeneralizedPareto(_values(0.0, 1.0), _values(1.0, 2.0), _values(0.1, 0.3)),
    "Geometric": lambda: D.Geometric(probs=_values(0.3, 0.6)),
    "Gumbel": lambda: D.Gumbel(_values(0.0, 1.0), _values(1.0, 2.0)),
    "HalfCauchy": lambda: D.HalfCauchy(_values(1.0, 2.0)),
    "HalfNormal": lambda: D.HalfNormal(_values(1.0, 2.0)),
    "Independent": lambda: D.Independent(D.Normal(_values(0.0, 1.0), _values(1.0, 2.0)), 1),
    "InverseGamma": lambda: D.InverseGamma(_values(2.0, 3.0), _values(1.0, 2.0)),
    "Kumaraswamy": lambda: D.Kumaraswamy(_values(1.0, 2.0), _values(2.0, 3.0)),
    "LKJCholesky": lambda: D.LKJCholesky(3, _values(0.5)),
    "Laplace": lambda: D.Laplace(_values(0.0, 1.0), _values(1.0, 2.0)),
    "LogNormal": lambda: D.LogNormal(_values(0.0, 1.0), _values(1.0, 0.5)),
    "LogisticNormal": lambda: D.LogisticNormal(_values(0.0, 1.0), _values(1.0, 0.5)),
    "LowRankMultivariateNormal": lambda: D.LowRankMultivariateNormal(
        _values(0.0, 1.0), _values(1.0, 0.5).reshape(2, 1), _values(1.0, 2.0)),
    "MixtureSameFamily": lambda: D.MixtureSameFamily(
        D.Categorical(probs=_values(0.3, 0.7)), D.Normal(_values(-1.0, 1.0), _values(1.0, 0.5))),
    "Multinomial": lambda: D.Multinomial(10, probs=_values(0.2, 0.3, 0.5)),
    "MultivariateNormal": lambda: D.MultivariateNormal(_values(0.0, 1.0), covariance_matrix=_eye(2) * 2),
    "NegativeBinomial": lambda: D.NegativeBinomial(_values(5.0, 10.0), probs=_values(0.3, 0.6)),
    "Normal": lambda: D.Normal(_values(0.0, 1.0), _values(1.0, 2.0)),
    "OneHotCategorical": lambda: D.OneHotCategorical(probs=_values(0.2, 0.3, 0.5)),
    "OneHotCategoricalStraightThrough": lambda: D.OneHotCategoricalStraightThrough(probs=_values(0.2, 0.3, 0.5)),
    "Pareto": lambda: D.Pareto(_values(1.0, 2.0), _values(2.0, 3.0)),
    "Poisson": lambda: D.Poisson(_values(2.0, 5.0)),
    "RelaxedBernoulli": lambda: D.RelaxedBernoulli(_values(0.5), probs=_values(0.3, 0.6)),
    "RelaxedOneHotCategorical": lambda: D.RelaxedOneHotCategorical(_values(0.5), probs=_values(0.2, 0.3, 0.5)),
    "StudentT": lambda: D.StudentT(_values(3.0, 5.0)),
    "TransformedDistribution": lambda: D.TransformedDistribution(
        D.Normal(_values(0.0, 1.0), _values(1.0, 2.0)), [D.transforms.ExpTransform()]),
    "Uniform": lambda: D.Uniform(_values(0.0, 1.0), _values(1.0, 3.0)),
    "VonMises": lambda: D.VonMises(_values(0.0, 1.0), _values(1.0, 4.0)),
    "Weibull": lambda: D.Weibull(_values(1.0, 2.0), _values(1.5, 2.0)),
    "Wishart": lambda: D.Wishart(_values(4.0), covariance_matrix=_eye(2)),
}
DISTRIBUTION_SKIPS = {
    "Distribution": "abstract base class: no sampler",
    "ExponentialFamily": "abstract base class: no sampler",
}


def _distribution_cases():
    names = sorted(name for name in D.__all__
                   if isinstance(getattr(D, name), type) and issubclass(getattr(D, name), D.Distribution))
    return [pytest.param(name, marks=pytest.mark.skip(reason=DISTRIBUTION_SKIPS[name]))
            if name in DISTRIBUTION_SKIPS else name for name in names]


@pytest.mark.filterwarnings("ignore:Singular sample detected")  # Wishart's, on the cpu too
@pytest.mark.parametrize("name", _distribution_cases())
def test_distribution_samples_draw_from_npu_generator(name):
    assert name in DISTRIBUTIONS, f"torch.distributions.{name} is new: add it to DISTRIBUTIONS or DISTRIBUTION_SKIPS"
    dist = DISTRIBUTIONS[name]()
    assert type(dist) is getattr(D, name)

    def sample():
        out = {"sample": dist.sample((16,))}
        if dist.has_rsample:
            out["rsample"] = dist.rsample((16,))
        assert all(t.device.type == "npu" for t in out.values())
        return out

    problems = check_npu_generator(sample)
    assert not problems, problems


# -- dropout variants and the other random nn ops, as functionals and modules (in training mode)

def _module(make, *shape, dtype=torch.float32):
    """A fn running module make() (built here, on the npu, in training mode) on a fixed input."""
    module = make().to("npu", dtype).train()
    return lambda: module(_x(*shape, dtype=dtype))


def _functional(f, *shape, dtype=torch.float32, **kwargs):
    return lambda: f(_x(*shape, dtype=dtype), **kwargs)


def _sdpa():
    q, k, v = (_x(2, 2, 6, 8) + i for i in range(3))
    return F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)


class _SelfAttention(nn.Module):
    def __init__(self, attention):
        super().__init__()
        self.attention = attention

    def forward(self, x):
        return self.attention(x, x, x)


NN_OPS = {
    "F.dropout": lambda: _functional(F.dropout, 16, 8, p=0.5, training=True),
    "F.dropout-float64": lambda: _functional(F.dropout, 16, 8, dtype=torch.float64, p=0.5, training=True),
    "F.dropout-inplace": lambda: _functional(F.dropout, 16, 8, p=0.5, training=True, inplace=True),
    "F.dropout1d": lambda: _functional(F.dropout1d, 4, 16, 3, p=0.5, training=True),
    "F.dropout2d": lambda: _functional(F.dropout2d, 4, 16, 3, 3, p=0.5, training=True),
    "F.dropout3d": lambda: _functional(F.dropout3d, 4, 16, 2, 2, 2, p=0.5, training=True),
    "F.alpha_dropout": lambda: _functional(F.alpha_dropout, 16, 8, p=0.5, training=True),
    "F.feature_alpha_dropout": lambda: _functional(F.feature_alpha_dropout, 4, 16, 3, p=0.5, training=True),
    "F.rrelu": lambda: _functional(F.rrelu, 16, 8, training=True),
    "F.rrelu_": lambda: _functional(F.rrelu_, 16, 8, training=True),
    "F.scaled_dot_product_attention": lambda: _sdpa,
    "nn.Dropout": lambda: _module(lambda: nn.Dropout(0.5), 16, 8),
    "nn.Dropout1d": lambda: _module(lambda: nn.Dropout1d(0.5), 4, 16, 3),
    "nn.Dropout2d": lambda: _module(lambda: nn.Dropout2d(0.5), 4, 16, 3, 3),
    "nn.Dropout3d": lambda: _module(lambda: nn.Dropout3d(0.5), 4, 16, 2, 2, 2),
    "nn.AlphaDropout": lambda: _module(lambda: nn.AlphaDropout(0.5), 16, 8),
    "nn.FeatureAlphaDropout": lambda: _module(lambda: nn.FeatureAlphaDropout(0.5), 4, 16, 3),
    "nn.RReLU": lambda: _module(nn.RReLU, 16, 8),
    "nn.MultiheadAttention": lambda: _module(lambda: _SelfAttention(nn.MultiheadAttention(8, 2, dropout=0.5)), 5, 2, 8),
    "nn.TransformerEncoderLayer": lambda: _module(lambda: nn.TransformerEncoderLayer(8, 2, 16, dropout=0.5), 5, 2, 8),
    "nn.LSTM": lambda: _module(lambda: nn.LSTM(8, 8, num_layers=2, dropout=0.5), 5, 2, 8),
    "nn.GRU": lambda: _module(lambda: nn.GRU(8, 8, num_layers=2, dropout=0.5), 5, 2, 8),
    "nn.RNN": lambda: _module(lambda: nn.RNN(8, 8, num_layers=2, dropout=0.5), 5, 2, 8),
    "aten.native_dropout": lambda: lambda: aten.native_dropout(_x(16, 8), 0.5, True),
    "aten.native_dropout-out": lambda: lambda: aten.native_dropout(
        _x(16, 8), 0.5, True, out0=_out(16, 8), out1=_out(16, 8, dtype=torch.bool)),
    # (OpInfo's samples of these have sizes where the random offsets cannot move a window)
    "F.fractional_max_pool2d": lambda: _functional(F.fractional_max_pool2d, 1, 2, 16, 16, kernel_size=2,
                                                   output_size=5),
    "F.fractional_max_pool3d": lambda: _functional(F.fractional_max_pool3d, 1, 2, 9, 9, 9, kernel_size=2,
                                                   output_size=3),
}


@pytest.mark.parametrize("name", NN_OPS)
def test_nn_random_op_draws_from_npu_generator(name):
    with torch.random.fork_rng(devices=[]):  # the modules' initialisation leaves the cpu generator as it was
        fn = NN_OPS[name]()
    problems = check_npu_generator(fn)
    assert not problems, problems


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_native_dropout_computes_what_aten_computes_from_its_mask(dtype):
    # The npu alone is seeded: nothing shared with the cpu could make the two agree.
    torch.npu.manual_seed(SEED)
    CPU_GENERATOR.manual_seed(99)
    x = _x(32, 8, dtype=dtype)
    out, mask = torch.native_dropout(x, 0.3, True)
    assert mask.dtype == torch.bool and 0 < mask.sum().item() < mask.numel()
    expected = x.cpu().mul(mask.cpu()).mul_(1 / 0.7)
    assert torch.equal(out.cpu(), expected)


# -- factories, Tensor methods and aten ops (out= forms too), with the default npu generator
# and with an explicit one. Each takes **g: {} (the overloads without a Generator argument
# where there are some) or {"generator": a torch.Generator("npu")}.

def _high():
    return torch.tensor(10)  # randint_like's high: a cpu scalar tensor, as ATen requires


LONG, F64 = torch.int64, torch.float64
FACTORIES = {
    "torch.rand": lambda **g: torch.rand(16, device="npu", **g),
    "torch.rand-float64": lambda **g: torch.rand(16, device="npu", dtype=F64, **g),
    "torch.rand-out": lambda **g: torch.rand(16, out=_out(16), **g),
    "torch.randn": lambda **g: torch.randn(16, device="npu", **g),
    "torch.randn-float64": lambda **g: torch.randn(16, device="npu", dtype=F64, **g),
    "torch.randn-out": lambda **g: torch.randn(16, out=_out(16), **g),
    "torch.randint": lambda **g: torch.randint(3, 10, (16,), device="npu", **g),
    "torch.randint-high": lambda **g: torch.randint(10, (16,), device="npu", **g),
    "torch.randint-out": lambda **g: torch.randint(3, 10, (16,), out=_out(16, dtype=LONG), **g),
    "torch.randint-high-out": lambda **g: torch.randint(10, (16,), out=_out(16, dtype=LONG), **g),
    "torch.randperm": lambda **g: torch.randperm(16, device="npu", **g),
    "torch.randperm-out": lambda **g: torch.randperm(16, out=_out(16, dtype=LONG), **g),
    "torch.rand_like": lambda **g: torch.rand_like(_x(16), **g),
    "torch.rand_like-out": lambda **g: aten.rand_like(_x(16), **g, out=_out(16)),
    "torch.randn_like": lambda **g: torch.randn_like(_x(16), **g),
    "torch.randn_like-out": lambda **g: aten.randn_like(_x(16), **g, out=_out(16)),
    "torch.randint_like": lambda **g: torch.randint_like(_x(16), 10, **g),
    "torch.randint_like-low": lambda **g: torch.randint_like(_x(16), 3, 10, **g),
    "torch.randint_like-out": lambda **g: aten.randint_like(_x(16), 10, **g, out=_out(16)),
    "torch.randint_like-low-out": lambda **g: aten.randint_like(_x(16), 3, 10, **g, out=_out(16)),
    "aten.randint_like.Tensor": lambda **g: (aten.randint_like.Tensor_generator if g else
                                             aten.randint_like.Tensor)(_x(16), _high(), **g),
    "aten.randint_like.Tensor-out": lambda **g: (aten.randint_like.Tensor_generator_out if g else
                                                 aten.randint_like.Tensor_out)(_x(16), _high(), **g, out=_out(16)),
    "torch.normal-tensor_tensor": lambda **g: torch.normal(_x(16), _p(16), **g),
    "torch.normal-tensor_float": lambda **g: torch.normal(_x(16), 2.0, **g),
    "torch.normal-float_tensor": lambda **g: torch.normal(1.0, _p(16), **g),
    "torch.normal-float_float": lambda **g: torch.normal(1.0, 2.0, (16,), device="npu", **g),
    "torch.normal-float64": lambda **g: torch.normal(_x(16, dtype=F64), 2.0, **g),
    "torch.normal-tensor_tensor-out": lambda **g: torch.normal(_x(16), _p(16), out=_out(16), **g),
    "torch.normal-tensor_float-out": lambda **g: torch.normal(_x(16), 2.0, out=_out(16), **g),
    "torch.normal-float_tensor-out": lambda **g: torch.normal(1.0, _p(16), out=_out(16), **g),
    "torch.normal-float_float-out": lambda **g: torch.normal(1.0, 2.0, (16,), out=_out(16), **g),
    "torch.bernoulli": lambda **g: torch.bernoulli(_p(16), **g),
    "torch.bernoulli-p": lambda **g: torch.bernoulli(_x(16), 0.5, **g),
    "torch.bernoulli-float64": lambda **g: torch.bernoulli(_p(16, dtype=F64), **g),
    "torch.bernoulli-out": lambda **g: torch.bernoulli(_p(16), out=_out(16), **g),
    "torch.multinomial": lambda **g: torch.multinomial(_p(2, 8), 4, **g),
    "torch.multinomial-replacement": lambda **g: torch.multinomial(_p(2, 8), 16, replacement=True, **g),
    "torch.multinomial-float64": lambda **g: torch.multinomial(_p(2, 8, dtype=F64), 4, **g),
    "torch.multinomial-out": lambda **g: torch.multinomial(_p(2, 8), 4, out=_out(2, 4, dtype=LONG), **g),
    "torch.poisson": lambda **g: torch.poisson(_p(16) * 5, **g),
    "torch.binomial": lambda **g: torch.binomial(_p(16) * 0 + 10, _p(16), **g),
    "torch._standard_gamma": lambda **g: torch._standard_gamma(_p(16) * 3, **g),
    "torch._sample_dirichlet": lambda **g: torch._sample_dirichlet(_p(4, 3) * 3, **g),
    "Tensor.uniform_": lambda **g: _x(16).uniform_(-2, 3, **g),
    "Tensor.uniform_-float64": lambda **g: _x(16, dtype=F64).uniform_(**g),
    "Tensor.normal_": lambda **g: _x(16).normal_(1.0, 2.0, **g),
    "Tensor.normal_-float64": lambda **g: _x(16, dtype=F64).normal_(**g),
    "Tensor.bernoulli_": lambda **g: _x(16).bernoulli_(0.5, **g),
    "Tensor.bernoulli_-tensor": lambda **g: _x(16).bernoulli_(_p(16), **g),
    "Tensor.random_": lambda **g: _x(16).random_(**g),
    "Tensor.random_-to": lambda **g: _x(16).random_(10, **g),
    "Tensor.random_-from_to": lambda **g: _x(16).random_(3, 10, **g),
    "Tensor.random_-int64": lambda **g: _x(16).long().random_(0, 1000, **g),
    "Tensor.exponential_": lambda **g: _x(16).exponential_(2.0, **g),
    "Tensor.geometric_": lambda **g: _x(16).geometric_(0.3, **g),
    "Tensor.log_normal_": lambda **g: _x(16).log_normal_(0.0, 0.5, **g),
    "Tensor.cauchy_": lambda **g: _x(16).cauchy_(0.0, 1.0, **g),
    # The functional forms (torch.compile and functionalization call them) and their out= forms.
    "aten.uniform": lambda **g: aten.uniform(_x(16), 0.0, 1.0, **g),
    "aten.uniform-out": lambda **g: aten.uniform(_x(16), 0.0, 1.0, **g, out=_out(16)),
    "aten.normal_functional": lambda **g: aten.normal_functional(_x(16), 0.0, 1.0, **g),
    "aten.normal-out": lambda **g: aten.normal(_x(16), 0.0, 1.0, **g, out=_out(16)),
    "aten.bernoulli.p": lambda **g: aten.bernoulli.p(_x(16), 0.5, **g),
    "aten.bernoulli.p-out": lambda **g: aten.bernoulli(_x(16), 0.5, **g, out=_out(16)),
    "aten.bernoulli.Tensor": lambda **g: aten.bernoulli.Tensor(_x(16), _p(16), **g),
    "aten.bernoulli.Tensor-out": lambda **g: aten.bernoulli(_x(16), _p(16), **g, out=_out(16)),
    "aten.random": lambda **g: aten.random(_x(16), **g),
    "aten.random.to": lambda **g: aten.random.to(_x(16), 10, **g),
    "aten.random.from": lambda **g: getattr(aten.random, "from")(_x(16), 3, 10, **g),
    "aten.random-out": lambda **g: aten.random(_x(16), **g, out=_out(16)),
    "aten.random.to-out": lambda **g: aten.random(_x(16), 10, **g, out=_out(16)),
    "aten.random.from-out": lambda **g: aten.random(_x(16), 3, 10, **g, out=_out(16)),
    "aten.exponential": lambda **g: aten.exponential(_x(16), 2.0, **g),
    "aten.exponential-out": lambda **g: aten.exponential(_x(16), 2.0, **g, out=_out(16)),
    "aten.geometric": lambda **g: aten.geometric(_x(16), 0.3, **g),
    "aten.geometric-out": lambda **g: aten.geometric(_x(16), 0.3, **g, out=_out(16)),
    "aten.log_normal": lambda **g: aten.log_normal(_x(16), 0.0, 0.5, **g),
    "aten.log_normal-out": lambda **g: aten.log_normal(_x(16), 0.0, 0.5, **g, out=_out(16)),
    "aten.cauchy": lambda **g: aten.cauchy(_x(16), 0.0, 1.0, **g),
    "aten.cauchy-out": lambda **g: aten.cauchy(_x(16), 0.0, 1.0, **g, out=_out(16)),
    "aten.poisson-out": lambda **g: aten.poisson(_p(16) * 5, **g, out=_out(16)),
    "aten.binomial-out": lambda **g: aten.binomial(_p(16) * 0 + 10, _p(16), **g, out=_out(16)),
    "aten._standard_gamma-out": lambda **g: aten._standard_gamma(_p(16) * 3, **g, out=_out(16)),
    "aten._sample_dirichlet-out": lambda **g: aten._sample_dirichlet(_p(4, 3) * 3, **g, out=_out(4, 3)),
    "aten.rrelu_with_noise": lambda **g: aten.rrelu_with_noise(_x(16), _x(16), 0.1, 0.3, True, **g),
    "aten.rrelu_with_noise-out": lambda **g: aten.rrelu_with_noise(_x(16), _x(16), 0.1, 0.3, True, **g,
                                                                   out=_out(16)),
    "aten.rrelu_with_noise_functional": lambda **g: aten.rrelu_with_noise_functional(_x(16), _x(16), 0.1, 0.3,
                                                                                     True, **g),
}


@pytest.mark.parametrize("generator", ["default", "Generator"])
@pytest.mark.parametrize("name", FACTORIES)
def test_factory_draws_from_npu_generator(name, generator):
    g = torch.Generator(device="npu") if generator == "Generator" else None
    kwargs = {} if g is None else {"generator": g}
    problems = check_npu_generator(lambda: FACTORIES[name](**kwargs), generator=g)
    assert not problems, problems


# -- every seeded aten op an npu tensor reaches is run by one of the cases above

NOT_RUN = {  # aten op (every overload) -> why no case runs it on npu tensors
    "_cudnn_init_dropout_state": "CUDA only (its out= form calls the CUDA kernel)",
    "_cudnn_rnn": "CUDA only (its out= form calls the CUDA kernel)",
    "_fused_dropout": "CUDA only (its out= form calls the CUDA kernel)",
    "_lstm_mps": "MPS only (its out= form calls the MPS kernel)",
    "_triton_scaled_dot_attention": "CUDA only (its out= form calls the CUDA kernel)",
    "miopen_rnn": "ROCm only (its out= form calls the ROCm kernel)",
    "_fused_sdp_choice": "returns which attention kernel to use (an int): draws nothing",
    "_scaled_dot_product_fused_attention_overrideable": "a PrivateUse1 backend's own fused attention; "
                                                        "torch_npu registers none (it raises)",
}


def _seeded_aten_ops():
    """The aten overloads tagged nondeterministic_seeded that npu tensors reach: with a kernel
    for them (npu, cpu through the fallback, composite), and not CompositeImplicitAutograd
    (those decompose, before dispatch, into ops of this list)."""
    has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key
    ops = {}
    for schema in torch._C._jit_get_all_schemas():
        if not schema.name.startswith("aten::"):
            continue
        overload = getattr(getattr(aten, schema.name[6:]), schema.overload_name or "default")
        qualified = f"{schema.name}.{schema.overload_name}" if schema.overload_name else schema.name
        if (torch.Tag.nondeterministic_seeded in overload.tags
                and not has_kernel(qualified, "CompositeImplicitAutograd")
                and any(has_kernel(qualified, key) for key in (
                    "PrivateUse1", "CPU", "CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional"))):
            ops[str(overload)] = schema.name[6:]
    return ops


def _every_case(random_opinfos):
    """Each case above, as a function that runs it once."""
    for op, _, samples in random_opinfos.values():
        for sample in samples:
            yield lambda op=op, sample=sample: _call_sample(op, sample, to_npu=True)
    for make in DISTRIBUTIONS.values():
        yield lambda make=make: (lambda d: (d.sample(), d.rsample() if d.has_rsample else None))(make())
    for make in NN_OPS.values():
        yield lambda make=make: make()()
    for make in FACTORIES.values():
        yield make
        yield lambda make=make: make(generator=torch.Generator(device="npu"))


@pytest.mark.filterwarnings("ignore:Singular sample detected")
def test_the_cases_run_every_seeded_aten_op(random_opinfos):
    seeded = _seeded_aten_ops()
    assert set(NOT_RUN) <= set(seeded.values()), "NOT_RUN names an op that is not (or no longer) seeded"
    recorder = _SeededOpRecorder(device_type="npu")
    with _unseeded_opinfos(), torch.random.fork_rng(devices=[]), recorder:
        for run_case in _every_case(random_opinfos[0]):
            run_case()
    missing = sorted(op for op, name in seeded.items() if op not in recorder.seeded and name not in NOT_RUN)
    assert not missing, f"no case runs these random ops on npu tensors: {missing}"


def test_check_npu_generator_catches_a_cpu_draw():
    """The protocol itself: an op drawing from the cpu, or from no generator, is caught."""
    assert set(check_npu_generator(lambda: torch.rand(16).to("npu"))) >= {
        "depends on the cpu generator", "advances the cpu generator",
        "reseeding the npu generator does not change the result", "does not advance the npu generator"}
    fixed = torch.Generator(device="npu")
    assert "reseeding the npu generator does not change the result" in check_npu_generator(
        lambda: torch.rand(16, device="npu", generator=fixed.manual_seed(0)))
    assert check_npu_generator(lambda: torch.rand(16, device="npu")) == []
