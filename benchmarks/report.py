"""The side-by-side report: rows, ratios, targets, JSON and a bar plot.

Input is what run_all collected: ``results[mode][backend][job]`` (the per-job
data of :mod:`benchmarks.scenarios` and :mod:`benchmarks.compute`, for each
launch mode of :mod:`benchmarks.launch`) and the socket floor. Every row shows
the launch modes side by side, and in each, every contender (torchrpc's own
API, and torch.distributed.rpc on the TORCHRPC backend where it ran) with its
ratio against torch.distributed.rpc on TensorPipe. A ratio above 1 always
means the contender is better: torch_time / its time for times and CPU, its
rate / torch's for rates.
"""

import json
import math
import os
import statistics

from benchmarks.backends import LABELS
from benchmarks.launch import MODE_LABELS

KB, MB = 1 << 10, 1 << 20

#: What every ratio is against, and what is compared with it.
BASELINE = "torch"
CONTENDERS = ("torchrpc", "backend")
#: Per contender: its ratio's key in a table entry (torchrpc's is the
#: historical "ratio"), its ratio column's header, its bar colours (>= 1, < 1).
RATIO_KEY = {"torchrpc": "ratio", "backend": "backend_ratio"}
RATIO_HEADER = {"torchrpc": "ratio", "backend": "backend ratio"}
COLORS = {"torchrpc": ("tab:green", "tab:red"), "backend": ("tab:blue", "tab:orange")}


class Row:
    """One scenario of the table.

    Attributes:
        key (str): stable id, used in the JSON.
        label (str): what the table shows.
        unit (str): "us", "ms", "calls/s", "MB/s", "pct" or "x".
        higher_is_better (bool): rates yes, times no.
        get (callable): results-of-one-backend -> value (KeyError when missing).
    """

    def __init__(self, key, label, unit, higher_is_better, get):
        self.key, self.label, self.unit = key, label, unit
        self.higher_is_better, self.get = higher_is_better, get

    def value(self, backend_results):
        """The value for one backend, or None if that measurement failed."""
        try:
            return float(self.get(backend_results))
        except (KeyError, TypeError, IndexError):
            return None

    def ratio(self, torch_value, ours):
        """How many times `ours` is better than `torch_value` (None if undefined)."""
        if torch_value is None or ours is None:
            return None
        num, den = (ours, torch_value) if self.higher_is_better else (torch_value, ours)
        if den <= 0:
            return math.inf if num > 0 else None
        return num / den


