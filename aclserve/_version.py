"""The package version, alone in its module: setup.py reads it without importing aclserve, and
code below the package root (the OM producer field, the CLI, server metadata) imports it
without pulling in the root's lazy Engine."""
__version__ = "0.1.0"
