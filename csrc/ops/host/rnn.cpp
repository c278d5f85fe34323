// The fused LSTM and GRU cells. On every device but the cpu, ATen's nn.LSTM,
// nn.GRU, nn.LSTMCell and nn.GRUCell run a step as _thnn_fused_lstm_cell /
// _thnn_fused_gru_cell (and their backward ops); PyTorch has kernels for them
// on CUDA only, so the cpu fallback cannot serve them. These are the npu's:
// one pass over the gates per row, parallel over the batch, computing in
// float for the 16-bit types. The workspace layouts are the ones the backward
// kernels read (and the shapes PyTorch's meta functions give):
//   LSTM: [batch, 4 * hidden] = the activated gates i, f, g, o;
//   GRU:  [batch, 5 * hidden] = r, z, n, hx, and the hidden n-gate (with bias).
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/sum.h>
#include <torch/library.h>

#include "dtypes.h"

#include <cmath>
#include <functional>
#include <initializer_list>
#include <optional>

#include "../../core/device.h"
#include "host_execution.h"

namespace npu::ops {
namespace {

template <typename T>
T sigmoid(T x) {
  return T(1) / (T(1) + std::exp(-x));
}

// Row-major [rows, width] access to a tensor made contiguous; an undefined
// tensor (no bias, no incoming gradient) reads as zeros.
template <typename scalar_t>
struct Rows {
  const scalar_t* data = nullptr;
  int64_t width = 0;
  explicit Rows(const at::Tensor& t) {
    if (t.defined()) {
      data = t.const_data_ptr<scalar_t>();
      width = t.dim() == 1 ? 0 : t.size(-1);  // a bias vector is the same for every row
    }
  }
  at::opmath_type<scalar_t> at(int64_t row, int64_t col) const {
    return data == nullptr ? 0 : static_cast<at::opmath_type<scalar_t>>(data[row * width + col]);
  }
};

// A contiguous host view of the npu argument `name` of `op`.
at::Tensor input(HostExecution& exec, const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK(t.device() == exec.device(), "Expected all tensors to be on the same device, but found at least two "
              "devices, ", exec.device(), " and ", t.device(), "! (", op, ", argument '", name, "'; move it with .to('",
              exec.device(), "'))");
  return exec.alias(t).contiguous();
}
at::Tensor input(HostExecution& exec, const char* op, const char* name, const std::optional<at::Tensor>& t) {
  return t.has_value() && t->defined() ? input(exec, op, name, *t) : at::Tensor();
}

void checkCell(const char* op, const at::Tensor& input_gates, const at::Tensor& hidden_gates, const at::Tensor& state,
               const std::optional<at::Tensor>& input_bias, const std::optional<at::Tensor>& hidden_bias,
               int64_t gates) {
  for (const auto* bias : {&input_bias, &hidden_bias}) {
    TORCH_CHECK(!bias->has_value() || !(*bias)->defined() ||
                    ((*bias)->dim() == 1 && (*bias)->size(0) == input_gates.size(-1) &&
                     (*bias)->scalar_type() == input_gates.scalar_type()),
                op, " on npu: a bias must be a vector of the gates' size and dtype, got ", (*bias)->sizes(), " ",
                (*bias)->scalar_type());
  }
  TORCH_CHECK(input_gates.dim() == 2 && hidden_gates.sizes() == input_gates.sizes() && state.dim() == 2 &&
                  state.size(0) == input_gates.size(0) && input_gates.size(1) == gates * state.size(1),
              op, " on npu: expected input_gates and hidden_gates of shape [batch, ", gates,
              " * hidden] and a state of shape [batch, hidden], got ", input_gates.sizes(), ", ",
              hidden_gates.sizes(), " and ", state.sizes());
  TORCH_CHECK(input_gates.scalar_type() == hidden_gates.scalar_type() &&
                  input_gates.scalar_type() == state.scalar_type(),
              op, " on npu: the gates and the state must have one dtype, got ", input_gates.scalar_type(), ", ",
              hidden_gates.scalar_type(), " and ", state.scalar_type());
}

// The backward kernels index the workspace by the state's shape: every state
// and gradient must be [batch, hidden] and the workspace [batch, slots * hidden],
// all of one dtype.
void checkBackward(const char* op, std::initializer_list<std::reference_wrapper<const at::Tensor>> states,
                   const at::Tensor& workspace, int64_t slots, std::initializer_list<const at::Tensor*> grads) {
  const at::Tensor& first = states.begin()->get();
  TORCH_CHECK(first.dim() == 2, op, " on npu: expected a state of shape [batch, hidden], got ", first.sizes());
  auto same = [&](const at::Tensor& t) {
    TORCH_CHECK(t.sizes() == first.sizes() && t.scalar_type() == first.scalar_type(), op,
                " on npu: expected [batch, hidden] = ", first.sizes(), " of dtype ", first.scalar_type(), ", got ",
                t.sizes(), " of dtype ", t.scalar_type());
  };
  for (const at::Tensor& t : states) same(t);
  for (const at::Tensor* g : grads) {
    if (g != nullptr) same(*g);
  }
  TORCH_CHECK(workspace.dim() == 2 && workspace.size(0) == first.size(0) &&
                  workspace.size(1) == slots * first.size(1) && workspace.scalar_type() == first.scalar_type(),
              op, " on npu: expected a workspace of shape [", first.size(0), ", ", slots * first.size(1), "] and dtype ",
              first.scalar_type(), ", got ", workspace.sizes(), " ", workspace.scalar_type());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> lstmCell(const at::Tensor& input_gates, const at::Tensor& hidden_gates,
                                                        const at::Tensor& cx,
                                                        const std::optional<at::Tensor>& input_bias,
                                                        const std::optional<at::Tensor>& hidden_bias) {
  checkCell("aten::_thnn_fused_lstm_cell", input_gates, hidden_gates, cx, input_bias, hidden_bias, 4);
  HostExecution exec(input_gates.device(), "aten::_thnn_fused_lstm_cell");
  constexpr const char* op = "aten::_thnn_fused_lstm_cell";
  const at::Tensor ig = input(exec, op, "input_gates", input_gates);
  const at::Tensor hg = input(exec, op, "hidden_gates", hidden_gates);
  const at::Tensor c = input(exec, op, "cx", cx);
  const at::Tensor ib = input(exec, op, "input_bias", input_bias);
  const at::Tensor hb = input(exec, op, "hidden_bias", hidden_bias);
  const int64_t batch = c.size(0);
  const int64_t hidden = c.size(1);
  at::Tensor hy = at::empty({batch, hidden}, c.options());
  at::Tensor cy = at::empty({batch, hidden}, c.options());
  at::Tensor workspace = at::empty({batch, 4 * hidden}, c.options());
  NPU_DISPATCH_FLOATING_TYPES(c.scalar_type(), "_thnn_fused_lstm_cell", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const Rows<scalar_t> in(ig), hid(hg), state(c), bi(ib), bh(hb);
    scalar_t* hy_p = hy.mutable_data_ptr<scalar_t>();
    scalar_t* cy_p = cy.mutable_data_ptr<scalar_t>();
    scalar_t* ws = workspace.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, batch, 1, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        for (int64_t j = 0; j < hidden; ++j) {
          auto gate = [&](int64_t k) {
            const int64_t col = k * hidden + j;
            return in.at(b, col) + hid.at(b, col) + bi.at(0, col) + bh.at(0, col);
          };
          const acc_t i = sigmoid(gate(0));
          const acc_t f = sigmoid(gate(1));
          const acc_t g = std::tanh(gate(2));
          const acc_t o = sigmoid(gate(3));
          const acc_t c_new = f * state.at(b, j) + i * g;
          cy_p[b * hidden + j] = static_cast<scalar_t>(c_new);
          hy_p[b * hidden + j] = static_cast<scalar_t>(o * std::tanh(c_new));
          scalar_t* w = ws + b * 4 * hidden + j;
          w[0] = static_cast<scalar_t>(i);
          w[hidden] = static_cast<scalar_t>(f);
          w[2 * hidden] = static_cast<scalar_t>(g);
          w[3 * hidden] = static_cast<scalar_t>(o);
        }
      }
    });
  });
  return {exec.toNpu(hy), exec.toNpu(cy), exec.toNpu(workspace)};
}