def _rows():
    rows = []
    lat = [("script", "TorchScript fn"), ("builtin", "builtin torch.add"), ("python", "Python fn"),
           ("script_int", "TorchScript fn, ints only"), ("python_int", "Python fn, ints only")]
    for name, label in lat:
        rows.append(Row(f"latency.{name}", f"rpc_sync tiny {label}", "us", False,
                        lambda r, n=name: r["main"]["latency_us"][n]["median"]))
    for kind in ("script", "builtin", "python"):
        for depth in (1, 16, 128):
            rows.append(Row(f"throughput.{kind}.{depth}", f"rpc_async {kind}, {depth} in flight",
                            "calls/s", True, lambda r, k=kind, d=depth: r["main"]["throughput"][k][str(d)]))
    for kind in ("script", "python"):
        rows.append(Row(f"cpu_bound.{kind}.one", f"CPU-bound {kind} callee, 1 caller", "calls/s", True,
                        lambda r, k=kind: r["scaling"]["cpu_bound"][k]["one"]))
        rows.append(Row(f"cpu_bound.{kind}.all", f"CPU-bound {kind} callee, 2 callers", "calls/s", True,
                        lambda r, k=kind: r["scaling"]["cpu_bound"][k]["all"]))
        rows.append(Row(f"cpu_bound.{kind}.scaling", f"CPU-bound {kind}: 2 callers / 1", "x", True,
                        lambda r, k=kind: r["scaling"]["cpu_bound"][k]["scaling"]))
    for size, label in ((KB, "1 KB"), (MB, "1 MB"), (16 * MB, "16 MB"), (64 * MB, "64 MB")):
        rows.append(Row(f"send.{size}", f"tensor send {label}", "MB/s", True,
                        lambda r, s=size: r["main"]["send"][str(s)]["mb_per_s"]))
    for key, call in (("", "rpc_async().wait()"), ("_sync", "rpc_sync")):
        rows.append(Row(f"script_caller.eager{key}", f"{call} from eager Python", "us", False,
                        lambda r, k=key: r["main"]["script_caller"][f"eager{k}"]["median"]))
        rows.append(Row(f"script_caller.from_script{key}", f"{call} from inside TorchScript", "us", False,
                        lambda r, k=key: r["main"]["script_caller"][f"from_script{k}"]["median"]))
        rows.append(Row(f"script_caller.gap{key}", f"{call}: from TorchScript / from eager", "x", False,
                        lambda r, k=key: r["main"]["script_caller"][f"from_script{k}"]["median"]
                        / r["main"]["script_caller"][f"eager{k}"]["median"]))
    rows.append(Row("unseen.first", "unseen script fn: first call (ships code)", "ms", False,
                    lambda r: r["main"]["unseen"]["first_ms"]))
    rows.append(Row("unseen.later", "unseen script fn: later calls", "us", False,
                    lambda r: r["main"]["unseen"]["later_us"]))
    for kind in ("script", "builtin", "python"):
        rows.append(Row(f"rref.remote.{kind}", f"remote() + to_here(), {kind}", "us", False,
                        lambda r, k=kind: r["main"]["rref"]["remote_to_here_us"][k]["median"]))
    rows.append(Row("rref.to_here", "to_here() of an existing RRef", "us", False,
                    lambda r: r["main"]["rref"]["to_here_us"]["median"]))
    rows.append(Row("rref.proxy", "rref.rpc_sync().method()", "us", False,
                    lambda r: r["main"]["rref"]["proxy_us"]["median"]))
    rows.append(Row("rref.churn_s", "create + drop RRefs (10k full, 1k quick)", "s", False,
                    lambda r: r["main"]["rref"]["churn"]["seconds"]))
    rows.append(Row("rref.churn_rss", "owner memory growth after the churn", "MB", False,
                    lambda r: r["main"]["rref"]["churn"]["owner_rss_growth_mb"]))
    rows.append(Row("rref.churn_rss_again", "owner memory growth, the same churn again", "MB", False,
                    lambda r: r["main"]["rref"]["churn"]["owner_rss_growth_again_mb"]))
    rows.append(Row("rref.churn_live", "live owner RRefs after the churn", "n", False,
                    lambda r: r["main"]["rref"]["churn"]["live_owner_rrefs_after"]))
    rows.append(Row("idle.callee", "idle CPU, callee", "pct", False, lambda r: r["main"]["idle"]["callee_pct"]))
    rows.append(Row("idle.caller", "idle CPU, caller", "pct", False, lambda r: r["main"]["idle"]["caller_pct"]))
    for world in (2, 4):
        rows.append(Row(f"init.{world}", f"init_rpc, {world} workers", "ms", False,
                        lambda r, w=world: r[f"init{w}"]["init_ms"]))
        rows.append(Row(f"shutdown.{world}", f"shutdown, {world} workers", "ms", False,
                        lambda r, w=world: r[f"init{w}"]["shutdown_ms"]))
    for phase in ("iteration", "forward", "backward", "step"):
        rows.append(Row(f"training.{phase}", f"split-RNN training {phase}", "ms", False,
                        lambda r, p=phase: r["training"]["training"][f"{p}_ms"]["median"]))
    rows.append(Row("training.its", "split-RNN training iterations", "it/s", True,
                    lambda r: 1e3 / r["training"]["training"]["iteration_ms"]["median"]))
    rows.append(Row("training.vs_local", "split-RNN iteration / same model local", "x", False,
                    lambda r: r["training"]["training"]["iteration_ms"]["median"]
                    / r["training"]["training"]["local_ms"]["median"]))
    rows.append(Row("compute.remote", "CNN forward inside rpc_sync (compute-heavy callee)", "ms", False,
                    lambda r: r["compute"]["compute"]["remote_ms"]["median"]))
    rows.append(Row("compute.vs_local", "CNN forward in a call / the same forward local", "x", False,
                    lambda r: r["compute"]["compute"]["remote_ms"]["median"]
                    / r["compute"]["compute"]["local_ms"]["median"]))
    rows.append(Row("beside.idle", "compute loop beside idle workers / them stopped", "x", True,
                    lambda r: r["beside"]["beside"]["idle"]["ratio"]))
    rows.append(Row("beside.calls", "compute loop beside workers calling every 5 ms / them stopped", "x", True,
                    lambda r: r["beside"]["beside"]["calls"]["ratio"]))
    return rows + _exported_rows()


