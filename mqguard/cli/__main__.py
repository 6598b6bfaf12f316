"""``python -m mqguard.cli`` runs the ``mqguard`` command."""

from mqguard.cli import main

main()
