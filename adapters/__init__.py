"""Wire protocols, the client library and the CLI: they turn traffic into calls on `broker`."""
