"""What the cycle model reports: per-unit busy cycles, traffic, roofline and a timeline."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Sequence, Union

from accel.hw.config import Config
from accel.hw.isa import Opcode
from accel.hw.timing import UNITS, Event, Timing

__all__ = ["UNITS", "Event", "Timeline", "Stats"]

class Timeline:
    """Per-unit busy intervals; ``str()`` is an ASCII chart, :meth:`save_png` a picture;
    ``tirpat.device.trace`` writes it as trace-event JSON (its ``events`` and ``units``).

    >>> t = Timeline([Event(0, "load", "LOAD", 0, 50), Event(1, "gemm", "GEMM", 50, 100)])
    >>> print(t.text(width=10))
    cycles 0..100, one column = 10 cycles
    load  |#####     |  50%
    gemm  |     #####|  50%
    alu   |          |   0%
    store |          |   0%
    """

    #: the units, in the order charts and traces show them
    units = UNITS

    def __init__(self, events: Iterable[Event] = ()) -> None:
        self._events = list(events)
        # Streams whose events are listed only when asked for: a session that runs the
        # same stream thousands of times keeps one (timing, base) pair per run, not
        # thousands of events.
        self._streams: list[tuple[Timing, int]] = []

    @property
    def events(self) -> list[Event]:
        """Every event so far, in stream order."""
        if self._streams:
            for timing, base in self._streams:
                self._events.extend(timing.events(base))
            self._streams.clear()
        return self._events

    def add(self, timing: Timing, base: int) -> None:
        """Append the events of a stream (a :class:`accel.hw.timing.Timing`) starting at ``base``."""
        self._streams.append((timing, base))

    @property
    def cycles(self) -> int:
        """The end of the last event."""
        return max((e.end for e in self.events), default=0)

    def text(self, width: int = 64) -> str:
        """An ASCII Gantt chart: ``#`` a unit busy most of a column, ``+`` partly, blank idle."""
        total = max(self.cycles, 1)
        scale = total / width
        lines = [f"cycles 0..{self.cycles}, one column = {scale:g} cycles"]
        for unit in UNITS:
            cover = [0.0] * width
            busy = 0
            for e in self.events:
                if e.unit != unit:
                    continue
                busy += e.end - e.start
                first, last = int(e.start / scale), min(int((e.end - 1) / scale), width - 1)
                for col in range(first, last + 1):
                    lo, hi = col * scale, (col + 1) * scale
                    cover[col] += max(0.0, min(hi, e.end) - max(lo, e.start)) / scale
            row = "".join("#" if c >= 0.5 else "+" if c > 0 else " " for c in cover)
            lines.append(f"{unit:<5} |{row}| {100 * busy / total:3.0f}%")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text()

    def save_png(self, path: Union[str, Path], title: str = "accel timeline",
                 layers: Sequence[tuple[str, int, int]] = ()) -> Path:
        """Draw the timeline as a Gantt chart PNG (needs the ``plot`` extra: matplotlib).

        ``layers`` labels it: ``(label, start cycle, end cycle)`` spans (a model's layers, in
        the order they ran) become a numbered row above the units, with a key under the chart.

        >>> Timeline().save_png("/tmp/empty_timeline.png").name  # doctest: +SKIP
        'empty_timeline.png'
        """
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError as e:
            raise ImportError("Timeline.save_png needs matplotlib: pip install 'tirpat[plot]'") from e
        colors = {"load": "tab:blue", "gemm": "tab:red", "alu": "tab:orange", "store": "tab:green"}
        rows = list(reversed(UNITS)) + (["layer"] if layers else [])
        key = [f"{n + 1}: {label} ({end - start} cycles)" for n, (label, start, end) in enumerate(layers)]
        chart_inches, key_inches = 0.5 * len(rows) + 1.1, 0.18 * len(key) + (0.2 if key else 0)
        fig, ax = plt.subplots(figsize=(10, chart_inches + key_inches))
        for row, unit in enumerate(reversed(UNITS)):
            spans = [(e.start, e.end - e.start) for e in self.events if e.unit == unit]
            ax.broken_barh(spans, (row - 0.4, 0.8), color=colors[unit])
        for n, (label, start, end) in enumerate(layers):
            ax.broken_barh([(start, end - start)], (len(UNITS) - 0.4, 0.8), color="0.55" if n % 2 else "0.75")
            ax.text((start + end) / 2, len(UNITS), str(n + 1), ha="center", va="center", fontsize=8)
            ax.axvline(start, color="0.5", linestyle=":", linewidth=0.8)
        ax.set_yticks(range(len(rows)), rows)
        ax.set_xlabel("cycle")
        ax.set_xlim(0, max(self.cycles, *(end for _, _, end in layers), 1))
        ax.set_title(title)
        if key:
            fig.text(0.01, 0.02, "\n".join(key), fontsize=8, va="bottom", family="monospace")
        fig.tight_layout(rect=(0, key_inches / (chart_inches + key_inches), 1, 1))
        path = Path(path)
        fig.savefig(path, dpi=100, format="png")       # a PNG at exactly this path, whatever its suffix
        plt.close(fig)
        return path


