"""clustersim's version (pyproject.toml's ``version``), in a module of its own: every layer can
read it (the CLI's ``--version``, a sweep's fingerprint) without importing the package's API,
which sits above them all (docs/architecture.md)."""

__version__ = "0.1.0"