def _exported_rows():
    """The ``exported`` job's rows: torchrpc only (torch.distributed.rpc
    cannot call an exported program), so their torch column reads n/a."""
    only = " (torchrpc only)"
    rows = []
    for key, label in (("exported", "exported program by name"), ("exported_direct", "exported program, direct"),
                       ("script", "TorchScript fn, same run"), ("python", "Python fn, same run")):
        rows.append(Row(f"exported.latency.{key}", f"rpc_sync tiny {label}{only}", "us", False,
                        lambda r, k=key: r["exported"]["latency_us"][k]["median"]))
    for kind in ("exported", "script"):
        rows.append(Row(f"exported.cpu.{kind}.one", f"CPU-bound {kind} callee, 1 caller{only}", "calls/s", True,
                        lambda r, k=kind: r["exported"]["cpu_bound"][k]["one"]))
        rows.append(Row(f"exported.cpu.{kind}.scaling", f"CPU-bound {kind}: 2 callers / 1{only}", "x", True,
                        lambda r, k=kind: r["exported"]["cpu_bound"][k]["scaling"]))
    rows.append(Row("exported.compile", f"exported tiny program: AOTInductor compile{only}", "s", False,
                    lambda r: r["exported"]["compile"]["compile_s"]["tiny"]))
    rows.append(Row("exported.cache_hit", f"exported: cache hit in a fresh process{only}", "ms", False,
                    lambda r: r["exported"]["first_call"]["cache_hit_ms"]))
    rows.append(Row("exported.first_call", f"exported: first call (ships + loads package){only}", "ms", False,
                    lambda r: r["exported"]["first_call"]["first_call_ms"]))
    return rows


ROWS = _rows()


class Target:
    """A goal attached to a row: check(torch, ours, ratio, floor_us) -> bool,
    with `ours` and `ratio` those of `subject` (a key of CONTENDERS)."""

    def __init__(self, row, text, check, subject="torchrpc"):
        self.row, self.text, self.check, self.subject = row, text, check, subject

    @property
    def label(self):
        """The text the table shows: torchrpc's targets bare, others named."""
        return self.text if self.subject == "torchrpc" else f"{self.subject}: {self.text}"


def _vs_torch(row, times, subject="torchrpc"):
    """The target `times` x torch (or better) on `row`."""
    return Target(row, f">= {times:g}x torch", lambda t, o, ratio, floor: ratio >= times, subject)


