"""Record the npu allocator's history over a few training steps of a small model,
dump the snapshot (open it with PyTorch's viewer: drop the file on
pytorch.org/memory_viz, or `python -m torch.cuda._memory_viz trace_plot FILE -o page.html`),
and draw its active-memory timeline (the viewer's first view) as a PNG with matplotlib.

    python examples/memory_snapshot.py [--out docs/memory_snapshot.png] [--pickle /tmp/npu_memory.pickle]
"""
import argparse
import os

import torch

import torch_npu  # noqa: F401


def train_a_little():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256)).npu()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    history = []
    for step in range(6):
        x = torch.randn(128, 256, device="npu")
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        history.append(loss)          # kept with its graph: the timeline shows it growing
    return history


def active_timeline(snapshot, device=0):
    """(event numbers, one series of live bytes per allocation) from the snapshot's trace:
    the stacked bands the viewer draws, in order of allocation."""
    series, live, by_address = [], {}, {}
    for event in snapshot["device_traces"][device]:
        if event["action"] == "alloc":
            by_address[event["addr"]] = len(series)
            live[len(series)] = event["size"]
            series.append([0] * len(series[0]) if series else [])
        elif event["action"] == "free_requested" and event["addr"] in by_address:
            live.pop(by_address.pop(event["addr"]), None)
        else:
            continue
        for index, values in enumerate(series):
            values.append(live.get(index, 0))
    return list(range(len(series[0]) if series else 0)), series


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "docs", "memory_snapshot.png"))
    parser.add_argument("--pickle", default="/tmp/npu_memory.pickle")
    args = parser.parse_args(argv)

    torch.npu.memory._record_memory_history("all", stacks="python", max_entries=100_000)
    kept = train_a_little()
    snapshot = torch.npu.memory._snapshot()
    torch.npu.memory._dump_snapshot(args.pickle)
    torch.npu.memory._record_memory_history(None)
    del kept

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    times, bands = active_timeline(snapshot)
    fig, ax = plt.subplots(figsize=(10, 4))
    ax.stackplot(times, [[b / 2**20 for b in band] for band in bands], linewidth=0)
    ax.set_xlabel("allocator events")
    ax.set_ylabel("active npu memory (MiB)")
    ax.set_title("npu:0 active memory timeline (torch.npu.memory._snapshot(), one band per allocation)")
    fig.tight_layout()
    fig.savefig(args.out, dpi=80)
    print(f"snapshot: {args.pickle} ({len(snapshot['device_traces'][0])} events, "
          f"{len(snapshot['segments'])} segments); timeline: {os.path.abspath(args.out)}")


if __name__ == "__main__":
    main()
