"""The ``distnn`` command line (``distnn.cli.main:main``) and its configuration."""
from .config import ConfigError, RunConfig, build_config, load_toml
from .main import build_parser, main

__all__ = ["main", "build_parser", "build_config", "load_toml", "ConfigError", "RunConfig"]
