"""Text generation from the decoder language model: a key/value cache, sampling, drafters for
speculative decoding, and an engine that batches every running sequence's next step together
(continuous batching). Pure torch: the serving layer wraps :class:`~scaleforge.generate.engine.Engine`.
"""
