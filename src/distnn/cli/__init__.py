"""The ``distnn`` command line (``distnn.cli.main:main``); the run it builds is
``distnn.run``'s."""
from .main import build_parser, main

__all__ = ["main", "build_parser"]
