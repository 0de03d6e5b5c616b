"""The version of ninelives: written here once (the build reads it from this file),
so that any module can name it without importing the package that assembles the API."""

__version__ = "0.1.0"
