"""Errors every podcert command answers the same way: one line naming what is wrong, exit 2.

Kept free of imports so the dispatcher can catch them without loading any command's packages.
"""

from __future__ import annotations


class ConfigError(Exception):
    """A command's configuration (a kubeconfig, credentials, a file it was pointed at) cannot be
    used. The message says which and why, in one line, and never quotes a credential."""
