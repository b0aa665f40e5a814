"""``python -m gpuzarr_dist``: the ``gpuzarr-dist`` command line."""

from gpuzarr_dist.cli import main

raise SystemExit(main())