// -> (grad_gates, grad_cx, grad_bias): the gradient of the pre-activation gates
// (input and hidden gates get the same one), of cx, and of each bias.
std::tuple<at::Tensor, at::Tensor, at::Tensor> lstmCellBackward(const std::optional<at::Tensor>& grad_hy,
                                                                const std::optional<at::Tensor>& grad_cy,
                                                                const at::Tensor& cx, const at::Tensor& cy,
                                                                const at::Tensor& workspace, bool has_bias) {
  constexpr const char* op = "aten::_thnn_fused_lstm_cell_backward_impl";
  const bool has_hy = grad_hy.has_value() && grad_hy->defined();
  const bool has_cy = grad_cy.has_value() && grad_cy->defined();
  if (!has_hy && !has_cy) return {};  // as on CUDA: no incoming gradient, none going out
  checkBackward(op, {cx, cy}, workspace, 4, {has_hy ? &*grad_hy : nullptr, has_cy ? &*grad_cy : nullptr});
  HostExecution exec(cx.device(), op);
  const at::Tensor ghy = input(exec, op, "grad_hy", grad_hy);
  const at::Tensor gcy = input(exec, op, "grad_cy", grad_cy);
  const at::Tensor c = input(exec, op, "cx", cx);
  const at::Tensor c_new = input(exec, op, "cy", cy);
  const at::Tensor ws = input(exec, op, "workspace", workspace);
  const int64_t batch = c.size(0);
  const int64_t hidden = c.size(1);
  at::Tensor grad_gates = at::empty({batch, 4 * hidden}, c.options());
  at::Tensor grad_cx = at::empty({batch, hidden}, c.options());
  NPU_DISPATCH_FLOATING_TYPES(c.scalar_type(), "_thnn_fused_lstm_cell_backward_impl", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const Rows<scalar_t> go(ghy), goc(gcy), state(c), state_new(c_new), gates(ws);
    scalar_t* gg = grad_gates.mutable_data_ptr<scalar_t>();
    scalar_t* gcx_p = grad_cx.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, batch, 1, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        for (int64_t j = 0; j < hidden; ++j) {
          const acc_t i = gates.at(b, j), f = gates.at(b, hidden + j);
          const acc_t g = gates.at(b, 2 * hidden + j), o = gates.at(b, 3 * hidden + j);
          const acc_t tanh_c = std::tanh(state_new.at(b, j));
          const acc_t grad_c = go.at(b, j) * o * (1 - tanh_c * tanh_c) + goc.at(b, j);
          scalar_t* out = gg + b * 4 * hidden + j;
          out[0] = static_cast<scalar_t>(grad_c * g * (1 - i) * i);
          out[hidden] = static_cast<scalar_t>(grad_c * state.at(b, j) * (1 - f) * f);
          out[2 * hidden] = static_cast<scalar_t>(grad_c * i * (1 - g * g));
          out[3 * hidden] = static_cast<scalar_t>(go.at(b, j) * tanh_c * (1 - o) * o);
          gcx_p[b * hidden + j] = static_cast<scalar_t>(grad_c * f);
        }
      }
    });
  });
  at::Tensor grad_bias = has_bias ? grad_gates.sum(0) : at::Tensor();
  return {exec.toNpu(grad_gates), exec.toNpu(grad_cx), exec.toNpu(grad_bias)};
}

