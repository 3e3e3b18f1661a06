"""The version of zoo (the distribution `jax-transformer-zoo`), recorded in saved models and
benchmark results."""

__version__ = "0.2.0.dev0"
