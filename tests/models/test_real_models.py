"""Real model code on the npu against the cpu, with the same weights.

Each model trains three optimizer steps on both devices; the outputs, the
gradients and the parameters after the steps must match the cpu's (float32,
tolerance 1e-5). The models are the patterns third-party code uses: tied
embeddings (GPT-2, T5), recurrent layers over packed sequences, PyTorch's
TransformerEncoder inference fast path (nested tensors), and sparse embedding
gradients with SparseAdam.
"""
import copy
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.rnn import pack_padded_sequence, pack_sequence, pad_packed_sequence

import torch_npu

TOL = dict(rtol=1e-5, atol=1e-5)
VOCAB = 17


def assert_close(npu, cpu, what):
    if cpu is None:
        assert npu is None, what
        return
    if cpu.layout == torch.sparse_coo:
        assert npu.layout == torch.sparse_coo and npu.device.type == "npu", what
        npu, cpu = npu.coalesce().to_dense(), cpu.coalesce().to_dense()
    assert npu.device.type == "npu", f"{what} is on {npu.device}"
    torch.testing.assert_close(npu.detach().cpu(), cpu.detach(), msg=lambda m: f"{what}: {m}", **TOL)


def assert_same_model(npu_model, cpu_model, what):
    for (name, p_cpu), p_npu in zip(cpu_model.named_parameters(), npu_model.parameters()):
        assert_close(p_npu, p_cpu, f"{what}: parameter {name}")
        assert_close(p_npu.grad, p_cpu.grad, f"{what}: gradient of {name}")


def train_on_both(cpu_model, make_optimizers, batches, loss_of, steps=3):
    """Trains a copy of cpu_model on the npu alongside it; returns the npu model."""
    npu_model = copy.deepcopy(cpu_model).to("npu")
    runs = [(cpu_model, make_optimizers(cpu_model), "cpu"), (npu_model, make_optimizers(npu_model), "npu")]
    for step in range(steps):
        outputs = []
        for model, optimizers, device in runs:
            for opt in optimizers:
                opt.zero_grad()
            out = loss_of(model, batches[step], device)
            out.backward()
            for opt in optimizers:
                opt.step()
            outputs.append(out)
        assert_close(outputs[1], outputs[0], f"loss at step {step}")
    assert_same_model(npu_model, cpu_model, "after 3 steps")
    return npu_model


# ---- a GPT-2-style decoder with tied embeddings ----------------------------------


class TinyGPT(nn.Module):
    def __init__(self, dim=16, heads=2, context=8):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, dim)
        self.wpe = nn.Embedding(context, dim)
        self.ln_1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln_2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(approximate="tanh"), nn.Linear(4 * dim, dim))
        self.ln_f = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, VOCAB, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as GPT-2's and T5's
        self.heads = heads

    def forward(self, ids):
        b, t = ids.shape
        pos = torch.arange(t, device=ids.device)
        x = self.wte(ids) + self.wpe(pos)
        q, k, v = self.qkv(self.ln_1(x)).split(x.size(-1), dim=-1)
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, -1))
        x = x + self.mlp(self.ln_2(x))
        return self.lm_head(self.ln_f(x))


def test_gpt_with_tied_embeddings_trains_like_cpu():
    torch.manual_seed(0)
    model = TinyGPT()
    batches = [torch.randint(0, VOCAB, (2, 8)) for _ in range(3)]

    def loss_of(m, ids, device):
        ids = ids.to(device)
        logits = m(ids[:, :-1])
        return F.cross_entropy(logits.reshape(-1, VOCAB), ids[:, 1:].reshape(-1))

    npu_model = train_on_both(model, lambda m: [torch.optim.AdamW(m.parameters(), lr=1e-2)], batches, loss_of)
    assert npu_model.lm_head.weight is npu_model.wte.weight
    assert len(list(npu_model.parameters())) == len(list(model.parameters()))


# ---- recurrent layers over packed sequences --------------------------------------


class PackedTagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 6)
        self.lstm = nn.LSTM(6, 5, num_layers=2, bidirectional=True, batch_first=True)
        self.gru = nn.GRU(10, 4, batch_first=True)
        self.out = nn.Linear(4, 3)

    def forward(self, ids, lengths):
        x = self.emb(ids)
        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        y, (h, c) = self.lstm(packed)
        y, _ = self.gru(y)
        y, out_lengths = pad_packed_sequence(y, batch_first=True)
        assert out_lengths.device.type == "cpu"  # as on CUDA
        return self.out(y), h, c


def test_lstm_gru_over_packed_sequences_trains_like_cpu():
    torch.manual_seed(0)
    model = PackedTagger()
    lengths = torch.tensor([6, 2, 4])  # on the cpu, as PyTorch requires
    batches = [torch.randint(0, VOCAB, (3, 6)) for _ in range(3)]

    def loss_of(m, ids, device):
        out, h, c = m(ids.to(device), lengths)
        return out.square().mean() + h.sum() * 0.1 + c.square().mean()

    train_on_both(model, lambda m: [torch.optim.Adam(m.parameters(), lr=1e-2)], batches, loss_of)


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("layers,batch_first", [(1, False), (2, True)])
def test_recurrent_layer_matches_cpu(kind, bidirectional, layers, batch_first):
    torch.manual_seed(0)
    cpu = getattr(nn, kind)(3, 4, num_layers=layers, bidirectional=bidirectional, batch_first=batch_first)
    npu = copy.deepcopy(cpu).npu()
    x = torch.randn(2, 5, 3)
    x_cpu, x_npu = x.clone().requires_grad_(), x.npu().requires_grad_()
    out_cpu, out_npu = cpu(x_cpu), npu(x_npu)
    h_cpu = out_cpu[1][0] if kind == "LSTM" else out_cpu[1]
    h_npu = out_npu[1][0] if kind == "LSTM" else out_npu[1]
    (out_cpu[0].sum() + h_cpu.square().sum()).backward()
    (out_npu[0].sum() + h_npu.square().sum()).backward()
    assert_close(out_npu[0], out_cpu[0], "output")
    assert_close(h_npu, h_cpu, "final hidden state")
    assert_close(x_npu.grad, x_cpu.grad, "input gradient")
    assert_same_model(npu, cpu, kind)


@pytest.mark.parametrize("cell", [nn.LSTMCell, nn.GRUCell])
@pytest.mark.parametrize("bias", [True, False])
def test_recurrent_cells_match_cpu(cell, bias):
    torch.manual_seed(0)
    cpu = cell(3, 4, bias=bias)
    npu = copy.deepcopy(cpu).npu()
    x = torch.randn(2, 3)
    hx = torch.randn(2, 4)
    state_cpu = (hx, hx * 0.5) if cell is nn.LSTMCell else hx
    state_npu = tuple(s.npu() for s in state_cpu) if cell is nn.LSTMCell else hx.npu()
    x_cpu, x_npu = x.clone().requires_grad_(), x.npu().requires_grad_()
    out_cpu, out_npu = cpu(x_cpu, state_cpu), npu(x_npu, state_npu)
    if cell is nn.LSTMCell:
        (out_cpu[0].sum() + out_cpu[1].square().sum()).backward()
        (out_npu[0].sum() + out_npu[1].square().sum()).backward()
        assert_close(out_npu[1], out_cpu[1], "cell state")
        out_cpu, out_npu = out_cpu[0], out_npu[0]
    else:
        out_cpu.square().sum().backward()
        out_npu.square().sum().backward()
    assert_close(out_npu, out_cpu, "hidden state")
    assert_close(x_npu.grad, x_cpu.grad, "input gradient")
    assert_same_model(npu, cpu, cell.__name__)


def test_recurrent_cell_rejects_cpu_state():
    cell = nn.GRUCell(3, 4).npu()
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        cell(torch.randn(2, 3).npu(), torch.randn(2, 4))


def test_pack_sequence_keeps_cpu_batch_sizes():
    seqs = [torch.randn(4, 3).npu(), torch.randn(2, 3).npu()]
    packed = pack_sequence(seqs)
    assert packed.data.device.type == "npu" and packed.batch_sizes.device.type == "cpu"
    assert packed.batch_sizes.tolist() == pack_sequence([s.cpu() for s in seqs]).batch_sizes.tolist()


