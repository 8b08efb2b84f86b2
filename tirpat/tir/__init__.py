"""tirpat's TIR core: patterns over lowered TIR, the matcher, regions, ``explain``, the
rewriter, TVMScript (module) rules and the TIR pipeline. Its public names are re-exported
by :mod:`tirpat`.
"""
