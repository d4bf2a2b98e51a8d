"""The `apexps` command line."""
