"""Fixtures shared by several test modules."""

import pytest

from tokenpath.bench import PromptBuilder, load_tokenizer


@pytest.fixture(scope="module")
def tekken():
    """The embedded default tokenizer (Tekken, from mistral-common's data files)."""
    return load_tokenizer(None)


@pytest.fixture(scope="module")
def builder(tekken):
    """The bench client's prompt builder over it."""
    return PromptBuilder(tekken)
