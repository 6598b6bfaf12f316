"""Test support for mqguard: pytest fixtures for real servers and an in-process loopback broker."""
