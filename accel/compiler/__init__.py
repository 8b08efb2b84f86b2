"""The accel compiler: tirpat rules, scheduling (GEMMs and convolutions as GEMMs),
scratchpad planning and ``accel.build``. It sits on :mod:`accel.hw` and tirpat.
"""
