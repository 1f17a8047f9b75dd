"""Tiny vision-language models built from code (no download), shared by the tests of this folder."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")


@pytest.fixture(scope="session")
def llava():
    import tiny_llava

    return tiny_llava.build()


@pytest.fixture(scope="session")
def llava_next():
    import tiny_llava_next

    return tiny_llava_next.build()


@pytest.fixture(scope="session")
def paligemma():
    import tiny_paligemma

    return tiny_paligemma.build()
