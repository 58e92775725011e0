"""Real-browser tests (Playwright driving Debian chromium); infrastructure in conftest.py."""