TARGETS = [
    _vs_torch("latency.script", 5),
    Target("latency.script", "<= 3x socket floor", lambda t, o, ratio, floor: o <= 3 * floor),
    _vs_torch("latency.python", 1),
    _vs_torch("latency.python_int", 1),
    _vs_torch("throughput.script.128", 4),
    _vs_torch("throughput.builtin.128", 3),
    _vs_torch("throughput.python.128", 2),
    Target("cpu_bound.script.scaling", ">= 1.7x", lambda t, o, ratio, floor: o >= 1.7),
    Target("exported.cpu.exported.scaling", ">= 1.7x", lambda t, o, ratio, floor: o >= 1.7),
    _vs_torch("send.67108864", 2),
    Target("idle.callee", "< 1% of a core", lambda t, o, ratio, floor: o < 1),
    Target("idle.caller", "< 1% of a core", lambda t, o, ratio, floor: o < 1),
    Target("init.4", "< 100 ms", lambda t, o, ratio, floor: o < 100),
    Target("script_caller.gap_sync", "<= 1.1x (no Python between)", lambda t, o, ratio, floor: o <= 1.1),
    _vs_torch("rref.remote.script", 3),
    _vs_torch("rref.remote.builtin", 3),
    _vs_torch("rref.remote.python", 3),
    _vs_torch("rref.to_here", 3),
    _vs_torch("rref.proxy", 3),
    Target("rref.churn_live", "0 left", lambda t, o, ratio, floor: o == 0),
    Target("rref.churn_rss_again", "< 1 MB (no leak)", lambda t, o, ratio, floor: o < 1),
    _vs_torch("training.its", 2),
    Target("training.vs_local", "<= 1.3x local", lambda t, o, ratio, floor: o <= 1.3),
    _vs_torch("compute.remote", 1.0),
    Target("beside.idle", ">= 0.95x them stopped", lambda t, o, ratio, floor: o >= 0.95),
]
#: Issue #23's targets for the TORCHRPC backend: tiny calls and throughput
#: >= 3x TensorPipe, 64 MB >= 2x, no CPU when idle (not one 10 ms tick).
_TINY = ("script", "builtin", "python")
TARGETS += [_vs_torch(f"latency.{kind}", 3, "backend") for kind in _TINY]
TARGETS += [_vs_torch(f"throughput.{kind}.128", 3, "backend") for kind in _TINY]
TARGETS += [_vs_torch("send.67108864", 2, "backend")]
TARGETS += [Target(f"idle.{who}", "0% of a core", lambda t, o, ratio, floor: o == 0, "backend")
            for who in ("callee", "caller")]


def aggregate_init(rank_results):
    """Per repetition the slowest worker, then the median over repetitions (ms);
    also the first repetition alone (cold: the first init_rpc of the process)."""
    out = {}
    for field in ("init", "shutdown"):
        per_rep = [max(reps) for reps in zip(*(r[f"{field}_s"] for r in rank_results))]
        out[f"{field}_ms"] = statistics.median(per_rep) * 1e3
        out[f"{field}_ms_first"] = per_rep[0] * 1e3
        out[f"{field}_ms_per_rep"] = [v * 1e3 for v in per_rep]
    return out


def median_of_rounds(rounds):
    """One job's results over rounds (each a job's result dict) as one: each
    number the median over the rounds that have it, lists item by item, and
    anything else as the first round gave it."""
    first = rounds[0]
    if isinstance(first, bool) or not isinstance(first, (int, float, dict, list)):
        return first
    if isinstance(first, (int, float)):
        numbers = [r for r in rounds if isinstance(r, (int, float)) and not isinstance(r, bool)]
        return statistics.median(numbers)
    if isinstance(first, dict):
        return {key: median_of_rounds([r[key] for r in rounds if isinstance(r, dict) and key in r])
                for key in first}
    same = [r for r in rounds if isinstance(r, list) and len(r) == len(first)]
    return [median_of_rounds(list(items)) for items in zip(*same)]


def build(results, floor):
    """Table rows as dicts: key, label, unit, target, subject (whose target),
    and under "modes", per launch mode, {"torch", "status"} and, for each
    contender that ran, its value and its ratio (RATIO_KEY)."""
    floor_us = floor["median"] if floor else None
    ran = [name for name in CONTENDERS if any(name in by_backend for by_backend in results.values())]
    table = []
    for row in ROWS:
        values = {mode: _values(row, by_backend, ran) for mode, by_backend in results.items()}
        if all(v[name] is None for v in values.values() for name in (BASELINE, *ran)):
            continue  # the job did not run (or failed: see the errors line)
        for goal in [t for t in TARGETS if t.row == row.key and t.subject in ran] or [None]:
            modes = {mode: dict(v, status=_status(goal, v, floor_us)) for mode, v in values.items()}
            table.append({"key": row.key, "label": row.label, "unit": row.unit,
                          "target": goal.label if goal else "", "subject": goal.subject if goal else None,
                          "modes": modes})
    return table


