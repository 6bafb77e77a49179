"""Fixtures for the security tests: throwaway certificates.

The certificate maker is the API tests' one (`tests/support/api_fakes.py`), not a copy.
"""

from __future__ import annotations

import pytest

from tests.support.api_fakes import Certs, make_certs


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("security-certs"))
