"""Tests of adapters/client.
"""
