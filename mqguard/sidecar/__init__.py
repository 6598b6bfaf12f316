"""STOMP sidecar proxy: mqguard between STOMP clients and an unmodified broker."""
