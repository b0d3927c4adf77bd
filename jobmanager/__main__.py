"""``python -m jobmanager``: see jobmanager.cli."""

from jobmanager.cli import main

raise SystemExit(main())