def test_pack_padded_sequence_rejects_npu_lengths_like_cuda():
    with pytest.raises(RuntimeError, match="1D CPU int64 tensor"):
        pack_padded_sequence(torch.randn(3, 2, 1).npu(), torch.tensor([3, 2]).npu())


def test_ctc_loss_takes_cpu_lengths():
    torch.manual_seed(0)
    log_probs = torch.randn(6, 2, 4).log_softmax(2)
    targets = torch.tensor([[1, 2], [1, 1]])
    lengths = (torch.tensor([6, 5]), torch.tensor([2, 2]))
    expected = F.ctc_loss(log_probs, targets, *lengths)
    assert_close(F.ctc_loss(log_probs.npu(), targets.npu(), *lengths), expected, "ctc loss")


# ---- TransformerEncoder inference with a padding mask (nested tensors) -----------


@pytest.mark.generic_ops
def test_transformer_encoder_padding_mask_inference_matches_cpu():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    cpu = nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(8), enable_nested_tensor=True).eval()
    npu = copy.deepcopy(cpu).npu()
    x = torch.randn(3, 5, 8)
    mask = torch.tensor([[False] * 5, [False] * 3 + [True] * 2, [False] * 4 + [True]])
    torch_npu.NPUFallbackMode.reset_fallback_stats()
    with torch.no_grad():
        expected = cpu(x, src_key_padding_mask=mask)
        actual = npu(x.npu(), src_key_padding_mask=mask.npu())
    # Padded positions included: the fast path zeroes them on both devices.
    assert_close(actual, expected, "encoder output")
    assert torch_npu.NPUFallbackMode.get_fallback_stats().total == 0


def test_transformer_encoder_trains_like_cpu():
    torch.manual_seed(0)
    model = nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True), 2,
                                  enable_nested_tensor=False)
    mask = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    batches = [torch.randn(2, 5, 8) for _ in range(3)]

    def loss_of(m, x, device):
        return m(x.to(device), src_key_padding_mask=mask.to(device)).square().mean()

    train_on_both(model, lambda m: [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)], batches, loss_of)


def test_nested_tensor_ops_on_npu():
    parts = [torch.randn(2, 4), torch.randn(3, 4)]
    nested = torch.nested.nested_tensor([p.npu() for p in parts])
    assert nested.is_nested and nested.device.type == "npu"
    padded = torch.nested.to_padded_tensor(nested, 0.0)
    expected = torch.nested.to_padded_tensor(torch.nested.nested_tensor(parts), 0.0)
    assert_close(padded, expected, "padded nested tensor")


# ---- sparse embedding gradients with SparseAdam -----------------------------------


class SparseBag(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 5, sparse=True)
        self.head = nn.Linear(5, 2)

    def forward(self, ids):
        return self.head(self.emb(ids).mean(1))


def test_sparse_embedding_with_sparse_adam_trains_like_cpu():
    torch.manual_seed(0)
    model = SparseBag()
    batches = [torch.randint(0, VOCAB, (4, 3)) for _ in range(3)]
    labels = torch.tensor([0, 1, 1, 0])

    def optimizers(m):
        return [torch.optim.SparseAdam(list(m.emb.parameters()), lr=0.05),
                torch.optim.Adam(list(m.head.parameters()), lr=0.05)]

    def loss_of(m, ids, device):
        return F.cross_entropy(m(ids.to(device)), labels.to(device))

    torch_npu.NPUFallbackMode.reset_fallback_stats()
    npu_model = train_on_both(model, optimizers, batches, loss_of)
    assert npu_model.emb.weight.grad.layout == torch.sparse_coo
    assert torch_npu.NPUFallbackMode.get_fallback_stats().total == 0


def test_sparse_coo_tensor_ops_match_cpu():
    indices = torch.tensor([[0, 2, 0], [1, 0, 1]])
    values = torch.tensor([1.0, 2.0, 3.0])
    cpu = torch.sparse_coo_tensor(indices, values, (3, 3))
    npu = torch.sparse_coo_tensor(indices.npu(), values.npu(), (3, 3))
    assert npu.device.type == "npu" and not npu.is_coalesced()
    coalesced = npu.coalesce()
    assert coalesced.is_coalesced() and coalesced._nnz() == 2
    assert_close(coalesced._values(), cpu.coalesce()._values(), "coalesced values")
    dense = torch.ones(3, 3)
    assert_close(dense.npu().add_(npu), dense.clone().add_(cpu), "dense + sparse")
    assert_close(torch.sparse.mm(npu, dense.npu()), torch.sparse.mm(cpu, dense), "sparse @ dense")
    assert_close(npu.to_dense(), cpu.to_dense(), "to_dense")
    assert_close(dense.npu().sparse_mask(coalesced).to_dense(), dense.sparse_mask(cpu.coalesce()).to_dense(),
                 "sparse_mask")


