"""Built-in plugins, one per module, installed as ``mqguard.plugins.<name>``.

Each is registered by the name given in :data:`mqguard.registry.BUILTIN_PLUGINS`
and can be disabled with ``[mqguard] disabled-plugins = ["<name>"]``.
"""
