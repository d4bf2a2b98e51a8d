"""What broker/ and the adapters share, below both: `errors`, the one exception hierarchy (each
class carries the reply code it answers with), and `xml_safe`, the hardened lxml parser every
vocabulary reads with. It imports nothing from broker/ or adapters/ (common/ruff.toml), which is
what lets the BEEP core use them without knowing the broker.
"""

from common import compiled as _compiled

# Before any module of the message path is imported (broker/ and adapters/ import this package
# first): its compiled build, where one is fresh, is what they get.
_compiled.install()
