"""Tiny models shared by the decoding tests (built once per session: building costs compiles)."""

import jax
import pytest

import zoo


@pytest.fixture(scope="session")
def gpt():
    return zoo.create("gpt-tiny", key=jax.random.key(1))


@pytest.fixture(scope="session")
def translator():
    return zoo.create("translator-tiny", key=jax.random.key(2))
