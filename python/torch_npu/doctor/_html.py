"""The report as one self-contained HTML page: findings, tables and four plots
(matplotlib, drawn off-screen and embedded as PNG), no external resources."""
import html

from ._text import CLEAN, cost_text, other_locations_text, png_base64

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 70em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.8em; border-bottom: 1px solid #ccc; }
.finding { border-left: 4px solid #c0392b; padding: 0.3em 1em; margin: 1em 0; background: #fbf3f2; }
.finding.wrong_result { border-color: #8e44ad; background: #f6f0f8; }
.kind { font-weight: bold; font-family: monospace; } code, pre { background: #f4f4f4; padding: 0 0.3em; }
.clean { border-left: 4px solid #27ae60; padding: 0.5em 1em; background: #eef8f1; }
table { border-collapse: collapse; } td, th { padding: 0.2em 0.8em; text-align: right; }
td:first-child, th:first-child { text-align: left; font-family: monospace; } tr:nth-child(even) { background: #f7f7f7; }
.plots img { max-width: 48%; margin: 0.5em 1%; vertical-align: top; }
"""


def _e(text):
    return html.escape(str(text))


def _plots(report):
    """(name, base64 PNG) of the four plots, or a sentence why there are none."""
    try:
        import matplotlib
        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt
    except ImportError:
        return "The plots need matplotlib (pip install matplotlib)."
    run = report.run
    plots = []

    def figure(name, draw):
        fig, ax = plt.subplots(figsize=(6, 3.6))
        try:
            draw(ax)
            fig.tight_layout()
            plots.append((name, png_base64(fig)))
        finally:
            plt.close(fig)

    def by_backend(ax):
        calls = {"npu kernel": 0, "custom npu op": 0, "cpu fallback": 0}
        for o in run.ops:
            calls["npu kernel" if o.op.startswith("aten::") else "custom npu op"] += o.calls - o.fallbacks
            calls["cpu fallback"] += o.fallbacks
        names = list(calls)
        colors = {"npu kernel": "#2e86c1", "custom npu op": "#17a589", "cpu fallback": "#c0392b"}
        ax.bar(names, [calls.get(n, 0) for n in names], color=[colors.get(n, "#999") for n in names])
        ax.set_ylabel("op calls")
        ax.set_title("Ops by backend")

    def host_device(ax):
        ops = [o for o in run.ops if o.profiled_host_us is not None] or run.ops
        ops = sorted(ops, key=lambda o: -(o.profiled_host_us if o.profiled_host_us is not None else o.host_s))[:12]
        names = [o.op.replace("aten::", "") for o in ops][::-1]
        profiled = any(o.profiled_host_us is not None for o in ops)
        host = [(o.profiled_host_us or 0) / 1e3 if profiled else o.host_s * 1e3 for o in ops][::-1]
        y = range(len(names))
        ax.barh([i + 0.2 for i in y], host, height=0.4, label="host", color="#f39c12")
        if profiled:
            ax.barh([i - 0.2 for i in y], [(o.profiled_device_us or 0) / 1e3 for o in ops][::-1], height=0.4,
                    label="device", color="#2e86c1")
        ax.set_yticks(list(y))
        ax.set_yticklabels(names, fontsize=7)
        ax.set_xlabel("ms" + (" (profiled steps)" if profiled else " (whole run, host)"))
        ax.legend()
        ax.set_title("Host vs device time per op")

    def memory(ax):
        if run.memory:
            t = [m[0] for m in run.memory]
            ax.plot(t, [m[1] / 2**20 for m in run.memory], label="allocated")
            ax.plot(t, [m[2] / 2**20 for m in run.memory], label="reserved", linestyle="--")
        if run.step_memory:
            ax.plot([m[1] for m in run.step_memory], [m[2] / 2**20 for m in run.step_memory], "o", markersize=3,
                    label="after each step")
        ax.set_xlabel("seconds")
        ax.set_ylabel("MiB")
        ax.legend()
        ax.set_title("npu memory over time")

    def fallbacks(ax):
        items = sorted(run.fallback_stats.items(), key=lambda kv: -kv[1].seconds)[:12]
        if items:
            ax.barh([op.replace("aten::", "") for op, _ in items][::-1], [s.seconds * 1e3 for _, s in items][::-1],
                    color="#c0392b")
        else:
            ax.text(0.5, 0.5, "no CPU fallbacks", ha="center", va="center", transform=ax.transAxes)
        ax.set_xlabel("ms in the CPU fallback (copies included)")
        ax.set_title("Fallbacks by cost")

    figure("backends", by_backend)
    figure("host-device", host_device)
    figure("memory", memory)
    figure("fallbacks", fallbacks)
    return plots


def _projected_plot(report, plots):
    """Adds to ``plots`` the measured against projected device time per op of the
    profiled steps (when they were projected onto the target); True if it did."""
    per_op = (report.run.profile or {}).get("per_op_projected_us") or {}
    rows = [(op, measured, projected) for op, (measured, projected) in per_op.items() if projected > 0]
    if not rows:
        return False
    import matplotlib.pyplot as plt
    rows.sort(key=lambda r: -r[2])
    rows = rows[:12]
    fig, ax = plt.subplots(figsize=(9, 3.8))
    try:
        xs = range(len(rows))
        ax.bar([x - 0.2 for x in xs], [r[1] for r in rows], width=0.4, label="measured (emulated npu)")
        ax.bar([x + 0.2 for x in xs], [r[2] for r in rows], width=0.4,
               label=f"projected on {report.verdict.device_name} (estimate)")
        ax.set_xticks(list(xs), [r[0].replace("aten::", "")[:18] for r in rows], rotation=40, ha="right",
                      fontsize=7)
        ax.set_ylabel("device us in the profiled steps")
        ax.legend(fontsize=7)
        fig.tight_layout()
        plots.append(("projected", png_base64(fig)))
    finally:
        plt.close(fig)
    return True


def render(report):
    run = report.run
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>torch_npu doctor: {_e(run.script)}</title>",
             f"<style>{_STYLE}</style></head><body>",
             f"<h1>torch_npu doctor: <code>{_e(run.script)}</code></h1>",
             "<p>" + "<br>".join(_e(line.strip()) for line in report.header_lines()[1:]) + "</p>"]
    if not run.findings:
        parts.append(f"<div class='clean'>{_e(CLEAN)}</div>")
    else:
        parts.append(f"<h2>{len(run.findings)} findings, costliest first</h2>")
        for i, f in enumerate(run.findings, 1):
            chip = report.verdict.device_name if report.verdict is not None else None
            cost, others = cost_text(f, chip), other_locations_text(f)
            parts.append(
                f"<div class='finding {_e(f.kind)}'><p><span class='kind'>{i}. {_e(f.kind)}</span> {_e(f.title)}</p>"
                f"<p>at <code>{_e(f.where)}</code>" + (f" <code>{_e(f.code)}</code>" if f.code else "") + "</p>"
                + (f"<p>cost: {_e(cost)}</p>" if cost else "") + (f"<p>also at: {_e(others)}</p>" if others else "")
                + f"<p>fix: {_e(f.remedy)}</p></div>")
    parts.append("<h2>Plots</h2>")
    plots = _plots(report)
    if isinstance(plots, str):
        parts.append(f"<p>{_e(plots)}</p>")
    else:
        parts.append("<div class='plots'>" + "".join(
            f"<img id='plot-{name}' alt='{name}' src='data:image/png;base64,{data}'>" for name, data in plots)
            + "</div>")
    parts.append("<h2>Ops</h2><table><tr><th>op</th><th>calls</th><th>host ms</th><th>profiled host us</th>"
                 "<th>profiled device us</th><th>backend</th></tr>")
    for o in run.ops[:40]:
        ph = f"{o.profiled_host_us:.0f}" if o.profiled_host_us is not None else "-"
        pd = f"{o.profiled_device_us:.0f}" if o.profiled_device_us is not None else "-"
        parts.append(f"<tr><td>{_e(o.op)}</td><td>{o.calls}</td><td>{o.host_s * 1e3:.2f}</td><td>{ph}</td>"
                     f"<td>{pd}</td><td>{_e(o.backend)}</td></tr>")
    parts.append("</table>")
    if run.profile and "analysis" in run.profile:
        parts.append(f"<h2>Profile of {run.profile['steps']} steps</h2><pre>{_e(run.profile['analysis'])}</pre>")
    if run.compared is not None:
        parts.append(f"<h2>Compared with the cpu</h2><p>{run.compared:,} npu op calls compared; "
                     f"{len(run.mismatches)} ops differ.</p>")
    verdict = report.verdict
    if verdict is not None:
        lines = verdict.lines()
        parts.append(f"<h2 id='target'>{_e(lines[0].rstrip(':'))}</h2><pre>"
                     + _e("\n".join(line[2:] for line in lines[1:])) + "</pre>")
        if not isinstance(plots, str) and _projected_plot(report, plots):
            name, data = plots[-1]
            parts.append(f"<div class='plots'><img id='plot-{name}' alt='{name}' "
                         f"src='data:image/png;base64,{data}'></div>")
    parts.append("</body></html>")
    return "\n".join(parts)
