"""``python -m accel``: the default demo (see :mod:`accel.demo`)."""

import sys

from accel.demo import main

sys.exit(main())
