"""The `ember` command; one module per sub-command, imported only when that command runs."""
