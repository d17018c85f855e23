"""LTD retrieval — training: data, models, losses and the training loop.

Nothing here imports ``indexer``, ``app`` or ``ui``; the loop takes a validation callable.
"""
__version__ = "0.1.0"
