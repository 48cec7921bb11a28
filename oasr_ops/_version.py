"""The package version (a module of its own, below every layer, so the graph pass can hash it)."""
__version__ = "0.1.0"
