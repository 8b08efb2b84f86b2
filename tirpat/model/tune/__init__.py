"""Tuning: backends' schedules searched by TVM's meta_schedule, measured on their devices,
here or on RPC servers (:mod:`tirpat.model.tune.tuner` has the whole flow).

- :mod:`~tirpat.model.tune.space`: knobs as a design space (``tp.Knob``, ``tp.knob_space``);
- :mod:`~tirpat.model.tune.artifact`: a candidate as a self-contained file, measured and
  checked bit for bit;
- :mod:`~tirpat.model.tune.runners`: meta_schedule's builder and runners for them;
- :mod:`~tirpat.model.tune.rpc`: measuring servers behind a TVM RPC tracker;
- :mod:`~tirpat.model.tune.tuner`: ``tp.tune``.

Records are :class:`tirpat.Records` (:mod:`tirpat.model.records`).
"""

from .artifact import NotBitExact
from .rpc import RPC, serve
from .space import Knob, MutateKnob, knob_space
from .tuner import Progress, TaskResult, TuneResult, tune

__all__ = ["tune", "TuneResult", "TaskResult", "Progress", "Knob", "knob_space", "MutateKnob", "RPC", "serve",
           "NotBitExact"]
