"""``predict --plot``: the iteration time's CDF and histogram with p50, p95,
p99 and the deterministic replay marked.  An adapter: matplotlib is imported
when a picture is drawn (Agg, no display), never by the pure core."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from prism_debug.predict.report import Prediction


def plot_prediction(prediction: Prediction, path: Path) -> None:
    """Write the picture to ``path`` (its suffix picks the format: png, svg, pdf …)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    p = prediction
    times_ms = np.sort(p.times_s.ravel()) * 1e3
    marks = [("deterministic", p.iteration.deterministic_s, "black", "-"),
             ("p50", p.iteration.p50_s, "tab:green", "--"),
             ("p95", p.iteration.p95_s, "tab:orange", "--"),
             ("p99", p.iteration.p99_s, "tab:red", "--")]
    figure, (cdf, histogram) = plt.subplots(1, 2, figsize=(11, 4.2))
    try:
        cdf.step(times_ms, np.arange(1, len(times_ms) + 1) / len(times_ms), where="post")
        cdf.set_ylabel("P(iteration time ≤ t)")
        histogram.hist(times_ms, bins=min(80, max(10, len(times_ms) // 25)), color="tab:blue",
                       alpha=0.75)
        histogram.set_ylabel("iterations")
        for axes in (cdf, histogram):
            for name, seconds, color, style in marks:
                axes.axvline(seconds * 1e3, color=color, linestyle=style,
                             label=f"{name} {seconds * 1e3:.2f} ms")
            axes.set_xlabel(f"rank {p.rank}'s iteration time (ms)")
        histogram.legend(loc="upper right", fontsize="small")
        figure.suptitle(f"{p.samples:,} samples × {p.iterations} iterations, world "
                        f"{p.graph_world:,}: {p.variability}", fontsize="medium")
        figure.tight_layout()
        figure.savefig(path)
    finally:
        plt.close(figure)
