"""The execute side: segments, the worker loop, the LISTEN wake-up and the daemon."""
