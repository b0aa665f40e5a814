"""``python -m gpuzarr_dist``: the ``gpuzarr-dist`` command line."""

from .cli import main

raise SystemExit(main())
