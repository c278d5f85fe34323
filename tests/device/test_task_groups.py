"""The Ascend adapter's graph and event names (vllm-ascend's full-decode graphs):
torch.npu.ExternalEvent, torch.npu.Event(external=True), and task groups, whose
captured work an update on another stream replaces before a replay. Checked against
eager results computed on the cpu."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import torch_npu


def _attention_cpu(q, k, v, lengths, scale):
    """Decode attention (BNSD, one query per sequence) over the first lengths[b] keys, in float32."""
    out = []
    for b, n in enumerate(lengths):
        scores = (q[b].float() @ k[b, :, :n].float().transpose(-1, -2)) * scale
        out.append(scores.softmax(-1) @ v[b, :, :n].float())
    return torch.stack(out)


def test_task_group_update_replaces_the_captured_work():
    """The work between group begin and end is replaced by the update's; the work around the
    group stays; the next replays run the new work, as many times as they replay."""
    torch.manual_seed(0)
    x_cpu, w_cpu = torch.randn(4, 8), torch.randn(8, 8)
    x, w = x_cpu.npu(), w_cpu.npu()
    mid, out = torch.empty(4, 8, device="npu"), torch.empty(4, 8, device="npu")
    s = torch.npu.Stream()
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g, stream=s):
        torch.mm(x, w, out=mid)
        torch.npu.graph_task_group_begin(s)
        torch.mul(mid, 2.0, out=out)
        handle = torch.npu.graph_task_group_end(s)
        final = out + 1
    assert isinstance(handle, torch_npu._C._NPUTaskGroupHandle) and handle.task_group == 0
    g.replay()
    torch.testing.assert_close(final.cpu(), x_cpu @ w_cpu * 2 + 1)
    update = torch.npu.Stream()
    for factor in (3.0, -0.5):
        with torch.npu.stream(update):
            torch.npu.graph_task_update_begin(update, handle)
            torch.mul(mid, factor, out=out)      # recorded for the group, not run
            torch.sub(out, 1.0, out=out)         # an update may launch more (or less) than the capture did
            torch.npu.graph_task_update_end(update)
        x_cpu = torch.randn(4, 8)
        x.copy_(x_cpu)
        g.replay()
        g.replay()
        torch.testing.assert_close(final.cpu(), x_cpu @ w_cpu * factor - 1 + 1)


def test_vllm_ascend_decode_pattern_with_external_events():
    """vllm-ascend's full-decode graph: at capture, an ExternalEvent wait and reset, then the
    attention op in a task group; before each replay, the op again on an update stream with new
    sequence lengths, then the event recorded there. The replay attends over the new lengths."""
    torch.manual_seed(0)
    B, N, S, D, scale = 2, 2, 16, 8, 0.3
    q, k, v = (torch.randn(B, N, n, D).half() for n in (1, S, S))
    qn, kn, vn = q.npu(), k.npu(), v.npu()
    lengths = [5, 9]
    common = dict(num_heads=N, scale=scale, input_layout="BNSD")
    attn_out, lse = torch.empty_like(qn), torch.empty(1, device="npu")
    workspace = torch_npu._npu_fused_infer_attention_score_get_max_workspace(
        qn, kn, vn, actual_seq_lengths_kv=lengths, **common)
    s = torch.npu.Stream()
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g, stream=s):
        event = torch.npu.ExternalEvent()
        event.wait(s)
        event.reset(s)
        torch.npu.graph_task_group_begin(s)
        torch_npu.npu_fused_infer_attention_score.out(qn, kn, vn, actual_seq_lengths_kv=lengths, **common,
                                                       workspace=workspace, out=[attn_out, lse])
        handle = torch.npu.graph_task_group_end(s)
        doubled = attn_out * 2
    update_stream = torch.npu.Stream()
    for new_lengths in ([3, 16], [16, 1], [7, 7]):
        with torch.npu.stream(update_stream):
            torch.npu.graph_task_update_begin(update_stream, handle)
            torch_npu.npu_fused_infer_attention_score.out(qn, kn, vn, actual_seq_lengths_kv=new_lengths, **common,
                                                           workspace=workspace, out=[attn_out, lse])
            torch.npu.graph_task_update_end(update_stream)
            event.record(update_stream)
        g.replay()
        expected = _attention_cpu(q, k, v, new_lengths, scale)
        torch.testing.assert_close(attn_out.cpu().float(), expected, atol=2e-3, rtol=2e-3)
        torch.testing.assert_close(doubled.cpu().float(), expected * 2, atol=4e-3, rtol=4e-3)


def test_external_event_wait_may_come_before_its_record():
    x = torch.zeros(64, device="npu")
    torch.npu.synchronize()                    # x is written on the default stream, read on others
    producer, consumer = torch.npu.Stream(), torch.npu.Stream()
    event = torch.npu.ExternalEvent()
    event.wait(consumer)                       # before the record: the consumer holds back its later work
    with torch.npu.stream(consumer):
        y = x * 2
    with torch.npu.stream(producer):
        x.fill_(5.0)
        event.record(producer)
    consumer.synchronize()
    assert y.cpu().tolist() == [10.0] * 64


def test_external_event_record_then_wait_and_reset():
    x = torch.zeros(8, device="npu")
    torch.npu.synchronize()                    # x is written on the default stream, read on others
    a, b = torch.npu.Stream(), torch.npu.Stream()
    event = torch.npu.ExternalEvent()
    with torch.npu.stream(a):
        x.add_(3)
        event.record(a)
    event.wait(b)
    with torch.npu.stream(b):
        y = x + 1
    b.synchronize()
    assert y.cpu().tolist() == [4.0] * 8
    event.record(a)
    event.record(a)
    a.synchronize()
    assert event._event.pending() == 2          # each wait consumes one record
    event.reset(a)
    a.synchronize()
    assert event._event.pending() == 0
    assert "ExternalEvent" in repr(event) and event.npu_event != 0


def test_event_external_records_and_waits_at_each_replay():
    """torch.npu.Event(external=True), as torch.cuda's: recorded or waited on a capturing stream,
    it is a node of the graph, done at each replay, not at capture."""
    x = torch.zeros(32, device="npu")
    torch.npu.synchronize()                    # x is written on the default stream, read on others
    done, ready = torch.npu.Event(external=True), torch.npu.Event(external=True)
    s = torch.npu.Stream()
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g, stream=s):
        ready.wait(s)
        y = x + 1
        done.record(s)
    assert done.event_id == 0                   # not recorded at capture
    other = torch.npu.Stream()
    for value in (1.0, 4.0):
        with torch.npu.stream(other):
            x.fill_(value)
            ready.record(other)
        g.replay()
        other.wait_event(done)
        with torch.npu.stream(other):
            z = y * 2
        other.synchronize()
        assert z.cpu().tolist() == [(value + 1) * 2] * 32
    assert done.event_id != 0
    with pytest.raises(ValueError, match="external and interprocess"):
        torch.npu.Event(external=True, interprocess=True)


def test_task_group_errors_name_the_call_and_the_remedy():
    s = torch.npu.Stream()
    with pytest.raises(RuntimeError, match="graph_task_group_begin: stream .* is not capturing"):
        torch.npu.graph_task_group_begin(s)
    x = torch.ones(4, device="npu")
    g = torch.npu.NPUGraph()
    with pytest.raises(RuntimeError, match="graph_task_group_begin.. without its graph_task_group_end"):
        with torch.npu.graph(g, stream=s):
            torch.npu.graph_task_group_begin(s)
            x.add_(1)
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g, stream=s):
        torch.npu.graph_task_group_begin(s)
        x.add_(1)
        handle = torch.npu.graph_task_group_end(s)
        with pytest.raises(RuntimeError, match="must be another stream"):
            torch.npu.graph_task_update_begin(s, handle)
        with pytest.raises(RuntimeError, match="no task group open"):
            torch.npu.graph_task_group_end(s)
    update = torch.npu.Stream()
    torch.npu.graph_task_update_begin(update, handle)
    with pytest.raises(RuntimeError, match="graph_task_update_end.. first"):
        g.replay()
    with torch.npu.stream(update), pytest.raises(RuntimeError, match="not permitted"):
        x.sum().item()                          # host reads are refused while updating, as in a capture
    with pytest.raises(RuntimeError, match="invalidated"):
        torch.npu.graph_task_update_end(update)
    g.replay()                                  # the group kept its captured work
    assert x.cpu().tolist() == [2.0] * 4
    with pytest.raises(RuntimeError, match="not updating a task group"):
        torch.npu.graph_task_update_end(update)
    g.reset()
    with pytest.raises(RuntimeError, match="reset, captured again or destroyed"):
        torch.npu.graph_task_update_begin(update, handle)
    with pytest.raises(TypeError, match="expected the handle"):
        torch.npu.graph_task_update_begin(update, 0)


def test_auto_dispatch_capture_and_update():
    """torch.npu.graph(g, auto_dispatch_capture=True): the attention op is captured in its own
    task group; g.update([{...}]) gives it new sequence lengths for the next replays."""
    torch.manual_seed(1)
    B, N, S, D, scale = 2, 2, 12, 8, 0.25
    q, k, v = (torch.randn(B, N, n, D).half() for n in (1, S, S))
    qn, kn, vn = q.npu(), k.npu(), v.npu()
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g, auto_dispatch_capture=True):
        out, _ = torch_npu.npu_fused_infer_attention_score(qn, kn, vn, num_heads=N, scale=scale, input_layout="BNSD",
                                                           actual_seq_lengths_kv=[4, 6])
        total = out.sum(dim=-1)
    assert len(g.graph_dispatch_mode.records) == 1
    # Each replay waits for an update (the op's ExternalEvent), as on the adapter.
    for lengths in ([4, 6], [12, 2], [1, 9]):
        g.update([{"actual_seq_lengths_kv": lengths}])
        g.replay()
        expected = _attention_cpu(q, k, v, lengths, scale)
        torch.testing.assert_close(out.cpu().float(), expected, atol=2e-3, rtol=2e-3)
        torch.testing.assert_close(total.cpu().float(), expected.sum(-1), atol=1e-2, rtol=1e-2)
    with pytest.raises(RuntimeError, match="captured 1 updatable ops"):
        g.update([{}, {}])
    with pytest.raises(ValueError, match="'actual_seq_length'.*actual_seq_lengths_kv"):
        g.update([{"actual_seq_length": [2, 2]}])     # misspelt: refused, not ignored
    g.update([{"actual_seq_lengths_kv": [1, 9]}])      # the group kept its work: it updates and replays
    g.replay()
    torch.testing.assert_close(out.cpu().float(), _attention_cpu(q, k, v, [1, 9], scale), atol=2e-3, rtol=2e-3)
    plain = torch.npu.NPUGraph()
    with torch.npu.graph(plain):
        qn.add_(0)
    with pytest.raises(RuntimeError, match="auto_dispatch_capture=True"):
        plain.update([{}])


def test_fused_ops_are_captured_and_replayed_on_new_inputs():
    """The npu library's fused ops run on the host; under a capture they are recorded (outputs from
    their Meta kernel) and computed at each replay, in inference mode too (vllm's)."""
    torch.manual_seed(2)
    x_cpu, gamma_cpu = torch.randn(3, 16), torch.randn(16)
    x, gamma = x_cpu.npu(), gamma_cpu.npu()

    def rms(t, w):
        return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6) * w

    with torch.inference_mode():
        g = torch.npu.NPUGraph()
        with torch.npu.graph(g):
            y, _ = torch_npu.npu_rms_norm(x, gamma, epsilon=1e-6)
            z = y * 2
        for _ in range(2):
            x_cpu = torch.randn(3, 16)
            x.copy_(x_cpu)
            g.replay()
            torch.testing.assert_close(z.cpu(), rms(x_cpu, gamma_cpu) * 2, atol=1e-5, rtol=1e-5)


