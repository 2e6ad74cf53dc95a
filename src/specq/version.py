"""specq's version (the bench records it with every run)."""

__version__ = "0.1.0"
