"""``python -m clustersim`` runs the same command line as the ``clustersim`` script."""

import sys

from clustersim.cli import main

sys.exit(main())
