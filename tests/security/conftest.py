"""Fixtures for the security tests: throwaway certificates, the API test helpers on the path.

`tests/api/api_fakes.py` (the in-memory `SidecarBackend` and the certificate maker) is
imported from its own directory, not copied.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "api"))

from api_fakes import Certs, make_certs


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("security-certs"))