def _values(row, by_backend, contenders):
    """One row's values in one launch mode: torch's, and each contender's with
    its ratio."""
    base = row.value(by_backend.get(BASELINE, {}))
    out = {BASELINE: base}
    for name in contenders:
        out[name] = row.value(by_backend.get(name, {}))
        out[RATIO_KEY[name]] = row.ratio(base, out[name])
    return out


def _status(goal, v, floor_us):
    """PASS, MISS, n/a (a value is missing) or "" (no target)."""
    if goal is None:
        return ""
    try:
        ok = goal.check(v[BASELINE], v[goal.subject], v[RATIO_KEY[goal.subject]], floor_us)
        return "PASS" if ok else "MISS"
    except TypeError:
        return "n/a"


def fmt(value, unit):
    """A value with its unit, for the table."""
    if value is None:
        return "n/a"
    if unit == "us":
        return f"{value:.0f} µs"
    if unit == "ms":
        return f"{value:.1f} ms" if value < 100 else f"{value:.0f} ms"
    if unit == "calls/s":
        return f"{value / 1e3:.1f}k/s" if value >= 1e3 else f"{value:.0f}/s"
    if unit == "MB/s":
        return f"{value:,.0f} MB/s"
    if unit == "pct":
        return f"{value:.1f}%"
    if unit == "x":
        return f"{value:.2f}x"
    if unit in ("s", "MB"):
        return f"{value:.2f} {unit}"
    return f"{value:g} {unit}"


def _fmt_ratio(ratio):
    if ratio is None:
        return "n/a"
    if math.isinf(ratio):
        return "inf"
    return f"{ratio:.2f}x" if ratio < 10 else f"{ratio:.1f}x"


def _contenders(table):
    """The contenders a table has columns for, in CONTENDERS order."""
    first = next(iter(table[0]["modes"].values())) if table else {}
    return [name for name in CONTENDERS if name in first]


def _short(mode):
    return "one" if mode == "one" else "sep."


def markdown(table, floor, meta, errors):
    """The table as aligned Markdown, the launch modes side by side (in each,
    torch, then each contender and its ratio), with the socket floor and run
    details."""
    modes = list(table[0]["modes"]) if table else []
    contenders = _contenders(table)
    header = ["scenario"]
    for mode in modes:
        header.append(f"torch ({_short(mode)})")
        for name in contenders:
            header += [f"{name} ({_short(mode)})", f"{RATIO_HEADER[name]} ({_short(mode)})"]
    header += ["target"] + [_short(m) for m in modes]
    lines = []
    for e in table:
        cells = [e["label"]]
        for mode in modes:
            v = e["modes"][mode]
            cells.append(fmt(v[BASELINE], e["unit"]))
            for name in contenders:
                cells += [fmt(v[name], e["unit"]), _fmt_ratio(v[RATIO_KEY[name]])]
        lines.append(cells + [e["target"]] + [e["modes"][m]["status"] for m in modes])
    widths = [max(len(str(c)) for c in col) for col in zip(header, *lines)]

    def line(cells):
        return "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"

    out = [line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(cells) for cells in lines]
    out.append("")
    legend = f"torch = {LABELS['torch']} (TensorPipe)"
    if "backend" in contenders:
        legend += ("; backend = the same torch.distributed.rpc program on torchrpc's agent "
                   "(import torchrpc; backend=rpc.BackendType.TORCHRPC)")
    out.append("Launch modes: " + "; ".join(f"({_short(m)}) {MODE_LABELS[m]}" for m in modes) + f". {legend}.")
    if floor:
        runs = ", ".join(f"{m:.1f}" for m in floor.get("medians_of_runs", [floor["median"]]))
        out.append(f"Socket round trip floor (Unix stream, 1 byte, two processes): "
                   f"{floor['median']:.1f} µs median (p90 {floor['p90']:.1f} µs; "
                   f"lowest median of the runs at the start and end: {runs} µs).")
    out.append(f"Ratio > 1: {' or '.join(contenders) or 'the contender'} better than torch. Medians. "
               f"{meta['summary']}")
    for mode in modes:
        counts = []
        for name in contenders:
            statuses = [e["modes"][mode]["status"] for e in table if e["subject"] == name]
            if statuses:
                counts.append(f"{name} {statuses.count('PASS')}/"
                              f"{statuses.count('PASS') + statuses.count('MISS')} PASS")
        out.append(f"Targets, {MODE_LABELS[mode]}: {'; '.join(counts) or 'none'}.")
    if errors:
        out.append(f"Failed (see results.json for their logs): {', '.join(sorted(errors))}.")
    return "\n".join(out)


