"""The client library: ApexClient and the clients built on it.
"""