std::tuple<at::Tensor, at::Tensor> gruCell(const at::Tensor& input_gates, const at::Tensor& hidden_gates,
                                           const at::Tensor& hx, const std::optional<at::Tensor>& input_bias,
                                           const std::optional<at::Tensor>& hidden_bias) {
  checkCell("aten::_thnn_fused_gru_cell", input_gates, hidden_gates, hx, input_bias, hidden_bias, 3);
  HostExecution exec(input_gates.device(), "aten::_thnn_fused_gru_cell");
  constexpr const char* op = "aten::_thnn_fused_gru_cell";
  const at::Tensor ig = input(exec, op, "input_gates", input_gates);
  const at::Tensor hg = input(exec, op, "hidden_gates", hidden_gates);
  const at::Tensor h = input(exec, op, "hx", hx);
  const at::Tensor ib = input(exec, op, "input_bias", input_bias);
  const at::Tensor hb = input(exec, op, "hidden_bias", hidden_bias);
  const int64_t batch = h.size(0);
  const int64_t hidden = h.size(1);
  at::Tensor hy = at::empty({batch, hidden}, h.options());
  at::Tensor workspace = at::empty({batch, 5 * hidden}, h.options());
  NPU_DISPATCH_FLOATING_TYPES(h.scalar_type(), "_thnn_fused_gru_cell", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const Rows<scalar_t> in(ig), hid(hg), state(h), bi(ib), bh(hb);
    scalar_t* hy_p = hy.mutable_data_ptr<scalar_t>();
    scalar_t* ws = workspace.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, batch, 1, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        for (int64_t j = 0; j < hidden; ++j) {
          auto input = [&](int64_t k) { return in.at(b, k * hidden + j) + bi.at(0, k * hidden + j); };
          auto hiddn = [&](int64_t k) { return hid.at(b, k * hidden + j) + bh.at(0, k * hidden + j); };
          const acc_t r = sigmoid(input(0) + hiddn(0));
          const acc_t z = sigmoid(input(1) + hiddn(1));
          const acc_t hn = hiddn(2);
          const acc_t n = std::tanh(input(2) + r * hn);
          const acc_t h_old = state.at(b, j);
          hy_p[b * hidden + j] = static_cast<scalar_t>(n + z * (h_old - n));
          scalar_t* w = ws + b * 5 * hidden + j;
          w[0] = static_cast<scalar_t>(r);
          w[hidden] = static_cast<scalar_t>(z);
          w[2 * hidden] = static_cast<scalar_t>(n);
          w[3 * hidden] = static_cast<scalar_t>(h_old);
          w[4 * hidden] = static_cast<scalar_t>(hn);
        }
      }
    });
  });
  return {exec.toNpu(hy), exec.toNpu(workspace)};
}

