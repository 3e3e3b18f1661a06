"""`--compile-cache DIR|none`: where `zoo train` keeps compiled programs (zoo.train.compile_cache)."""

from __future__ import annotations

import argparse

from zoo.train.compile_cache import default_directory, enable_compile_cache


def add_compile_cache_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--compile-cache",
        metavar="DIR",
        default=None,
        help="keep compiled steps in DIR so a rerun of the same shapes skips compiling "
        "(default: $ZOO_COMPILE_CACHE, else ~/.cache/zoo/compile); 'none' turns it off",
    )


def use_compile_cache(chosen: str | None) -> None:
    """Turn on the cache `--compile-cache` names (`chosen`; its default when not given)."""
    enable_compile_cache(default_directory() if chosen is None else chosen)
