"""Tests of common/.
"""
