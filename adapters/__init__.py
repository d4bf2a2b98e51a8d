"""Wire protocols, the client library and the CLI: they turn traffic into calls on `broker`."""

import common  # noqa: F401  (first: it installs the finder of the compiled message path)