# ---- ops that used to fall back for float32 ----------------------------------------


@pytest.fixture
def fallback_forbidden():
    torch_npu.set_fallback_mode("error")
    yield
    torch_npu.set_fallback_mode("auto")


@pytest.mark.generic_ops
def test_former_fallbacks_run_natively(fallback_forbidden):
    torch.manual_seed(0)
    emb_cpu = nn.Embedding(10, 4, max_norm=1.0)
    emb_npu = copy.deepcopy(emb_cpu).npu()
    ids = torch.tensor([1, 2, 1])
    assert_close(emb_npu(ids.npu()), emb_cpu(ids), "embedding with max_norm")
    assert_close(emb_npu.weight, emb_cpu.weight, "renormalised weight")
    x = torch.rand(5) + 0.5
    assert_close(torch.polygamma(2, x.npu()), torch.polygamma(2, x), "polygamma")
    a = torch.randn(4, 4)
    spd = a @ a.T + 4 * torch.eye(4)
    for fn in (torch.linalg.cholesky, torch.linalg.inv, lambda m: torch.linalg.eigh(m).eigenvalues,
               lambda m: torch.linalg.svd(m).S, lambda m: torch.linalg.qr(m).R,
               lambda m: torch.linalg.lu_factor(m).LU,
               lambda m: torch.linalg.solve_triangular(torch.linalg.cholesky(m), m, upper=False),
               lambda m: torch.view_as_real(torch.fft.rfft(m))):
        assert_close(fn(spd.npu()), fn(spd), "linalg/fft")
    counts = torch.full((4,), 10.0)
    assert torch.binomial(counts.npu(), torch.full((4,), 0.5).npu()).device.type == "npu"
    alpha = (torch.rand(3) + 1).npu().requires_grad_()
    torch._standard_gamma(alpha).sum().backward()  # _standard_gamma_grad
    assert math.isfinite(alpha.grad.sum().item())


def test_nested_and_sparse_tensors_move_between_devices():
    from conftest import NUM_DEVICES

    parts = [torch.randn(2, 3), torch.randn(1, 3)]
    nested = torch.nested.nested_tensor(parts).npu()
    assert nested.is_nested and nested.device.type == "npu"
    back = nested.cpu()
    assert back.device.type == "cpu" and back.is_nested
    expected = torch.nested.to_padded_tensor(torch.nested.nested_tensor(parts), 0.0)
    torch.testing.assert_close(torch.nested.to_padded_tensor(back, 0.0), expected)
    sparse = torch.sparse_coo_tensor(torch.tensor([[0, 2]]), torch.tensor([1.0, 2.0]), (4,))
    moved = sparse.npu()
    assert moved.layout == torch.sparse_coo and moved.device.type == "npu"
    assert moved.cpu().device.type == "cpu" and moved.cpu().to_dense().tolist() == [1.0, 0.0, 2.0, 0.0]
    if NUM_DEVICES > 1:
        assert nested.to("npu:1").device == torch.device("npu:1")
        assert moved.to("npu:1").device == torch.device("npu:1")


def test_rnn_backward_kernels_check_shapes():
    cx = torch.randn(2, 4).npu()
    with pytest.raises(RuntimeError, match="_thnn_fused_lstm_cell_backward_impl.*workspace"):
        torch.ops.aten._thnn_fused_lstm_cell_backward_impl(cx, None, cx, cx, torch.randn(2, 8).npu(), True)
    with pytest.raises(RuntimeError, match="_thnn_fused_gru_cell_backward.*workspace"):
        torch.ops.aten._thnn_fused_gru_cell_backward(cx, torch.randn(2, 12).npu(), True)
