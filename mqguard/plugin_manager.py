"""Builds the pluggy plugin manager: built-ins by name, third parties by entry point."""

from __future__ import annotations

from importlib.metadata import entry_points

import pluggy

from mqguard import hookspecs
from mqguard.config import MqguardConfig
from mqguard.errors import ConfigError
from mqguard.registry import BUILTIN_PLUGINS, PLUGIN_ENTRY_POINT_GROUP, load_target


def make_plugin_manager(config: MqguardConfig) -> pluggy.PluginManager:
    """A plugin manager with every enabled built-in and installed third-party plugin.

    Plugins named in ``[mqguard] disabled-plugins`` are blocked, so neither a
    built-in nor an entry point of that name is registered. A disabled name that
    matches no known plugin is an error: a typo must not leave a plugin running.
    """
    manager = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    manager.add_hookspecs(hookspecs)
    disabled = set(config.core.disabled_plugins)
    installed = {ep.name for ep in entry_points(group=PLUGIN_ENTRY_POINT_GROUP)}
    unknown = disabled - set(BUILTIN_PLUGINS) - installed
    if unknown:
        known = ", ".join(sorted({*BUILTIN_PLUGINS, *installed}))
        raise ConfigError(
            f"{config.source}: mqguard.disabled-plugins names unknown plugin(s) "
            f"{', '.join(sorted(unknown))}; known plugins: {known}")
    for name in sorted(disabled):
        manager.set_blocked(name)
    for name, target in BUILTIN_PLUGINS.items():
        if name not in disabled:
            plugin = load_target(target)
            # A class holds per-guard state: each plugin manager gets its own instance.
            manager.register(plugin() if isinstance(plugin, type) else plugin, name=name)
    manager.load_setuptools_entrypoints(PLUGIN_ENTRY_POINT_GROUP)
    manager.hook.configure.call_historic(kwargs={"config": config})
    return manager
