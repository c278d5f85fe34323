"""The ops that fuse a collective of an "hccl" group with computation.

``torch_npu.<name>`` and ``torch.ops.npu.<name>`` with the Ascend adapter's
schemas (csrc/ops/fused/collective.cpp holds the schemas, meta kernels and
kernels). Each takes its group by the communicator name the group's backend
gives::

    name = group._get_backend(torch.device("npu")).get_hccl_comm_name(rank)

- ``npu_all_gather_base_mm``: ``all_gather(x1) @ x2 (+ bias)`` and the gathered x1;
- ``npu_mm_reduce_scatter_base``: ``reduce_scatter(x1 @ x2 (+ bias))`` along the rows;
- ``npu_moe_distribute_dispatch`` (``_v2``): expert parallelism, each token's top-k
  copies sent to the ranks that own its experts (optionally int8-quantized);
- ``npu_moe_distribute_combine`` (``_v2``): the experts' outputs back to the
  token's rank, summed with the router's weights (plus the shared expert's).

None has a derivative, as on Ascend.
"""
import torch

__all__ = [
    "npu_all_gather_base_mm",
    "npu_mm_reduce_scatter_base",
    "npu_moe_distribute_dispatch",
    "npu_moe_distribute_dispatch_v2",
    "npu_moe_distribute_combine",
    "npu_moe_distribute_combine_v2",
]

_ops = torch.ops.npu


def npu_all_gather_base_mm(input, x2, hcom, world_size, *, bias=None, x1_scale=None, x2_scale=None,  # noqa: A002
                           gather_index=0, gather_output=True, comm_turn=0, output_dtype=None, comm_mode=None):
    """``(output, gather_out)``: ``output = all_gather(input) @ x2 (+ bias)`` of shape
    ``(m * world_size, n)``, ``gather_out = all_gather(input)`` (``(m * world_size, k)``; an empty
    tensor when ``gather_output=False``), over the group named ``hcom``."""
    return _ops.npu_all_gather_base_mm(input, x2, hcom, world_size, bias=bias, x1_scale=x1_scale, x2_scale=x2_scale,
                                       gather_index=gather_index, gather_output=gather_output, comm_turn=comm_turn,
                                       output_dtype=output_dtype, comm_mode=comm_mode)


def npu_mm_reduce_scatter_base(input, x2, hcom, world_size, *, reduce_op="sum", bias=None,  # noqa: A002
                               x1_scale=None, x2_scale=None, comm_turn=0, output_dtype=None, comm_mode=None):
    """``reduce_scatter(input @ x2 (+ bias))``: this rank's ``m / world_size`` rows of the sum over
    the group named ``hcom``."""
    return _ops.npu_mm_reduce_scatter_base(input, x2, hcom, world_size, reduce_op=reduce_op, bias=bias,
                                           x1_scale=x1_scale, x2_scale=x2_scale, comm_turn=comm_turn,
                                           output_dtype=output_dtype, comm_mode=comm_mode)


def npu_moe_distribute_dispatch(x, expert_ids, group_ep, ep_world_size, ep_rank_id, moe_expert_num, **kwargs):
    """``(expand_x, dynamic_scales, expand_idx, expert_token_nums, ep_recv_counts, tp_recv_counts,
    expand_scales)``: the rows this rank's experts receive, by local expert then source rank."""
    return _ops.npu_moe_distribute_dispatch(x, expert_ids, group_ep, ep_world_size, ep_rank_id, moe_expert_num,
                                            **kwargs)


def npu_moe_distribute_dispatch_v2(x, expert_ids, group_ep, ep_world_size, ep_rank_id, moe_expert_num, **kwargs):
    """As ``npu_moe_distribute_dispatch``, the third result being ``assist_info_for_combine``."""
    return _ops.npu_moe_distribute_dispatch_v2(x, expert_ids, group_ep, ep_world_size, ep_rank_id, moe_expert_num,
                                               **kwargs)


def npu_moe_distribute_combine(expand_x, expert_ids, expand_idx, ep_send_counts, expert_scales, group_ep,
                               ep_world_size, ep_rank_id, moe_expert_num, **kwargs):
    """``(BS, H)``: ``sum_k expert_scales[t, k] * y(t, k) (+ shared_expert_x[t])`` on the token's rank."""
    return _ops.npu_moe_distribute_combine(expand_x, expert_ids, expand_idx, ep_send_counts, expert_scales, group_ep,
                                           ep_world_size, ep_rank_id, moe_expert_num, **kwargs)


def npu_moe_distribute_combine_v2(expand_x, expert_ids, assist_info_for_combine, ep_send_counts, expert_scales,
                                  group_ep, ep_world_size, ep_rank_id, moe_expert_num, **kwargs):
    """As ``npu_moe_distribute_combine``, with dispatch_v2's ``assist_info_for_combine``."""
    return _ops.npu_moe_distribute_combine_v2(expand_x, expert_ids, assist_info_for_combine, ep_send_counts,
                                              expert_scales, group_ep, ep_world_size, ep_rank_id, moe_expert_num,
                                              **kwargs)
