"""``python -m tirpat``: the ``tirpat`` command line (see :mod:`tirpat.cli`)."""

from tirpat.cli import main

raise SystemExit(main())
