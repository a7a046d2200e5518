"""Fixtures for the approval side live in tests/conftest.py (the Globex run is shared with tests/faults)."""
