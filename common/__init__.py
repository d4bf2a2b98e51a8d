"""Shared by broker/ and the adapters alike: the one exception hierarchy (errors) and
the hardened XML parser (xml_safe). Imports nothing from broker/ or adapters/.
"""
