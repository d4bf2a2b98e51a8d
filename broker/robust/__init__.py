"""Robust delivery (XEP-0040 bound to APEX): link seqs, the durable link log.

See docs/robust-binding.md for the wire binding and `linkseq`, `links` for the theory.
"""