HATCHES = ("", "//")  # one per launch mode in the plot


def _positive(ratio):
    """The ratio if a log axis can show it, else nan (no bar)."""
    return ratio if ratio is not None and math.isfinite(ratio) and ratio > 0 else float("nan")


def plot(table, path):
    """Horizontal bars of the ratios (log scale, 1 = parity), one bar per
    launch mode and contender (colour: contender, a second one below 1;
    hatch: launch mode), into a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    contenders = _contenders(table)
    seen, entries = set(), []
    for e in table:
        ratios = [_positive(v[RATIO_KEY[name]]) for v in e["modes"].values() for name in contenders]
        if e["key"] in seen or all(math.isnan(r) for r in ratios):
            continue
        seen.add(e["key"])
        entries.append(e)
    if not entries:
        return False
    entries.reverse()  # first row on top
    modes = list(entries[0]["modes"])
    bars = [(mode, name) for mode in modes for name in contenders]
    height_in = (0.2 + 0.13 * len(bars)) * len(entries) + 1.5
    fig, ax = plt.subplots(figsize=(9, height_in))
    height = 0.8 / len(bars)
    for i, (mode, name) in enumerate(bars):
        ys = [y - (i - (len(bars) - 1) / 2) * height for y in range(len(entries))]  # first bar on top
        shown = [_positive(e["modes"][mode][RATIO_KEY[name]]) for e in entries]
        better, worse = COLORS[name]
        ax.barh(ys, shown, height=height, hatch=HATCHES[modes.index(mode) % len(HATCHES)],
                color=[better if r >= 1 else worse for r in shown], edgecolor="black", linewidth=0.3)
        for y, r in zip(ys, shown):
            if math.isfinite(r):
                ax.text(r, y, f" {r:.2f}x", va="center", fontsize=7)
    ax.set_yticks(range(len(entries)))
    ax.set_yticklabels([e["label"] for e in entries])
    ax.set_ylim(-0.6, len(entries) - 0.4)
    ax.axvline(1.0, color="black", linewidth=1)
    ax.set_xscale("log")
    ax.set_xlim(right=ax.get_xlim()[1] * 1.3)  # room for the bars' labels
    from matplotlib.patches import Patch

    handles = [Patch(facecolor="white", edgecolor="black", hatch=HATCHES[i % len(HATCHES)], label=MODE_LABELS[m])
               for i, m in enumerate(modes)]
    handles += [Patch(facecolor=COLORS[name][0], label=f"{LABELS[name]} (< 1: {COLORS[name][1][4:]})")
                for name in contenders]
    fig.legend(handles=handles, loc="lower center", ncol=2, fontsize=8)
    ax.set_xlabel("ratio to torch.distributed.rpc on TensorPipe (>1 = better; log scale)")
    ax.set_title("medians, by launch mode and backend")
    fig.tight_layout(rect=(0, 0.6 / height_in, 1, 1))  # the legend below, in 0.6 inch
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _finite(obj):
    """obj with inf/nan floats replaced by None (strict JSON)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def write(out_dir, results, floor, meta, errors):
    """Writes results.json, results.md and ratios.png; returns the Markdown table."""
    os.makedirs(out_dir, exist_ok=True)
    table = build(results, floor)
    text = markdown(table, floor, meta, errors)
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump(_finite({"meta": meta, "floor_us": floor, "table": table, "raw": results,
                           "errors": errors}), f, indent=1, allow_nan=False)
    with open(os.path.join(out_dir, "results.md"), "w") as f:
        f.write(text + "\n")
    plot(table, os.path.join(out_dir, "ratios.png"))
    return text
