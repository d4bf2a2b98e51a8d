"""What broker/ and the adapters share, below both: `errors`, the one exception hierarchy (each
class carries the reply code it answers with), and `xml_safe`, the hardened lxml parser every
vocabulary reads with. It imports nothing from broker/ or adapters/ (common/ruff.toml), which is
what lets the BEEP core use them without knowing the broker.
"""