// -> (grad_input_gates, grad_hidden_gates, grad_hx, grad_input_bias, grad_hidden_bias)
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> gruCellBackward(const at::Tensor& grad_hy,
                                                                                       const at::Tensor& workspace,
                                                                                       bool has_bias) {
  constexpr const char* op = "aten::_thnn_fused_gru_cell_backward";
  checkBackward(op, {grad_hy}, workspace, 5, {});
  HostExecution exec(workspace.device(), op);
  const at::Tensor go_t = input(exec, op, "grad_hy", grad_hy);
  const at::Tensor ws = input(exec, op, "workspace", workspace);
  const int64_t batch = go_t.size(0);
  const int64_t hidden = go_t.size(1);
  at::Tensor grad_input = at::empty({batch, 3 * hidden}, go_t.options());
  at::Tensor grad_hidden = at::empty({batch, 3 * hidden}, go_t.options());
  at::Tensor grad_hx = at::empty({batch, hidden}, go_t.options());
  NPU_DISPATCH_FLOATING_TYPES(go_t.scalar_type(), "_thnn_fused_gru_cell_backward", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const Rows<scalar_t> go(go_t), saved(ws);
    scalar_t* gi = grad_input.mutable_data_ptr<scalar_t>();
    scalar_t* gh = grad_hidden.mutable_data_ptr<scalar_t>();
    scalar_t* ghx = grad_hx.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, batch, 1, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        for (int64_t j = 0; j < hidden; ++j) {
          const acc_t r = saved.at(b, j), z = saved.at(b, hidden + j), n = saved.at(b, 2 * hidden + j);
          const acc_t h_old = saved.at(b, 3 * hidden + j), hn = saved.at(b, 4 * hidden + j);
          const acc_t g = go.at(b, j);
          const acc_t grad_z = g * (h_old - n) * (1 - z) * z;
          const acc_t grad_n = g * (1 - z) * (1 - n * n);
          const acc_t grad_r = grad_n * hn * (1 - r) * r;
          scalar_t* i_row = gi + b * 3 * hidden + j;
          scalar_t* h_row = gh + b * 3 * hidden + j;
          i_row[0] = h_row[0] = static_cast<scalar_t>(grad_r);
          i_row[hidden] = h_row[hidden] = static_cast<scalar_t>(grad_z);
          i_row[2 * hidden] = static_cast<scalar_t>(grad_n);
          h_row[2 * hidden] = static_cast<scalar_t>(grad_n * r);
          ghx[b * hidden + j] = static_cast<scalar_t>(g * z);
        }
      }
    });
  });
  at::Tensor grad_input_bias = has_bias ? grad_input.sum(0) : at::Tensor();
  at::Tensor grad_hidden_bias = has_bias ? grad_hidden.sum(0) : at::Tensor();
  return {exec.toNpu(grad_input), exec.toNpu(grad_hidden), exec.toNpu(grad_hx), exec.toNpu(grad_input_bias),
          exec.toNpu(grad_hidden_bias)};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_thnn_fused_lstm_cell", TORCH_FN(lstmCell));
  m.impl("_thnn_fused_lstm_cell_backward_impl", TORCH_FN(lstmCellBackward));
  m.impl("_thnn_fused_gru_cell", TORCH_FN(gruCell));
  m.impl("_thnn_fused_gru_cell_backward", TORCH_FN(gruCellBackward));
}

}  // namespace npu::ops