class Stats:
    """Cumulative cycle-model statistics of a session (every synced stream, back to back).

    >>> s = Stats(Config()); s.macs = 4096; s.bytes["dram_to_sram"] = 512; s.cycles = 32
    >>> s.roofline_cycles, s.utilization["gemm"]
    (16, 0.0)
    """

    def __init__(self, config: Config) -> None:
        self.config = config
        self.cycles = 0
        self.macs = 0
        self.timeline = Timeline()
        self._busy = dict.fromkeys(UNITS, 0)
        self._instructions = dict.fromkeys((op.name for op in Opcode), 0)
        self._bytes = {"dram_to_sram": 0, "sram_to_dram": 0}
        # streams added but not yet in the three tallies: summed when one is read (a model
        # call adds a hundred streams and mostly reads only the cycles)
        self._unsummed: list[Timing] = []

    @property
    def busy(self) -> dict[str, int]:
        """Busy cycles per unit."""
        if self._unsummed:
            self._sum()
        return self._busy

    @property
    def instructions(self) -> dict[str, int]:
        """Instructions run, per opcode name."""
        if self._unsummed:
            self._sum()
        return self._instructions

    @property
    def bytes(self) -> dict[str, int]:
        """DMA bytes per direction (``dram_to_sram``, ``sram_to_dram``)."""
        if self._unsummed:
            self._sum()
        return self._bytes

    def add(self, timing: Timing) -> None:
        """Account a stream that ran after everything before it (a :class:`accel.hw.timing.Timing`):
        a few additions, its per-unit and per-opcode tallies summed when first read.

        >>> from accel.hw.cycles import schedule
        >>> from accel.hw.isa import Finish
        >>> s = Stats(Config()); s.add(schedule([Finish()], Config())); s.add(schedule([Finish()], Config()))
        >>> s.cycles, s.instructions["FINISH"]
        (8, 2)
        """
        self._unsummed.append(timing)
        self.macs += timing.macs
        self.timeline.add(timing, self.cycles)
        self.cycles += timing.cycles

    def _sum(self) -> None:
        busy, instructions, moved = self._busy, self._instructions, self._bytes
        for timing in self._unsummed:
            for unit, cycles in timing.busy.items():
                busy[unit] += cycles
            for op, count in timing.instructions.items():
                instructions[op] += count
            for direction, count in timing.bytes.items():
                moved[direction] += count
        self._unsummed.clear()

    def __repr__(self) -> str:
        return (f"Stats(cycles={self.cycles}, busy={self.busy}, instructions={self.instructions}, "
                f"bytes={self.bytes}, macs={self.macs})")

    @property
    def utilization(self) -> dict[str, float]:
        """Busy cycles over total cycles, per unit."""
        return {u: (b / self.cycles if self.cycles else 0.0) for u, b in self.busy.items()}

    @property
    def roofline_cycles(self) -> int:
        """The larger of MAC-bound and DMA-bound cycles: no schedule can beat it."""
        c = self.config
        return max(-(-self.macs // c.gemm_macs_per_cycle),
                   -(-sum(self.bytes.values()) // c.dma_bytes_per_cycle))

    def mac_bound_cycles(self, macs: int) -> int:
        """The cycles ``macs`` multiply-accumulates take at the GEMM array's peak.

        >>> Stats(Config()).mac_bound_cycles(2_437_120)
        9520
        """
        return -(-macs // self.config.gemm_macs_per_cycle)

    def summary(self, model_macs: int | None = None) -> str:
        """A few readable lines: cycles, roofline fraction and per-unit utilisation.

        ``model_macs``, the model's own MACs that ran here (its report's count), makes the
        headline the share of the roofline for those; the roofline of the MACs the device
        executed (padding to whole tiles included, so a schedule that pads more can look
        better on it) follows on the next line.

        >>> s = Stats(Config()); s.macs = 4096; s.cycles = 32
        >>> print(s.summary(model_macs=2048))
        32 cycles, roofline 8 (25%) for the model's 2048 MACs at 256 a cycle
        device: 4096 MACs executed (padding to whole tiles included), roofline 16 (50%), 0 DMA bytes
        utilisation: load 0%  gemm 0%  alu 0%  store 0%
        """
        util = "  ".join(f"{u} {_percent(v)}" for u, v in self.utilization.items())
        share = lambda roof: f"{roof} ({100 * roof / self.cycles if self.cycles else 0:.0f}%)"  # noqa: E731
        dma = f"{sum(self.bytes.values())} DMA bytes"
        if model_macs is None:
            return (f"{self.cycles} cycles, roofline {share(self.roofline_cycles)}, {self.macs} MACs, {dma}\n"
                    f"utilisation: {util}")
        return (f"{self.cycles} cycles, roofline {share(self.mac_bound_cycles(model_macs))} for the model's "
                f"{model_macs} MACs at {self.config.gemm_macs_per_cycle} a cycle\n"
                f"device: {self.macs} MACs executed (padding to whole tiles included), roofline "
                f"{share(self.roofline_cycles)}, {dma}\nutilisation: {util}")


def _percent(share: float) -> str:
    """A share as a whole percentage, but a unit that worked a little is not "0%".

    >>> _percent(0.004), _percent(0.0), _percent(0.996), _percent(0.25)
    ('<1%', '0%', '>99%', '25%')
    """
    if 0 < share < 0.005:
        return "<1%"
    if 0.995 <= share < 1:
        return ">99%"
    return f"{100 * share:.0f}%"
