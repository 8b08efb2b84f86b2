"""The parameters of one accel core: array shape, bandwidths and scratchpad sizes."""

from __future__ import annotations

from dataclasses import dataclass

from accel.hw.instructions import ACC, INP, WGT, capacity_option

__all__ = ["Config"]


@dataclass(frozen=True)
class Config:
    """Hardware parameters of the simulated NPU; the defaults are the reference core.

    A GEMM step is one ``tile x tile x tile`` product; scratchpad sizes are in bytes
    (INP and WGT hold int8, ACC holds int32).

    >>> Config().tile_cycles
    16
    >>> Config(acc_bytes=64 * 1024).acc_elements
    16384
    """

    tile: int = 16
    gemm_macs_per_cycle: int = 256
    dma_bytes_per_cycle: int = 64
    alu_lanes: int = 16
    issue_overhead: int = 4
    inp_bytes: int = 32 * 1024
    wgt_bytes: int = 256 * 1024
    acc_bytes: int = 128 * 1024
    dwmac_macs_per_cycle: int = 16
    unit_queue: int = 2

    def __post_init__(self) -> None:
        for name in ("tile", "gemm_macs_per_cycle", "dma_bytes_per_cycle", "alu_lanes",
                     "inp_bytes", "wgt_bytes", "acc_bytes", "dwmac_macs_per_cycle"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"Config.{name} must be a positive int, got {value!r}")
        for name in ("issue_overhead", "unit_queue"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"Config.{name} must be an int >= 0, got {value!r}")
        if self.tile & (self.tile - 1):
            raise ValueError(f"Config.tile must be a power of two, got {self.tile}")
        # A scratchpad must hold at least one whole tile and a whole number of SRAM rows,
        # and every element address must fit the ISA's 32-bit address fields.
        for memory in (INP, WGT, ACC):
            name, itemsize = capacity_option(memory), memory.itemsize
            size = getattr(self, name)
            row = self.tile * itemsize
            if size % row or size < self.tile * row:
                raise ValueError(
                    f"Config.{name}={size} must be a multiple of {row} bytes (one SRAM row) "
                    f"and hold at least one {self.tile}x{self.tile} tile ({self.tile * row} bytes)")
            if size // itemsize > 2**32:
                raise ValueError(f"Config.{name}={size} exceeds the 32-bit element address space")

    @property
    def inp_elements(self) -> int:
        """INP capacity in int8 elements (:data:`accel.hw.instructions.INP`'s for this Config)."""
        return INP.capacity_of(self.__dict__)

    @property
    def wgt_elements(self) -> int:
        """WGT capacity in int8 elements."""
        return WGT.capacity_of(self.__dict__)

    @property
    def acc_elements(self) -> int:
        """ACC capacity in int32 elements."""
        return ACC.capacity_of(self.__dict__)

    @property
    def tile_cycles(self) -> int:
        """Cycles the GEMM array needs for one tile step."""
        return -(-self.tile**3 // self.gemm_macs_per_cycle)

    @property
    def dwmac_cycles(self) -> int:
        """Cycles the GEMM array needs for one DWMAC step (``tile x tile`` MACs) at
        ``dwmac_macs_per_cycle``: by default ``tile`` a cycle, one per lane, as many cycles as a
        GEMM step takes, since both read one INP row of ``tile`` elements a cycle.

        >>> Config().dwmac_cycles, Config(dwmac_macs_per_cycle=256).dwmac_cycles
        (16, 1)
        """
        return -(-self.tile**2 // self.dwmac_macs_per_cycle)
