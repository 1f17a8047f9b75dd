"""camkit's private helpers: input checks, file modes, module state, device-sync recording.

Nothing here is public API; every wing may import it, and it imports only :mod:`camkit.errors`.
"""
