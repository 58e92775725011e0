"""The package version, at the ground floor so that any module can name it without importing ``qdebug``."""

__version__ = "0.1.0"
