"""tirpat's model level: backends, composite targets, partitioning and whole-model builds.

It sits on the device kit (:mod:`tirpat.device`) and the TIR core (:mod:`tirpat.tir`);
neither of those imports it.
"""
