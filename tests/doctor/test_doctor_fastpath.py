"""The doctor's per-op shortcuts (an op described once, a frame's site remembered, plain ops
past the classification rules) report exactly what the full path reports, on loops whose
behaviour changes mid-way: the same counts per line and the same findings."""
import torch

from torch_npu.doctor import Doctor, _monitor

# What a Site counts, compared as is (times, frames and weak references left out: they differ
# between two runs by nature).
_COUNTS = ("ops", "direct_ops", "direct_small", "steps_hit", "most_ops_per_call", "h2d", "h2d_bytes",
           "h2d_repeats", "h2d_steps", "syncs", "sync_steps", "d2h_bytes", "strided_copies", "strided_bytes",
           "strided_writes", "strided_steps", "strided_repeats", "f64_created", "f64_ops", "f16_ops", "bf16_ops",
           "h2d_fresh", "h2d_fresh_bytes", "h2d_fresh_steps", "kept_steps", "kept_bytes", "kept_graph",
           "backward_ops", "direct_small", "library_syncs", "callers")
_COUNTERS = ("op_names", "sync_kinds", "sync_forms", "fallbacks", "fallback_backward", "h2d_origins", "via")


def _site_counts(site):
    counts = {name: getattr(site, name) for name in _COUNTS}
    counts.update({name: dict(getattr(site, name)) for name in _COUNTERS})
    counts["h2d_seen"] = len(site.h2d_seen)
    counts["loop"] = None if site.loop is None else (site.loop.file, site.loop.line)
    counts["loop_hits"] = {(event, loop.line): hit[1] for (event, loop), hit in site.loop_hits.items()}
    return counts


def _observed(doctor):
    monitor = doctor.monitor
    sites = {key: _site_counts(site) for key, site in monitor.sites.items()}
    loops = {(loop.file, loop.line): (loop.boundaries, loop.frames, loop.data) for loop in monitor.loops.values()}
    # launch_bound, strided_copy (a share of the op time) and the minor mark are decided from
    # host times: not compared (their counts are, in the sites)
    findings = sorted((f.kind, f.file, f.line, f.count) for f in doctor.findings
                      if f.kind not in ("launch_bound", "strided_copy"))
    return {"sites": sites, "loops": loops, "findings": findings, "steps": monitor.step,
            "total_ops": monitor.total_ops, "op_calls": dict(monitor.op_calls),
            "host_op_calls": {str(op): n for op, n in monitor.host_op_calls.items()}}


def _both(monkeypatch, fn):
    """What the doctor saw of fn() with its shortcuts, and with the full path."""
    seen = []
    for monitor in (_monitor.Monitor, _monitor.FullPathMonitor):
        monkeypatch.setattr(_monitor, "Monitor", monitor)
        torch.manual_seed(0)
        with Doctor(profile=False) as d:
            fn()
        assert type(d.monitor) is monitor
        seen.append(_observed(d))
    monkeypatch.undo()
    return seen


def _scale(t):
    return t * 0.5   # a helper called from the loop: a new frame on each call


def test_a_loop_that_changes_mid_way_is_reported_the_same_by_the_fast_path(monkeypatch):
    def loop():
        w = torch.randn(16, 16, device="npu") * 0.1
        x = torch.zeros(16, 16, device="npu")
        history = []
        total = 0.0
        for i in range(24):
            x = torch.tanh(x @ w)
            for _ in range(4):
                x = x + 0.01                                        # tiny ops, one line, every iteration
            x = _scale(x)
            if i >= 10:
                x = x + torch.randn(16, 16).to("npu")              # host data made in the loop from 10 on
            if i >= 5:
                total += x.sum().item()                             # a sync from 5 on
            if i >= 15:
                total += float(x.double().mean())                   # float64 from 15 on
            if i >= 12:
                x.t().mul_(1.0)                                     # a strided in-place write from 12 on
            if i >= 8:
                history.append(x.clone())                           # tensors kept from 8 on
            y = x[:, ::2].contiguous()                              # a strided copy, each iteration
            x = x + y.sum()
        return total

    fast, full = _both(monkeypatch, loop)
    assert fast["steps"] >= 20 and fast["total_ops"] > 24 * 10
    assert {k for k, *_ in fast["findings"]} >= {"host_to_device_copy", "hidden_sync", "float64"}
    assert fast == full


def test_ops_with_kwargs_lists_views_and_a_backward_pass_are_reported_the_same(monkeypatch):
    def train():
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to("npu")
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for i in range(12):
            x = torch.randn(4, 8, device="npu")
            parts = [x[:, :4], x[:, 4:]]                            # views
            x = torch.cat(parts, dim=1)                             # a list argument
            x = torch.clamp(x, min=-1.0, max=1.0)                   # keyword arguments
            loss = model(x).square().mean()
            if i >= 6:
                loss = loss + torch.tensor([0.5], device="npu").sum()   # host data lifted from 6 on
            loss.backward()
            opt.step()
            opt.zero_grad()

    fast, full = _both(monkeypatch, train)
    assert fast["steps"] == 12
    assert fast == full
