"""The apex=pubsub service's wire side: the handler and the sequenced fan-out.
"""