def _run_bounded(code, timeout=120):
    """Runs `code` in a fresh interpreter, failing (not hanging) if it does not end in time."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [os.path.dirname(os.path.dirname(torch_npu.__file__)),
                                                     env.get("PYTHONPATH", "")] if p)
    try:
        done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"did not end within {timeout} s (a wait ran on the caller's thread?)")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "OK" in done.stdout


def test_replay_before_the_external_record_does_not_hang():
    """vllm-ascend's order: replay first, then update the task group and record the event
    the graph waits for. The captured wait waits on the stream, never on the replaying thread."""
    _run_bounded("""
        import torch, torch_npu
        x = torch.arange(4.0, device="npu")
        torch.npu.synchronize()
        s, other = torch.npu.Stream(), torch.npu.Stream()
        ev = torch.npu.ExternalEvent()
        g = torch.npu.NPUGraph()
        with torch.npu.graph(g, stream=s):
            ev.wait(s)
            ev.reset(s)
            y = x * 3
            torch.npu.graph_task_group_begin(s)
            z = y + 1
            handle = torch.npu.graph_task_group_end(s)
        for step in range(3):
            g.replay()                                  # queued behind the wait
            with torch.npu.stream(other):               # then update, then record
                torch.npu.graph_task_update_begin(other, handle)
                torch.add(y, 10.0 * (step + 1), out=z)
                torch.npu.graph_task_update_end(other)
                ev.record(other)
            s.synchronize()
            assert y.cpu().tolist() == [0.0, 3.0, 6.0, 9.0]
            assert z.cpu().tolist() == [v * 3 + (1.0 if step == 0 else 10.0 * step) for v in range(4)], z
        print("OK")
    """)


def test_eager_external_wait_after_reset_or_replays_does_not_block():
    """An eager wait never blocks its caller, whatever records came before: after a reset, or
    once replays consumed them, its record may still come later from this thread."""
    _run_bounded("""
        import torch, torch_npu
        a, b = torch.npu.Stream(), torch.npu.Stream()
        e = torch.npu.ExternalEvent()
        x = torch.zeros(4, device="npu")
        torch.npu.synchronize()
        e.record(a)
        torch.npu.synchronize()
        e.reset(a)
        torch.npu.synchronize()
        e.wait(b)                                       # no record left: waits on b, not here
        with torch.npu.stream(b):
            y = x + 1
        with torch.npu.stream(a):
            x.fill_(2.0)
            e.record(a)
        b.synchronize()
        assert y.cpu().tolist() == [3.0] * 4
        # Records consumed by a replay's wait do not count for an eager wait.
        g = torch.npu.NPUGraph()
        s = torch.npu.Stream()
        with torch.npu.graph(g, stream=s):
            e.wait(s)
            w = x * 2
        e.record(a)
        g.replay()
        s.synchronize()
        e.wait(b)
        with torch.npu.stream(b):
            v = x + 5
        e.record(a)
        b.synchronize()
        assert w.cpu().tolist() == [4.0] * 4 and v.cpu().tolist() == [7.0] * 4
        print("OK")
    """)


def test_update_leaves_replays_queued_on_other_streams_their_work():
    """Replays queued on two streams (both waiting for an event), then an update: the update
    waits for neither; the queued replays run the work they were launched with, the next the new."""
    _run_bounded("""
        import torch, torch_npu
        x = torch.arange(4.0, device="npu")
        torch.npu.synchronize()
        s, first, second, other = (torch.npu.Stream() for _ in range(4))
        ev = torch.npu.ExternalEvent()
        g = torch.npu.NPUGraph()
        with torch.npu.graph(g, stream=s):
            ev.wait(s)
            torch.npu.graph_task_group_begin(s)
            z = x * 2
            handle = torch.npu.graph_task_group_end(s)
        outs = []
        for stream in (first, second):
            with torch.npu.stream(stream):
                g.replay()                              # waits for ev on its stream
                outs.append(z + 0)
        with torch.npu.stream(other):
            torch.npu.graph_task_update_begin(other, handle)
            torch.mul(x, 5.0, out=z)
            torch.npu.graph_task_update_end(other)      # does not wait for the queued replays
        with torch.npu.stream(other):
            ev.record(other)
            ev.record(other)
        torch.npu.synchronize()
        assert [o.cpu().tolist() for o in outs] == [[0.0, 2.0, 4.0, 6.0]] * 2, outs
        ev.record(other)
        other.synchronize()
        with torch.npu.stream(first):
            g.replay()
        first.synchronize()
        assert z.cpu().tolist() == [0.0, 5.0, 10.0, 15.0]
        print("OK")
    """)
